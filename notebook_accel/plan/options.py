"""Every option of the public entry points, once: its name, type, default, allowed values, who takes it, help.

The entry points — ``notebook_launcher``, ``start_launch``, ``launch_panel``, ``Session``, ``Session.run`` and
``Session.execute`` — write their options out as typed keyword-only parameters, so that editors complete them and
type checkers check them; ``tests/test_entry_points.py`` fails when a ``def`` line drifts from this table (names, order,
defaults, types). ``plan.entry_points`` checks every call against it, the config file saves the options marked
``saved``, the CLI offers the allowed values and the panel its pickers.

Adding an option is one ``Option`` here (``takers``: the entry points that take it), one parameter line in the
``def`` of each of them — as ``expected_parameters(entry)`` prints it — and, for a launch setting, one field of
``LaunchOptions`` and one ``name=name`` where each of them makes it (tests fail until all agree); then the code that
reads it from the ``LaunchOptions``.

>>> OPTIONS["mixed_precision"].default, OPTIONS["mixed_precision"].choices.values()
('no', ('no', 'fp16', 'bf16'))
"""
from __future__ import annotations

import difflib
import inspect
import numbers
import os
import textwrap
from dataclasses import dataclass, fields
from typing import (Any, Callable, Dict, FrozenSet, List, Literal, Mapping, Optional, Sequence, Tuple, Type, Union,
                    get_args, get_origin)

from ..errors import LaunchConfigError, LaunchConfigTypeError
from ..wire.choices import (Choice, Cluster, ClusterName, Device, DeviceName, Display, DisplayName, MixedPrecision,
                            MixedPrecisionName, Placement, PlacementName, RendezvousBackend, RendezvousBackendName,
                            StartMethod, StartMethodName)

# The public entry points, as a user writes them, with their own parameters (not options), in ``def`` order.
NOTEBOOK_LAUNCHER, START_LAUNCH, LAUNCH_PANEL = "notebook_launcher", "start_launch", "launch_panel"
SESSION, SESSION_RUN, SESSION_EXECUTE = "Session", "Session.run", "Session.execute"
ENTRY_POINTS: Dict[str, Tuple[str, ...]] = {
    NOTEBOOK_LAUNCHER: ("function", "args", "kwargs"),
    START_LAUNCH: ("function", "args", "kwargs", "view"),
    LAUNCH_PANEL: ("function", "args", "kwargs"),
    SESSION: ("self",),
    SESSION_RUN: ("self", "function", "args", "kwargs"),
    SESSION_EXECUTE: ("self", "code"),
}
LAUNCHES = frozenset({NOTEBOOK_LAUNCHER, START_LAUNCH, LAUNCH_PANEL})
EVERYWHERE = LAUNCHES | {SESSION}                # a launch's settings; a session keeps them for its runs
RUNS = frozenset({SESSION_RUN, SESSION_EXECUTE})  # one task on a session's ranks: None there is the session's value

PathLike = Union[str, os.PathLike]  # a path as ``open`` takes it


def _anything(value: Any) -> bool:
    return True


def _positive(value: Any) -> bool:
    return value > 0


def _at_least_zero(value: Any) -> bool:
    return value >= 0


def _port(value: Any) -> bool:
    return 0 < value < 65536


def _not_empty(value: Any) -> bool:
    return len(value) > 0


def _str_keys(value: Any) -> bool:
    return all(isinstance(key, str) for key in value)


def _resources(value: Any) -> bool:
    return all(isinstance(key, str) and key and isinstance(amount, numbers.Real) and not isinstance(amount, bool)
               and amount >= 0 for key, amount in value.items())


@dataclass(frozen=True)
class Option:
    """One option. ``annotation``: its type as every ``def`` writes it (a ``Literal`` alias for a choice);
    ``expects``: what a good value is, for messages; ``valid``: what the type does not say (a range; never asked of
    ``None``). ``choices``: the Enum of the allowed values, or the names we offer where others are allowed too
    (``open_choices``). ``takers``: the entry points that take it. ``saved``: the config file keeps it. ``nodes``: a
    multi-node / restart option (``plan.nodes``). ``positional``: also the entry points' 4th (or 1st) positional."""

    name: str
    annotation: Any
    default: Any
    help: str
    takers: FrozenSet[str] = EVERYWHERE
    expects: str = ""
    valid: Callable[[Any], bool] = _anything
    choices: Optional[Type[Choice]] = None
    open_choices: bool = False
    saved: bool = False
    nodes: bool = False
    positional: bool = False
    also_called: Tuple[Tuple[str, str], ...] = ()  # (a name people use, the choice it means): ("gpu", "cuda")

    def from_saved_config(self, entry: str) -> bool:
        """Whether ``entry`` takes this option's value from the saved config file when the call does not give it: a
        saved option, unless it is one of torch elastic's node options and ``entry`` is ``Session`` (a config's nodes
        are ``notebook_launcher``'s, which a session has not; a session takes ``num_nodes`` only as given, where its
        planner takes it).

        >>> [OPTIONS["num_nodes"].from_saved_config(entry) for entry in ("notebook_launcher", "Session")]
        [True, False]
        """
        return self.saved and not (self.nodes and entry == SESSION)

    def refusal(self, value: Any) -> str:
        """What is wrong with ``value``, as the error says it (with the choice meant, when one is)."""
        if self.choices is not None and not self.open_choices:
            allowed = ", ".join(repr(choice) for choice in self.choices.values())
            meant = self.meant(value)
            return f"{self.name}={value!r} is not one of {allowed}" + (f"; did you mean {meant!r}?" if meant else "")
        return f"{self.name} must be {self.expects}, got {value!r}"

    def meant(self, value: Any) -> Optional[str]:
        """The choice ``value`` most likely means: another name for it ("gpu": "cuda", "cuda:1": "cuda"), another
        case ("CPU"), or a close spelling ("fb16": "fp16"); None when nothing is close.

        >>> OPTIONS["device"].meant("gpu"), OPTIONS["device"].meant("CPU"), OPTIONS["mixed_precision"].meant("fb16")
        ('cuda', 'cpu', 'fp16')
        """
        if self.choices is None or not isinstance(value, str):
            return None
        said = value.strip().lower()
        said = said.split(":", 1)[0] if ":" in said else said  # a torch device string: "cuda:0"
        choices = self.choices.values()
        lowered = {choice.lower(): choice for choice in choices}
        if said in lowered:
            return lowered[said]
        named = dict(self.also_called).get(said)
        if named is not None:
            return named
        close = closest(said, list(lowered))
        return lowered[close] if close else None


def closest(said: str, names: Sequence[str], cutoff: float = 0.75) -> Optional[str]:
    """The one of ``names`` that ``said`` most likely misspells, or None: every "did you mean" of the options (a
    choice, a ``slurm={...}`` key).

    >>> closest("partiton", ["partition", "time"]), closest("zzz", ["time"])
    ('partition', None)
    """
    close = difflib.get_close_matches(said, list(names), n=1, cutoff=cutoff)
    return close[0] if close else None


def _choice(name: str, annotation: Any, enum: Type[Choice], default: Any, help: str, **more: Any) -> Option:
    """An option whose values are ``enum``'s (its ``Literal`` twin is the type)."""
    closed = not more.get("open_choices", False)
    more.setdefault("valid", (lambda value: value in enum.values()) if closed else _not_empty)
    return Option(name, annotation, default, help, choices=enum, **more)


# The values ``cluster`` takes: ``plan.planners``' rows, which add themselves (the package's are ``Cluster``'s).
CLUSTER_NAMES = set(Cluster.values())


def _a_planners_cluster(value: Any) -> bool:
    return value in CLUSTER_NAMES


LAUNCHER_OPTIONS: Tuple[Option, ...] = (
    Option("num_processes", Optional[int], None, "ranks this call starts: on this machine all of them (one rank "
           "runs in the kernel process itself); with ``num_nodes``, this node's share; on a cluster, every rank, "
           "wherever it places them. None = every device of the kind (GPUs, TPU cores), 1 on CPU (per node).",
           expects="a positive int or None",
           valid=_positive, saved=True, positional=True),
    _choice("device", Optional[DeviceName], Device, None, "the device the ranks use; None = the best one here.",
            saved=True, also_called=(("gpu", "cuda"), ("nvidia", "cuda"), ("tpu", "xla"), ("metal", "mps"),
                                     ("apple", "mps"))),
    _choice("mixed_precision", MixedPrecisionName, MixedPrecision, MixedPrecision.NO.value,
            "the precision the ranks' ``Accelerator`` (ours or HF accelerate's) trains in: \"bf16\" and \"fp16\" "
            "run the model's forward pass under autocast in that type (the weights stay fp32, outputs come back "
            "fp32); \"fp16\" (CUDA only) also scales the loss so that small gradients do not underflow. Exported "
            "to the ranks as ``ACCELERATE_MIXED_PRECISION``: a loop without an ``Accelerator`` is unchanged.",
            saved=True),
    _choice("start_method", StartMethodName, StartMethod, StartMethod.AUTO.value, "\"auto\" (fork when safe, else a "
            "warm forkserver), or one named.", saved=True),
    Option("master_addr", str, "127.0.0.1", "the rendezvous address.",
           expects="a host name or address string", valid=_not_empty),
    Option("use_port", Optional[int], None, "the rendezvous port; None lets the launcher hold a free one.",
           expects="None or a port number in 1..65535", valid=_port),
    Option("timeout", Optional[float], None, "seconds; past it every rank is stopped and ``LaunchTimeout`` (a "
           "``TimeoutError``) raised.", takers=EVERYWHERE | RUNS,
           expects="None or a positive number of seconds", valid=_positive),
    Option("return_all", bool, False, "return a list of every rank's value (by rank) instead of rank 0's.",
           takers=LAUNCHES | {SESSION_RUN}, expects="True or False"),
    _choice("display", DisplayName, Display, Display.AUTO.value, "\"auto\" (dashboard in a notebook, text "
            "elsewhere), or one named.", takers=(EVERYWHERE - {LAUNCH_PANEL}) | RUNS),
    Option("pdb", Optional[bool], None, "post-mortem: a rank whose function raises opens pdb in the frame that "
           "raised, asking where the launch was started (the cell's input box, the terminal); after ``q`` the "
           "exception is raised as usual. None: as IPython's ``%pdb`` says (off outside IPython). ``breakpoint()`` "
           "works in every rank either way.", takers=frozenset({NOTEBOOK_LAUNCHER, SESSION}) | RUNS,
           expects="True, False or None"),
    Option("compile_cache", Optional[PathLike], None, "XLA only, opt-in: a directory for torch_xla's persistent "
           "compilation cache (one subdirectory per worker process), so relaunching the same program skips "
           "recompiling.", expects="a directory path or None"),
    Option("fsdp_config", Optional[Mapping[str, Any]], None, "shard with FSDP2 in every rank: accelerate's "
           "``fsdp_config`` keys (e.g. ``{\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\"}``), set in the ranks "
           "as the ``ACCELERATE_USE_FSDP`` / ``FSDP_*`` variables ``Accelerator()`` (ours and HF accelerate's) builds "
           "its plugin from.", expects="a mapping of accelerate's fsdp_config keys, or None", saved=True),
    Option("deepspeed_config", Optional[Mapping[str, Any]], None, "train with DeepSpeed ZeRO in every rank: "
           "accelerate's ``deepspeed_config`` keys (e.g. ``{\"zero_stage\": 3}``), set as ``ACCELERATE_USE_DEEPSPEED`` "
           "/ ``ACCELERATE_DEEPSPEED_*``.", expects="a mapping of accelerate's deepspeed_config keys, or None",
           saved=True),
    _choice("cluster", Optional[ClusterName], Cluster, None, valid=_a_planners_cluster, help="run the ranks on a "
            "cluster instead of this machine: "
            "\"ray\" makes each rank a Ray actor, wherever Ray places it (the kernel's ``ray.init`` cluster, or "
            "``RAY_ADDRESS``'s; without either, a local Ray). ``pip install \"notebook_accel[ray]\"``. \"slurm\" runs "
            "the ranks as a job step (``srun``) of the kernel's Slurm allocation, or of one asked for with ``slurm``."),
    Option("resources_per_rank", Optional[Mapping[str, float]], None, "with ``cluster``: what Ray reserves for each "
           "rank, e.g. ``{\"GPU\": 1, \"CPU\": 4}`` (any resource the nodes declare); None: 1 CPU, and 1 GPU with "
           "device=\"cuda\".", expects="a mapping of resource names to numbers >= 0, or None", valid=_resources),
    _choice("placement", Optional[PlacementName], Placement, None, "with ``cluster``: how Ray spreads the ranks over "
            "its nodes (its placement group strategies: ``PACK`` as few nodes as possible, ``SPREAD`` as many, "
            "``STRICT_`` a must); None: \"PACK\"."),
    Option("slurm", Optional[Mapping[str, Any]], None, "with ``cluster=\"slurm\"`` outside an allocation: the one "
           "to ask for, as salloc's long options (sbatch's too) without dashes, e.g. ``{\"partition\": \"gpu\", \"time\": "
           "\"01:00:00\", \"account\": \"lab\"}`` (a value ``True`` is a flag).",
           expects="a mapping of salloc long option names to values, or None", valid=_str_keys),
    Option("num_nodes", int, 1, "the machines the ranks span. Without ``cluster``: torch elastic's nodes, one "
           "notebook (or ``notebook-accel launch``) per node, each starting its ``num_processes``; global ranks follow "
           "the node order. With ``cluster=\"slurm\"``: the job's nodes (inside an allocation, all of its nodes by "
           "default), the call's ``num_processes`` spread evenly over them. Where it is refused (Ray places the ranks "
           "itself; a ``Session`` on this machine) the planner says why.", takers=LAUNCHES | {SESSION},
           expects="a positive int", valid=_positive, saved=True, nodes=True),
    Option("node_rank", Optional[int], None, "this node's place: 0 on the first machine, 1 on the second, ... Global "
           "ranks follow it with every rendezvous backend. None: 0 with \"static\"; the order the nodes joined in "
           "with \"c10d\" and \"etcd\" (give it on every node or on none).", takers=LAUNCHES,
           expects="None or an int >= 0", valid=_at_least_zero, saved=True, nodes=True),
    _choice("rdzv_backend", Union[RendezvousBackendName, str], RendezvousBackend, RendezvousBackend.STATIC.value,
            "torch elastic's rendezvous: \"static\" (node 0 at ``rdzv_endpoint``), \"c10d\", \"etcd\" or a registered "
            "plugin. The rendezvous store is a TCP listener without authentication: trusted networks only.",
            takers=LAUNCHES, expects="a rendezvous backend name", open_choices=True, saved=True, nodes=True),
    Option("rdzv_endpoint", Optional[str], None, "\"host:port\" of node 0 (static) or of the rendezvous store.",
           takers=LAUNCHES, expects="a 'host:port' string or None", saved=True, nodes=True),
    Option("rdzv_id", Optional[str], None, "the run id every node names (torchrun's ``--rdzv-id``).",
           takers=LAUNCHES, expects="a non-empty string or None", valid=_not_empty, saved=True, nodes=True),
    Option("rdzv_conf", Optional[Dict[str, Any]], None, "more rendezvous settings, e.g. ``{\"join_timeout\": 60, "
           "\"node_timeout\": 30}``.", takers=LAUNCHES, expects="a dict of str keys or None", valid=_str_keys,
           nodes=True),
    Option("max_restarts", int, 0, "after a failure, stop every rank on every node and run the whole world again "
           "this many times (``TORCHELASTIC_RESTART_COUNT`` tells the function which attempt it is). Never after an "
           "interrupt or a timeout. With ``cluster``, Ray places the new world, on the nodes left if one was lost.",
           takers=LAUNCHES, expects="an int >= 0", valid=_at_least_zero, saved=True,
           nodes=True),
    Option("monitor_interval", float, 0.1, "seconds between checks of the other nodes' state.", takers=LAUNCHES,
           expects="a positive number of seconds", valid=_positive, nodes=True),
    Option("detach", bool, False, "run the launch as a job of the cluster that outlives the kernel "
           "(``cluster=\"slurm\"``: a batch job; ``cluster=\"ray\"``: a detached driver actor): returns a "
           "``DetachedJob`` at once; ``notebook_accel.attach(job.id)`` from any later kernel shows its dashboard and "
           "returns its result. Its events and result are kept until ``job.forget()``.",
           takers=frozenset({START_LAUNCH}), expects="True or False"),
)

# A session's own: not a launch setting.
SESSION_OPTIONS: Tuple[Option, ...] = (
    Option("recover_timeout", float, 5.0, "seconds an interrupted rank may take to return to idle (a failed peer, "
           "Ctrl-C, a timeout) before the whole session is restarted (its state lost): a rank stuck in a C++ call.",
           takers=frozenset({SESSION}), expects="a positive number of seconds", valid=_positive),
)

# Where to read saved defaults from, not a launch setting.
CONFIG_OPTION = Option("config", Union[bool, PathLike, None], None, "``True`` or a path: take the saved defaults "
                       "(``notebook-accel config``) for the options not given here. Off by default: a shared "
                       "notebook carries its own settings.", takers=frozenset({NOTEBOOK_LAUNCHER, LAUNCH_PANEL, SESSION}),
                       expects="True, False, None or a path")

# The table: every option of every entry point, in the order their ``def`` lines write them.
ALL_OPTIONS: Tuple[Option, ...] = LAUNCHER_OPTIONS + SESSION_OPTIONS + (CONFIG_OPTION,)
OPTIONS: Dict[str, Option] = {option.name: option for option in LAUNCHER_OPTIONS}  # a launch's settings
SAVED_OPTIONS: Tuple[Option, ...] = tuple(option for option in LAUNCHER_OPTIONS if option.saved)
NODE_OPTION_NAMES: Tuple[str, ...] = tuple(option.name for option in LAUNCHER_OPTIONS if option.nodes)
_BY_NAME: Dict[str, Option] = {option.name: option for option in ALL_OPTIONS}
assert all(option.takers <= set(ENTRY_POINTS) for option in ALL_OPTIONS), "a taker that is no entry point"


def options_for(entry: str) -> Tuple[Option, ...]:
    """The options ``entry`` (a name in ``ENTRY_POINTS``) takes, in ``def`` order."""
    return tuple(option for option in ALL_OPTIONS if entry in option.takers)


def parameter_for(entry: str, option: Option) -> Tuple[Any, Any]:
    """``(annotation, default)`` of ``option`` in ``entry``'s ``def``: the table's, except that a session's run
    takes ``None`` for "the session's value" (``Session(timeout=60)`` is every run's default)."""
    if entry in RUNS and SESSION in option.takers:
        return Optional[option.annotation], None
    return option.annotation, option.default


def expected_parameters(entry: str) -> List[inspect.Parameter]:
    """The parameters ``entry``'s ``def`` writes for its options; ``str()`` of one is the line to write.

    >>> for parameter in expected_parameters("Session.execute"):
    ...     print(parameter)
    timeout: Optional[float] = None
    display: Optional[Literal['auto', 'widgets', 'text', 'none']] = None
    pdb: Optional[bool] = None
    """
    parameters = []
    for option in options_for(entry):
        annotation, default = parameter_for(entry, option)
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if option.positional else inspect.Parameter.KEYWORD_ONLY
        parameters.append(inspect.Parameter(option.name, kind, default=default, annotation=annotation))
    return parameters


# ---------------------------------------------------------------------------------------------- checking

def conforms(value: Any, annotation: Any) -> bool:
    """Whether ``value`` has the type ``annotation`` names, for the few kinds of type options have (``bool`` is no
    number here; a ``Literal`` asks for the type of its values, the choice itself is ``Option.valid``'s).

    >>> conforms(5, Optional[float]), conforms(True, int), conforms("bogus", DisplayName)
    (True, False, True)
    """
    origin = get_origin(annotation)
    if annotation is Any:
        return True
    if origin is Union:
        return any(conforms(value, member) for member in get_args(annotation))
    if origin is Literal:
        return any(isinstance(value, type(member)) for member in get_args(annotation))
    annotation = origin or annotation  # Dict[str, Any] -> dict, Mapping[...] -> collections.abc.Mapping
    if annotation is type(None):
        return value is None
    if annotation in (int, float) and isinstance(value, bool):
        return False
    if annotation is float:
        return isinstance(value, numbers.Real)
    if annotation is int:
        return isinstance(value, numbers.Integral)
    return isinstance(value, annotation)


def check_option(option: Option, value: Any, annotation: Any = None) -> None:
    """``LaunchConfigTypeError`` when ``value`` is not of the option's type (``annotation``: another one, e.g. a
    run's ``Optional``), ``LaunchConfigError`` when it is out of its range or not one of its choices."""
    if not conforms(value, option.annotation if annotation is None else annotation):
        raise LaunchConfigTypeError(option.refusal(value))
    if value is not None and not option.valid(value):
        raise LaunchConfigError(option.refusal(value))


def defaults() -> Dict[str, Any]:
    """``{name: default}`` for every launch setting."""
    return {option.name: option.default for option in LAUNCHER_OPTIONS}


def launch_options(given: Mapping[str, Any]) -> Dict[str, Any]:
    """Every launch setting's value — the ``given`` ones, the table's defaults for the rest — each checked.

    >>> launch_options({"timeout": 5})["timeout"], launch_options({})["display"]
    (5, 'auto')
    >>> launch_options({"timout": 5})
    Traceback (most recent call last):
    ...
    notebook_accel.errors.LaunchConfigTypeError: unexpected keyword argument 'timout'; did you mean 'timeout'?
    """
    for name in given:
        if name not in OPTIONS:
            raise LaunchConfigTypeError(unexpected_keyword("plan_launch", name, list(OPTIONS)))
    values = defaults()
    values.update(given)
    for name, value in values.items():
        check_option(OPTIONS[name], value)
    return values


@dataclass(frozen=True)
class LaunchOptions:
    """Every launch setting as one typed value, from the entry point down to where each one acts: an entry point
    writes its ``def``'s options into it by name (its call was checked already, once, by ``plan.entry_points``), a
    script or the CLI makes it with ``checked``; ``plan.plan.make_plan`` reads it. The fields are the table's launch
    options, with their types and defaults (``tests/test_options.py`` holds the two together).

    >>> LaunchOptions.checked(num_processes=2, timeout=30).timeout
    30
    """

    num_processes: Optional[int] = None
    device: Optional[DeviceName] = None
    mixed_precision: MixedPrecisionName = "no"
    start_method: StartMethodName = "auto"
    master_addr: str = "127.0.0.1"
    use_port: Optional[int] = None
    timeout: Optional[float] = None
    return_all: bool = False
    display: DisplayName = "auto"
    pdb: Optional[bool] = None
    compile_cache: Optional[PathLike] = None
    fsdp_config: Optional[Mapping[str, Any]] = None
    deepspeed_config: Optional[Mapping[str, Any]] = None
    cluster: Optional[ClusterName] = None
    resources_per_rank: Optional[Mapping[str, float]] = None
    placement: Optional[PlacementName] = None
    slurm: Optional[Mapping[str, Any]] = None
    num_nodes: int = 1
    node_rank: Optional[int] = None
    rdzv_backend: Union[RendezvousBackendName, str] = "static"
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    rdzv_conf: Optional[Dict[str, Any]] = None
    max_restarts: int = 0
    monitor_interval: float = 0.1
    detach: bool = False

    @classmethod
    def checked(cls, **given: Any) -> "LaunchOptions":
        """The ``given`` settings, each checked against the table (``launch_options``), the defaults for the rest."""
        return cls(**launch_options(given))

    def as_dict(self) -> Dict[str, Any]:
        """``{name: value}`` of every setting (for the checks that read settings by name)."""
        return {option.name: getattr(self, option.name) for option in fields(self)}


def unexpected_keyword(entry: str, name: str, accepted: Sequence[str]) -> str:
    """What to say about keyword ``name`` that ``entry`` does not take: who takes it, or the option meant.

    >>> unexpected_keyword("Session", "timout", ["num_processes", "timeout", "display"])
    "unexpected keyword argument 'timout'; did you mean 'timeout'?"
    >>> unexpected_keyword("Session", "node_rank", ["num_processes", "timeout"])
    "unexpected keyword argument 'node_rank': notebook_launcher, start_launch and launch_panel take it, Session does not"
    """
    said = f"unexpected keyword argument {name!r}"
    option = _BY_NAME.get(name)
    if option is not None:  # another entry point's option (before guessing: num_nodes is not num_processes)
        takers = [taker for taker in ENTRY_POINTS if taker in option.takers]
        listed = ", ".join(takers[:-1]) + (" and " if len(takers) > 1 else "") + takers[-1]
        return f"{said}: {listed} take{'s' if len(takers) == 1 else ''} it, {entry} does not"
    meant = difflib.get_close_matches(name, accepted, n=1)
    return f"{said}; did you mean {meant[0]!r}?" if meant else said


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


def options_help(entry: str, indent: str = "        ") -> str:
    """The "Args" lines of ``entry``'s options, for its docstring."""
    lines = []
    for option in options_for(entry):
        _, default = parameter_for(entry, option)
        allowed = f" One of {' | '.join(repr(value) for value in option.choices.values())}." \
            if option.choices is not None and not option.open_choices else ""
        said = "None (the session's)" if entry in RUNS and SESSION in option.takers else repr(default)
        text = f"{option.name}: {option.help}{allowed} Default: {said}."
        lines.append(textwrap.fill(text, width=110, initial_indent=indent, subsequent_indent=indent + "    "))
    return "\n".join(lines)
