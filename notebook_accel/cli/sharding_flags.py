"""``--use_fsdp`` / ``--use_deepspeed`` and their settings, spelled as for ``accelerate launch``, for
``notebook-accel launch`` and ``notebook-accel config default``. They become the ``fsdp_config`` /
``deepspeed_config`` launcher options (accelerate's config keys; ``plan.sharding`` turns them into the
variables every rank gets)."""
from __future__ import annotations

import argparse
from typing import Any, Dict, Optional

from ..errors import LaunchConfigError

# flag dest -> accelerate's config key, per section
_FSDP_FLAGS = {"fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
               "fsdp_min_num_params": "fsdp_min_num_params",
               "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
               "fsdp_reshard_after_forward": "fsdp_reshard_after_forward"}
_DEEPSPEED_FLAGS = {"zero_stage": "zero_stage", "offload_optimizer_device": "offload_optimizer_device",
                    "offload_param_device": "offload_param_device", "deepspeed_config_file": "deepspeed_config_file",
                    "gradient_clipping": "gradient_clipping"}


def _true_false(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError("true or false")
    return text.lower() == "true"


def add_sharding_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sharding: FSDP2 or DeepSpeed ZeRO for Accelerator() in every rank "
                                      "(accelerate launch's spellings; a setting implies its --use_ flag)")
    add = group.add_argument
    add("--use_fsdp", "--use-fsdp", action="store_true", help="shard with FSDP2")
    add("--fsdp_transformer_layer_cls_to_wrap", metavar="CLASS[,CLASS]", default=None,
        help="the model's block classes, each sharded on its own")
    add("--fsdp_min_num_params", type=int, default=None, help="or: each submodule of at least this many parameters")
    add("--fsdp_activation_checkpointing", type=_true_false, default=None, metavar="true|false")
    add("--fsdp_reshard_after_forward", type=_true_false, default=None, metavar="true|false")
    add("--use_deepspeed", "--use-deepspeed", action="store_true", help="train with DeepSpeed ZeRO")
    add("--zero_stage", type=int, choices=(0, 1, 2, 3), default=None)
    add("--offload_optimizer_device", choices=("none", "cpu", "nvme"), default=None)
    add("--offload_param_device", choices=("none", "cpu", "nvme"), default=None)
    add("--gradient_clipping", type=float, default=None)
    add("--deepspeed_config_file", default=None, metavar="PATH")


def sharding_from_flags(options: argparse.Namespace, fsdp_config: Optional[Dict[str, Any]] = None,
                        deepspeed_config: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``{"fsdp_config": ..., "deepspeed_config": ...}`` when a flag was given (its settings over the saved
    section's), else ``{}`` (the saved defaults stand)."""
    fsdp = {key: getattr(options, dest) for dest, key in _FSDP_FLAGS.items() if getattr(options, dest) is not None}
    zero = {key: getattr(options, dest) for dest, key in _DEEPSPEED_FLAGS.items()
            if getattr(options, dest) is not None}
    use_fsdp, use_deepspeed = options.use_fsdp or bool(fsdp), options.use_deepspeed or bool(zero)
    if use_fsdp and use_deepspeed:
        raise LaunchConfigError("--use_fsdp and --use_deepspeed (or their settings) both shard the model: give one")
    if use_fsdp:
        return {"fsdp_config": {**(fsdp_config or {}), **fsdp}, "deepspeed_config": None}
    if use_deepspeed:
        return {"deepspeed_config": {**(deepspeed_config or {}), **zero}, "fsdp_config": None}
    return {}
