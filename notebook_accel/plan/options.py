"""Every launcher option, once: its name, default, allowed values and help.

``notebook_launcher`` and ``start_launch`` take these as keyword arguments (their signatures and docstrings
are built from this table), ``plan_launch`` fills and checks them, the config file saves the ones marked
``saved``, the CLI offers the allowed values, and the panel its pickers. Adding an option is one entry here
plus the code that uses it.

>>> OPTIONS["mixed_precision"].default, OPTIONS["mixed_precision"].choices.values()
('no', ('no', 'fp16', 'bf16'))
"""
from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Tuple, Type

from ..errors import LaunchConfigError
from ..wire.choices import Choice, Device, Display, MixedPrecision, RendezvousBackend, StartMethod


@dataclass(frozen=True)
class Option:
    """One launcher option. ``choices``: the Enum of its allowed values (checked by ``check_choice``), or the
    names we offer where others are allowed too (``open_choices``). ``saved``: the config file keeps it.
    ``nodes``: it belongs to the multi-node / restart options (``plan.nodes``)."""

    name: str
    default: Any
    help: str
    choices: Optional[Type[Choice]] = None
    open_choices: bool = False
    saved: bool = False
    nodes: bool = False


LAUNCHER_OPTIONS: Tuple[Option, ...] = (
    Option("num_processes", None, "ranks to start; None = every device of the kind (GPUs, TPU cores), 1 on CPU. "
           "One rank runs in the kernel process itself.", saved=True),
    Option("device", None, "the device the ranks use; None = the best one here.", choices=Device, saved=True),
    Option("mixed_precision", MixedPrecision.NO.value, "exported as ``ACCELERATE_MIXED_PRECISION``.",
           choices=MixedPrecision, saved=True),
    Option("start_method", StartMethod.AUTO.value, "\"auto\" (fork when safe, else a warm forkserver), or one "
           "named.", choices=StartMethod, saved=True),
    Option("master_addr", "127.0.0.1", "the rendezvous address."),
    Option("use_port", None, "the rendezvous port; None lets the launcher hold a free one."),
    Option("timeout", None, "seconds; past it every rank is stopped and ``LaunchTimeout`` (a ``TimeoutError``) "
           "raised."),
    Option("return_all", False, "return a list of every rank's value (by rank) instead of rank 0's."),
    Option("display", Display.AUTO.value, "\"auto\" (dashboard in a notebook, text elsewhere), or one named.",
           choices=Display),
    Option("compile_cache", None, "XLA only, opt-in: a directory for torch_xla's persistent compilation cache "
           "(one subdirectory per worker process), so relaunching the same program skips recompiling."),
    Option("fsdp_config", None, "shard with FSDP2 in every rank: accelerate's ``fsdp_config`` keys (e.g. "
           "``{\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\"}``), set in the ranks as the ``ACCELERATE_USE_FSDP`` "
           "/ ``FSDP_*`` variables ``Accelerator()`` (ours and HF accelerate's) builds its plugin from.", saved=True),
    Option("deepspeed_config", None, "train with DeepSpeed ZeRO in every rank: accelerate's ``deepspeed_config`` keys "
           "(e.g. ``{\"zero_stage\": 3}``), set as ``ACCELERATE_USE_DEEPSPEED`` / ``ACCELERATE_DEEPSPEED_*``.",
           saved=True),
    Option("num_nodes", 1, "several machines, one notebook (or ``notebook-accel launch``) per node; "
           "``num_processes`` is per node and global ranks follow the node order.", saved=True, nodes=True),
    Option("node_rank", None, "this node's place: 0 on the first machine, 1 on the second, ... Global ranks follow "
           "it with every rendezvous backend. None: 0 with \"static\"; the order the nodes joined in with "
           "\"c10d\" and \"etcd\" (give it on every node or on none).", saved=True, nodes=True),
    Option("rdzv_backend", RendezvousBackend.STATIC.value, "torch elastic's rendezvous: \"static\" (node 0 at "
           "``rdzv_endpoint``), \"c10d\", \"etcd\" or a registered plugin. The rendezvous store is a TCP listener "
           "without authentication: trusted networks only.", choices=RendezvousBackend, open_choices=True,
           saved=True, nodes=True),
    Option("rdzv_endpoint", None, "\"host:port\" of node 0 (static) or of the rendezvous store.", saved=True,
           nodes=True),
    Option("rdzv_id", None, "the run id every node names (torchrun's ``--rdzv-id``).", saved=True, nodes=True),
    Option("rdzv_conf", None, "more rendezvous settings, e.g. ``{\"join_timeout\": 60, \"node_timeout\": 30}``.",
           nodes=True),
    Option("max_restarts", 0, "after a failure, stop every rank on every node and run the whole world again this "
           "many times (``TORCHELASTIC_RESTART_COUNT`` tells the function which attempt it is). Never after an "
           "interrupt or a timeout.", saved=True, nodes=True),
    Option("monitor_interval", 0.1, "seconds between checks of the other nodes' state.", nodes=True),
)

OPTIONS: Dict[str, Option] = {option.name: option for option in LAUNCHER_OPTIONS}
SAVED_OPTIONS: Tuple[Option, ...] = tuple(option for option in LAUNCHER_OPTIONS if option.saved)
NODE_OPTION_NAMES: Tuple[str, ...] = tuple(option.name for option in LAUNCHER_OPTIONS if option.nodes)

# ``config`` is the launcher's own: where to read saved defaults from, not a launch setting.
CONFIG_OPTION = Option("config", None, "``True`` or a path: take the saved defaults (``notebook-accel config``) "
                                       "for the options left at their defaults here. Off by default: a shared "
                                       "notebook carries its own settings.")


def defaults() -> Dict[str, Any]:
    """``{name: default}`` for every launcher option."""
    return {option.name: option.default for option in LAUNCHER_OPTIONS}


def with_defaults(given: Dict[str, Any], *, caller: str = "the launcher") -> Dict[str, Any]:
    """Every option's value: the ``given`` ones, the table's defaults for the rest; a ``TypeError`` naming
    any option the table does not know (as Python names an unexpected keyword argument).

    >>> with_defaults({"timeout": 5})["timeout"], with_defaults({})["display"]
    (5, 'auto')
    """
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unexpected launcher option(s) for {caller}: {', '.join(unknown)}")
    values = defaults()
    values.update(given)
    return values


def check_choice(name: str, value: Any) -> None:
    """A clear ``LaunchConfigError`` when ``value`` is not one of option ``name``'s allowed values."""
    choices = OPTIONS[name].choices
    if choices is None or OPTIONS[name].open_choices or value in choices.values():
        return
    allowed = ", ".join(repr(choice) for choice in choices.values())
    raise LaunchConfigError(f"{name}={value!r} is not one of {allowed}")


def check_precision_for_device(mixed_precision: Any, device: Any) -> None:
    """The one rule tying two options: fp16 needs CUDA (a GradScaler); TPUs and CPUs compute in bf16. The
    launcher, the config file (before saving) and the panel all ask this.

    >>> check_precision_for_device("bf16", "cpu")
    >>> check_precision_for_device("fp16", "cpu")
    Traceback (most recent call last):
    ...
    notebook_accel.errors.LaunchConfigError: mixed_precision='fp16' needs CUDA; on CPU use 'bf16'
    """
    if mixed_precision != MixedPrecision.FP16 or device is None or device == Device.CUDA:
        return
    if device == Device.XLA:
        raise LaunchConfigError("mixed_precision='fp16' is not supported on XLA; TPUs compute in 'bf16'")
    raise LaunchConfigError(f"mixed_precision='fp16' needs CUDA; on {str(device).upper()} use 'bf16'")


def precisions_for(device: Any) -> Tuple[str, ...]:
    """The precisions ``device`` can train in (for pickers and questionnaires)."""
    allowed = []
    for precision in MixedPrecision.values():
        try:
            check_precision_for_device(precision, device)
        except LaunchConfigError:
            continue
        allowed.append(precision)
    return tuple(allowed)


def launcher_parameters(leading: Iterable[inspect.Parameter], *, config: bool) -> inspect.Signature:
    """The signature ``help()``, ``inspect.signature`` and Jupyter's Shift-Tab show for a launcher function:
    its ``leading`` parameters, then every option as keyword-only with its default (and ``config``)."""
    parameters = list(leading)
    seen = {parameter.name for parameter in parameters}
    keyword = inspect.Parameter.KEYWORD_ONLY
    for option in LAUNCHER_OPTIONS + ((CONFIG_OPTION,) if config else ()):
        if option.name not in seen:
            parameters.append(inspect.Parameter(option.name, keyword, default=option.default))
    return inspect.Signature(parameters)


def options_help(*, config: bool, indent: str = "        ") -> str:
    """The "Args" lines for every option, for a launcher function's docstring."""
    lines = []
    for option in LAUNCHER_OPTIONS + ((CONFIG_OPTION,) if config else ()):
        allowed = f" One of {' | '.join(repr(value) for value in option.choices.values())}." \
            if option.choices is not None and not option.open_choices else ""
        text = f"{option.name}: {option.help}{allowed} Default: {option.default!r}."
        lines.append(textwrap.fill(text, width=110, initial_indent=indent, subsequent_indent=indent + "    "))
    return "\n".join(lines)
