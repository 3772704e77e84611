"""HF accelerate's own test scripts pass on our Accelerator wherever they pass on HF's (tests/hf_scripts.py).

One launch per script per library, 2 CPU ranks each, started by our ``notebook_launcher``: HF's real accelerate
(no alias), then ours (``accelerate`` -> ``notebook_accel`` by an import alias, HF's ``accelerate.test_utils``
helpers kept). Each check of a script's ``main()`` runs on its own; a check passes when it passes on every rank.
A check that fails on HF is skipped (with HF's error); one that passes on HF must pass on ours, except those in
:data:`KNOWN_GAPS`, each with its reason, which must still fail (so the list shrinks as the gaps close: a gap
that now passes fails its test, saying to remove it from the list).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import pytest

from hf_scripts import _GRID, CHECKS, SET_UP, check_ids, labels, run_checks
from notebook_accel import notebook_launcher

pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(600)

MISSING = "missing name (branch hf)"  # a name or module of HF's that we lack: issue 47's other half
RESET_STATE = "missing name (branch hf): AcceleratorState._reset_state / GradientState._reset_state"
PREPARE_DATA_LOADER = ("missing name (branch hf): accelerate.data_loader.prepare_data_loader with HF's parameters "
                       "(put_on_device=, dataloader=, positional device/num_processes/process_index)")  # fmt: skip
SCRIPT_MODULE = "missing name (branch hf): is_hpu_available, used at test_script.py's top level"

# script::check -> why it fails on ours while it passes on HF. Where the names are found anywhere in our package
# (tests/hf_scripts.py's found_anywhere, run by hand), the checks marked "then:" still fail for that reason.
KNOWN_GAPS: Dict[str, str] = {
    **{f"test_ops.py::{check}": MISSING + ": accelerate.utils.operations / accelerate.utils.dataclasses" for check in [
        "test_gather(state)", "test_gather_object(state)", "test_gather_non_contiguous(state)", "test_broadcast(state)",
        "test_pad_across_processes(state)", "test_reduce_sum(state)", "test_reduce_mean(state)",
        "test_reduce_max(state)", "test_copy_tensor_to_devices(state)"]},
    "test_ops.py::test_op_checker(state)": MISSING + "; then: the op checker (DistributedOperationException when "
                                           "ranks gather different shapes under debug) is not offered",
    **{f"test_script.py::{check}": SCRIPT_MODULE for check in [
        "init_state_check()", "process_execution_check()", "test_split_between_processes_list()",
        "test_split_between_processes_nested_dict()", "test_split_between_processes_tensor()",
        "test_split_between_processes_evenly()", "check_seedable_sampler()", "check_seedable_sampler_with_data_seed()",
        "test_trigger()"]},
    "test_script.py::rng_sync_check()": SCRIPT_MODULE + "; then: synchronize_rng_states",
    "test_script.py::training_check(use_seedable_sampler=True)": SCRIPT_MODULE + "; then: SeedableRandomSampler",
    **{f"test_script.py::{check}": SCRIPT_MODULE + "; then: " + PREPARE_DATA_LOADER for check in [
        "dl_preparation_check()", "central_dl_preparation_check()", "custom_sampler_check()",
        "check_seedable_sampler_in_batch_sampler_shard()"]},
    # training_check's plain, split_batches and other fp32 trainings pass on ours (HF's expected weights); it stops
    # at the _reset_state before its bf16 part
    **{f"test_script.py::{check}": SCRIPT_MODULE + "; then: " + RESET_STATE for check in [
        "training_check(use_seedable_sampler=False)", "test_reinstantiated_state()"]},
    "test_sync.py::test_dataloader_break()": "missing name (branch hf): GradientState.active_dataloader",
    "test_sync.py::test_distributed_sync_multiple_fwd(accelerator)": (
        "Accelerator.trigger_sync_in_backward is absent (accelerator/absent.py: accumulate() instead)"),
    **{f"test_sync.py::{check}": MISSING + ": GradientAccumulationPlugin / DataLoaderConfiguration from "
                                 "accelerate.accelerator; then: " + RESET_STATE for check in [
        *[f"test_gradient_accumulation({s}, {d}, {e})" for s, d, e in _GRID],
        "test_gradient_accumulation_with_opt_and_scheduler()",
        *[f"test_gradient_accumulation_with_opt_and_scheduler({s}, {d}, {e})" for s, d, e in _GRID if s or d or e]]},
    **{f"test_distributed_data_loop.py::{check}": MISSING + ": DataLoaderConfiguration from accelerate.accelerator "
       "(create_accelerator)" for check in [
        "test_default_ensures_even_batch_sizes()", "test_can_disable_even_batches()", "test_pickle_accelerator()",
        "test_data_loader(shuffle=False)", "test_data_loader(shuffle=True)",
        "test_data_loader(batch_sampler=BatchSampler)", "test_data_loader(sampler=BatchSampler)"]},
    "test_distributed_data_loop.py::test_join_raises_warning_for_non_ddp_distributed(accelerator)": (
        MISSING + "; then: Accelerator().state is our frozen ProcessState: distributed_type cannot be assigned"),
    "test_cli.py::main()": MISSING + ": is_xpu_available",
}

Outcome = Dict[str, Optional[str]]  # check -> None (passed on every rank) or the first failing rank's traceback


def _launch(library: str, script: str, workdir: str) -> Outcome:
    ranks: List[Outcome] = notebook_launcher(run_checks, args=(library, script, workdir), num_processes=2,
                                             device="cpu", display="none", return_all=True)  # fmt: skip
    return {check: next((rank[check] for rank in ranks if rank[check] is not None), None) for check in ranks[0]}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> Dict[str, Dict[str, Outcome]]:
    """``{library: {script: outcome}}``: 2 launches per script."""
    found: Dict[str, Dict[str, Outcome]] = {"hf": {}, "ours": {}}
    for script in CHECKS:
        for library in found:
            found[library][script] = _launch(library, script, str(tmp_path_factory.mktemp(library)))
    return found


@pytest.mark.parametrize("check_id", check_ids())
def test_a_check_that_passes_on_hf_passes_on_ours(outcomes, check_id):
    script, check = check_id.split("::", 1)
    hf, ours = outcomes["hf"][script], outcomes["ours"][script]
    if hf.get(check, "did not run") is not None or hf[SET_UP] is not None:
        pytest.skip(f"fails on HF accelerate too:\n{hf.get(check) or hf[SET_UP]}")
    if check_id in KNOWN_GAPS:
        assert ours.get(check) is not None, f"now passes on ours: remove it from KNOWN_GAPS ({KNOWN_GAPS[check_id]})"
        pytest.xfail(KNOWN_GAPS[check_id])
    assert ours.get(check, "did not run") is None, f"passes on HF, fails on ours:\n{ours.get(check)}"


def test_the_counts(outcomes):
    """HF passes / ours passes, printed (``-s``) for the parity page; every check ran on both."""
    passes = {library: sum(outcome[check] is None for outcome in by_script.values() for check in outcome
                           if check != SET_UP) for library, by_script in outcomes.items()}  # fmt: skip
    print(f"\nHF accelerate's test-script checks on 2 CPU ranks: {passes['hf']} pass on HF, {passes['ours']} on ours "
          f"({len(check_ids())} checks)")
    assert passes["hf"] > 0
    for library, by_script in outcomes.items():
        for script, outcome in by_script.items():
            assert set(outcome) == {SET_UP, *labels(script)}, (library, script)
