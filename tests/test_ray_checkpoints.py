"""Long runs on Ray (``cluster="ray"``, the run's fake two-node cluster ``shared_clusters.fake_ray``) answered by a
checkpoint: a rank whose actor process dies mid-training is survived with ``max_restarts`` and the new world resumes
from the latest checkpoint (``load_state()``) to exactly the weights of a run never interrupted; the time limit's
warning (SIGUSR2, sent to a rank's actor process) reaches the ranks as on local ranks, and the launch raises
``TimeLimitReached`` with its checkpoint — not restarted from the start under ``max_restarts``: a time limit is
not a crash.

The functions run on ranks (and test_time_limit.py's, which they use) travel by value
(``cloudpickle.register_pickle_by_value``: the actors cannot import a test module), as a notebook's do.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict, Optional

import pytest
import torch

from notebook_accel import TimeLimitReached, start_launch
from notebook_accel.views.model import LaunchState
from notebook_accel.wire.events import AttemptStarted, RankStatus
import test_time_limit
from ray_cluster import leftovers
from scripts import Recorder
from test_time_limit import prepared, train_step
from waiting import wait_until

pytestmark = pytest.mark.timeout(900)

TOTAL_STEPS = 24
CHECKPOINT_EVERY = 8        # the resumed run's function saves a checkpoint every 8 steps
STOP_AFTER = 12             # attempt 0's rank 1 stops after this many steps: the latest checkpoint is at step 8
WARNED_RANK = 1


@pytest.fixture
def ray(fake_ray):
    """The connected ``ray`` module, this module's functions pickled by value; nothing may be left after a test."""
    import cloudpickle

    modules = (sys.modules[__name__], test_time_limit)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield fake_ray.ray
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
    assert leftovers(fake_ray.ray) == []


# ------------------------------------------------------------------------------ functions run on ranks

def train(project_dir: str, pause_after: Optional[int] = None, pause_file: str = "") -> Dict[str, Any]:
    """test_time_limit.py's regression, with a checkpoint every ``CHECKPOINT_EVERY`` steps, resumed from the latest
    one where there is one (a restarted attempt). On attempt 0 (``TORCHELASTIC_RESTART_COUNT``), rank 1 writes its pid to
    ``pause_file`` after ``pause_after`` steps and waits there (for the test to kill or warn its process)."""
    from notebook_accel.rank.time_warning import was_warned

    accelerator, model, optimizer, scheduler = prepared(project_dir)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if accelerator.latest_checkpoint is not None:  # as a requeued Slurm job resumes: a restarted attempt has one
        accelerator.load_state()                   # the latest checkpoints/checkpoint_<i>
    first = accelerator.optimizer_steps
    for step in range(first, TOTAL_STEPS):
        train_step(accelerator, model, optimizer, scheduler, step)
        if accelerator.optimizer_steps % CHECKPOINT_EVERY == 0 and not accelerator.should_checkpoint:
            accelerator.save_state()
        if attempt == 0 and step + 1 == pause_after and accelerator.process_index == WARNED_RANK:
            with open(pause_file + ".tmp", "w") as out:
                out.write(str(os.getpid()))
            os.replace(pause_file + ".tmp", pause_file)
            deadline = time.monotonic() + 300
            while not was_warned() and time.monotonic() < deadline:  # killed here, or warned
                time.sleep(0.05)
    weights = accelerator.unwrap_model(model).state_dict()
    return {"attempt": attempt, "first": first, "weights": {name: value.clone() for name, value in weights.items()}}


def launch(*args: Any, recorder: Optional[Recorder] = None, max_restarts: int = 0) -> Any:
    return start_launch(train, args=args, num_processes=2, cluster="ray", placement="STRICT_SPREAD",
                        max_restarts=max_restarts, return_all=True, display="none", view=recorder)


def paused_pid(pause_file: str) -> int:
    wait_until(lambda: os.path.exists(pause_file), timeout=300, what="rank 1 to pause")
    with open(pause_file) as handle:
        return int(handle.read())


def assert_same_weights(results: Any, uninterrupted: Any) -> None:
    for result in results:
        for name, value in uninterrupted[0]["weights"].items():
            torch.testing.assert_close(result["weights"][name], value, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------- tests

def test_a_rank_lost_mid_training_restarts_and_resumes_from_the_latest_checkpoint(ray, tmp_path):
    uninterrupted = launch(str(tmp_path / "whole")).wait(600)

    recorder = Recorder()
    pause = str(tmp_path / "paused")
    job = launch(str(tmp_path / "cut"), STOP_AFTER, pause, recorder=recorder, max_restarts=1)
    os.kill(paused_pid(pause), signal.SIGKILL)  # rank 1's actor process, as a lost node takes it
    resumed = job.wait(600)

    assert [result["attempt"] for result in resumed] == [1, 1]
    # the latest checkpoint before the loss was at step 8: both ranks resumed at the next one, not from the start
    assert [result["first"] for result in resumed] == [CHECKPOINT_EVERY, CHECKPOINT_EVERY]
    assert_same_weights(resumed, uninterrupted)
    (restart,) = [event for event in recorder.of(AttemptStarted) if event.attempt == 1]
    assert "rank 1" in restart.previous_errors[0] and "died" in restart.previous_errors[0], restart.previous_errors


def test_the_time_limit_warning_reaches_ray_ranks_and_checkpoints_without_a_restart(ray, tmp_path):
    recorder = Recorder()
    pause = str(tmp_path / "paused")
    project = str(tmp_path / "warned")
    job = launch(project, STOP_AFTER, pause, recorder=recorder, max_restarts=1)
    os.kill(paused_pid(pause), signal.SIGUSR2)  # the warning Slurm's --signal=USR2@N (or scancel --signal) sends
    with pytest.raises(TimeLimitReached) as raised:
        job.wait(600)
    # the ranks agreed at the first agreement after the warning (every 8 steps: step 16), and the library saved there
    checkpoint = os.path.join(project, "checkpoints", "checkpoint_1")  # checkpoint_0: step 8
    assert raised.value.checkpoint == checkpoint and raised.value.step == 16, raised.value
    assert os.path.isdir(checkpoint)
    # a time limit is not a crash: the checkpointed world is not run again from the start under max_restarts
    assert [event.attempt for event in recorder.of(AttemptStarted)] == [0]
    # and the dashboard's rows say "checkpointed", not "failed"
    state = LaunchState()
    for event in recorder.events:
        state.apply(event)
    assert [state.rank(rank).status for rank in (0, 1)] == [RankStatus.CHECKPOINTED] * 2
