"""Time limits on real ranks (2 CPU ranks, gloo): the warning signal (SIGUSR2, what Slurm's ``--signal=USR2@N``
sends) reaches the user's loop as ``accelerator.should_checkpoint``, agreed by every rank at the same step; with
``automatic_checkpoint_naming`` the library saves the checkpoint and the launch raises ``TimeLimitReached``; a new
launch's ``load_state()`` resumes at the next step and ends with the weights of a run never interrupted.

A rank warns itself (``os.kill(getpid(), SIGUSR2)`` after a chosen step), and only ONE rank is warned: the other
learns of it through the agreement, which is what these tests are about.
"""
from __future__ import annotations

import os
import signal
from typing import Any, Dict, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

from notebook_accel import Accelerator, TimeLimitReached, notebook_launcher
from notebook_accel.accelerator import ProjectConfiguration
from notebook_accel.accelerator.time_limit import AGREE_EVERY

pytestmark = pytest.mark.timeout(180)

TOTAL_STEPS = 40
WARN_AFTER = 13  # the 0-based step after which the warned rank gets SIGUSR2
WARNED_RANK = 1  # not rank 0: rank 0 hears of it only through the agreement
# the agreement runs every AGREE_EVERY steps (counted from the launch's start): the first one after the warning
AGREED_AT = (WARN_AFTER + 1 + AGREE_EVERY - 1) // AGREE_EVERY * AGREE_EVERY


def launch(function: Any, *args: Any) -> Any:
    return notebook_launcher(function, args=args, num_processes=2, device="cpu", display="none", return_all=True,
                             timeout=120)  # fmt: skip


def prepared(project_dir: str, automatic: bool = True) -> Tuple[Any, Any, Any, Any]:
    """A small regression with an LR schedule (a checkpoint saved before ``scheduler.step()`` would resume with
    the wrong learning rate), prepared: (accelerator, model, optimizer, scheduler). Also test_ray_checkpoints.py's."""
    torch.set_num_threads(1)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=project_dir,
                                                                  automatic_checkpoint_naming=automatic))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.8)
    return (accelerator, *accelerator.prepare(model, optimizer, scheduler))


def train_step(accelerator: Any, model: Any, optimizer: Any, scheduler: Any, step: int) -> None:
    """One step; its batch depends only on (step, rank), so a resumed run sees what an uninterrupted one saw."""
    generator = torch.Generator().manual_seed(1000 * step + accelerator.process_index)
    inputs = torch.randn(8, 4, generator=generator)
    loss = F.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def train(project_dir: str, automatic: bool = True, warn_after: Optional[int] = None,
          resume: bool = False) -> Dict[str, Any]:
    accelerator, model, optimizer, scheduler = prepared(project_dir, automatic)
    if resume:
        accelerator.load_state()
    first = accelerator.optimizer_steps
    for step in range(first, TOTAL_STEPS):
        train_step(accelerator, model, optimizer, scheduler, step)
        if step == warn_after and accelerator.process_index == WARNED_RANK:
            os.kill(os.getpid(), signal.SIGUSR2)
        if not automatic and accelerator.should_checkpoint:  # the user's own save, on every rank at one step
            accelerator.save_state(os.path.join(project_dir, "mine"))
            return {"stopped_at": accelerator.optimizer_steps}
    weights = accelerator.unwrap_model(model).state_dict()
    return {"first": first, "weights": {name: value.clone() for name, value in weights.items()},
            "should_checkpoint": accelerator.should_checkpoint}


def test_a_warned_run_checkpoints_and_resumes_to_the_uninterrupted_weights(tmp_path):
    uninterrupted = launch(train, str(tmp_path / "whole"))
    assert [result["should_checkpoint"] for result in uninterrupted] == [False, False]

    project = str(tmp_path / "cut")
    with pytest.raises(TimeLimitReached) as raised:
        launch(train, project, True, WARN_AFTER)
    checkpoint = os.path.join(project, "checkpoints", "checkpoint_0")
    assert raised.value.step == AGREED_AT and raised.value.checkpoint == checkpoint, raised.value
    assert f"time limit reached at step {AGREED_AT}; checkpoint at {checkpoint}" in str(raised.value)

    resumed = launch(train, project, True, None, True)
    assert [result["first"] for result in resumed] == [AGREED_AT, AGREED_AT]  # the next step, on both ranks
    for name, value in uninterrupted[0]["weights"].items():
        torch.testing.assert_close(resumed[0]["weights"][name], value, rtol=0, atol=0)
        torch.testing.assert_close(resumed[1]["weights"][name], value, rtol=0, atol=0)


def test_should_checkpoint_turns_true_on_every_rank_after_the_same_step(tmp_path):
    results = launch(train, str(tmp_path), False, WARN_AFTER)
    assert [result.get("stopped_at") for result in results] == [AGREED_AT, AGREED_AT], results
    assert os.path.isdir(tmp_path / "mine")
    assert not os.path.exists(tmp_path / "checkpoints")  # no automatic naming: the library saved nothing itself


def test_a_checkpointed_rank_is_shown_as_checkpointed_not_failed():
    from notebook_accel.views.model import LaunchState
    from notebook_accel.wire.events import RankExited, RankFailed, RankStatus

    state = LaunchState()
    state.apply(RankFailed(rank=0, exc_type="notebook_accel.errors.TimeLimitReached", message="time limit reached at step 16",
                           traceback="", exception=None))  # fmt: skip
    state.apply(RankFailed(rank=1, exc_type="builtins.ValueError", message="bad", traceback="", exception=None))
    for rank in (0, 1):
        state.apply(RankExited(rank=rank, exitcode=1, signal_name=None, stopped=True))
    assert [state.rank(rank).status for rank in (0, 1)] == [RankStatus.CHECKPOINTED, RankStatus.FAILED]


def test_a_slurm_job_with_a_time_limit_asks_for_the_warning():
    from notebook_accel.backends.slurm.allocation import salloc_command

    assert "--signal=USR2@90" in salloc_command({"time": "01:00:00"}, 1, 2, "job")
    assert "--signal=USR2@30" in salloc_command({"time": "1"}, 1, 2, "job")  # half of a short limit
    assert not any(arg.startswith("--signal") for arg in salloc_command({}, 1, 2, "job"))
    assert salloc_command({"time": "5", "signal": "USR2@200"}, 1, 2, "job").count("--signal=USR2@200") == 1
