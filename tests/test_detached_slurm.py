"""Detached launches on the real two-node Slurm cluster (``slurm_cluster``): a batch job that outlives its kernel.

A first "kernel" (a script, as the launch tests' kernels are) starts three detached jobs — a training that prints
and reports, a failing one, one that holds its ranks — and is SIGKILLed while the first runs. A second kernel
attaches: the lines of every rank (in order), the metrics and the result are those of the same function run attached;
the failing job raises the rank's own exception with its traceback, naming rank and node; the holding job is
cancelled from a handle made from its id (Slurm lists it no more); ``forget()`` leaves no folder.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import slurm_cluster
from resumable_training import TRAIN
from scripts import script_env

pytestmark = [pytest.mark.skipif(slurm_cluster.unavailable() is not None, reason=slurm_cluster.unavailable() or ""),
              pytest.mark.timeout(300)]

COMMON = textwrap.dedent('''
    import json, os, sys, time
    import notebook_accel
    from notebook_accel import report, start_launch

    def train(lines):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        for number in range(lines):
            print(f"line {number} of rank {rank}", flush=True)
            report(step=number, loss=1.0 / (number + 1) + rank)
            time.sleep(0.1)
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        dist.destroy_process_group()
        return {"sum": total.item(), "ranks": dist_world(rank)}

    def dist_world(rank):
        return [rank, os.environ["WORLD_SIZE"]]

    def fail():
        if os.environ["RANK"] == "1":
            raise ValueError("rank one's own error")
        time.sleep(60)

    def hold():
        print("holding", flush=True)
        time.sleep(600)

    options = dict(num_processes=4, num_nodes=2, cluster="slurm", slurm={"time": "00:05:00"})
    two = dict(options, num_processes=2)
''')

STARTER = COMMON + textwrap.dedent('''
    jobs = [start_launch(train, (40,), detach=True, **options).id, start_launch(fail, detach=True, **two).id,
            start_launch(hold, detach=True, **two).id]
    print("JOBS " + json.dumps(jobs), flush=True)
    time.sleep(600)   # the kernel waits on; the test kills it
''')

ATTACHER = COMMON + textwrap.dedent('''
    from notebook_accel import DetachedJob, attach, detached_jobs, last_launch, notebook_launcher
    from notebook_accel.detached.folder import find_job
    from notebook_accel.monitor.metric_log import MetricLog
    from notebook_accel.wire.events import MetricReport
    import subprocess
    trained, failing, holding = json.loads(sys.argv[1])
    report_ = {"listed": sorted(detached_jobs()["id"])}
    print("ATTACHED", flush=True)
    report_["result"] = attach(trained, display="text")
    replayed = MetricLog()
    for event in find_job(trained).read(0)[0]:
        if isinstance(event, MetricReport):
            replayed.add(event)
    report_["metrics"] = sorted((row.rank, row.step, row.name, row.value) for row in replayed.rows())
    try:
        attach(failing, display="none")
    except Exception as error:
        import traceback
        report_["failure"] = {"type": type(error).__name__, "message": str(error), "node": getattr(error, "node", None),
                              "notes": getattr(error, "__notes__", []), "rank": getattr(error, "rank", None),
                              "text": "".join(traceback.format_exception(error))}
    job = DetachedJob(holding)
    slurm_job = find_job(holding).record()["slurm_job"]
    job.cancel()
    report_["after_cancel"] = {"status": job.status, "queue": subprocess.run(
        ["squeue", "-h", "-j", slurm_job, "-o", "%i"], capture_output=True, text=True).stdout.split()}
    if report_["after_cancel"]["queue"]:   # still there: it would hold the nodes the attached run needs
        subprocess.run(["scancel", slurm_job])
        print("REPORT " + json.dumps(report_), flush=True)
        sys.exit(0)
    print("ATTACHED RUN", flush=True)
    report_["attached_result"] = notebook_launcher(train, (40,), display="text", **options)
    report_["attached_metrics"] = sorted((row.rank, row.step, row.name, row.value)
                                         for row in last_launch().metric_log.rows())
    print("END OF RUNS", flush=True)
    folders = [find_job(name).path for name in (trained, failing, holding)]
    for name in (trained, failing, holding):
        DetachedJob(name).forget()
    report_["left"] = [folder for folder in folders if os.path.exists(folder)]
    print("REPORT " + json.dumps(report_), flush=True)
''')


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} after {timeout} s"
        time.sleep(0.2)


def test_a_detached_launch_outlives_its_kernel_and_a_new_kernel_attaches_cancels_and_forgets(slurm, tmp_path):
    env = dict(script_env(), SLURM_CONF=slurm.conf, NOTEBOOK_ACCEL_JOBS=str(tmp_path / "jobs"))
    (tmp_path / "starter.py").write_text(STARTER)
    (tmp_path / "attacher.py").write_text(ATTACHER)
    out = open(tmp_path / "starter.out", "w+")
    starter = subprocess.Popen([sys.executable, str(tmp_path / "starter.py")], env=env, stdout=out,
                               stderr=subprocess.STDOUT, text=True)
    try:
        def said_jobs():
            out.seek(0)
            return [line for line in out.read().splitlines() if line.startswith("JOBS ")]
        wait_for(lambda: said_jobs() or starter.poll() is not None, 60, "the kernel named no jobs")
        assert said_jobs(), open(tmp_path / "starter.out").read()
        jobs = json.loads(said_jobs()[0][len("JOBS "):])
        log = tmp_path / "jobs" / jobs[0] / "events.log"
        wait_for(lambda: log.exists() and b"line 3 of rank" in log.read_bytes(), 90,
                 f"the first job printed nothing: {slurm.jobs()}")
        starter.send_signal(signal.SIGKILL)   # the kernel dies while its job runs
        starter.wait()
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        out.close()
    done = slurm.run([sys.executable, str(tmp_path / "attacher.py"), json.dumps(jobs)], env=env, timeout=240)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{slurm.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert report["after_cancel"] == {"status": "stopped", "queue": []}, report["after_cancel"]
    assert report["listed"] == sorted(jobs)
    # The lines and metrics of the detached run, replayed and then followed, are the attached run's.
    detached_part, attached_part = done.stdout.split("ATTACHED RUN", 1)
    for rank in range(4):
        expected = [f"[rank {rank}] line {number} of rank {rank}" for number in range(40)]
        assert [line for line in detached_part.splitlines() if line.startswith(f"[rank {rank}] line ")] == expected
        assert [line for line in attached_part.splitlines() if line.startswith(f"[rank {rank}] line ")] == expected
    assert report["result"] == report["attached_result"] == {"sum": 10.0, "ranks": [0, "4"]}
    assert report["metrics"] == report["attached_metrics"] and len(report["metrics"]) == 4 * 40
    # The failing job: the rank's own exception, its traceback, rank and node named.
    failure = report["failure"]
    assert failure["type"] == "ValueError" and "rank one's own error" in failure["message"], failure
    assert failure["rank"] == 1 and failure["node"] == slurm.nodes[1], failure
    assert 'raise ValueError("rank one\'s own error")' in failure["text"] and "[rank 1]" in failure["text"], failure
    # The cancelled job is gone from Slurm (above), and forget() left nothing.
    assert report["left"] == [] and os.listdir(tmp_path / "jobs") == []
    assert slurm.wait_no_jobs(timeout=30) == []


# ------------------------------------------------------------------------------------- requeue and resume

RESUMING = TRAIN + textwrap.dedent('''
    import json, os, sys
    from notebook_accel import attach, notebook_launcher, start_launch

    folder = sys.argv[1]
    options = dict(num_processes=2, num_nodes=2, cluster="slurm", slurm={"time": "00:05:00"})
    job = start_launch(train, (folder + "/cut", 150, 0.05), detach=True, **options)
    print("JOB " + job.id, flush=True)
    report = {"detached": attach(job.id, display="text")}
    # the uninterrupted run on two local ranks: the same gloo all-reduce of the same gradients, without a job to wait for
    report["whole"] = notebook_launcher(train, (folder + "/whole", 150, 0.0), num_processes=2, display="none")
    report["checkpoints"] = sorted(os.listdir(folder + "/cut/checkpoints"))
    job.forget()
    print("REPORT " + json.dumps(report), flush=True)
''')


# How the job learns it must stop: the warning before a time limit or a preemption (Slurm's ``--signal=USR2@N``; sent
# here by hand, as ``scancel --signal=USR2`` does: the driver requeues the job), or a preemption itself (``scontrol
# requeue`` from outside: Slurm's SIGTERM, KillWait = 2 s before SIGKILL here, and Slurm requeues the job).
STOPPERS = {"warning": ["scancel", "--signal=USR2"], "preemption": ["scontrol", "requeue"]}


@pytest.mark.parametrize("how", sorted(STOPPERS))
def test_a_warned_or_preempted_detached_job_checkpoints_requeues_and_resumes_to_the_weights_of_an_uninterrupted_run(
        slurm, tmp_path, how):
    """The ranks checkpoint at an agreed step, the job is requeued, the restarted job resumes from the checkpoint, and
    the attached kernel sees one launch to its end."""
    env = dict(script_env(), SLURM_CONF=slurm.conf, NOTEBOOK_ACCEL_JOBS=str(tmp_path / "jobs"))
    (tmp_path / "kernel.py").write_text(RESUMING)
    out = open(tmp_path / "kernel.out", "w+")
    kernel = subprocess.Popen([sys.executable, str(tmp_path / "kernel.py"), str(tmp_path)], env=env, stdout=out,
                              stderr=subprocess.STDOUT, text=True)
    try:
        def output():
            out.seek(0)
            return out.read()
        wait_for(lambda: "JOB " in output() or kernel.poll() is not None, 60, "the kernel named no job")
        job_id = output().split("JOB ", 1)[1].split()[0]
        record = json.loads((tmp_path / "jobs" / job_id / "record.json").read_text())
        slurm_job = record["slurm_job"]
        wait_for(lambda: "] step 40" in output() or kernel.poll() is not None, 90, "the job never reached step 40")
        warned = slurm.run(STOPPERS[how] + [slurm_job])
        assert warned.returncode == 0, warned.stderr

        pending_since = []

        def requeued_and_pending():   # a requeued job waits for its old credentials to expire (120 s): not here
            state = slurm.run(["squeue", "-h", "-j", slurm_job, "-o", "%T %r"]).stdout.split()
            if state[:2] == ["PENDING", "BeginTime"]:
                # not at once: slurmd refuses a batch launch whose credential dates from the second the requeue revoked
                # the old one ("Job 1 already killed, do not launch batch job": the job then ends FAILED, 1 run in 3)
                pending_since[:] = pending_since or [time.monotonic()]
                if time.monotonic() - pending_since[0] < 2.0:
                    return False
                slurm.run(["scontrol", "update", f"JobId={slurm_job}", "StartTime=now"])
                return True
            return "resumed at step" in output() or kernel.poll() is not None
        wait_for(requeued_and_pending, 90, f"the job was not requeued: {slurm.jobs()}\n{output()[-3000:]}")
        kernel.wait(timeout=180)
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()
        out.close()
    said = open(tmp_path / "kernel.out").read()
    driver_log = next(iter((tmp_path / "jobs").glob("*/driver.log")), None)
    said += f"\n--- the driver's log (both runs of the batch job)\n{driver_log.read_text()[-4000:] if driver_log else '(none)'}"
    reports = [line for line in said.splitlines() if line.startswith("REPORT ")]
    assert reports, f"{said[-8000:]}\n{slurm.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert "time limit reached at step" in said, said[-8000:]
    assert ("is requeued" if how == "warning" else "the ranks checkpoint at their next agreed step") in said, \
        said[-4000:]
    assert "resumed at step" in said, said[-4000:]
    assert report["checkpoints"] == ["checkpoint_0"], report
    assert report["detached"] == report["whole"], report
    assert slurm.wait_no_jobs(timeout=30) == []
