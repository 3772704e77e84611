"""DeepSpeed ZeRO through the Accelerator: ``Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))``.

ZeRO-1 partitions the optimizer state over the ranks, ZeRO-2 also the gradients, ZeRO-3 also the parameters.
``prepare`` builds DeepSpeed's engine from the user's own torch optimizer and fills every "auto" of the
DeepSpeed config from what the launch knows (the loader's batch size, the Accelerator's accumulation steps
and precision), so no "auto" is left for the user to fix. The training loop stays the same:
``accelerator.backward`` goes through the engine, ``optimizer.step()`` is the engine's step on sync steps.

One process gets the engine too, as with HF accelerate (ZeRO-Offload is how one GPU trains a model bigger than its
memory): a one-rank process group is made for it from an in-process store (``state.one_rank_group``).

``deepspeed`` is an optional dependency, imported only when a plugin is used (``pip install deepspeed``). No
DeepSpeed op is built: none at install (``DS_BUILD_OPS=0``), and on CPU not its shared-memory collective either,
which it would JIT-compile at the first engine (see :func:`_no_shared_memory_op_on_cpu`); the torch optimizer runs.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Union

import torch
from torch.overrides import TorchFunctionMode

from .gradient_state import GradientState
from .optimizer import AcceleratedOptimizer

__all__ = ["DeepSpeedPlugin", "DeepSpeedOptimizer", "build_engine", "filled_config", "is_engine", "engine_state_dict",
           "zero_init"]

_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclasses.dataclass
class DeepSpeedPlugin:
    """DeepSpeed's ZeRO settings (HF accelerate's field names).

    Args:
        hf_ds_config: a DeepSpeed config, as a dict or a JSON file's path; "auto" values are filled in. Fields
            given below override it.
        zero_stage: 0-3 (default: the config's, else 2).
        gradient_accumulation_steps: default: the Accelerator's.
        gradient_clipping: the max gradient norm DeepSpeed clips to inside its step (``clip_grad_norm_`` must
            then ask for the same value: DeepSpeed fixes it when the engine is built). Default: no clipping
            (DeepSpeed's own default, 1.0, would clip a loop that never asked for it).
        offload_optimizer_device: "none", "cpu" or "nvme".
        offload_param_device: "none", "cpu" or "nvme" (ZeRO-3 only).
    """

    # HF's fields, in HF's order (positional use lands on the same field)
    hf_ds_config: Union[Dict[str, Any], str, None] = None
    gradient_accumulation_steps: Optional[int] = None
    gradient_clipping: Optional[float] = None
    zero_stage: Optional[int] = None
    is_train_batch_min: bool = True
    offload_optimizer_device: Optional[str] = None
    offload_param_device: Optional[str] = None
    offload_optimizer_nvme_path: Optional[str] = None
    offload_param_nvme_path: Optional[str] = None
    zero3_init_flag: Optional[bool] = None
    zero3_save_16bit_model: Optional[bool] = None
    transformer_moe_cls_names: Optional[str] = None
    enable_msamp: Optional[bool] = None
    msamp_opt_level: Optional[str] = None

    def __post_init__(self) -> None:
        self._refuse_unoffered_fields()
        if isinstance(self.hf_ds_config, (str, os.PathLike)):
            with open(self.hf_ds_config) as file:
                self.hf_ds_config = json.load(file)
        config: Dict[str, Any] = copy.deepcopy(self.hf_ds_config or {})
        if not isinstance(config, dict):
            raise TypeError(f"hf_ds_config must be a dict or a JSON file's path, not {type(config).__name__}")
        if "optimizer" in config:
            raise ValueError(
                "hf_ds_config has an 'optimizer' section: notebook_accel gives DeepSpeed your own torch optimizer "
                "(prepare(model, optimizer)); remove that section and build the optimizer in your function"
            )
        zero = config.setdefault("zero_optimization", {})
        stage = self.zero_stage if self.zero_stage is not None else zero.get("stage", 2)
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={stage!r}: DeepSpeed ZeRO has stages 0, 1, 2 and 3")
        zero["stage"] = self.zero_stage = stage
        for field, section in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
            device = getattr(self, field)
            if device is None:
                continue
            if device not in _OFFLOAD_DEVICES:
                raise ValueError(f"{field}={device!r}: use one of {', '.join(_OFFLOAD_DEVICES)}")
            if section == "offload_param" and device != "none" and stage != 3:
                raise ValueError(f"offload_param_device={device!r} needs zero_stage=3 (only ZeRO-3 partitions parameters)")
            zero[section] = {"device": device}
            nvme_path = getattr(self, field.replace("_device", "_nvme_path"))
            if nvme_path is not None:
                zero[section]["nvme_path"] = nvme_path
        if self.zero3_save_16bit_model is not None:  # HF's key for it (ours gathers a ZeRO-3 model to save it anyway)
            zero["stage3_gather_16bit_weights_on_model_save"] = self.zero3_save_16bit_model
        if self.gradient_accumulation_steps is not None:
            config["gradient_accumulation_steps"] = self.gradient_accumulation_steps
        elif isinstance(config.get("gradient_accumulation_steps"), int):
            self.gradient_accumulation_steps = config["gradient_accumulation_steps"]
        if self.gradient_clipping is not None:
            config["gradient_clipping"] = self.gradient_clipping
        if self.hf_ds_config is None and stage == 3:
            # sized from the model at prepare (DeepSpeed's own defaults, 500M-element buckets and a 1G-element
            # optimizer step, are made for GPUs with models in the billions: in a notebook they cost a rank more
            # memory during backward and its step than ZeRO-3 saves)
            for key in _SIZED_BY_THE_MODEL:
                zero.setdefault(key, "auto")
        self.hf_ds_config = config

    @property
    def config(self) -> Dict[str, Any]:
        return self.hf_ds_config  # type: ignore[return-value]

    @property
    def deepspeed_config(self) -> Dict[str, Any]:
        """The filled DeepSpeed config (HF's name)."""
        return self.hf_ds_config  # type: ignore[return-value]

    def _refuse_unoffered_fields(self) -> None:
        from .absent import ABSENT_PARAMETERS, refuse_name

        if not self.is_train_batch_min:
            refuse_name("DeepSpeedPlugin(is_train_batch_min=False)", "the train_batch_size comes from the training "
                        "DataLoader prepared with the model; leave is_train_batch_min at True")  # fmt: skip
        if self.transformer_moe_cls_names:
            refuse_name("DeepSpeedPlugin(transformer_moe_cls_names=...)", "DeepSpeed's MoE leaf modules are not set "
                        "here; use HF accelerate's Accelerator for mixture-of-experts models under ZeRO-3")  # fmt: skip
        if self.enable_msamp or self.msamp_opt_level:
            refuse_name("DeepSpeedPlugin(enable_msamp=...)", ABSENT_PARAMETERS["mixed_precision='fp8'"])

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None) -> Optional["DeepSpeedPlugin"]:
        """The plugin HF accelerate's launcher describes (``ACCELERATE_USE_DEEPSPEED``...), or None."""
        environ = os.environ if environ is None else environ
        if not _flag(environ, "ACCELERATE_USE_DEEPSPEED"):
            return None

        def number(name: str, kind: Any) -> Any:
            value = environ.get(name, "").strip()
            return kind(value) if value and value != "auto" else None

        return cls(
            hf_ds_config=environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") or None,
            zero_stage=number("ACCELERATE_DEEPSPEED_ZERO_STAGE", int),
            gradient_accumulation_steps=number("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", int),
            gradient_clipping=number("ACCELERATE_GRADIENT_CLIPPING", float),
            offload_optimizer_device=environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE") or None,
            offload_param_device=environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE") or None,
        )


def import_deepspeed(on_cpu: bool = False) -> Any:
    """``deepspeed``, or an ImportError that says how to install it. ``on_cpu``: this rank trains on the CPU, which
    DeepSpeed is told (``DS_ACCELERATOR=cpu``, unless set already) before its first import: it would otherwise pick
    CUDA wherever a GPU is visible (``Accelerator(cpu=True)`` on a GPU machine), and without one warn from every
    rank that it is "Setting accelerator to CPU" as if that were a guess."""
    if on_cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(
            "deepspeed_plugin needs DeepSpeed: pip install deepspeed (on a machine without CUDA, "
            "DS_BUILD_OPS=0 pip install deepspeed: no ops are built and your torch optimizer runs)"
        ) from error
    return deepspeed


def _leftover_autos(tree: Any, path: str = "") -> List[str]:
    if isinstance(tree, dict):
        return [found for key, value in tree.items() for found in _leftover_autos(value, f"{path}.{key}".lstrip("."))]
    return [path] if tree == "auto" else []


# ZeRO-3's sizes that HF accelerate fills from the model's hidden size h where the config says "auto"
# (sub_group_size too, here: the optimizer then steps 4·h² elements at a time, not a rank's whole partition)
_SIZED_BY_THE_MODEL = {
    "reduce_bucket_size": lambda hidden: hidden * hidden,
    "stage3_prefetch_bucket_size": lambda hidden: int(0.9 * hidden * hidden),
    "sub_group_size": lambda hidden: 4 * hidden * hidden,
    # How many gathered parameters stay after their module ran (DeepSpeed's defaults, 1G each, keep a model of
    # up to a billion parameters gathered from the forward to its backward: no ZeRO-3 saving for smaller ones).
    "stage3_max_live_parameters": lambda hidden: 4 * hidden * hidden,
    "stage3_max_reuse_distance": lambda hidden: 4 * hidden * hidden,
}
_ALSO_HF_AUTO = {"stage3_param_persistence_threshold": lambda hidden: 10 * hidden}


def hidden_size(model: torch.nn.Module) -> Optional[int]:
    """The model's width: a transformers model's ``config.hidden_size``, else the largest of the smaller side of
    its matrices (a Transformer's d_model); None without matrices."""
    given = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(given, int):
        return given
    sides = [min(getattr(param, "ds_shape", param.shape)[-2:]) for param in model.parameters()
             if len(getattr(param, "ds_shape", param.shape)) >= 2]  # fmt: skip
    return max(sides) if sides else None


def filled_config(
    plugin: DeepSpeedPlugin, *, micro_batch: Optional[int], accumulation: int, world: int, mixed_precision: str,
    model: Optional[torch.nn.Module] = None,
) -> Dict[str, Any]:
    """The plugin's config with every "auto" (and every missing size) filled from the launch and the ``model``;
    refuses leftovers."""
    config = copy.deepcopy(plugin.config)
    zero = config.get("zero_optimization", {})
    hidden = hidden_size(model) if model is not None else None
    for key, size in {**_SIZED_BY_THE_MODEL, **_ALSO_HF_AUTO}.items():
        if zero.get(key) == "auto" and hidden is not None:
            zero[key] = size(hidden)

    def fill(key: str, value: Any) -> None:
        if config.get(key, "auto") == "auto" and value is not None:
            config[key] = value

    fill("train_micro_batch_size_per_gpu", micro_batch)
    fill("gradient_accumulation_steps", accumulation)
    if isinstance(config.get("train_micro_batch_size_per_gpu"), int):
        fill("train_batch_size", config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * world)
    if config.get("gradient_clipping", "auto") == "auto":
        # DeepSpeed's own default clips at 1.0, which a plain loop never did: clip only when asked
        config["gradient_clipping"] = 0.0
    for precision in ("bf16", "fp16"):
        section = config.setdefault(precision, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = mixed_precision == precision
    for section in ("zero_optimization", "optimizer", "scheduler"):
        for key, value in list(config.get(section, {}).items()):
            if value == "auto" and section == "zero_optimization":
                del config[section][key]  # DeepSpeed's own default (bucket sizes...)
    config["zero_allow_untested_optimizer"] = True  # the user's torch optimizer is the point
    if config["zero_optimization"].get("offload_optimizer", {}).get("device", "none") != "none":
        # DeepSpeed refuses a torch optimizer with optimizer offload unless told (it would rather have its own
        # DeepSpeedCPUAdam, whose ops need building): the user's optimizer, stepped on the CPU, is what is asked
        config.setdefault("zero_force_ds_cpu_optimizer", False)
    config.setdefault("steps_per_print", 10**9)  # DeepSpeed's own progress lines would fill the cell
    leftovers = _leftover_autos(config)
    if "train_micro_batch_size_per_gpu" in leftovers or "train_micro_batch_size_per_gpu" not in config:
        raise ValueError(
            "DeepSpeed needs the per-rank batch size: prepare the DataLoader in the same prepare() call as the "
            "model, or set train_micro_batch_size_per_gpu in hf_ds_config"
        )
    if leftovers:
        raise ValueError(f"hf_ds_config still has 'auto' at {', '.join(leftovers)}: give those values")
    if config["gradient_accumulation_steps"] != accumulation:
        raise ValueError(
            f"the DeepSpeed config's gradient_accumulation_steps={config['gradient_accumulation_steps']} differs from "
            f"the Accelerator's {accumulation}: give it in one place"
        )
    return config


def is_engine(model: Any) -> bool:
    """True for a DeepSpeed engine (without importing deepspeed where it was never used)."""
    return type(model).__name__ == "DeepSpeedEngine" and type(model).__module__.startswith("deepspeed")


def _no_shared_memory_op_on_cpu(deepspeed: Any) -> None:
    """Keep DeepSpeed from compiling its CPU collective op: training's collectives are torch's own (gloo).

    The first DeepSpeed engine of a CPU process creates DeepSpeed's torch comm backend, which JIT-compiles
    ``deepspeed_shm_comm`` (ninja and g++, 30 s to minutes, a compiler of several GiB as the rank's child) into
    ``~/.cache/torch_extensions``, shared by every environment. The op serves only ``inference_all_reduce``
    (DeepSpeed inference's tensor parallelism), which falls back to ``torch.distributed.all_reduce`` without it;
    ZeRO's collectives go through torch.distributed either way. DeepSpeed builds it only when its table of
    compatible ops (``deepspeed.ops.__compatible_ops__``, probed once and kept in the module so edits persist)
    says so: marking the op not compatible there is the narrowest switch it offers (no variable does). Only the
    CPU accelerator has the op; elsewhere the table is left unprobed.
    """
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _group_even_for_one_rank(deepspeed: Any) -> None:
    """DeepSpeed's engine and ``zero.Init`` talk through torch.distributed even alone: a one-rank group when the
    launch made none (one process), on DeepSpeed's device (nccl on a GPU, gloo on the CPU)."""
    from deepspeed.accelerator import get_accelerator

    from .state import one_rank_group

    if one_rank_group(torch.device("cuda" if get_accelerator().device_name() == "cuda" else "cpu")):
        # what deepspeed.init_distributed would set for a process started without a launcher (the engine asks
        # for LOCAL_RANK); a launched rank has them all already
        for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
            os.environ.setdefault(name, value)


def zero_init(plugin: DeepSpeedPlugin, *, accumulation: int, world: int, mixed_precision: str) -> "ZeroInit":
    """``deepspeed.zero.Init`` with the plugin's config (see :class:`ZeroInit`). The batch size is not known yet,
    and does not matter here."""
    deepspeed = import_deepspeed()
    _group_even_for_one_rank(deepspeed)
    _no_shared_memory_op_on_cpu(deepspeed)  # zero.Init starts DeepSpeed's comm backend, which would build it
    _quiet_deprecated_collectives()
    config = filled_config(plugin, micro_batch=1, accumulation=accumulation, world=world,
                           mixed_precision=mixed_precision)  # fmt: skip
    config.pop("train_batch_size")  # checked against DeepSpeed's world size, which is 1 until zero.Init starts
    return ZeroInit(deepspeed, config)


class ZeroInit:
    """``deepspeed.zero.Init``: every module's parameters are partitioned over the ranks as soon as the module is
    built (each rank builds them, then keeps its partition of rank 0's values), in the dtype ZeRO-3 trains with.

    Three changes to DeepSpeed's defaults keep the model the same as one built outside the block (the same
    weights from the same random state). DeepSpeed's memory-efficient ``F.linear``, which would replace torch's
    for the rest of the process, is left off (the engine does not need it). ``copy.deepcopy`` of a partitioned
    parameter — ``nn.TransformerEncoder`` clones its layer so, after the layer was built and partitioned — would
    copy the empty local tensor and lose the value: here the copy gathers the parameter (one at a time) and is
    partitioned in its turn. And a ``torch.nn.init`` function called on a submodule's partitioned parameter by its
    parent (``nn.MultiheadAttention`` zeroes its ``out_proj.bias`` so) would write nothing: here it runs on the
    gathered parameter and rank 0's result is partitioned, as DeepSpeed does for ``Module.apply`` — so does any
    in-place write to the parameter itself (``child.bias.zero_()``). Writes through ``.data`` to an already
    partitioned parameter (``child.weight.data.normal_()`` in a parent's ``__init__``, outside ``apply``) are still
    lost, as with DeepSpeed's own ``zero.Init``.
    """

    def __init__(self, deepspeed: Any, config: Dict[str, Any]) -> None:
        from .memory import release_freed_memory

        self._deepspeed = deepspeed
        self._config = config
        self._transformers: Any = None
        self._init = deepspeed.zero.Init(config_dict_or_path=config, mem_efficient_linear=False)
        partition = self._init._post_init_method

        def partition_then_trim(module: torch.nn.Module) -> None:
            partition(module)  # the module's whole parameters were just freed: see release_freed_memory
            if sum(getattr(param, "ds_numel", 0) for param in module.parameters(recurse=False)) >= 1 << 18:
                release_freed_memory()

        self._init._post_init_method = partition_then_trim
        self._deepcopy: Any = None
        self._initialisers: Dict[str, Any] = {}
        self._writes = _GatheredWrites(deepspeed)

    def __enter__(self) -> "ZeroInit":
        from .sharded_init import init_functions

        self._transformers = _transformers_sees_zero3(self._config)
        self._init.__enter__()
        self._deepcopy = torch.nn.Parameter.__deepcopy__
        torch.nn.Parameter.__deepcopy__ = self._copy_of_partitioned  # type: ignore[method-assign]
        self._initialisers = init_functions()
        for name, function in self._initialisers.items():
            setattr(torch.nn.init, name, self._gathering(function))
        self._writes.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        self._transformers = None  # from_pretrained outside the block loads as usual again
        self._writes.__exit__(*exc)
        for name, function in self._initialisers.items():
            setattr(torch.nn.init, name, function)
        torch.nn.Parameter.__deepcopy__ = self._deepcopy  # type: ignore[method-assign]
        return self._init.__exit__(*exc)

    def _gathering(self, initialise: Any) -> Any:
        writes = self._writes

        @functools.wraps(initialise)
        def on_the_whole_parameter(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if not writes.is_partitioned(tensor):
                return initialise(tensor, *args, **kwargs)
            with writes.gathered([tensor], modifier_rank=0):  # every rank draws the same: random states move alike
                initialise(tensor, *args, **kwargs)
            return tensor

        return on_the_whole_parameter

    @property
    def _copy_of_partitioned(self) -> Any:
        zero_init, original, gathered = self._init, self._deepcopy, self._deepspeed.zero.GatheredParameters

        def deepcopy(param: torch.nn.Parameter, memo: Dict[int, Any]) -> torch.nn.Parameter:
            if not hasattr(param, "ds_id"):
                return original(param, memo)
            if id(param) not in memo:  # every rank copies the same parameters in the same order: collectives align
                with gathered([param]):
                    copy = torch.nn.Parameter(param.data.clone(), requires_grad=param.requires_grad)
                zero_init._zero_init_param(copy)
                memo[id(param)] = copy
            return memo[id(param)]

        return deepcopy


def _transformers_sees_zero3(config: Dict[str, Any]) -> Any:
    """Where transformers is in use (imported), tell it ZeRO-3 is on, as HF accelerate's ``zero3_init_flag`` does:
    ``from_pretrained`` inside the block then loads each weight into its partitioned parameter (gathered one module
    at a time) instead of into the empty local tensors. transformers keeps only a weak reference: the returned
    object must be kept alive for as long as it should see it."""
    import sys

    if "transformers" not in sys.modules:
        return None
    try:
        from transformers.integrations import HfDeepSpeedConfig
    except ImportError:
        return None
    return HfDeepSpeedConfig(config)


class _GatheredWrites(TorchFunctionMode):
    """In-place writes to a partitioned parameter (a torch.nn.init function that dispatches, ``zero_``, ``fill_``,
    ``param[i] = x``...) run on the gathered parameter; rank 0's result is partitioned again."""

    def __init__(self, deepspeed: Any) -> None:
        super().__init__()
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self.gathered = deepspeed.zero.GatheredParameters
        self._partitioned = ZeroParamStatus.NOT_AVAILABLE

    def is_partitioned(self, tensor: Any) -> bool:
        return getattr(tensor, "ds_status", None) == self._partitioned

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        is_init = getattr(func, "__module__", None) == "torch.nn.init"
        target = kwargs["tensor"] if is_init and "tensor" in kwargs else (args[0] if args else None)
        writes = is_init or name == "__setitem__" or (name.endswith("_") and not name.startswith("_")
                                                      and name not in ("requires_grad_", "share_memory_"))
        if writes and self.is_partitioned(target):
            with self.gathered([target], modifier_rank=0):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def _quiet_deprecated_collectives() -> None:
    """DeepSpeed calls collectives torch has deprecated (``all_gather_into_tensor``), and torch says so in every
    rank: a warning about DeepSpeed's code the user can do nothing about, so it is not shown — from ``zero.Init``
    on (its gathers while a model is built: big_models.ipynb printed it once per rank) as from the engine's."""
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)


def build_engine(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: Dict[str, Any]) -> Any:
    deepspeed = import_deepspeed()
    _group_even_for_one_rank(deepspeed)
    _no_shared_memory_op_on_cpu(deepspeed)
    _quiet_deprecated_collectives()
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    _share_fp32_partitions(engine.optimizer)
    return engine


def _share_fp32_partitions(optimizer: Any) -> int:
    """Under ZeRO-3, let the optimizer step the parameters' own fp32 partitions instead of a copy of them; how
    many flat groups now share (0 where anything differs from the plain case).

    ZeRO-3 keeps a "master" fp32 copy of this rank's partition for the optimizer, beside the partition the
    parameters use, and copies it back after each step. When the parameters are fp32 already, DeepSpeed means to
    use the partition itself (``_create_fp32_partitions``: "we don't need another copy of the weights"), but it
    compares a ``torch.device`` with its device's name, a string, which is never equal: every rank holds its
    parameters twice (bench_sharded's 100M model: 192 MiB more per rank, a fifth of what it holds). The copy is
    dropped here under exactly DeepSpeed's own condition (same dtype, same device, nothing offloaded or
    swapped); the tensor the optimizer holds stays the same object, now over the partition's storage, so its
    param_groups and state keys are unchanged, and the copy back after each step copies onto itself."""
    flats = getattr(optimizer, "fp16_partitioned_groups_flat", None)
    masters = getattr(optimizer, "fp32_partitioned_groups_flat", None)
    if not flats or not masters or len(flats) != len(masters):
        return 0  # not ZeRO-3, or a DeepSpeed laid out otherwise: leave it
    if getattr(optimizer, "offload_optimizer", True) or getattr(optimizer, "offload_param", True) \
            or getattr(optimizer, "swap_optimizer", True):
        return 0
    shared = 0
    for flat, master in zip(flats, masters):
        if flat is None or flat is master or flat.dtype != master.dtype or flat.device != master.device \
                or flat.numel() != master.numel() or master.grad is not None:
            continue
        with torch.no_grad():
            if not torch.equal(flat, master):
                continue  # not a plain copy of the partition: DeepSpeed did something else with it
        master.data = flat.data
        shared += 1
    return shared


def engine_state_dict(engine: Any) -> Dict[str, torch.Tensor]:
    """Full weights: gathered on rank 0 under ZeRO-3 (the other ranks get an empty dict; call it on every rank),
    this rank's whole module otherwise (ZeRO-1/2 keep every parameter on every rank)."""
    if engine.zero_optimization_partition_weights():
        gathered = engine._zero3_consolidated_16bit_state_dict()
        return {} if gathered is None else {name: value.cpu() for name, value in gathered.items()}
    # a copy (.cpu() of a CPU tensor is the tensor itself): what comes back must not move with training
    return {name: value.detach().cpu().clone() for name, value in engine.module.state_dict().items()}


class DeepSpeedOptimizer(AcceleratedOptimizer):
    """The optimizer ``prepare`` returns under DeepSpeed: ``step()`` is the engine's step on sync steps (it clips,
    steps, zeroes the gradients and updates the loss scale); ``zero_grad()`` has nothing left to do.

    ``optimizer`` stays the user's torch optimizer (DeepSpeed steps it and reads its param_groups' learning
    rates), so LR schedulers built on it keep working."""

    def __init__(self, optimizer: torch.optim.Optimizer, engine: Any, gradient_state: GradientState) -> None:
        super().__init__(optimizer, gradient_state)
        self.engine = engine

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # the engine's step zeroed them

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("optimizer.step(closure) is not supported under DeepSpeed")
        self._step_was_skipped = False
        if self.gradient_state.sync_gradients:
            self.engine.step()
            self._step_was_skipped = bool(getattr(self.engine, "skipped_steps", 0) > self._skipped_before)
            self._skipped_before = getattr(self.engine, "skipped_steps", 0)
            self._first_step_done()

    _skipped_before = 0

    def state_dict(self) -> Dict[str, Any]:
        return self.engine.optimizer.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.engine.optimizer.load_state_dict(state_dict)
