"""``sweep(..., cluster="slurm")`` from outside an allocation, on the real two-node Slurm (``slurm_cluster``): ONE job
array, ``max_concurrent`` tasks at a time, each task a trial's launch (its ranks a step of that task's job), every
trial's result or root cause back through the shared file system, and a stop that cancels the array.

The "kernel" is a script run from the login node (as a notebook on a login node): four sweeps, and what ``squeue``
showed meanwhile, in one report — one run for the module keeps it short on a loaded machine. Inside an allocation
(a script under ``salloc``), a sweep's trials are steps of that job instead, no array.
"""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

import slurm_cluster
from scripts import script_env

pytestmark = [pytest.mark.skipif(slurm_cluster.unavailable() is not None, reason=slurm_cluster.unavailable() or ""),
              pytest.mark.timeout(400)]

KERNEL = textwrap.dedent('''
    import json, os, subprocess, sys, threading, time
    import notebook_accel
    from notebook_accel import last_sweep, sweep

    report = {"queue": []}

    def give_up(why):   # a break that would hang the script: say it, cancel ours, end at once
        report["broken"] = why
        print("REPORT " + json.dumps(report), flush=True)
        subprocess.run(["scancel", "--user", str(os.getuid())])
        os._exit(0)

    def bounded(what, seconds):
        timer = threading.Timer(seconds, give_up, (f"{what} had not returned after {seconds} s",))
        timer.daemon = True
        timer.start()
        return timer

    def watch_queue():   # every task of ours squeue lists: (array job id, task id, state)
        while True:
            listed = subprocess.run(["squeue", "-h", "-r", "-o", "%%F %%K %%T"], capture_output=True, text=True)
            report["queue"].append([line.split() for line in listed.stdout.splitlines() if line.strip()])
            time.sleep(0.3)

    threading.Thread(target=watch_queue, daemon=True).start()

    def trial(config):
        import os, time, torch.distributed as dist
        dist.init_process_group("gloo")
        started = time.time()
        meet = os.environ["SWEEP_TEST_MEET"]   # two trials wait for each other (20 s at most: one at a time)
        open(os.path.join(meet, f"started.{config}.{dist.get_rank()}"), "w").close()
        deadline = time.time() + 20
        while len([name for name in os.listdir(meet) if name.endswith(".0")]) < 2 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1)
        if config == 2 and dist.get_rank() == dist.get_world_size() - 1:
            raise ValueError(f"bad config {config} on rank {dist.get_rank()}")
        dist.barrier()
        dist.destroy_process_group()
        return {"config": config, "array": os.environ["SLURM_ARRAY_JOB_ID"], "task": os.environ["SLURM_ARRAY_TASK_ID"],
                "node": os.environ["SLURMD_NODENAME"], "started": started, "ended": time.time()}

    # One rank per trial: the cluster (2 nodes of 2 CPUs) holds 4 such tasks at once, so only the array's own
    # limit (%%2) keeps it at 2. The errors="raise" sweep spans both nodes (its rank 1 fails on the second).
    options = dict(num_processes=1, cluster="slurm", slurm={"partition": "debug", "time": "00:05:00"}, display="text")
    two_nodes = dict(options, num_processes=2, num_nodes=2)

    bound = bounded("the sweep of 4 (errors='return')", 240)
    results = sweep(trial, [0, 1, 2, 3], max_concurrent=2, errors="return", **options)
    bound.cancel()
    report["returned"] = [{"error": type(item).__name__, "message": str(item)} if isinstance(item, BaseException)
                          else item for item in results]
    report["states"] = [trial.state for trial in last_sweep().trials]
    report["queue_after_return"] = subprocess.run(["squeue", "-h", "-o", "%%i"], capture_output=True,
                                                  text=True).stdout.split()

    bound = bounded("the sweep of 2 (errors='raise')", 180)
    try:
        sweep(trial, [1, 2], max_concurrent=2, **two_nodes)
        report["raised"] = None
    except Exception as error:
        import traceback
        report["raised"] = {"type": type(error).__name__, "message": str(error),
                            "notes": getattr(error, "__notes__", []),
                            "traceback": "".join(traceback.format_exception(error))}
    bound.cancel()
    report["results_after_raise"] = [trial.result["config"] if trial.result else None
                                     for trial in last_sweep().trials]

    def sleepy(config):
        import time
        time.sleep(300)

    def stop_when_running():
        deadline = time.time() + 120
        while time.time() < deadline:
            sweeping = last_sweep()
            if sweeping is not None and getattr(sweeping, "array_id", None) and \\
                    any(trial.state == "running" for trial in sweeping.trials):
                report["stopped_array"] = sweeping.array_id
                sweeping.stop()
                return
            time.sleep(0.2)

    notebook_accel.sweeps._last_sweep = None
    threading.Thread(target=stop_when_running, daemon=True).start()
    bound = bounded("the stopped sweep", 180)
    try:
        sweep(sleepy, [0, 1, 2], max_concurrent=2, **options)
    except KeyboardInterrupt as interrupted:
        report["interrupted"] = str(interrupted)
    bound.cancel()
    report["stopped_states"] = [trial.state for trial in last_sweep().trials]
    report["queue_after_stop"] = subprocess.run(["squeue", "-h", "-o", "%%i %%T"], capture_output=True,
                                                text=True).stdout.splitlines()

    def sleep_unless_one(config):
        import os, time
        if config == 0:
            open(os.path.join(os.environ["SWEEP_TEST_MEET"], "sleeping"), "w").close()
            time.sleep(300)
        return config

    def cancel_task_0():   # someone else's scancel of one array task (or a node lost): its trial ends, the call returns
        deadline = time.time() + 120
        while time.time() < deadline:
            sweeping = last_sweep()
            # once its function runs (cancelled while its driver still starts, it would end without a word: lost)
            if sweeping is not None and getattr(sweeping, "array_id", None) and \
                    os.path.exists(os.path.join(os.environ["SWEEP_TEST_MEET"], "sleeping")):
                subprocess.run(["scancel", f"{sweeping.array_id}_0"])
                return
            time.sleep(0.2)

    notebook_accel.sweeps._last_sweep = None
    threading.Thread(target=cancel_task_0, daemon=True).start()
    bound = bounded("the sweep whose task 0 was cancelled by someone else", 150)
    results = sweep(sleep_unless_one, [0, 1], max_concurrent=2, errors="return", **options)
    bound.cancel()
    report["one_cancelled"] = {"states": [trial.state for trial in last_sweep().trials],
                               "first": f"{type(results[0]).__name__}: {results[0]}", "second": results[1]}
    report["folders_left"] = os.listdir(os.environ["NOTEBOOK_ACCEL_SWEEP_DIR"])
    print("REPORT " + json.dumps(report), flush=True)
''') % {}


@pytest.fixture(scope="module")
def kernel(slurm, tmp_path_factory):
    """The kernel script's report and output (stdout then stderr)."""
    folder = tmp_path_factory.mktemp("sweep")
    script = folder / "kernel.py"
    script.write_text(KERNEL)
    sweeps = folder / "sweeps"
    sweeps.mkdir()
    meet = folder / "meet"
    meet.mkdir()
    env = dict(script_env(), SLURM_CONF=slurm.conf, NOTEBOOK_ACCEL_SWEEP_DIR=str(sweeps), SWEEP_TEST_MEET=str(meet))
    done = slurm.run([sys.executable, str(script)], env=env, timeout=380)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{slurm.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert "broken" not in report, f"{report['broken']}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert slurm.wait_no_jobs() == []
    return report, done.stdout + done.stderr


def test_a_sweep_of_4_is_one_job_array_2_tasks_at_a_time_results_in_config_order(kernel):
    report, output = kernel
    returned = report["returned"]
    assert [item.get("config") for item in returned if "config" in item] == [0, 1, 3]
    assert returned[2]["error"] == "ValueError" and "bad config 2 on rank 0" in returned[2]["message"]
    assert report["states"] == ["finished", "finished", "failed", "finished"]
    arrays = {item["array"] for item in returned if "array" in item}
    assert len(arrays) == 1, returned   # one job array, every trial one of its tasks
    assert [item["task"] for item in returned if "task" in item] == ["0", "1", "3"]
    # squeue, sampled while it ran: that one array only, never more than 2 of its tasks running, and 2 at once
    samples = [sample for sample in report["queue"] if sample]
    assert {row[0] for sample in samples for row in sample} >= arrays
    running = [sum(1 for row in sample if row[0] in arrays and row[2] == "RUNNING") for sample in samples]
    assert max(running) == 2, running
    # the trials' own clocks: two at once (the first two waited for each other: alone, 20 s and then this fails)
    spans = [(item["started"], item["ended"]) for item in returned if "started" in item]
    assert max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans) == 2, spans
    assert report["queue_after_return"] == []
    assert "[sweep] trial 2 2: failed" in output


def test_with_errors_raise_the_failing_trial_is_raised_as_itself_with_its_traceback(kernel):
    report, _ = kernel
    raised = report["raised"]
    assert raised is not None and raised["type"] == "ValueError", raised
    assert "bad config 2 on rank 1" in raised["message"]
    assert 'raise ValueError(f"bad config {config} on rank {dist.get_rank()}")' in raised["traceback"]
    notes = " ".join(raised["notes"])
    assert "raised in rank 1 of 2" in notes and "sweep trial 1" in notes and "Slurm array task" in notes
    assert "1 of 2 sweep trials failed" in notes
    assert report["results_after_raise"] == [1, None]


def test_stop_cancels_the_array_and_leaves_nothing_in_the_queue_or_on_disk(kernel):
    report, _ = kernel
    assert report.get("stopped_array"), report
    assert "Slurm job array" in report["interrupted"] and "cancelled" in report["interrupted"]
    assert "running" not in report["stopped_states"] and "stopped" in report["stopped_states"]
    assert report["stopped_states"][2] == "not started"
    assert report["queue_after_stop"] == []
    assert report["folders_left"] == []


def test_an_array_task_cancelled_by_someone_else_ends_its_trial_and_the_others_run_on(kernel):
    report, _ = kernel
    cancelled = report["one_cancelled"]
    assert cancelled["states"][0] in ("stopped", "failed") and cancelled["states"][1] == "finished", cancelled
    assert cancelled["second"] == 1
    # the driver (the batch step's own process: exec'd, so Slurm's SIGTERM reaches it) says it at once
    assert cancelled["first"].startswith("LaunchError: Slurm ended array task 0 "), cancelled["first"]
    assert "a scancel, the time limit, or a preemption" in cancelled["first"]


INSIDE = textwrap.dedent('''
    import json, os
    from notebook_accel import sweep

    def where(config):
        import os
        return {"config": config, "job": os.environ["SLURM_JOB_ID"], "step": os.environ["SLURM_STEP_ID"]}

    results = sweep(where, [0, 1, 2, 3], num_processes=1, num_nodes=1, cluster="slurm", max_concurrent=2,
                    display="none")
    print("REPORT " + json.dumps({"job": os.environ["SLURM_JOB_ID"], "results": results}), flush=True)
''')


def test_inside_an_allocation_the_trials_are_steps_of_the_kernels_job_not_an_array(slurm, tmp_path):
    script = tmp_path / "inside.py"
    script.write_text(INSIDE)
    env = dict(script_env(), SLURM_CONF=slurm.conf, NOTEBOOK_ACCEL_SWEEP_DIR=str(tmp_path / "unused"))
    done = slurm.run(["salloc", "-N2", "-n4", sys.executable, str(script)], env=env, timeout=240)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(reports[0][len("REPORT "):])
    assert [result["config"] for result in report["results"]] == [0, 1, 2, 3]
    assert {result["job"] for result in report["results"]} == {report["job"]}   # no job of their own
    assert len({result["step"] for result in report["results"]}) == 4
    assert not (tmp_path / "unused").exists()
    assert slurm.wait_no_jobs() == []
