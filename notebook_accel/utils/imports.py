"""``accelerate.utils``' ``is_*_available`` and ``is_torch_version``: what this machine has."""
from __future__ import annotations

import importlib.util
import operator
from typing import Callable, Dict

import torch

__all__ = ["is_torch_version", "is_bf16_available", "is_fp16_available", "is_cuda_available", "is_mps_available",
           "is_xpu_available", "is_npu_available", "is_mlu_available", "is_musa_available", "is_sdaa_available",
           "is_hpu_available", "is_neuron_available", "is_rocm_available", "is_torch_xla_available",
           "is_bnb_available", "is_datasets_available", "is_deepspeed_available", "is_mlflow_available",
           "is_pytest_available", "is_schedulefree_available", "is_tensorboard_available", "is_tqdm_available",
           "is_transformers_available", "is_wandb_available", "is_safetensors_available", "is_peft_available",
           "is_torchvision_available", "is_timm_available", "is_comet_ml_available", "is_aim_available",
           "is_clearml_available", "is_dvclive_available", "is_swanlab_available", "is_trackio_available",
           "is_rich_available"]  # fmt: skip

_COMPARE: Dict[str, Callable[[object, object], bool]] = {
    ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<=": operator.le, "<": operator.lt}


def is_torch_version(operation: str, version: str) -> bool:
    """``is_torch_version(">=", "2.0")``: compares the installed torch's base version."""
    from packaging.version import parse

    if operation not in _COMPARE:
        raise ValueError(f"`operation` must be one of {sorted(_COMPARE)}, received {operation}")
    return _COMPARE[operation](parse(parse(torch.__version__).base_version), parse(version))


def _installed(module: str) -> Callable[[], bool]:
    def available() -> bool:
        return importlib.util.find_spec(module) is not None

    available.__name__ = available.__qualname__ = f"is_{module}_available"  # the API reference finds it by name
    return available


is_datasets_available = _installed("datasets")
is_deepspeed_available = _installed("deepspeed")
is_mlflow_available = _installed("mlflow")
is_pytest_available = _installed("pytest")
is_schedulefree_available = _installed("schedulefree")
is_tqdm_available = _installed("tqdm")
is_transformers_available = _installed("transformers")
is_wandb_available = _installed("wandb")
is_safetensors_available = _installed("safetensors")
is_peft_available = _installed("peft")
is_torchvision_available = _installed("torchvision")
is_timm_available = _installed("timm")
is_comet_ml_available = _installed("comet_ml")
is_aim_available = _installed("aim")
is_clearml_available = _installed("clearml")
is_dvclive_available = _installed("dvclive")
is_swanlab_available = _installed("swanlab")
is_trackio_available = _installed("trackio")
is_rich_available = _installed("rich")


def is_bnb_available(min_version: object = None) -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def is_tensorboard_available() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboard", "tensorboardX"))


def is_cuda_available() -> bool:
    return torch.cuda.is_available()


def is_rocm_available() -> bool:
    return torch.version.hip is not None and torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    return torch.backends.mps.is_available()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bf16 works here: on CUDA when the GPU supports it; on the CPU always (as HF says)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    """fp16 mixed precision is offered on CUDA only here (ours refuses it on the CPU)."""
    return torch.cuda.is_available()


# Devices we do not drive (Intel XPU, Ascend NPU, ...): HF code asking gets False and takes its other path.
def is_xpu_available(check_device: bool = False) -> bool:
    return False


def is_npu_available(check_device: bool = False) -> bool:
    return False


def is_mlu_available(check_device: bool = False) -> bool:
    return False


def is_musa_available(check_device: bool = False) -> bool:
    return False


def is_sdaa_available(check_device: bool = False) -> bool:
    return False


def is_neuron_available(check_device: bool = False) -> bool:
    return False


def is_hpu_available(init_hccl: bool = False) -> bool:
    return False
