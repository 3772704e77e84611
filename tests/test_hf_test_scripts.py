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

from hf_scripts import CHECKS, SET_UP, check_ids, labels, run_checks
from notebook_accel import notebook_launcher

pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(600)

# script::check -> why it fails on ours while it passes on HF. Each is a feature we do not offer (docs/accelerate-parity.md
# says so); a gap that starts passing fails its test, saying to remove it from the list.
KNOWN_GAPS: Dict[str, str] = {}

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
