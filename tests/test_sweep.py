"""``notebook_accel.sweep``: one launch per config, N at a time, every trial's result or exception back, a stop that
leaves no rank behind, and every user error before any process starts."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import notebook_accel
from notebook_accel import LaunchConfigError, LaunchConfigTypeError, last_sweep, sweep


def times_ten(config):
    import time as clock

    clock.sleep(0.3 if config == 0 else 0)   # the first trial ends last: results must still come in config order
    if config == 2:
        raise ValueError(f"bad config {config}")
    return config * 10


def test_results_come_back_in_config_order_and_a_failure_does_not_stop_the_others():
    results = sweep(times_ten, [0, 1, 2, 3], num_processes=1, max_concurrent=2, display="none", errors="return")
    assert results[:2] == [0, 10] and results[3] == 30
    assert isinstance(results[2], ValueError) and "bad config 2" in str(results[2])
    assert [trial.state for trial in last_sweep().trials] == ["finished", "finished", "failed", "finished"]


def test_errors_raise_raises_the_failing_trial_s_own_exception_after_every_trial_ran(capsys):
    with pytest.raises(ValueError, match="bad config 2") as raised:
        sweep(times_ten, [1, 2, 3], num_processes=2, display="text")
    notes = " ".join(raised.value.__notes__)
    assert "sweep trial 1" in notes and "1 of 3 sweep trials failed" in notes
    assert [trial.result for trial in last_sweep().trials] == [10, None, 30]
    lines = capsys.readouterr().out
    assert "[sweep] trial 0 1: finished" in lines and "[sweep] trial 1 2: failed" in lines


def test_at_most_max_concurrent_trials_run_at_once(tmp_path):
    def record(config):
        import os as system
        import time as clock

        path = system.path.join(str(tmp_path), f"{config}")
        with open(path, "w") as stamp:
            stamp.write(f"{clock.time()} ")
        clock.sleep(0.5)
        with open(path, "a") as stamp:
            stamp.write(f"{clock.time()}")
        return config

    assert sweep(record, [0, 1, 2, 3], num_processes=1, max_concurrent=2, display="none") == [0, 1, 2, 3]
    spans = [tuple(map(float, (tmp_path / f"{index}").read_text().split())) for index in range(4)]
    most = max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans)
    assert most <= 2


STOPPED_WITHIN = 60   # s from stop() to the sweep's return: it takes a second; a hang, not a speed


def test_a_stop_ends_every_running_trial_s_ranks_and_starts_no_more(tmp_path):
    def hang(config):
        import os as system
        import time as clock

        open(system.path.join(str(tmp_path), f"{config}-{system.getpid()}"), "w").close()
        clock.sleep(600)

    def stop_once_started():
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        last_sweep().stop()

    raised = []

    def run_the_sweep():
        try:
            sweep(hang, [0, 1, 2], num_processes=1, max_concurrent=2, display="none")
        except KeyboardInterrupt as interrupt:
            raised.append(interrupt)

    stopper = threading.Thread(target=stop_once_started)
    stopper.start()
    runner = threading.Thread(target=run_the_sweep, daemon=True)
    runner.start()
    runner.join(STOPPED_WITHIN)   # broken, the sweep waits for ever on trials nobody stopped: fail, naming it
    stopper.join()
    pids = [int(path.name.split("-")[1]) for path in tmp_path.iterdir()]
    if runner.is_alive():
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        runner.join(30)
        pytest.fail(f"a stopped sweep had not returned after {STOPPED_WITHIN} s: its running trials' ranks were not "
                    f"stopped")
    assert len(raised) == 1 and "1 trial" in str(raised[0]), raised
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert [trial.state for trial in last_sweep().trials][2] == "not started"


@pytest.mark.parametrize("call, error, message", [
    (dict(configs=[]), LaunchConfigError, "configs is empty"),
    (dict(configs="abc"), LaunchConfigTypeError, "configs must be a list"),
    (dict(configs=[1, threading.Lock()]), LaunchConfigError, "trial 1 .*cannot be pickled"),
    (dict(configs=[1], max_concurrent=0), LaunchConfigError, "max_concurrent must be"),
    (dict(configs=[1], errors="ignore"), LaunchConfigError, "errors='ignore'"),
    (dict(configs=[1], timout=3), LaunchConfigTypeError, "did you mean 'timeout'"),
    (dict(configs=[1], device="gpuu"), LaunchConfigError, "device='gpuu'"),
    (dict(configs=[1], args=(1,)), LaunchConfigTypeError, "args= is not taken"),
])
def test_every_user_error_is_named_before_any_trial_starts(call, error, message, tmp_path):
    def touch(config):
        open(os.path.join(str(tmp_path), str(config)), "w").close()

    with pytest.raises(error, match=message) as raised:
        sweep(touch, display="none", **call)
    assert str(raised.value).startswith("sweep: ")
    assert list(tmp_path.iterdir()) == []


def test_sweep_is_public():
    assert notebook_accel.sweep is sweep and "sweep" in notebook_accel.__all__


def test_a_sweep_on_slurm_without_slurm_s_commands_names_them_before_anything_is_submitted(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))   # no sbatch, squeue, scancel, scontrol here
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("NOTEBOOK_ACCEL_SWEEP_DIR", str(tmp_path / "sweeps"))
    with pytest.raises(LaunchConfigError, match="sbatch") as refused:
        sweep(times_ten, [1, 2], num_processes=1, cluster="slurm", display="none")
    assert "not on this machine's PATH" in str(refused.value)
    assert not (tmp_path / "sweeps").exists()   # nothing written, nothing submitted
