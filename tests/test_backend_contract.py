"""One contract, every backend: what ``Backend.run`` must do, checked the same way for each way ranks start.

Each case drives a backend directly (``backend_for(plan).run(env, sink)``) with a sink that records every
event, so what is checked is the backend itself, not the launcher around it. Every line of the backends' table
(``backends.BACKENDS``) has a case here (a test fails for a line without one): a new backend adds its case and passes
this file. The Ray case runs these same tests from ``tests/test_ray_cluster.py``, on its fake two-node cluster (a
file whose tests make pytest's process a Ray driver, after which this file's fork cases would be refused); the Slurm
case from ``tests/test_slurm_launch.py``, on its real Slurm cluster (root, network namespaces, a slurmd per node:
made once for that file, and skipped where Slurm's packages are missing).

The "relayed" case is a backend the package does not have: ``tests/relayed_local`` (local processes driven through
the relayed base as a cluster's ranks would be) registers its planner row and its ``BACKENDS`` line for the case's
tests only. It passing every check here, with no edit to the package, is what "a new backend is a site, a planner, a
folder and a line" means (docs/architecture.md).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

import pytest
import relayed_local

from notebook_accel.backends import LaunchSink, backend_for
from notebook_accel.wire.events import (OutputLine, OutputLines, ProgressUpdate, RankEvent, RankExited, RankFailed,
                                        RankStarted)
from notebook_accel.outcome.root_cause import Outcome
from notebook_accel.plan.plan import plan_launch

pytestmark = pytest.mark.timeout(120)

# case name -> (launch options, the backend it must pick)
CASES: Dict[str, Tuple[Dict[str, Any], str]] = {
    "inline": ({"num_processes": 1}, "inline"),
    "fork": ({"num_processes": 2, "start_method": "fork"}, "processes"),
    "forkserver": ({"num_processes": 2, "start_method": "forkserver"}, "processes"),
    "spawn": ({"num_processes": 2, "start_method": "spawn"}, "processes"),
    # A fake 2-chip TPU host (tests/fake_tpu.py; no TPU here): two xmp.spawn workers of one device each.
    "xla": ({"device": "xla"}, "xla"),
    # One node with a restart: the nodes backend (a local store, no rendezvous to meet), each failure run twice.
    "nodes": ({"num_processes": 2, "device": "cpu", "max_restarts": 1}, "nodes"),
    # Ray actors on tests/test_ray_cluster.py's fake cluster (run from there: see the module docstring).
    "ray": ({"num_processes": 2, "cluster": "ray"}, "ray"),
    # A job step over tests/test_slurm_launch.py's two Slurm nodes, in a job each launch asks for and gives back.
    "slurm": ({"num_processes": 2, "num_nodes": 2, "cluster": "slurm"}, "slurm"),
    # The tests' own relayed backend (tests/relayed_local), registered while its case runs (see the module docstring).
    "relayed": ({"num_processes": 2, "cluster": relayed_local.NAME}, relayed_local.NAME),
}
# Cases whose backend only the tests have: registered around each of their tests, never in the package's table.
REGISTERED_BY_THE_TESTS = {"relayed": relayed_local.registered}
# Cases run from the file that has their cluster (see the module docstring).
RUN_FROM_THE_CLUSTER_TESTS = {"ray": "tests/test_ray_cluster.py", "slurm": "tests/test_slurm_launch.py"}
# Seconds a case's ranks may take to start (Ray places and starts an actor per rank: over a minute on a busy 2-core
# machine); added to the timeout, the ranks' sleep and the hang bounds. Such a case is stopped once every rank said
# it is ready, not after a fixed delay.
# A Slurm case waits for its job (salloc) and its step's tasks on both nodes: tens of seconds on this machine.
# The relayed case starts a launcher, then a Python per rank that imports the rank side before it says hello.
START_ALLOWANCE = {"ray": 120.0, "slurm": 90.0, "relayed": 60.0}
# How long a case took to start in this process (the longest seen): a quick launch from its start to its end, or a
# launch stopped once ready from its start to the last rank's "ready". Its timeout test allows a multiple of it,
# within START_ALLOWANCE, instead of waiting out the whole allowance on a machine where starts are quick.
QUICK_RUNS: Dict[str, float] = {}


def start_allowance(case: str) -> float:
    """The seconds a case's ranks may take to start: START_ALLOWANCE, or twice its longest start seen here plus 5 s
    when that is less (the timeout must not fire before every rank runs). The starts are measured in this process,
    seconds before, on the same machine under the same load; a quick launch's time holds a start and more (the run,
    the ranks' ends). Three times plus 15 s waited out 25-35 s per cluster case (a start takes 2-5 s there)."""
    most = START_ALLOWANCE.get(case, 0.0)
    seen = QUICK_RUNS.get(case)
    return most if seen is None else min(most, 2 * seen + 5.0)
HERE = [case for case in CASES if case not in RUN_FROM_THE_CLUSTER_TESTS]


def checks_with_a_case() -> list:
    """The names of this file's tests that take a ``case`` (what a file running a cluster's case runs)."""
    import inspect

    return sorted(name for name, test in globals().items() if name.startswith("test_") and callable(test)
                  and "case" in inspect.signature(test).parameters)


@pytest.fixture(autouse=True)
def fake_tpu_for_the_xla_case(request, monkeypatch, tmp_path):
    if getattr(request.node, "callspec", None) and request.node.callspec.params.get("case") == "xla":
        from fake_tpu import become_tpu_host

        become_tpu_host(monkeypatch, str(tmp_path / "sysfs"), "v5e-2")


@pytest.fixture(autouse=True)
def register_the_tests_own_backend(request):
    """A case of ``REGISTERED_BY_THE_TESTS``: its backend in the tables, and (its ranks being a cluster's, which
    cannot import a test module) this file's functions sent by value."""
    case = request.node.callspec.params.get("case") if getattr(request.node, "callspec", None) else None
    if case not in REGISTERED_BY_THE_TESTS:
        yield
        return
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with REGISTERED_BY_THE_TESTS[case]():
            yield
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def run_case(case: str, function: Callable, args: tuple = (), *, stop_after: float = 0.0,
             stop_when_ready: bool = False, **options: Any) -> Tuple[Outcome, List[RankEvent], int]:
    """Run ``function`` on the case's backend; return its outcome, every event it delivered, the world size.
    ``stop_after``: press Stop that many seconds after the start; ``stop_when_ready``: once every rank printed
    "ready RANK" (``sleeps_for_ever``)."""
    launch_options, expected_backend = CASES[case]
    plan = plan_launch(function, args, display="none", **launch_options, **options)
    assert plan.backend == expected_backend
    backend = backend_for(plan)
    recorded: List[str] = []  # the "ready RANK" lines seen
    stop = threading.Event()

    class Events(list):
        def append(self, event: RankEvent) -> None:
            super().append(event)
            ready = {line.text for line in of_type([event], OutputLine)}
            recorded.extend(text for text in ready if text.startswith("ready "))
            if stop_when_ready and len(set(recorded)) == plan.world_size and not stop.is_set():
                QUICK_RUNS[case] = max(QUICK_RUNS.get(case, 0.0), time.monotonic() - began)   # a start: to ready
                stop.set()

    events: List[RankEvent] = Events()
    timer = threading.Timer(stop_after, stop.set) if stop_after else None
    store = backend.open_rendezvous()
    began = time.monotonic()
    try:
        if timer:
            timer.start()
        outcome = backend.run(store.env(), LaunchSink(events.append, lambda: None, stop))
    finally:
        if timer:
            timer.cancel()
        store.close()
    if outcome.status == "finished" and function in (rank_times_ten, prints_and_counts):   # quick ones: a start
        QUICK_RUNS[case] = max(QUICK_RUNS.get(case, 0.0), time.monotonic() - began)
    return outcome, events, plan.world_size


def of_type(events: List[RankEvent], kind: type) -> List[Any]:
    if kind is OutputLine:  # the supervisor sends a read's lines as one OutputLines: line by line here
        events = [line for event in events for line in (
            [OutputLine(rank=event.rank, stream=event.stream, text=text) for text in event.lines]
            if isinstance(event, OutputLines) else [event])]
    return [event for event in events if isinstance(event, kind)]


# ----------------------------------------------------------------------------------- launched functions

def rank_times_ten():
    return int(os.environ["RANK"]) * 10 + int(os.environ["WORLD_SIZE"])


def last_rank_raises():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == world - 1:
        raise ValueError(f"boom in rank {rank}")
    time.sleep(60)  # a peer that would block for ever: the backend must stop it


def sleeps_for_ever(seconds=60):
    print(f"ready {os.environ['RANK']}", flush=True)
    time.sleep(seconds)


def prints_and_counts(total):
    from tqdm.auto import tqdm

    rank = os.environ["RANK"]
    print(f"hello from {rank}")
    os.write(2, f"fd-level {rank}\n".encode())
    for _ in tqdm(range(total), desc=f"loop {rank}"):
        pass
    return rank


# ----------------------------------------------------------------------------------------------- tests

def test_every_line_of_the_backends_table_has_a_case():
    from notebook_accel.backends import BACKENDS

    theirs = {CASES[case][1] for case in REGISTERED_BY_THE_TESTS}
    assert not theirs & set(BACKENDS), "the tests' own backends are in the table only while their cases run"
    assert {backend for _, backend in CASES.values()} == set(BACKENDS) | theirs


@pytest.mark.parametrize("case", HERE)
def test_result_of_rank0_and_of_every_rank_on_request(case):
    outcome, events, world = run_case(case, rank_times_ten)
    assert outcome.status == "finished" and outcome.root is None
    assert outcome.results[0] == world
    outcome, events, world = run_case(case, rank_times_ten, return_all=True)
    assert [outcome.results[rank] for rank in range(world)] == [rank * 10 + world for rank in range(world)]
    assert sorted(event.rank for event in of_type(events, RankStarted)) == list(range(world))
    exits = of_type(events, RankExited)
    assert sorted(event.rank for event in exits) == list(range(world))
    assert all(event.exitcode == 0 and not event.stopped for event in exits)


@pytest.mark.parametrize("case", HERE)
def test_root_cause_is_the_rank_that_raised_and_its_peers_are_stopped(case):
    started = time.monotonic()
    outcome, events, world = run_case(case, last_rank_raises)
    assert outcome.status == "failed", outcome
    assert outcome.root.rank == world - 1
    assert outcome.root.event.exc_type == "builtins.ValueError"
    assert f"boom in rank {world - 1}" in outcome.root.event.traceback
    attempts = 1 + CASES[case][0].get("max_restarts", 0)  # a failure is restarted while restarts are left
    assert [event.rank for event in of_type(events, RankFailed)] == [world - 1] * attempts
    assert time.monotonic() - started < 40 + START_ALLOWANCE.get(case, 0.0), "the blocked peers were not stopped"
    stopped = {event.rank for event in of_type(events, RankExited) if event.stopped}
    # The rank that raised is not among the stopped, even when it was still exiting as the stop began (seen on a
    # loaded machine, nodes and fork alike): it ended on its own.
    assert stopped == set(range(world - 1))


@pytest.mark.parametrize("case", HERE)
def test_stop_requested_stops_every_rank(case):
    started = time.monotonic()
    allowance = START_ALLOWANCE.get(case, 0.0)
    outcome, events, world = run_case(case, sleeps_for_ever, (60 + allowance,), stop_after=0.0 if allowance else 3.0,
                                      stop_when_ready=bool(allowance))
    assert time.monotonic() - started < 40 + allowance, "the ranks were not stopped (they sleep for 60 s)"
    assert outcome.status == "stopped"
    assert sorted(outcome.still_running) == list(range(world))
    assert all(event.stopped for event in of_type(events, RankExited))


def test_stop_interrupts_the_inline_rank_in_a_process_started_with_sigint_ignored():
    """A script started in the background by a shell without job control (``python train.py &``) ignores SIGINT
    from its start; the in-process rank must still be stopped in its blocking sleep, and the ignore stays."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = time.monotonic()
        outcome, _, _ = run_case("inline", sleeps_for_ever, stop_after=2.0)
        assert time.monotonic() - started < 40, "the rank was not stopped (it sleeps for 60 s)"
        assert outcome.status == "stopped"
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # the process's own choice, put back
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("case", HERE)
def test_timeout_stops_every_rank(case):
    if case in START_ALLOWANCE and case not in QUICK_RUNS:  # run alone, or on an xdist worker that saw no quick one:
        run_case(case, rank_times_ten)                       # one start measured beats waiting out the allowance
    started = time.monotonic()
    allowance = start_allowance(case)
    outcome, events, world = run_case(case, sleeps_for_ever, (60 + allowance,), timeout=3.0 + allowance)
    assert time.monotonic() - started < 40 + allowance, "the ranks were not stopped (they sleep for 60 s)"
    assert outcome.status == "timeout"
    assert sorted(outcome.still_running) == list(range(world))


@pytest.mark.parametrize("case", HERE)
def test_output_is_labelled_by_rank_and_progress_reported(case):
    outcome, events, world = run_case(case, prints_and_counts, (500,), return_all=True)
    assert outcome.status == "finished"
    lines = of_type(events, OutputLine)
    for rank in range(world):
        mine = [(line.stream, line.text) for line in lines if line.rank == rank]
        assert ("stdout", f"hello from {rank}") in mine
        assert ("stderr", f"fd-level {rank}") in mine
        bars = [update for update in of_type(events, ProgressUpdate) if update.rank == rank]
        assert bars and bars[-1].closed and bars[-1].n == 500 and bars[-1].desc == f"loop {rank}"



def naps():
    for _ in range(6000):  # Python between the sleeps: an interrupt raised in the rank's thread lands there
        time.sleep(0.1)


def test_the_tests_own_relayed_backend_keeps_a_sessions_ranks_warm():
    """Its ``BACKENDS`` line names a ``relay.RelayedWarmRanks`` too: a ``Session`` there keeps each rank's namespace
    across runs, interrupts a run, and ends every task at ``close``."""
    import cloudpickle

    from notebook_accel import Session
    from notebook_accel.errors import LaunchTimeout

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with relayed_local.registered():
            with Session(num_processes=2, cluster=relayed_local.NAME, display="none") as session:
                assert session.run(rank_times_ten, return_all=True) == [2, 12]
                session.push(kept=5)
                session.execute("import os; kept = kept * 10 + int(os.environ['RANK'])")
                # a timeout interrupts the ranks through the transport: they stay, and so does their state
                with pytest.raises(LaunchTimeout):
                    session.run(naps, timeout=3.0)
                assert session.pull("kept") == [50, 51] and session.restarts == 0
                pids = dict(session._ranks.pids)
            assert session._ranks is None or not session._ranks.handles
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
