"""HF accelerate's own test scripts, run check by check on a library: HF's real accelerate, or ours by an import alias.

The scripts are HF's installed ``accelerate/test_utils/scripts/*.py`` (accelerate 1.15 is a test dependency; nothing
of HF's is copied here). Each script's ``main()`` runs its checks one after another and stops at the first failure;
here :data:`CHECKS` lists, per script, the calls its ``main()`` makes on 2 CPU ranks (``MULTI_CPU``), plus the
GPU-only variants when they can run on CPU, each as the line of code ``main()`` would run. :func:`run_checks` runs
in every rank of one launch: the script's set-up lines, then each check in its own ``try``, so one failure does not
hide the next; it returns ``{check: None or the traceback}``.

**The alias** (``library="ours"``): ``accelerate`` and every ``accelerate.<x>`` the script imports resolve to
``notebook_accel`` and ``notebook_accel.<x>`` (the same module objects: a ``sys.meta_path`` finder), *except*
``accelerate.test_utils``: that is HF's test helper package (``RegressionModel``, ``RegressionDataset``,
``are_the_same_tensors``, ``assert_exception``), not the thing under test, so it stays HF's, imported before the
alias is set and bound to HF's own accelerate underneath (its modules keep HF's ``gather`` / ``AcceleratorState``;
that state is made for them by an HF ``Accelerator(cpu=True)`` before the alias is set).
HF's other modules are then removed from ``sys.modules`` so nothing of the script reaches them by name.

**Missing names**: the script's top-level ``from accelerate... import a, b`` is loaded name by name; a name the
library lacks becomes a :class:`MissingName` that raises ``ImportError`` ("missing name") where a check uses it, so
the checks that do not need it still run. The same loading is used for HF's run (where nothing is missing).
"""
from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import traceback
import types
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple, Union

HF_SCRIPTS = os.path.join(os.path.dirname(importlib.util.find_spec("accelerate").origin), "test_utils", "scripts")

# script -> (set-up lines of its main(), [the checks main() runs on 2 CPU ranks, one line each, or (label, lines)])
# Left out: test_notebook.py (HF's own notebook_launcher, not rank code), test_merge_weights.py (FSDP1 and
# HF's `accelerate merge-weights` command), external_deps/* (transformers, datasets, evaluate: not installed).
_GRID = [(s, d, e) for s in (True, False) for d in (True, False) for e in (True, False)]
Check = Union[str, Tuple[str, str]]
CHECKS: Dict[str, Tuple[str, List[Check]]] = {
    "test_ops.py": ("state = PartialState()", [
        "test_gather(state)", "test_gather_object(state)", "test_gather_non_contiguous(state)",
        "test_broadcast(state)", "test_pad_across_processes(state)", "test_reduce_sum(state)",
        "test_reduce_mean(state)", "test_reduce_max(state)", "test_op_checker(state)",
        "test_copy_tensor_to_devices(state)",
    ]),
    "test_script.py": ("accelerator = Accelerator()\nstate = accelerator.state", [
        "init_state_check()", "process_execution_check()", "test_split_between_processes_list()",
        "test_split_between_processes_nested_dict()", "test_split_between_processes_tensor()",
        "test_split_between_processes_evenly()", "rng_sync_check()", "dl_preparation_check()",
        "central_dl_preparation_check()", "custom_sampler_check()", "check_seedable_sampler()",
        "check_seedable_sampler_with_data_seed()", "check_seedable_sampler_in_batch_sampler_shard()",
        "training_check(use_seedable_sampler=False)", "training_check(use_seedable_sampler=True)",
        "test_trigger()", "test_reinstantiated_state()",
    ]),
    "test_sync.py": ("accelerator = Accelerator()\nstate = accelerator.state", [
        "test_dataloader_break()", "test_distributed_sync(accelerator)",
        "test_distributed_sync_multiple_fwd(accelerator)",
        # main() runs these on GPUs only; on CPU they are a fair comparison too (HF's run says which pass)
        *[f"test_gradient_accumulation({s}, {d}, {e})" for s, d, e in _GRID],
        "test_gradient_accumulation_with_opt_and_scheduler()",
        *[f"test_gradient_accumulation_with_opt_and_scheduler({s}, {d}, {e})" for s, d, e in _GRID if s or d or e],
    ]),
    "test_distributed_data_loop.py": ("accelerator = create_accelerator()\n"
                                      "torch.manual_seed(accelerator.process_index)", [
        "test_default_ensures_even_batch_sizes()", "test_can_disable_even_batches()",
        "test_join_can_override_even_batches()",
        "test_join_can_override_for_mixed_type_dataloaders()",
        "test_join_raises_warning_for_iterable_when_overriding_even_batches()",
        ("test_join_raises_warning_for_non_ddp_distributed(accelerator)",
         "original_state = accelerator.state.distributed_type; "
         "accelerator.state.distributed_type = DistributedType.FSDP; "
         "test_join_raises_warning_for_non_ddp_distributed(accelerator); "
         "accelerator.state.distributed_type = original_state"),
        "test_pickle_accelerator()",
        ("test_data_loader(shuffle=False)",
         "test_data_loader(DataLoader(DummyDataset(), shuffle=False, batch_size=BATCH_SIZE, "
         "num_workers=NUM_WORKERS), accelerator)"),
        ("test_data_loader(shuffle=True)",
         "test_data_loader(DataLoader(DummyDataset(), shuffle=True, batch_size=BATCH_SIZE, "
         "num_workers=NUM_WORKERS), accelerator)"),
        ("test_data_loader(batch_sampler=BatchSampler)",
         "test_data_loader(DataLoader(DummyDataset(), batch_sampler=BatchSampler(RandomSampler(DummyDataset()), "
         "batch_size=BATCH_SIZE, drop_last=False), num_workers=NUM_WORKERS), accelerator)"),
        ("test_data_loader(sampler=BatchSampler)",
         "test_data_loader(DataLoader(DummyDataset(), sampler=BatchSampler(RandomSampler(DummyDataset()), "
         "batch_size=BATCH_SIZE, drop_last=False), batch_size=None, collate_fn=default_collate, "
         "num_workers=NUM_WORKERS), accelerator)"),
        "test_stateful_dataloader(accelerator)", "test_stateful_dataloader_save_state(accelerator)",
        # left out: test_can_join_uneven_inputs(): on HF with CPU ranks it waits in a collective until the
        # timeout (and leaves the process group unusable for every check after it), so it can never count
    ]),
    "test_ddp_comm_hook.py": ("H = DDPCommunicationHookType", [
        f"test_ddp_comm_hook(H.{hook}, H.{wrapper}, {option})" for hook, wrapper, option in [
            ("NO", "NO", {}), ("FP16", "NO", {}), ("BF16", "NO", {}), ("POWER_SGD", "NO", {}),
            ("POWER_SGD", "FP16", {}), ("POWER_SGD", "BF16", {}),
            ("POWER_SGD", "NO", {"matrix_approximation_rank": 2}), ("BATCHED_POWER_SGD", "NO", {}),
            ("BATCHED_POWER_SGD", "FP16", {}), ("BATCHED_POWER_SGD", "BF16", {}),
        ]
    ]),
    "test_cli.py": ("", ["main()"]),
}

SET_UP = "(set-up)"


def labelled(check: Check) -> Tuple[str, str]:
    """``(label, source)`` of a check: a one-line check is its own label."""
    return (check, check) if isinstance(check, str) else check


def labels(script: str) -> List[str]:
    return [labelled(check)[0] for check in CHECKS[script][1]]


def check_ids() -> List[str]:
    """``script::check`` for every check, in run order."""
    return [f"{script}::{label}" for script in CHECKS for label in labels(script)]


class MissingName:
    """A name the library under test lacks: using it raises ImportError, so only the checks that need it fail."""

    def __init__(self, module: str, name: str, error: BaseException) -> None:
        self._message = f"cannot import name {name!r} from {module!r} (missing name: {error})"

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise ImportError(self._message)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ImportError(self._message)

    def __mro_entries__(self, bases: Any) -> Any:
        raise ImportError(self._message)


def found_anywhere(module: str, name: str, error: BaseException) -> Any:
    """Diagnostics (``run_checks(..., anywhere=True)``): a name missing where HF has it, looked up in every module of
    our package instead (what the checks would do were it exported there), an ``is_*_available`` probe taken from
    HF's test helpers; a MissingName if none has it."""
    import pkgutil

    import notebook_accel.accelerator

    for info in pkgutil.iter_modules(notebook_accel.accelerator.__path__, "notebook_accel.accelerator."):
        importlib.import_module(info.name)
    for candidate in ["notebook_accel", "notebook_accel.utils"] + sorted(sys.modules):
        found = getattr(sys.modules.get(candidate), name, None) if candidate.startswith("notebook_accel") else None
        if found is not None:
            return found
    if name.startswith("is_") and name.endswith("_available"):  # an environment probe: HF's own, from its helpers
        found = getattr(_HF_MODULES.get("accelerate.utils"), name, None)
        if found is not None:
            return found
    return MissingName(module, name, error)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``accelerate[.x]`` -> the module ``notebook_accel[.x]`` itself (``accelerate.test_utils`` is left alone)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != "accelerate" and not fullname.startswith("accelerate."):
            return None
        if fullname == "accelerate.test_utils" or fullname.startswith("accelerate.test_utils."):
            return None
        ours = "notebook_accel" + fullname[len("accelerate"):]
        try:
            importlib.import_module(ours)
        except ModuleNotFoundError as error:
            if error.name != ours:
                raise
            raise ModuleNotFoundError(f"No module named {fullname!r} (ours: {ours}; missing name)",
                                      name=fullname) from None  # fmt: skip
        return importlib.machinery.ModuleSpec(fullname, self, origin=ours)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return sys.modules[spec.origin]

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # already imported as notebook_accel.<x>


_HF_MODULES: Dict[str, types.ModuleType] = {}  # HF's modules the alias took out of sys.modules


def alias_accelerate_to_ours() -> None:
    """Keep HF's ``accelerate.test_utils`` (imported now, on HF's accelerate), send every other ``accelerate`` name
    to ``notebook_accel``."""
    import accelerate.test_utils  # noqa: F401  HF's helpers, bound to HF's modules
    import accelerate.test_utils.testing  # noqa: F401
    import accelerate.test_utils.training  # noqa: F401

    # are_the_same_tensors() asks HF's AcceleratorState for the device: made by HF's own Accelerator(), here
    accelerate.Accelerator(cpu=True)

    for name in [name for name in sys.modules if name == "accelerate" or name.startswith("accelerate.")]:
        if not name.startswith("accelerate.test_utils"):
            _HF_MODULES[name] = sys.modules.pop(name)
    sys.meta_path.insert(0, _Alias())


class _SplitImports(ast.NodeTransformer):
    """Top-level ``from accelerate... import a, b`` -> one guarded import per name (a MissingName when absent)."""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        if not (node.module or "").startswith("accelerate") or node.level:
            return node
        guarded = []
        for alias in node.names:
            bound = alias.asname or alias.name
            source = (f"try:\n    from {node.module} import {alias.name} as {bound}\n"
                      f"except ImportError as _error:\n"
                      f"    {bound} = _MissingName({node.module!r}, {alias.name!r}, _error)\n")  # fmt: skip
            for statement in ast.parse(source).body:
                guarded.append(ast.copy_location(statement, node))
        return guarded

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        return node  # imports inside functions stay as HF wrote them


def load_script(script: str, anywhere: bool = False) -> types.ModuleType:
    """HF's script as a module, its top-level accelerate imports split name by name (``anywhere``: a missing name
    is looked up in all of our package, see :func:`found_anywhere`)."""
    path = os.path.join(HF_SCRIPTS, script)
    with open(path) as file:
        tree = _SplitImports().visit(ast.parse(file.read(), path))
    ast.fix_missing_locations(tree)
    module = types.ModuleType(f"hf_script_{script[:-3]}")
    module.__file__ = path
    module.__dict__["_MissingName"] = found_anywhere if anywhere else MissingName
    sys.modules[module.__name__] = module
    exec(compile(tree, path, "exec"), module.__dict__)
    return module


def run_checks(library: str, script: str, workdir: str, anywhere: bool = False) -> Dict[str, Optional[str]]:
    """In each rank: the script's set-up, then every check of :data:`CHECKS` on its own; ``{check: traceback}``
    (None: passed on this rank). ``anywhere``: diagnostics, see :func:`found_anywhere`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.chdir(workdir)
    # a short collective timeout, for both libraries: a check that fails on one rank while the other waits in a
    # collective fails after half a minute rather than hanging the launch
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    if library == "ours":
        alias_accelerate_to_ours()
    results: Dict[str, Optional[str]] = {}
    try:
        module = load_script(script, anywhere)
    except BaseException:  # noqa: B036  the whole script failed to load: every check fails with that
        failure = traceback.format_exc()
        return {check: failure for check in [SET_UP] + labels(script)}
    set_up, checks = CHECKS[script]
    for check, source in [(SET_UP, set_up)] + [labelled(check) for check in checks]:
        try:
            exec(compile(source, f"<{script} check>", "exec"), module.__dict__)
            results[check] = None
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: B036  pytest.raises' Failed and SystemExit are BaseExceptions
            results[check] = traceback.format_exc()
    return results
