"""Time limits and preemption: a warning signal, agreed on by every rank, and the checkpoint made at that step.

A cluster warns a job before it ends it: Slurm's ``--signal=USR2@90`` sends SIGUSR2 to every task 90 s before the
time limit (``scancel --signal=USR2`` does the same by hand, e.g. before a preemption). A rank's handler only
raises a flag in its own process (:func:`was_warned`); the flag becomes ``accelerator.should_checkpoint`` once the
ranks AGREE on it, after the same optimizer step on every rank: a collective ``save_state`` made one step later on
one rank than on its peers would deadlock in the save's barrier, or mix two steps' weights.

How they agree: :class:`TimeLimitWatch` counts the prepared optimizer's real steps (the same count on every rank)
and, every ``every`` steps, all-reduces (max) the local flag. One reduce of one number, not a store key: a key the
first warned rank sets is read by its peers at different moments (rank 1 may read it before, rank 0 after it was
set), so a store needs a second round to agree on the step anyway. Measured on 2 CPU ranks (gloo, loopback, the
2-core machine at load 1.4): 330-470 µs per reduce, about 50 µs per step once spread over ``AGREE_EVERY`` = 8
steps; on NCCL the reduce also waits for the step's kernels (``.item()``), which is the other reason it is not done
every step. The warning comes 90 s ahead by default, so steps of up to ~10 s still leave time to save.

SIGTERM is not a warning here: it is how the launcher stops a rank (``rank/process.py`` leaves it at its
default), and Slurm's own SIGTERM at the time limit is followed by SIGKILL ``KillWait`` seconds later — too late to
save. A preemption warned with ``--signal`` (or ``scancel --signal=USR2``) is handled like a time limit.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..errors import TimeLimitReached
from ..rank.time_warning import install_warning_handler, was_warned
from . import operations

AGREE_EVERY = 8  # optimizer steps between two agreements (one all-reduce of one number each)


class TimeLimitWatch:
    """One Accelerator's view of the warning: counts optimizer steps, agrees every ``every`` of them.

    ``agree(flag)`` returns True on every rank when any rank's flag is True (a collective); ``steps`` counts the
    real optimizer steps, starting from what ``load_state`` restored.
    """

    def __init__(self, agree: Callable[[bool], bool], every: int = AGREE_EVERY) -> None:
        self.agree = agree
        self.every = every
        self.steps = 0
        self.agreed_at: Optional[int] = None  # the step after which every rank saw the warning
        self.saved = False  # the checkpoint for it was made (by us or by the user)
        self._since_agreement = 0

    @property
    def should_checkpoint(self) -> bool:
        return self.agreed_at is not None

    def after_step(self) -> None:
        """Called after each real step of the prepared optimizer, on every rank."""
        self.steps += 1
        self._since_agreement += 1
        if self.agreed_at is not None or self._since_agreement < self.every:
            return
        self._since_agreement = 0
        if self.agree(was_warned()):
            self.agreed_at = self.steps


class TimeLimitMembers:
    """The Accelerator's side: ``should_checkpoint``, ``optimizer_steps``, and the checkpoint made for the user
    under ``ProjectConfiguration(automatic_checkpoint_naming=True)`` at the first step boundary (the prepared
    optimizer's next ``zero_grad()`` or ``step()``) after the agreed step, followed by :class:`TimeLimitReached`."""

    _time_limit: TimeLimitWatch

    def _watch_time_limit(self) -> None:
        install_warning_handler()
        self._time_limit = TimeLimitWatch(self._any_rank_warned)

    def _any_rank_warned(self, flag: bool) -> bool:
        if self.num_processes == 1:  # type: ignore[attr-defined]
            return flag
        total = operations.reduce(torch.tensor(int(flag), device=self.device), "max")  # type: ignore[attr-defined]
        return bool(int(total.item()))

    def _watch_optimizer(self, optimizer: Any) -> None:
        """The first prepared optimizer's steps are the ones counted (one per training step, on every rank)."""
        if not any(getattr(other, "after_each_step", None) for other in self._optimizers):  # type: ignore[attr-defined]
            optimizer.after_each_step = self._time_limit.after_step
            optimizer.at_step_boundary = self._at_step_boundary

    @property
    def should_checkpoint(self) -> bool:
        """True, on every rank after the same optimizer step, once any rank was warned that the job ends soon
        (SIGUSR2: Slurm's ``--signal``). Reading it costs nothing (the ranks agree inside ``optimizer.step()``).

        Example::

            if accelerator.should_checkpoint:
                accelerator.save_state("checkpoints/last")
                return
        """
        return self._time_limit.should_checkpoint

    @property
    def optimizer_steps(self) -> int:
        """Real optimizer steps done, counting those the checkpoint a ``load_state()`` restored had done: where a
        resumed loop starts (``for step in range(accelerator.optimizer_steps, total): ...``)."""
        return self._time_limit.steps

    def _at_step_boundary(self) -> None:
        watch = self._time_limit
        config = self.project_configuration  # type: ignore[attr-defined]
        if watch.agreed_at is None or watch.saved or not config.automatic_checkpoint_naming:
            return
        directory = self.save_state()  # type: ignore[attr-defined]
        raise TimeLimitReached(f"time limit reached at step {watch.steps}; checkpoint at {directory}; "
                               "accelerator.load_state() in a new launch resumes at the next step",
                               step=watch.steps, checkpoint=str(directory))  # fmt: skip
