"""Detached launches on Ray (``start_launch(..., cluster="ray", detach=True)``), on the run's fake two-node cluster
(``shared_clusters.fake_ray``): the launch runs in a detached driver actor, so a kernel SIGKILLed mid-run leaves it
running; a new kernel attaches by id and gets every rank's lines, metrics and the result exactly as an attached run
gave them; a reattached handle cancels it (its rank actors end), ``forget()`` removes the driver actor, and a failing
job's ``attach`` raises the rank's own exception with its traceback.

Kernels are scripts in subprocesses (their functions in ``__main__`` as a notebook's), connected to
the cluster with ``ray.init(address=...)``, as the other Ray tests' kernels are.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from notebook_accel import start_launch
from notebook_accel.wire.events import MetricReport, OutputLine
from ray_cluster import _children, command_line, leftovers
from scripts import Recorder, script_env
from waiting import wait_until

pytestmark = pytest.mark.timeout(900)

DRIVER_TITLE = "ray::JobDriver"   # the process title Ray gives a detached launch's driver actor

# The launched function, as a notebook cell defines it (the kernel scripts and this module share its text).
WORK = '''
def work(ready, go, fail=False):
    import os
    import time

    from notebook_accel import progress, report

    rank = int(os.environ["RANK"])
    for step in progress(range(3), desc="before"):
        print(f"rank {rank} step {step} before", flush=True)
        report(step=step, loss=float(rank * 10 + step))
    open(f"{ready}.{rank}", "w").close()
    while not os.path.exists(go):  # the test kills the kernel meanwhile, then lets the ranks go on
        time.sleep(0.05)
    for step in range(3, 6):
        print(f"rank {rank} step {step} after", flush=True)
        report(step=step, loss=float(rank * 10 + step))
    if fail and rank == 1:
        raise ValueError(f"rank {rank} gave up after step {step}")
    return {"rank": rank, "steps": 6}


def wait_here(ready):
    import os
    import time

    open(f"{ready}.{os.environ['RANK']}", "w").close()
    while True:
        time.sleep(0.05)
'''
namespace = {"__name__": "__main__"}
exec(compile(WORK, "/notebook/detached-cell.py", "exec"), namespace)
work = namespace["work"]
CELL_WAIT_HERE = namespace["wait_here"]

CONNECT = """
import json
import os
import sys

import ray

ray.init(address=os.environ["RAY_ADDRESS"])
"""

START = CONNECT + WORK + """
from notebook_accel import start_launch

job = start_launch(FUNCTION, args=ARGS, num_processes=2, cluster="ray", placement="STRICT_SPREAD", return_all=True,
                   detach=True)
print("JOB", job.id, flush=True)
import time
time.sleep(600)   # a kernel that sits idle until it is culled (here: SIGKILLed by the test)
"""

ATTACH = CONNECT + """
import notebook_accel
from notebook_accel.wire.events import MetricReport, OutputLines

job = notebook_accel.DetachedJob(sys.argv[1])
try:
    result, error = notebook_accel.attach(sys.argv[1], display="none"), None
except Exception as raised:
    result, error = None, {"type": type(raised).__name__, "message": str(raised), "cause": str(raised.__cause__),
                           "rank": getattr(raised, "rank", None)}
events, ending = job.source.read(0)
lines = {}
for event in events:
    if isinstance(event, OutputLines):
        lines.setdefault(str(event.rank), []).extend(event.lines)
metrics = [[event.rank, step, name, value] for event in events if isinstance(event, MetricReport)
           for step, _, _, values in event.calls() for name, value in sorted(values.items())]
print("ATTACHED " + json.dumps({"result": result, "error": error, "lines": lines, "metrics": metrics}), flush=True)
"""


@pytest.fixture
def ray(fake_ray):
    """The connected ``ray`` module; after the test, no detached job, driver, rank actor or placement group is left."""
    yield fake_ray.ray
    from notebook_accel.backends.ray.detached import jobs

    for source in jobs():  # a test that failed before forgetting its job
        source.forget()
    assert leftovers(fake_ray.ray) == []
    wait_until(lambda: not driver_processes(), timeout=60, what="the driver actors to end", interval=0.2)


def driver_processes():
    return [process for process in _children(psutil.Process()) if DRIVER_TITLE in command_line(process)
            and _alive(process)]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kernel_env(cluster) -> dict:
    return dict(script_env(), RAY_ADDRESS=cluster.cluster.address)


def start_detached_kernel(cluster, tmp_path, function: str, args: str) -> tuple:
    """A kernel script that starts a detached launch and idles; (its process, the job's id)."""
    script = tmp_path / "kernel.py"  # a file, as a notebook's cells are to linecache: tracebacks quote its lines
    script.write_text(START.replace("FUNCTION", function).replace("ARGS", args))
    kernel = subprocess.Popen([sys.executable, str(script)],
                              env=kernel_env(cluster), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = kernel.stdout.readline()
    if not line.startswith("JOB "):
        kernel.kill()
        raise AssertionError(f"the kernel did not start its job: {line}{kernel.communicate(timeout=60)}")
    return kernel, line.split()[1]


def kill_kernel(kernel: subprocess.Popen) -> None:
    kernel.send_signal(signal.SIGKILL)  # no atexit, no cleanup: as a culled kernel or a crashed laptop
    kernel.communicate(timeout=60)


def attach_from_a_new_kernel(cluster, tmp_path, job_id: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(ATTACH), job_id], env=kernel_env(cluster),
                          cwd=str(tmp_path), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    found = [line for line in done.stdout.splitlines() if line.startswith("ATTACHED ")]
    assert done.returncode == 0 and found, done.stdout + done.stderr
    return json.loads(found[0][len("ATTACHED "):])


def wait_for_ranks(ready: str) -> None:
    wait_until(lambda: all(os.path.exists(f"{ready}.{rank}") for rank in (0, 1)), timeout=300, what="both ranks")


# ---------------------------------------------------------------------------------------------------- tests

def test_a_detached_launch_outlives_its_kernel_and_a_new_kernel_gets_what_an_attached_run_got(ray, cluster_of,
                                                                                                tmp_path):
    # the attached run, for comparison
    go = tmp_path / "go"
    go.touch()
    recorder = Recorder()
    attached = start_launch(work, args=(str(tmp_path / "attached"), str(go)), num_processes=2, cluster="ray",
                            placement="STRICT_SPREAD", return_all=True, display="none", view=recorder).wait(600)
    lines = {str(rank): [event.text for event in recorder.of(OutputLine) if event.rank == rank] for rank in (0, 1)}
    metrics = [[event.rank, step, name, value] for event in recorder.of(MetricReport)
               for step, _, _, values in event.calls() for name, value in sorted(values.items())]

    ready, go = str(tmp_path / "ready"), tmp_path / "go-detached"
    kernel, job_id = start_detached_kernel(cluster_of, tmp_path, "work", f"({ready!r}, {str(go)!r})")
    wait_for_ranks(ready)
    kill_kernel(kernel)
    go.touch()  # the ranks go on without any kernel: what they do now is kept by the driver alone
    seen = attach_from_a_new_kernel(cluster_of, tmp_path, job_id)
    assert seen["error"] is None, seen["error"]
    assert seen["result"] == attached
    assert seen["lines"] == lines
    assert sorted(seen["metrics"]) == sorted(metrics)

    from notebook_accel import DetachedJob, detached_jobs

    job = DetachedJob(job_id)
    assert job.status == "finished"
    assert job_id in _ids(detached_jobs())
    job.forget()
    assert job_id not in _ids(detached_jobs())
    wait_until(lambda: not driver_processes(), timeout=60, what="the driver actor to end")


def test_a_detached_job_cancelled_from_a_reattached_handle_ends_its_actors(ray, cluster_of, tmp_path):
    from notebook_accel import DetachedJob

    ready = str(tmp_path / "ready")
    kernel, job_id = start_detached_kernel(cluster_of, tmp_path, "wait_here", f"({ready!r},)")
    wait_for_ranks(ready)
    kill_kernel(kernel)
    job = DetachedJob(job_id)   # this process is the new kernel
    assert job.status == "running"
    job.cancel()
    assert job.status == "stopped"
    assert leftovers(ray) == []  # its rank actors and placement group are gone
    with pytest.raises(KeyboardInterrupt):
        job.wait(60)
    job.forget()
    wait_until(lambda: not driver_processes(), timeout=60, what="the driver actor to end")
    with pytest.raises(LookupError, match=f"no detached Ray job '{job_id}'"):
        DetachedJob(job_id).status


def test_a_failing_detached_jobs_attach_raises_the_ranks_own_exception(ray, cluster_of, tmp_path):
    go = tmp_path / "go"
    go.touch()
    ready = str(tmp_path / "ready")
    kernel, job_id = start_detached_kernel(cluster_of, tmp_path, "work", f"({ready!r}, {str(go)!r}, True)")
    wait_for_ranks(ready)
    kill_kernel(kernel)
    seen = attach_from_a_new_kernel(cluster_of, tmp_path, job_id)
    error = seen["error"]
    assert error["type"] == "ValueError" and error["message"].startswith("rank 1 gave up after step 5"), error
    assert error["rank"] == 1
    assert "[rank 1]" in error["cause"] and 'raise ValueError(f"rank {rank} gave up' in error["cause"], error
    from notebook_accel import DetachedJob

    DetachedJob(job_id).forget()


@pytest.fixture
def cluster_of(fake_ray):
    return fake_ray


def _ids(listing) -> list:
    rows = listing.to_dict("records") if hasattr(listing, "to_dict") else listing
    return [row["id"] for row in rows]


def test_a_detached_launch_the_cluster_cannot_hold_is_refused_in_the_cell_and_leaves_no_driver(ray):
    from notebook_accel.backends.ray.detached import jobs
    from notebook_accel.errors import LaunchConfigError

    with pytest.raises(LaunchConfigError, match="STRICT_SPREAD needs 3 different nodes"):
        start_launch(work, args=("", ""), num_processes=3, cluster="ray", placement="STRICT_SPREAD", detach=True)
    assert jobs() == []


def test_a_detached_job_whose_driver_dies_is_attached_as_lost_and_its_ranks_end_with_it(ray, tmp_path):
    from notebook_accel import attach
    from notebook_accel.errors import LaunchError

    ready = str(tmp_path / "ready")
    job = start_launch(CELL_WAIT_HERE, args=(ready,), num_processes=2, cluster="ray", detach=True)
    wait_for_ranks(ready)
    (driver,) = driver_processes()
    driver.kill()  # as a lost node takes it
    with pytest.raises(LaunchError, match="ended without recording how"):
        attach(job.id, display="none")
    assert leftovers(ray) == []  # Ray ended the rank actors and the placement group the driver had made
    job.forget()


def test_the_driver_keeps_a_ranks_memory_samples_sparsely_and_every_other_event(monkeypatch):
    """No cluster: the driver as plain Python. A day of samples at one a second would fill its memory."""
    from notebook_accel.backends.ray import detached
    from notebook_accel.wire.events import ResourceSample

    clock = [1000.0]
    monkeypatch.setattr(detached, "_now", lambda: clock[0])
    driver = detached.JobDriver({"id": "ray-x"})
    for second in range(12):
        for rank in (0, 1):
            driver.append(ResourceSample(rank=rank, rss=second))
        driver.append(OutputLine(rank=0, stream="stdout", text=f"line {second}"))
        clock[0] += 1.0
    events, ending = driver.read(0, wait=0)
    assert ending is None
    assert [event.text for event in events if isinstance(event, OutputLine)] == [f"line {n}" for n in range(12)]
    assert [(event.rank, event.rss) for event in events if isinstance(event, ResourceSample)] == \
        [(0, 0), (1, 0), (0, 5), (1, 5), (0, 10), (1, 10)]
