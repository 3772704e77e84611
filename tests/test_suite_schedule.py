"""The suite's scheduler (tests/suite_schedule.py): when a shared group goes out, the rest counted whole — the units
not handed out, the other groups, and what the other workers still have of theirs. No xdist run: its choice is asked
of it directly, with the state xdist would have given it."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Dict

from suite_schedule import SuiteScheduling


class Worker:
    shutting_down = False


def scheduler(queued: Dict[str, float], busy: Dict[Worker, float]) -> SuiteScheduling:
    """A scheduler whose queue holds one test of each file in ``queued`` (file: its seconds), and whose workers in
    ``busy`` each run a file they got just now with that many seconds left by its estimate."""
    made = SuiteScheduling.__new__(SuiteScheduling)   # xdist's own __init__ wants a whole config: set what it sets
    made.workqueue, made.assigned_work, made.handed, made.last_unit_nodes = OrderedDict(), {}, {}, set()
    made.seconds = dict(queued)
    for path in queued:
        made.workqueue.setdefault(made._split_scope(f"{path}::t"), {})[f"{path}::t"] = False
    for index, (worker, left) in enumerate(busy.items()):
        running = f"tests/test_running_{index}.py"
        made.seconds[running] = left
        made.assigned_work[worker] = {running: {f"{running}::t": False}}
        made.handed[(worker, running)] = (time.monotonic(), left)
    return made


FILES = {"tests/test_real_hosts.py": 300.0, "tests/test_ray_cluster.py": 170.0}


def test_a_shared_group_waits_while_the_rest_would_leave_the_others_busy_longer():
    asking, others = Worker(), [Worker(), Worker()]
    # 500 s of files and the Ray group's 170 for the two others: 335 s each, more than the real hosts' 300
    early = scheduler({**FILES, "tests/test_a.py": 260.0, "tests/test_b.py": 240.0}, {worker: 0.0 for worker in others})
    assert early._next_unit(asking) == "tests/test_a.py" and asking not in early.last_unit_nodes
    # 400 s of files: 285 s each, so the real hosts go out now, and that worker gets nothing after them
    due = scheduler({**FILES, "tests/test_a.py": 200.0, "tests/test_b.py": 200.0}, {worker: 0.0 for worker in others})
    assert due._next_unit(asking) == "real-hosts" and asking in due.last_unit_nodes


def test_what_the_other_workers_still_run_counts_as_work_left():
    asking, others = Worker(), [Worker(), Worker()]
    idle = scheduler({**FILES, "tests/test_a.py": 200.0, "tests/test_b.py": 200.0}, {worker: 0.0 for worker in others})
    busy = scheduler({**FILES, "tests/test_a.py": 200.0, "tests/test_b.py": 200.0}, {worker: 60.0 for worker in others})
    assert idle._next_unit(asking) == "real-hosts"
    assert busy._next_unit(Worker()) == "tests/test_a.py"   # 60 s more each: 345 s, more than 300
    assert 55.0 < busy.still_busy(others[0], time.monotonic()) <= 60.0
