"""FSDP and DeepSpeed launch defaults (the ``fsdp_config`` / ``deepspeed_config`` options) as the environment
HF accelerate's own launcher sets in every rank.

``accelerate launch`` with an FSDP or DeepSpeed config sets ``ACCELERATE_USE_FSDP`` and ``FSDP_*`` (or
``ACCELERATE_USE_DEEPSPEED`` and ``ACCELERATE_DEEPSPEED_*``) in its ranks; ``accelerate.Accelerator()`` and our
``Accelerator()`` both build their plugin from those variables. The two options take the keys of accelerate's
config file (its ``fsdp_config:`` / ``deepspeed_config:`` sections), so one YAML block means the same in both
files, and code written for either library shards when launched by us. Checked here, before any process starts.

>>> sharding_environment({"fsdp_transformer_layer_cls_to_wrap": ["GPT2Block"]}, None)["FSDP_TRANSFORMER_CLS_TO_WRAP"]
'GPT2Block'
"""
from __future__ import annotations

import numbers
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ..errors import LaunchConfigError

__all__ = ["FSDP_KEYS", "DEEPSPEED_KEYS", "sharding_environment", "check_sharding_for_device"]

_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _flag(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower()
    raise LaunchConfigError(f"{name} must be true or false, got {value!r}")


def _whole(low: int) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise LaunchConfigError(f"{name} must be a whole number >= {low}, got {value!r}")
        return str(int(value))
    return check


def _number(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        raise LaunchConfigError(f"{name} must be a number >= 0, got {value!r}")
    return str(value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise LaunchConfigError(f"{name} must be a string, got {value!r}")
    return value


def _fsdp_version(name: str, value: Any) -> str:
    if str(value) != "2":
        raise LaunchConfigError(f"{name}={value!r}: notebook_accel shards with FSDP2 (fully_shard) only, not the "
                                "legacy FSDP1 wrapper; use fsdp_version: 2")
    return "2"


def _wrap_policy(name: str, value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in _WRAP_POLICIES:
        raise LaunchConfigError(f"{name} must be one of {', '.join(_WRAP_POLICIES)}, got {value!r}")
    return value.upper()


def _class_names(name: str, value: Any) -> str:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise LaunchConfigError(f"{name} must be a class name or a list of them, got {value!r}")
    return ",".join(n.strip() for n in names)  # accelerate's launcher writes a list as "A,B"


def _offload_device(name: str, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in _OFFLOAD_DEVICES:
        raise LaunchConfigError(f"{name} must be one of {', '.join(_OFFLOAD_DEVICES)}, got {value!r}")
    return value.lower()


def _config_file(name: str, value: Any) -> str:
    path = os.path.abspath(os.path.expanduser(_text(name, value)))  # the ranks may run elsewhere than here
    if not os.path.isfile(path):
        raise LaunchConfigError(f"{name}: {value!r} does not exist")
    return path


Rule = Tuple[str, Callable[[str, Any], str]]

# accelerate's fsdp_config key -> (the variable its launcher sets, how the value is checked and written)
FSDP_KEYS: Dict[str, Rule] = {
    "fsdp_version": ("FSDP_VERSION", _fsdp_version),
    "fsdp_auto_wrap_policy": ("FSDP_AUTO_WRAP_POLICY", _wrap_policy),
    "fsdp_transformer_layer_cls_to_wrap": ("FSDP_TRANSFORMER_CLS_TO_WRAP", _class_names),
    "fsdp_min_num_params": ("FSDP_MIN_NUM_PARAMS", _whole(0)),
    "fsdp_reshard_after_forward": ("FSDP_RESHARD_AFTER_FORWARD", _flag),
    "fsdp_offload_params": ("FSDP_OFFLOAD_PARAMS", _flag),
    "fsdp_activation_checkpointing": ("FSDP_ACTIVATION_CHECKPOINTING", _flag),
    "fsdp_state_dict_type": ("FSDP_STATE_DICT_TYPE", _text),
    # read by HF accelerate only (our FSDP2 has no use for them): passed on as its launcher does
    "fsdp_cpu_ram_efficient_loading": ("FSDP_CPU_RAM_EFFICIENT_LOADING", _flag),
    "fsdp_sync_module_states": ("FSDP_SYNC_MODULE_STATES", _flag),
    "fsdp_use_orig_params": ("FSDP_USE_ORIG_PARAMS", _flag),
    "fsdp_forward_prefetch": ("FSDP_FORWARD_PREFETCH", _flag),
    "fsdp_backward_prefetch": ("FSDP_BACKWARD_PREFETCH", _text),
    "fsdp_sharding_strategy": ("FSDP_SHARDING_STRATEGY", _text),
    "fsdp_activation_checkpointing_offload": ("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", _flag),
}

# accelerate's deepspeed_config key -> (variable, check)
DEEPSPEED_KEYS: Dict[str, Rule] = {
    "zero_stage": ("ACCELERATE_DEEPSPEED_ZERO_STAGE", lambda name, value: _stage(name, value)),
    "gradient_accumulation_steps": ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", _whole(1)),
    "gradient_clipping": ("ACCELERATE_GRADIENT_CLIPPING", _number),
    "offload_optimizer_device": ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", _offload_device),
    "offload_param_device": ("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", _offload_device),
    "offload_optimizer_nvme_path": ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", _text),
    "offload_param_nvme_path": ("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", _text),
    "zero3_init_flag": ("ACCELERATE_DEEPSPEED_ZERO3_INIT", _flag),
    "zero3_save_16bit_model": ("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", _flag),
    "deepspeed_config_file": ("ACCELERATE_DEEPSPEED_CONFIG_FILE", _config_file),
}


def _stage(name: str, value: Any) -> str:
    if isinstance(value, bool) or value not in (0, 1, 2, 3):
        raise LaunchConfigError(f"{name} must be 0, 1, 2 or 3 (DeepSpeed ZeRO's stages), got {value!r}")
    return str(value)


def _section(option: str, given: Any, keys: Mapping[str, Rule], prefix: str = "") -> Dict[str, str]:
    if not isinstance(given, Mapping):
        raise LaunchConfigError(f"{option} must be a mapping of accelerate's {option} keys, got {given!r}")
    env: Dict[str, str] = {}
    for key, value in given.items():
        # the plugin's own field names work too: fsdp_config={"transformer_layer_cls_to_wrap": [...]}
        name = key if str(key) in keys or not prefix else f"{prefix}{key}"
        if name not in keys:
            raise LaunchConfigError(f"{option}: unknown key {key!r}; known: {', '.join(keys)}")
        if value is None:
            continue  # accelerate's files write null for "not set"
        variable, check = keys[name]
        env[variable] = check(f"{option}.{key}", value)
    return env


def sharding_environment(fsdp_config: Optional[Mapping[str, Any]],
                         deepspeed_config: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    """The variables every rank gets for these options ({} for neither); a ``LaunchConfigError`` for a bad one.

    >>> sharding_environment(None, {"zero_stage": 3})["ACCELERATE_USE_DEEPSPEED"]
    'true'
    """
    if fsdp_config is not None and deepspeed_config is not None:
        raise LaunchConfigError("fsdp_config and deepspeed_config both shard the model: give one of them")
    if fsdp_config is not None:
        env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}  # accelerate's launcher would default to FSDP1
        env.update(_section("fsdp_config", fsdp_config, FSDP_KEYS, prefix="fsdp_"))
        if "FSDP_AUTO_WRAP_POLICY" not in env:
            # our plugin infers the policy from what is given; accelerate's reads it (default NO_WRAP): say it
            if "FSDP_TRANSFORMER_CLS_TO_WRAP" in env:
                env["FSDP_AUTO_WRAP_POLICY"] = "TRANSFORMER_BASED_WRAP"
            elif int(env.get("FSDP_MIN_NUM_PARAMS", "0")) > 0:
                env["FSDP_AUTO_WRAP_POLICY"] = "SIZE_BASED_WRAP"
        return env
    if deepspeed_config is not None:
        env = {"ACCELERATE_USE_DEEPSPEED": "true"}
        env.update(_section("deepspeed_config", deepspeed_config, DEEPSPEED_KEYS))
        # as accelerate's launcher: which fields came from the launch config (its DeepSpeedPlugin refuses them
        # next to a deepspeed_config_file, which must then hold them)
        env["ACCELERATE_CONFIG_DS_FIELDS"] = ",".join(key for key, value in deepspeed_config.items()
                                                      if value is not None)
        return env
    return {}


def check_sharding_for_device(fsdp_config: Any, deepspeed_config: Any, device: str) -> None:
    """FSDP2 and DeepSpeed shard over a torch.distributed process group: TPU cores here have none."""
    if device == "xla" and (fsdp_config is not None or deepspeed_config is not None):
        which = "fsdp_config" if fsdp_config is not None else "deepspeed_config"
        raise LaunchConfigError(f"{which} with device='xla': FSDP2 and DeepSpeed shard over a torch.distributed "
                                "process group, which TPU cores here do not use; launch without it")
