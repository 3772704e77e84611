"""The suite's xdist scheduler: which test file a worker runs next (conftest.py's ``pytest_xdist_make_scheduler``).

xdist's ``--dist loadfile`` hands files out in collection order, a file at a time. Its run of the suite left two of
three workers idle for the last two minutes: the Ray files, which must run last in their worker (they make it a Ray
driver, and a fork launch after that is refused: tests/tiers.py, ``RAY_DRIVER_FILES``), came last of all, 150 s of
them on one worker. This one, with the same unit of work:

- a unit is a file, or the files of one of ``shared_clusters.SHARED_GROUPS`` together: the Slurm cluster and the
  real hosts, and the fake Ray cluster, are then made once per run (one worker runs every file that uses them);
- the longest unit first (longest-processing-time first, from ``file_seconds.json``: each file's seconds in a run on
  a quiet 2-core machine, written by ``scripts/timeline.py --costs``; a file not listed counts by its tier);
- a shared group's unit is a worker's last — the Ray one for the reason above, the others because their cluster's
  daemons (slurmctld, munged, the hosts' processes) live until the worker ends, as children of it, and the tests
  that check nothing of theirs is left would count them (37 such failures in the first run that ran them first):
  each is handed out once what is left for the other workers would keep them busy about as long, and that worker
  then gets nothing more. "What is left" counts the other units not handed out yet, the other shared groups (each
  the last of some other worker), and what the other workers still have of the units they run now (their estimate
  less the time since they got them). Counting only the first, the real-hosts unit (~300 s) went out while ~600 s
  of files and the Ray unit were left for the other two: its worker ended 80-100 s before them (2026-11-29 runs).
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, Iterable, Optional, Set, Tuple

from xdist.scheduler import LoadScopeScheduling

import tiers
from shared_clusters import SHARED_GROUPS  # RAY_DRIVER_FILES (tiers.py) are all in it: checked below

COSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_seconds.json")
# seconds a file that file_seconds.json does not list yet counts for, by its tier
TIER_SECONDS: Dict[Optional[str], float] = {"unit": 2.0, "ranks": 20.0, "cluster": 60.0, "kernel": 30.0,
                                            "browser": 60.0, "xla": 30.0, None: 20.0}


def file_of(nodeid: str) -> str:
    """``tests/test_x.py`` of ``tests/test_x.py::test_y[z]`` (a notebook's cell: ``notebooks/n.ipynb``)."""
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """A test's unit of work: its shared group's name, else its file."""
    path = file_of(nodeid)
    return SHARED_GROUPS.get(os.path.basename(path), path)


def load_seconds(path: str = COSTS) -> Dict[str, float]:
    try:
        with open(path) as table:
            return {name: float(seconds) for name, seconds in json.load(table).items()}
    except (OSError, ValueError):
        return {}


class SuiteScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the order and the last unit chosen as the module docstring says."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self.seconds = load_seconds()
        self.last_unit_nodes: Set[object] = set()   # workers given a Ray unit: nothing more for them
        self.handed: Dict[Tuple[object, str], Tuple[float, float]] = {}   # (worker, unit): (when, its estimate)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def cost(self, nodeids: Iterable[str]) -> float:
        files = {file_of(nodeid) for nodeid in nodeids}
        return sum(self.seconds.get(path, TIER_SECONDS[tiers.tier_of(os.path.basename(path))]) for path in files)

    @staticmethod
    def runs_last(nodeids: Iterable[str]) -> bool:
        return any(os.path.basename(file_of(nodeid)) in SHARED_GROUPS for nodeid in nodeids)

    def still_busy(self, node, now: float) -> float:
        """The seconds ``node`` has left, by the estimates, of the units handed to it and not done."""
        undone = [scope for scope, work in self.assigned_work.get(node, {}).items() if not all(work.values())]
        if not undone:
            return 0.0
        began = min(self.handed[(node, scope)][0] for scope in undone)
        return max(0.0, began + sum(self.handed[(node, scope)][1] for scope in undone) - now)

    def _next_unit(self, node) -> Optional[str]:
        """The unit ``node`` runs next: the longest of the others, or a last one when its time has come (None:
        nothing for this worker now)."""
        last = [scope for scope, work in self.workqueue.items() if self.runs_last(work)]
        others = [scope for scope in self.workqueue if scope not in last]
        if last:
            helpers = [peer for peer in self.assigned_work if peer is not node
                       and peer not in self.last_unit_nodes and not peer.shutting_down]
            longest_last = max(last, key=lambda scope: self.cost(self.workqueue[scope]))
            now = time.monotonic()
            left = (sum(self.cost(self.workqueue[scope]) for scope in self.workqueue if scope != longest_last)
                    + sum(self.still_busy(peer, now) for peer in helpers))
            if not others or (helpers and left / len(helpers) <= self.cost(self.workqueue[longest_last])):
                self.last_unit_nodes.add(node)
                return longest_last
        if not others:
            return None
        return max(others, key=lambda scope: self.cost(self.workqueue[scope]))

    def _assign_work_unit(self, node) -> None:
        """xdist's, but for which unit (``_next_unit``)."""
        scope = self._next_unit(node)
        if scope is None:
            return
        work_unit = self.workqueue.pop(scope)
        self.handed[(node, scope)] = (time.monotonic(), self.cost(work_unit))
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        worker_collection = self.registered_collections[node]
        node.send_runtest_some([worker_collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node) -> None:
        """xdist's; a worker that was given a last unit gets nothing more, and ends once it has run it."""
        if node in self.last_unit_nodes:
            if not node.shutting_down:
                node.shutdown()
            return
        super()._reschedule(node)


assert tiers.RAY_DRIVER_FILES <= set(SHARED_GROUPS), "a Ray driver file must be in a shared group to run last"
