"""Saved launch defaults: ``notebook-accel config`` writes them, ``notebook-accel launch`` reads them.

The file is YAML, next to accelerate's in the Hugging Face cache (``$HF_HOME``, by default
``~/.cache/huggingface``)::

    ~/.cache/huggingface/notebook_accel/default_config.yaml      ours (written by `notebook-accel config`)
    ~/.cache/huggingface/accelerate/default_config.yaml          accelerate's, read when ours is absent

``NOTEBOOK_ACCEL_CONFIG_FILE`` points at another file. ``num_processes`` is per node in our file; in
accelerate's it is the total over all machines (``accelerate launch`` divides it by ``num_machines``), and
reading accelerate's file converts it.

``fsdp_config`` / ``deepspeed_config`` hold accelerate's own ``fsdp_config:`` / ``deepspeed_config:`` keys: every
rank then gets the ``ACCELERATE_USE_FSDP`` / ``FSDP_*`` (or ``ACCELERATE_USE_DEEPSPEED`` / ``ACCELERATE_DEEPSPEED_*``)
variables accelerate's launcher sets, and ``Accelerator()`` with no plugin (ours or HF accelerate's) shards::

    fsdp_config:
      fsdp_transformer_layer_cls_to_wrap: GPT2Block
      fsdp_activation_checkpointing: true

A notebook never reads the file unless asked (``notebook_launcher(..., config=True)``): a shared
notebook must carry its own settings.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Optional, Union

from ..errors import LaunchConfigError, LaunchConfigTypeError
from ..wire.choices import Device, MixedPrecision, RendezvousBackend, StartMethod
from .options import SAVED_OPTIONS, check_precision_for_device, precisions_for
from .sharding import DEEPSPEED_KEYS, FSDP_KEYS, sharding_environment

CONFIG_FILE_VARIABLE = "NOTEBOOK_ACCEL_CONFIG_FILE"
_OUR_KEYS_HEADER = ("# notebook_accel launch defaults, written by `notebook-accel config`.\n"
                    "# num_processes is per node. Edit freely; unknown keys are an error.\n")


class _SavedValues:
    def launcher_options(self) -> Dict[str, Any]:
        """The values as ``notebook_launcher`` keyword arguments (``None`` values left out).

        >>> LaunchConfig(num_processes=2, device="cpu").launcher_options()["num_processes"]
        2
        """
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}


# Launch defaults as saved in the YAML file: the options ``plan.options`` marks ``saved``, with the launcher's
# defaults (``None`` means "the launcher decides"). ``num_processes`` is per node.
LaunchConfig = dataclasses.make_dataclass(
    "LaunchConfig", [(option.name, Any, dataclasses.field(default=option.default)) for option in SAVED_OPTIONS],
    bases=(_SavedValues,), namespace={"__module__": __name__,
                                      "__doc__": "Launch defaults as saved in the YAML file (``None``: the "
                                                 "launcher decides)."})


def saved_options(config: Union[bool, str, "os.PathLike[str]", None]) -> Dict[str, Any]:
    """The config file's values (``None`` ones left out), for the options a call did not give (the caller's win,
    even when equal to a default: ``plan.entry_points.resolve_options``). ``config``: ``None``/``False`` (the file
    is ignored: ``{}``), ``True`` (the default file) or a path.

    >>> saved_options(None)
    {}
    """
    if config is None or config is False:
        return {}
    if not isinstance(config, (bool, str, os.PathLike)):
        raise LaunchConfigTypeError(f"config must be True, False, None or a path, got {config!r}")
    return load_config(None if config is True else os.fspath(config)).launcher_options()


def hf_home() -> str:
    """The Hugging Face cache folder, found the way accelerate finds it."""
    default = os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.expanduser(os.environ.get("HF_HOME", default))


def default_config_path() -> str:
    """Where ``notebook-accel config`` writes (``$NOTEBOOK_ACCEL_CONFIG_FILE`` when set)."""
    return os.environ.get(CONFIG_FILE_VARIABLE) or os.path.join(hf_home(), "notebook_accel", "default_config.yaml")


def accelerate_config_path() -> str:
    """accelerate's default config file (``accelerate config`` writes it)."""
    return os.path.join(hf_home(), "accelerate", "default_config.yaml")


def find_config_file() -> Optional[str]:
    """Ours if it exists, else accelerate's if it exists, else ``None``."""
    for path in (default_config_path(), accelerate_config_path()):
        if os.path.isfile(path):
            return path
    return None


def load_config(path: Optional[str] = None) -> LaunchConfig:
    """Read launch defaults from ``path`` (ours or accelerate's format), or from the default file.

    No file at the default places gives the built-in defaults; an explicit ``path`` must exist.

    >>> load_config("/nonexistent.yaml")  # doctest: +SKIP
    LaunchConfigError: config file /nonexistent.yaml does not exist
    """
    import yaml

    if path is None:
        path = find_config_file()
        if path is None:
            return LaunchConfig()
    if not os.path.isfile(path):
        raise LaunchConfigError(f"config file {path} does not exist; write one with `notebook-accel config`")
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as err:
        raise LaunchConfigError(f"cannot read config file {path}: {err}") from err
    if not isinstance(data, dict):
        raise LaunchConfigError(f"config file {path} must hold a mapping of option: value, "
                                f"got {type(data).__name__}")
    if is_accelerate_config(data):
        return from_accelerate(data, path)
    return _from_ours(data, path)


def is_accelerate_config(data: Dict[str, Any]) -> bool:
    """accelerate's files always carry ``compute_environment`` or ``distributed_type``."""
    return "compute_environment" in data or "distributed_type" in data or "num_machines" in data


def _from_ours(data: Dict[str, Any], path: str) -> LaunchConfig:
    known = {field.name: field for field in dataclasses.fields(LaunchConfig)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise LaunchConfigError(f"config file {path}: unknown option(s) {', '.join(unknown)}; "
                                f"known: {', '.join(known)}")
    config = LaunchConfig(**data)
    check_config(config, path)
    return config


def from_accelerate(data: Dict[str, Any], path: str = "accelerate config") -> LaunchConfig:
    """Translate accelerate's ``default_config.yaml`` (``num_processes`` is its total over machines).

    >>> from_accelerate({"distributed_type": "MULTI_CPU", "num_processes": 4, "num_machines": 2,
    ...                  "use_cpu": True, "main_process_ip": "10.0.0.1", "main_process_port": 29500})
    ... # doctest: +NORMALIZE_WHITESPACE
    LaunchConfig(num_processes=2, device='cpu', mixed_precision='no', start_method='auto', fsdp_config=None,
                 deepspeed_config=None, num_nodes=2, node_rank=0, rdzv_backend='static',
                 rdzv_endpoint='10.0.0.1:29500', rdzv_id=None, max_restarts=0)
    """
    distributed = str(data.get("distributed_type") or "NO").upper()
    num_nodes = int(data.get("num_machines") or 1)
    total = data.get("num_processes")
    per_node = None if total in (None, -1) else max(1, int(total) // max(1, num_nodes))
    device = None
    if data.get("use_cpu") or distributed == "MULTI_CPU":
        device = "cpu"
    elif distributed in ("MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM"):
        device = "cuda"
    elif distributed in ("XLA", "TPU"):
        device = "xla"
    endpoint = None
    if data.get("main_process_ip"):
        endpoint = f"{data['main_process_ip']}:{data.get('main_process_port') or 29500}"
    precision = str(data.get("mixed_precision") or "no").lower()
    # its FSDP / DeepSpeed section, minus what only its own launcher uses (deepspeed_multinode_launcher...)
    sections = {"FSDP": ("fsdp_config", FSDP_KEYS), "DEEPSPEED": ("deepspeed_config", DEEPSPEED_KEYS)}
    sharding = {}
    if distributed in sections:
        option, keys = sections[distributed]
        given = data.get(option) or {}
        sharding[option] = {key: value for key, value in given.items() if key in keys} if isinstance(given, dict) \
            else given
    config = LaunchConfig(
        num_processes=per_node, device=device, mixed_precision="no" if precision == "fp8" else precision,
        num_nodes=num_nodes, node_rank=int(data.get("machine_rank") or 0),
        rdzv_backend=str(data.get("rdzv_backend") or "static"), rdzv_endpoint=endpoint,
        max_restarts=int(data.get("max_restarts") or 0), **sharding)
    check_config(config, path)
    return config


def check_config(config: LaunchConfig, where: str) -> None:
    """Types and ranges of every value, named with the file they came from."""
    def fail(name: str, expected: str) -> None:
        raise LaunchConfigError(f"config file {where}: {name} must be {expected}, got {getattr(config, name)!r}")

    if config.num_processes is not None and not _positive_int(config.num_processes):
        fail("num_processes", "a positive integer or null")
    if config.device is not None and config.device not in Device.values():
        fail("device", f"one of {', '.join(Device.values())} or null")
    if config.mixed_precision not in MixedPrecision.values():
        fail("mixed_precision", f"one of {', '.join(MixedPrecision.values())}")
    if config.start_method not in StartMethod.values():
        fail("start_method", f"one of {', '.join(StartMethod.values())}")
    try:  # the launcher's own rule: a saved fp16 on a CPU would make every later launch refuse
        check_precision_for_device(config.mixed_precision, config.device)
    except LaunchConfigError as refused:
        raise LaunchConfigError(f"config file {where}: {refused}") from None
    if not _positive_int(config.num_nodes):
        fail("num_nodes", "a positive integer")
    if config.node_rank is not None and (not isinstance(config.node_rank, int) or isinstance(config.node_rank, bool)
                                        or config.node_rank < 0):
        fail("node_rank", "an integer >= 0 or null")
    if not isinstance(config.max_restarts, int) or isinstance(config.max_restarts, bool) or config.max_restarts < 0:
        fail("max_restarts", "an integer >= 0")
    if not isinstance(config.rdzv_backend, str) or not config.rdzv_backend:
        fail("rdzv_backend", "a rendezvous backend name (static, c10d, etcd, ...)")
    for name in ("rdzv_endpoint", "rdzv_id"):
        if getattr(config, name) is not None and not isinstance(getattr(config, name), str):
            fail(name, "a string or null")
    try:  # the launcher's own check: a saved bad sharding default would make every later launch refuse
        sharding_environment(config.fsdp_config, config.deepspeed_config)
    except LaunchConfigError as refused:
        raise LaunchConfigError(f"config file {where}: {refused}") from None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def save_config(config: LaunchConfig, path: Optional[str] = None) -> str:
    """Write ``config`` as YAML (creating the folder); returns the path written."""
    import yaml

    check_config(config, "to save")
    path = path or default_config_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_OUR_KEYS_HEADER)
        yaml.safe_dump(dataclasses.asdict(config), handle, sort_keys=False)
    return path


def basic_config(mixed_precision: str = "no") -> LaunchConfig:
    """Defaults for this machine: its best device, every device of it (1 process on CPU), one node."""
    from . import devices as environment

    best = environment.available_devices()[0]
    return LaunchConfig(num_processes=1 if best.kind == "cpu" else best.count, device=best.kind,
                        mixed_precision=mixed_precision)


def write_basic_config(mixed_precision: str = "no", save_location: Optional[str] = None,
                       overwrite: bool = False, overwrite_hint: str = "pass overwrite=True",
                       **sharding: Any) -> Union[str, bool]:
    """Write a config for this machine without asking anything (Colab cells cannot answer prompts).

    Like ``accelerate.utils.write_basic_config``: an existing file is kept (returns ``False``) unless
    ``overwrite``; otherwise returns the path written. ``fsdp_config=`` or ``deepspeed_config=`` (accelerate's
    keys) saves a sharding default too.

    >>> write_basic_config(mixed_precision="bf16")  # doctest: +SKIP
    '/root/.cache/huggingface/notebook_accel/default_config.yaml'
    """
    path = save_location or default_config_path()
    if os.path.exists(path) and not overwrite:
        print(f"Configuration already exists at {path}, will not override. "
              f"Run `notebook-accel config` or {overwrite_hint}.")
        return False
    return save_config(dataclasses.replace(basic_config(mixed_precision.lower()), **sharding), path)


def ask_config(ask: Callable[[str], str] = input, say: Callable[[str], None] = print) -> LaunchConfig:
    """The ``notebook-accel config`` questionnaire; Enter keeps the default shown in brackets."""
    from . import devices as environment

    base = basic_config()
    kinds = [info.kind for info in environment.available_devices()]
    say("notebook_accel launch defaults (press Enter to keep the value in brackets)")
    device = _ask_choice(ask, say, "device", kinds, base.device)
    count = environment.describe(device).count
    default_processes = 1 if device == "cpu" else count
    processes = _ask_int(ask, say, f"processes per node (1..{count})", default_processes, 1, count)
    precision = _ask_choice(ask, say, "mixed precision", list(precisions_for(device)), MixedPrecision.NO.value)
    nodes = _ask_int(ask, say, "number of nodes (machines)", 1, 1, 100_000)
    config = LaunchConfig(num_processes=processes, device=device, mixed_precision=precision, num_nodes=nodes)
    if nodes > 1:
        config.node_rank = _ask_int(ask, say, f"rank of this node (0..{nodes - 1})", 0, 0, nodes - 1)
        config.rdzv_backend = _ask_choice(ask, say, "rendezvous backend", list(RendezvousBackend.values()),
                                          RendezvousBackend.STATIC.value)
        while not config.rdzv_endpoint:
            config.rdzv_endpoint = ask("rendezvous endpoint host:port (node 0's address for static): ").strip()
    config.max_restarts = _ask_int(ask, say, "restarts after a failure", 0, 0, 1000)
    _ask_sharding(ask, say, config)
    return config


def _ask_sharding(ask, say, config: LaunchConfig) -> None:
    """FSDP2 or DeepSpeed ZeRO for ``Accelerator()`` in every rank (saved as accelerate's config keys)."""
    how = _ask_choice(ask, say, "shard the model over the ranks", ["no", "fsdp", "deepspeed"], "no")
    if how == "fsdp":
        names = ask("FSDP: class names of the model's blocks to shard one by one, comma-separated "
                    "(e.g. GPT2Block; empty: none) []: ").strip()
        section: Dict[str, Any] = {"fsdp_version": 2}
        if names:
            section.update(fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP", fsdp_transformer_layer_cls_to_wrap=names)
        else:
            size = _ask_int(ask, say, "FSDP: shard each submodule of at least this many parameters (0: the whole "
                                      "model as one unit)", 0, 0, 10**12)
            section["fsdp_auto_wrap_policy"] = "SIZE_BASED_WRAP" if size else "NO_WRAP"
            if size:
                section["fsdp_min_num_params"] = size
        checkpointing = _ask_choice(ask, say, "FSDP: activation checkpointing", ["no", "yes"], "no")
        section["fsdp_activation_checkpointing"] = checkpointing == "yes"
        config.fsdp_config = section
    elif how == "deepspeed":
        stage = _ask_int(ask, say, "DeepSpeed: ZeRO stage (1: optimizer state, 2: + gradients, 3: + parameters)",
                         2, 1, 3)
        offload = _ask_choice(ask, say, "DeepSpeed: offload the optimizer state to", ["none", "cpu", "nvme"], "none")
        config.deepspeed_config = {"zero_stage": stage, "offload_optimizer_device": offload}


def _ask_choice(ask, say, question: str, choices, default: str) -> str:
    while True:
        answer = ask(f"{question} ({'/'.join(choices)}) [{default}]: ").strip() or default
        if answer in choices:
            return answer
        say(f"  please answer one of: {', '.join(choices)}")


def _ask_int(ask, say, question: str, default: int, low: int, high: int) -> int:
    while True:
        answer = ask(f"{question} [{default}]: ").strip() or str(default)
        if answer.isdigit() and low <= int(answer) <= high:
            return int(answer)
        say(f"  please answer a whole number from {low} to {high}")
