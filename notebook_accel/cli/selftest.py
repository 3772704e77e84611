"""``notebook-accel test``: a 2-rank self-check that ends with a clear PASS or FAIL.

It checks what every launch relies on: the rendezvous (``init_process_group`` over gloo), an
all-reduce, labelled output coming back, rank 0's result, and a failing rank named as the root cause
with its own exception type.
"""
from __future__ import annotations

import sys
from typing import Callable, List, Tuple

WORLD = 2


class SelfTestError(Exception):
    """Raised on purpose by rank 1 in the root-cause check."""


def all_reduce_check() -> dict:
    """Runs in every rank: join the group, sum the ranks, say hello, return what rank 0 saw."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        print(f"hello from rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
        return {"sum": float(value.item()), "world_size": dist.get_world_size()}
    finally:
        dist.destroy_process_group()


def failing_check() -> None:
    """Rank 1 raises; rank 0 waits at a barrier, so its error would be collateral."""
    import os
    import time

    if os.environ["RANK"] == "1":
        raise SelfTestError("rank 1 fails on purpose")
    time.sleep(30)  # stopped by the launcher once rank 1 failed


def _run_checks(say: Callable[[str], None]) -> List[Tuple[str, bool, str]]:
    from ..launcher import Launch
    from ..plan.plan import plan_launch
    from ..views import TextView

    results = []
    lines: List[str] = []

    class Recorder(TextView):
        def handle(self, event) -> None:
            from ..wire.events import OutputLine, OutputLines

            if isinstance(event, (OutputLine, OutputLines)):
                lines.extend(f"[rank {event.rank}] {text}" for text in event.texts)
            super().handle(event)

    try:
        plan = plan_launch(all_reduce_check, num_processes=WORLD, device="cpu", display="text",
                           allow_inline=False, timeout=120)
        value = Launch(plan, view=Recorder()).run()
        expected = sum(range(1, WORLD + 1))
        results.append(("rendezvous and all-reduce", value.get("sum") == expected,
                        f"sum {value.get('sum')} (expected {expected})"))
        results.append(("result from rank 0", value.get("world_size") == WORLD, f"{value}"))
        greeted = [rank for rank in range(WORLD) if any(f"[rank {rank}] hello from rank {rank}" in line
                                                        for line in lines)]
        results.append(("labelled output", greeted == list(range(WORLD)), f"ranks heard from: {greeted}"))
    except Exception as err:  # the launch itself failed: that is the finding
        results.append(("rendezvous and all-reduce", False, f"{type(err).__name__}: {err}"))
    try:
        plan = plan_launch(failing_check, num_processes=WORLD, device="cpu", display="none",
                           allow_inline=False, timeout=120)
        Launch(plan).run()
        results.append(("root-cause error", False, "the failing launch did not raise"))
    except SelfTestError as err:
        results.append(("root-cause error", getattr(err, "rank", None) == 1, f"SelfTestError from rank "
                                                                              f"{getattr(err, 'rank', None)}"))
    except Exception as err:
        results.append(("root-cause error", False, f"expected SelfTestError, got {type(err).__name__}: {err}"))
    return results


def run_self_test(say: Callable[[str], None] = print) -> int:
    """Run the checks, print one line each and a verdict; 0 when all passed.

    >>> run_self_test()  # doctest: +SKIP
    ...
    PASS: notebook_accel works here (4/4 checks)
    """
    say(f"notebook_accel self-test: {WORLD} CPU ranks")
    results = _run_checks(say)
    for name, passed, detail in results:
        say(f"  {'ok  ' if passed else 'FAIL'} {name}: {detail}")
    passed = sum(1 for _, ok, _ in results if ok)
    if passed == len(results):
        say(f"PASS: notebook_accel works here ({passed}/{len(results)} checks)")
        return 0
    say(f"FAIL: {len(results) - passed} of {len(results)} checks failed; paste `notebook-accel env` and this "
        f"output into a bug report")
    return 1


if __name__ == "__main__":
    sys.exit(run_self_test())
