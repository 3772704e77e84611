"""HF accelerate's example scripts (``nlp_example.py`` and ``by_feature/*``, vendored in tests/hf_examples/) run
on our Accelerator wherever they run on HF's, with only the import changed (tests/hf_example_runs.py).

One launch per library, 2 CPU ranks, started by our ``notebook_launcher``, each rank running every script in turn:
HF's real accelerate, then ours (``accelerate`` -> ``notebook_accel`` by the import alias of tests/hf_scripts.py). A script passes when
its ``main()`` returns on every rank. One that fails on HF is skipped (with HF's error); one that passes on HF must
pass on ours, except those in :data:`KNOWN_GAPS`, which must still fail (a gap that closes fails its test, saying
to remove it from the list).
"""
from __future__ import annotations

import importlib.util
from typing import Dict, List, Optional

import pytest

from hf_example_runs import EXAMPLES, run_examples
from notebook_accel import notebook_launcher
from notebook_accel.errors import LaunchTimeout

pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(600)
LAUNCH_BOUND = 240   # s for one library's launch (about 10 s each on a quiet machine): a hang, named with its stacks

# script -> why it fails on ours while it passes on HF (docs/accelerate-parity.md says so too)
KNOWN_GAPS: Dict[str, str] = {}

# script -> the package it imports beyond the stand-ins (setup.cfg's test extra has it); without it the script skips
NEEDS: Dict[str, str] = {"schedule_free.py": "schedulefree"}
RUNNABLE = [script for script in EXAMPLES if script not in NEEDS or importlib.util.find_spec(NEEDS[script])]


def _launch(library: str, workdir: str) -> Dict[str, Optional[str]]:
    """``{script: None or the first failing rank's traceback}``: every script, in one launch of 2 ranks."""
    try:
        ranks: List[Dict[str, Optional[str]]] = notebook_launcher(
            run_examples, args=(library, RUNNABLE, workdir), num_processes=2, device="cpu", display="none",
            return_all=True, timeout=LAUNCH_BOUND)  # fmt: skip
    except LaunchTimeout as error:
        where = "\n".join(f"--- rank {rank}:\n{stack}" for rank, stack in sorted(error.stacks.items()))
        pytest.fail(f"{library}'s examples had not returned after {LAUNCH_BOUND} s; where each rank was:\n{where}")
    return {script: next((rank[script] for rank in ranks if rank[script] is not None), None) for script in RUNNABLE}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> Dict[str, Dict[str, Optional[str]]]:
    """``{library: {script: None or the first failing rank's traceback}}``: one launch per library."""
    return {library: _launch(library, str(tmp_path_factory.mktemp(library))) for library in ("hf", "ours")}


@pytest.mark.parametrize("script", list(EXAMPLES))
def test_an_example_that_runs_on_hf_runs_on_ours(outcomes, script):
    if script not in RUNNABLE:
        pytest.skip(f"needs the `{NEEDS[script]}` package (setup.cfg's test extra), not installed here")
    hf, ours = outcomes["hf"][script], outcomes["ours"][script]
    if hf is not None:
        pytest.skip(f"fails on HF accelerate too:\n{hf}")
    if script in KNOWN_GAPS:
        assert ours is not None, f"now passes on ours: remove it from KNOWN_GAPS ({KNOWN_GAPS[script]})"
        pytest.xfail(KNOWN_GAPS[script])
    assert ours is None, f"runs on HF, fails on ours:\n{ours}"


def test_the_counts(outcomes):
    """HF passes / ours passes, printed (``-s``) for the parity page."""
    passes = {library: sum(failure is None for failure in by_script.values()) for library, by_script in outcomes.items()}
    print(f"\nHF accelerate's examples on 2 CPU ranks: {passes['hf']} run on HF, {passes['ours']} on ours "
          f"({len(RUNNABLE)} of {len(EXAMPLES)} scripts runnable here)")
    assert passes["hf"] == len(RUNNABLE), {script: failure for script, failure in outcomes["hf"].items() if failure}
