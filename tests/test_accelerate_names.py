"""HF accelerate's names on ours, compared mechanically with the installed accelerate 1.x (the test extra).

Two checks, both in pytest's own process:

- **import paths**: every ``from accelerate... import X`` that HF user code reaches — HF's top level, the modules
  its docs, ``examples/`` and Transformers' ``no_trainer`` scripts import from, and every import of HF's own test
  scripts (``accelerate/test_utils/scripts``, read with ``ast`` from the installed package) — has its twin under
  ``notebook_accel``, or is listed in ``NOT_OURS`` with the reason.
- **signatures**: every function, class and ``Accelerator`` / state / optimizer member we share with HF takes HF's
  parameters by the same names, kinds, positions and defaults (``inspect.signature``). Ours may add parameters
  after them (HF code never passes more positional arguments than HF takes). Each accepted difference is in ``SIGNATURE_EXCEPTIONS`` with the reason;
  a new difference fails, and so does an exception that is no longer one.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import torch

accelerate = pytest.importorskip("accelerate")

import notebook_accel  # noqa: E402
from notebook_accel.accelerator.absent import ABSENT_MEMBERS  # noqa: E402
from notebook_accel.big_modeling import REFUSED  # noqa: E402

# ------------------------------------------------------------------------------------------------ import paths
# HF modules user code imports from, beyond the top level and the test scripts (HF's docs, examples/by_feature,
# nlp_example.py / cv_example.py, Transformers' run_*_no_trainer.py)
USER_IMPORTS: List[Tuple[str, str]] = [
    ("accelerate.logging", "get_logger"),
    ("accelerate.local_sgd", "LocalSGD"),
    ("accelerate.state", "PartialState"),
    ("accelerate.state", "AcceleratorState"),
    ("accelerate.state", "GradientState"),
    ("accelerate.data_loader", "skip_first_batches"),
    ("accelerate.data_loader", "prepare_data_loader"),
    ("accelerate.data_loader", "DataLoaderShard"),
    ("accelerate.tracking", "GeneralTracker"),
    ("accelerate.optimizer", "AcceleratedOptimizer"),
    ("accelerate.scheduler", "AcceleratedScheduler"),
    ("accelerate.big_modeling", "init_empty_weights"),
    ("accelerate.big_modeling", "init_on_device"),
    ("accelerate.launchers", "debug_launcher"),
    *(("accelerate.utils", name) for name in (
        "set_seed", "gather_object", "broadcast_object_list", "find_executable_batch_size", "send_to_device",
        "gather", "reduce", "pad_across_processes", "wait_for_everyone", "broadcast", "release_memory",
        "patch_environment", "extract_model_from_parallel", "recursively_apply", "DistributedDataParallelKwargs",
        "GradScalerKwargs", "InitProcessGroupKwargs", "AutocastKwargs", "ProfileKwargs", "KwargsHandler",
        "GradientAccumulationPlugin", "DataLoaderConfiguration", "ProjectConfiguration", "TorchDynamoPlugin",
        "DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "DistributedType", "PrecisionType", "LoggerType",
        "RNGType", "DynamoBackend", "DDPCommunicationHookType", "write_basic_config", "is_tensorboard_available",
        "is_wandb_available", "is_mlflow_available", "DummyOptim", "DummyScheduler", "tqdm", "is_torch_version",
        "WEIGHTS_NAME", "SAFE_WEIGHTS_NAME", "get_max_memory", "merge_fsdp_weights", "synchronize_rng_states",
        "is_npu_available", "is_xpu_available", "is_schedulefree_available", "is_transformers_available",
        "is_deepspeed_available", "concatenate", "find_batch_size", "listify", "PartialState", "AcceleratorState",
        "load_checkpoint_and_dispatch", "infer_auto_device_map", "dispatch_model", "cpu_offload")),
]  # fmt: skip

# HF's paths that have no twin here, each with the reason (user code in HF's examples does not reach them on a
# path ours offers: the alternative is in the reason)
NOT_OURS: Dict[Tuple[str, str], str] = {
    # HF's top-level submodules that are HF's machinery, not user API
    ("accelerate", "commands"): "HF's `accelerate` CLI: ours is `python -m notebook_accel` (launch, config, env)",
    ("accelerate", "hooks"): "big-model inference hooks (HF's): big-model inference is refused (big_modeling)",
    ("accelerate", "inference"): "pipeline-parallel inference (prepare_pippy, refused at the top level)",
    ("accelerate", "checkpointing"): "HF's internal save/load helpers: use Accelerator.save_state / load_state",
    ("accelerate", "parallelism_config"): "ParallelismConfig (refused at the top level): no device meshes here",
    ("accelerate", "memory_utils"): "a deprecated alias of accelerate.utils.memory: use find_executable_batch_size",
    # HF's test-suite helpers, imported by its test scripts (the harness keeps HF's for these)
    ("accelerate.test_utils", "*"): "HF's test helpers (RegressionModel, assert_exception...): not user API",
    ("accelerate.commands.merge", "*"): "HF's `accelerate merge-weights` CLI: call utils.merge_fsdp_weights",
    ("accelerate.utils", "save_fsdp_model"): "HF's FSDP1 saving helper: use Accelerator.save_state / save_model",
}


def hf_test_script_imports() -> Iterator[Tuple[str, str]]:
    """Every ``from accelerate... import name`` in HF's installed test scripts."""
    scripts = os.path.join(os.path.dirname(accelerate.__file__), "test_utils", "scripts")
    for file in sorted(os.listdir(scripts)):
        if file.endswith(".py"):
            with open(os.path.join(scripts, file)) as handle:
                tree = ast.parse(handle.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accelerate"):
                    for alias in node.names:
                        yield node.module, alias.name


def hf_import_paths() -> List[Tuple[str, str]]:
    top_level = [("accelerate", name) for name in dir(accelerate) if not name.startswith("_")]
    return sorted(set(top_level) | set(USER_IMPORTS) | set(hf_test_script_imports()))


def not_ours(module: str, name: str) -> bool:
    return (module, name) in NOT_OURS or (module, "*") in NOT_OURS or any(
        module.startswith(prefix + ".") for prefix, star in NOT_OURS if star == "*")  # fmt: skip


def ours(module: str, name: str) -> Any:
    """``from <module, accelerate -> notebook_accel> import name``, as Python does it (a submodule counts)."""
    our_module = importlib.import_module("notebook_accel" + module[len("accelerate"):])
    if hasattr(our_module, name):
        return getattr(our_module, name)
    return importlib.import_module(f"{our_module.__name__}.{name}")


def test_every_import_path_hf_code_reaches_is_ours_or_listed():
    missing = []
    for module, name in hf_import_paths():
        if not_ours(module, name):
            continue
        try:
            ours(module, name)
        except (ImportError, AttributeError) as error:
            missing.append(f"from {module} import {name} ({error})")
    assert not missing, "HF import paths with no twin in notebook_accel (add it, or list it in NOT_OURS):\n" + \
        "\n".join(missing)


def test_the_not_ours_list_names_only_hf_paths():
    for module, name in NOT_OURS:
        hf_module = importlib.import_module(module)
        assert name == "*" or hasattr(hf_module, name) or importlib.util.find_spec(f"{module}.{name}"), \
            f"{module}.{name} is not HF's: remove it from NOT_OURS"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_big_model_entry_point_is_refused_by_name_pointing_to_hf(name):
    with pytest.raises(NotImplementedError, match=rf"{name} .*HF accelerate's big-model inference.*from accelerate "
                                                  rf"import {name}"):  # fmt: skip
        getattr(notebook_accel, name)(object())


# ------------------------------------------------------------------------------------------------- signatures
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _same_default(theirs: Any, mine: Any) -> bool:
    if theirs is mine:
        return True
    try:
        if bool(theirs == mine):
            return True
    except Exception:  # noqa: BLE001 - e.g. tensors: compared by repr below
        pass
    return repr(theirs) == repr(mine) or str(getattr(theirs, "value", theirs)) == str(getattr(mine, "value", mine))


def signature_difference(theirs: Any, mine: Any) -> Optional[str]:
    """None when ``mine`` takes HF's parameters as HF's ``theirs`` does (names, kinds, order, defaults); else what
    differs. Ours may add parameters after HF's (any kind), ``*args`` / ``**kwargs``."""
    try:
        hf_sig, our_sig = inspect.signature(theirs), inspect.signature(mine)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: nothing to compare
    hf_params = [p for p in hf_sig.parameters.values() if p.name != "self"]
    our_params = [p for p in our_sig.parameters.values() if p.name != "self"]
    if all(p.kind in _VARIADIC for p in hf_params):
        return None  # HF's takes anything (a decorated wrapper): ours says more, nothing to compare
    problems = []
    our_kinds = {p.kind for p in our_params}
    for index, param in enumerate(hf_params):
        if param.kind in _VARIADIC:
            if param.kind not in our_kinds:
                problems.append(f"no {'*args' if param.kind == param.VAR_POSITIONAL else '**kwargs'}")
            continue
        mine_here = our_params[index] if index < len(our_params) else None
        if param.kind == param.KEYWORD_ONLY:
            mine_here = next((p for p in our_params if p.name == param.name), None)
        if mine_here is None or mine_here.name != param.name:
            problems.append(f"parameter {index} is {param.name!r} on HF, "
                            f"{mine_here.name if mine_here else 'missing'!r} on ours")  # fmt: skip
            break
        if mine_here.kind != param.kind:
            problems.append(f"{param.name}: {param.kind.description} on HF, {mine_here.kind.description} on ours")
        elif not _same_default(param.default, mine_here.default):
            problems.append(f"{param.name}: default {param.default!r} on HF, {mine_here.default!r} on ours")
    # ours may go on after HF's parameters (HF code never passes more positional arguments than HF takes)
    return "; ".join(problems) or None


def _callable_of(obj: Any) -> Any:
    """What to compare: a function itself, a class's constructor (a dataclass's generated one too)."""
    if inspect.isclass(obj):
        import enum

        return None if issubclass(obj, enum.Enum) else obj
    return obj if callable(obj) else None


def _public_methods(cls: Any) -> Iterator[Tuple[str, Any]]:
    for name in dir(cls):
        if not name.startswith("_") or name in ("_reset_state",):
            member = inspect.getattr_static(cls, name)
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member):
                yield name, member


# HF classes whose members user code calls; (HF's, ours)
def _member_classes() -> Dict[str, Tuple[Any, Any]]:
    import accelerate.local_sgd
    import accelerate.logging
    import accelerate.optimizer
    import accelerate.scheduler
    import accelerate.state

    import notebook_accel.accelerator as ours_accelerator
    import notebook_accel.local_sgd
    import notebook_accel.logging
    import notebook_accel.state

    return {
        "Accelerator": (accelerate.Accelerator, notebook_accel.Accelerator),
        "PartialState": (accelerate.state.PartialState, notebook_accel.state.PartialState),
        "AcceleratorState": (accelerate.state.AcceleratorState, notebook_accel.state.AcceleratorState),
        "GradientState": (accelerate.state.GradientState, notebook_accel.state.GradientState),
        "AcceleratedOptimizer": (accelerate.optimizer.AcceleratedOptimizer, ours_accelerator.AcceleratedOptimizer),
        "AcceleratedScheduler": (accelerate.scheduler.AcceleratedScheduler, ours_accelerator.AcceleratedScheduler),
        "LocalSGD": (accelerate.local_sgd.LocalSGD, notebook_accel.local_sgd.LocalSGD),
        "MultiProcessAdapter": (accelerate.logging.MultiProcessAdapter, notebook_accel.logging.MultiProcessAdapter),
    }


def signature_differences() -> Dict[str, str]:
    """Every difference: ``"module.name"`` / ``"Class.member"`` -> what differs."""
    found: Dict[str, str] = {}
    for module, name in hf_import_paths():
        if not_ours(module, name) or name in REFUSED:
            continue
        theirs = _callable_of(getattr(importlib.import_module(module), name, None))
        try:
            mine = _callable_of(ours(module, name))
        except (ImportError, AttributeError):
            continue  # reported by the import-path test
        if theirs is not None and mine is not None and not inspect.ismodule(theirs):
            difference = signature_difference(theirs, mine)
            if difference:
                found[f"{module}.{name}"] = difference
    for label, (theirs_cls, mine_cls) in _member_classes().items():
        mine_members = dict(_public_methods(mine_cls))
        for name, theirs in _public_methods(theirs_cls):
            if name in mine_members and not (label == "Accelerator" and name in ABSENT_MEMBERS):  # refused
                difference = signature_difference(theirs, mine_members[name])
                if difference:
                    found[f"{label}.{name}"] = difference
    return found


_INTERNAL = "users never build it: prepare() does (HF's constructor takes HF's internals)"

# every accepted signature difference, with why (the test fails on one not listed, and on a listed one that is gone)
SIGNATURE_EXCEPTIONS: Dict[str, str] = {
    "Accelerator.unwrap_model": "keep_torch_compile defaults to False: unwrap_model(model).state_dict() has the "
                                "user's keys (HF's default True keeps torch.compile's wrapper, whose keys start "
                                "with `_orig_mod.`); pass keep_torch_compile=True for HF's",
    "accelerate.Accelerator": "split_batches' default is HF's private sentinel (meaning False, with a deprecation "
                              "path); ours is False",
    "accelerate.accelerator.Accelerator": "the same constructor as accelerate.Accelerator",
    "accelerate.ParallelismConfig": "refused when built (no device meshes here): takes anything, refuses all",
    "accelerate.data_loader.DataLoaderShard": "HF's name for our prepared loader (isinstance checks): " + _INTERNAL,
    "accelerate.optimizer.AcceleratedOptimizer": _INTERNAL,
    "accelerate.scheduler.AcceleratedScheduler": _INTERNAL,
    "accelerate.notebook_launcher": "the launcher is ours (issue-wide API: kwargs=, device=, display=...); HF's "
                                    "keyword arguments are accepted by name, its 3rd positional (num_processes) "
                                    "is our kwargs",
    "accelerate.utils.recursively_apply": "test_type's default is the same test (is a torch.Tensor), our function",
    "accelerate.utils.write_basic_config": "plan/ (issue 43's team) owns it: save_location None means HF's "
                                           "default path; ours adds overwrite and sharding keywords",
}


def test_every_signature_takes_hf_accelerates_parameters_or_is_a_listed_exception():
    found = signature_differences()
    new = {name: found[name] for name in sorted(found) if name not in SIGNATURE_EXCEPTIONS}
    assert not new, "signatures that differ from HF accelerate's (fix them, or list them with the reason):\n" + \
        "\n".join(f"{name}: {why}" for name, why in new.items())
    gone = sorted(set(SIGNATURE_EXCEPTIONS) - set(found))
    assert not gone, f"listed as exceptions but now the same as HF's (remove them from the list): {gone}"


# ------------------------------------------------------------------------------- behaviours behind the names
def test_accelerator_state_is_an_accelerator_state_that_hf_code_can_use_assign_and_reset():
    from notebook_accel.state import AcceleratorState, PartialState

    accelerator = notebook_accel.Accelerator(cpu=True)
    state = accelerator.state
    assert isinstance(state, AcceleratorState) and AcceleratorState().__dict__ is state.__dict__
    state.wait_for_everyone()
    assert state.deepspeed_plugin is None and state.mixed_precision == "no" and state.num_processes == 1
    state.distributed_type = notebook_accel.DistributedType.FSDP  # HF's test_distributed_data_loop does this
    assert accelerator.distributed_type == notebook_accel.DistributedType.FSDP
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"This happens if `AcceleratorState._reset_state\(\)`"):
        accelerator.prepare(torch.nn.Linear(1, 1))
    second = notebook_accel.Accelerator(cpu=True)  # a second one, after the reset, works
    assert second.distributed_type == notebook_accel.DistributedType.NO and second.prepare(torch.nn.Linear(1, 1))
    PartialState().debug = True
    assert PartialState().debug  # one state shared by every instance (HF's test_ops sets it so)
    PartialState().debug = False


def test_gradient_state_names_the_active_dataloader_and_resets():
    from notebook_accel.state import GradientState

    accelerator = notebook_accel.Accelerator(cpu=True)
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(4)), batch_size=2))
    assert accelerator.gradient_state.active_dataloader is None
    seen = [accelerator.gradient_state.active_dataloader is loader for _ in loader]
    assert seen == [True, True] and accelerator.gradient_state.active_dataloader is None
    GradientState._reset_state()
    plugin = notebook_accel.utils.GradientAccumulationPlugin(num_steps=3)
    assert GradientState(plugin).num_steps == 3 and GradientState().num_steps == 1


class ScheduleFree(torch.optim.SGD):
    """A schedule-free optimizer's API: train() / eval() modes."""

    mode = "train"

    def train(self):
        self.mode = "train"

    def eval(self):
        self.mode = "eval"


def test_a_prepared_optimizer_passes_train_and_eval_to_a_schedule_free_one():
    accelerator = notebook_accel.Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    inner = ScheduleFree(model.parameters(), lr=0.1)
    optimizer = accelerator.prepare(inner)
    optimizer.eval()
    assert inner.mode == "eval"
    optimizer.train()
    assert inner.mode == "train"
    accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1)).eval()  # no modes: nothing happens


def test_init_empty_weights_and_init_on_device_as_hf_documents():
    with notebook_accel.init_empty_weights():
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model[1].running_mean.device.type == "cpu"  # buffers stay real unless include_buffers
    with notebook_accel.init_empty_weights(include_buffers=True):
        model = torch.nn.BatchNorm1d(4)
    assert model.running_mean.device.type == "meta" and model.weight.device.type == "meta"
    with notebook_accel.init_on_device(torch.device("cpu")):
        assert torch.nn.Linear(2, 2).weight.device.type == "cpu"
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"  # the patch is gone after the block


def test_hf_parameters_of_utils_work_by_keyword():
    from notebook_accel import utils

    batch = {"x": torch.ones(1), "meta": torch.ones(1)}
    moved = utils.send_to_device(batch, "meta", skip_keys="meta")
    assert moved["x"].device.type == "meta" and moved["meta"].device.type == "cpu"
    assert utils.gather(tensor=torch.tensor([1])).tolist() == [1]
    assert utils.pad_across_processes(tensor=torch.ones(2), dim=0).tolist() == [1.0, 1.0]
    assert utils.broadcast(torch.ones(1), from_process=0).tolist() == [1.0]
    assert utils.gather_object(object=["a"]) == ["a"]
    try:
        utils.set_seed(3, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert utils.is_torch_version(">=", "2.0") and utils.WEIGHTS_NAME == "pytorch_model.bin"
    accelerator = notebook_accel.Accelerator(cpu=True)
    model = accelerator.prepare_model(torch.nn.Linear(1, 1), device_placement=False, evaluation_mode=True)
    assert accelerator.gather(tensor=torch.tensor([2])).tolist() == [2]
    assert accelerator.gather_for_metrics(input_data=torch.tensor([3])).tolist() == [3]
    assert accelerator.unwrap_model(model) is model
    with pytest.raises(NotImplementedError, match="slice_fn_for_dispatch"):
        accelerator.prepare_data_loader(torch.utils.data.DataLoader([1]), slice_fn_for_dispatch=lambda x: x)


def test_prepare_data_loader_of_the_data_loader_module_takes_hf_positional_forms():
    from notebook_accel.data_loader import SeedableRandomSampler, prepare_data_loader, skip_first_batches

    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    shard = prepare_data_loader(loader, torch.device("cpu"), 2, 1, put_on_device=True)  # rank 1 of 2
    batches = [batch.tolist() for batch in shard]
    assert len(batches) == 2 and sorted(sum(batches, [])) != list(range(8))
    assert [b.tolist() for b in skip_first_batches(prepare_data_loader(loader), num_batches=3)] == [[6, 7]]
    sampler = SeedableRandomSampler(list(range(6)), data_seed=4)
    assert list(sampler) != list(sampler)  # the next epoch's order
    sampler.set_epoch(0)
    first = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_deepspeed_and_fsdp_plugins_take_hf_fields_and_refuse_by_name_what_they_cannot_honour():
    from notebook_accel.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    plugin = DeepSpeedPlugin(None, 2, 1.0, 3, offload_param_device="nvme", offload_param_nvme_path="/nvme",
                             zero3_save_16bit_model=True)  # HF's positional order
    assert plugin.gradient_accumulation_steps == 2 and plugin.zero_stage == 3
    assert plugin.deepspeed_config["zero_optimization"]["offload_param"] == {"device": "nvme", "nvme_path": "/nvme"}
    for given in (dict(transformer_moe_cls_names="Moe"), dict(enable_msamp=True), dict(is_train_batch_min=False)):
        with pytest.raises(NotImplementedError, match=next(iter(given))):
            DeepSpeedPlugin(**given)
    from torch.distributed.fsdp import FullStateDictConfig

    fsdp = FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP",
                                          state_dict_config=FullStateDictConfig(offload_to_cpu=False))
    assert fsdp.reshard_after_forward is False and fsdp.fsdp_version == 2 and not fsdp.cpu_offload
    for given in (dict(backward_prefetch="BACKWARD_PRE"), dict(sharding_strategy="NO_SHARD"),
                  dict(ignored_modules=[torch.nn.Linear(1, 1)])):
        with pytest.raises(NotImplementedError, match=next(iter(given))):
            FullyShardedDataParallelPlugin(**given)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in one process, as meant here
def test_merge_fsdp_weights_makes_one_weights_file_of_a_sharded_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from notebook_accel.utils import SAFE_WEIGHTS_NAME, WEIGHTS_NAME, merge_fsdp_weights

    weights = {"layer.weight": torch.arange(6.0).reshape(2, 3), "layer.bias": torch.ones(2)}
    dcp.save({"model": weights}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "pytorch_model_fsdp_0")))
    merge_fsdp_weights(str(tmp_path / "pytorch_model_fsdp_0"), str(tmp_path / "merged"))
    merged = load_file(str(tmp_path / "merged" / SAFE_WEIGHTS_NAME))
    assert merged.keys() == weights.keys() and all(torch.equal(merged[k], weights[k]) for k in weights)
    merge_fsdp_weights(str(tmp_path / "pytorch_model_fsdp_0"), str(tmp_path / "bin"), safe_serialization=False,
                       remove_checkpoint_dir=True)  # fmt: skip
    assert torch.equal(torch.load(tmp_path / "bin" / WEIGHTS_NAME)["layer.bias"], torch.ones(2))
    assert not (tmp_path / "pytorch_model_fsdp_0").exists()
