"""How a launch ended, and which failure is its root cause. Shared by every backend; imports no backend.

The root-cause rule: the first rank to raise or die is the root cause; errors that a rank raises *because*
a peer died or was stopped (gloo's "Connection closed by peer", NCCL aborts, an XLA pool breaking) are
collateral and never win over a real failure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar

from ..wire.events import RankFailed, Status
from ..wire.peer_errors import reacts_to_a_peer

F = TypeVar("F")


@dataclass
class Failure:
    """One candidate for the root cause: an exception a rank sent, or a death without one."""

    rank: int
    time: float
    event: Optional[RankFailed] = None   # None: died without an exception
    exitcode: Optional[int] = None

    @property
    def collateral(self) -> bool:
        return self.event is not None and is_collateral(self.event)


def is_collateral(event: RankFailed) -> bool:
    """The rank raised *because* a peer died or was stopped (gloo's "Connection closed by peer", ...)."""
    return reacts_to_a_peer(event.message + event.exc_type)


@dataclass
class Outcome:
    """How a launch ended. ``status``: FINISHED, FAILED, STOPPED or TIMEOUT."""

    status: Status
    results: Dict[int, Any] = field(default_factory=dict)      # decoded return values, by rank
    root: Optional[Failure] = None
    still_running: List[int] = field(default_factory=list)
    exitcodes: Dict[int, Optional[int]] = field(default_factory=dict)
    local_exception: Optional[BaseException] = None            # in-kernel runs keep the exception object
    stacks: Dict[int, str] = field(default_factory=dict)       # where each rank was, when a timeout hit
    ranks: Optional[List[int]] = None   # the global ranks that ran here (one node of several); None: all
    waiting: Optional[str] = None       # what still held the ranks back when it ended (a job pending in a queue)


def choose_root_cause(failures: Sequence[F], order: Callable[[F], float] = lambda failure: failure.time) -> F:
    """The earliest failure that is not a peer's reaction to another failure (gloo's "Connection closed
    by peer" after a rank died); the earliest of all when every one looks collateral.

    ``order`` says what "earliest" means: the time the supervisor saw it, or (several nodes, no shared clock)
    the sequence number the shared store gave it. Any object with ``collateral`` works.

    >>> first, second = Failure(1, time=2.0), Failure(0, time=1.0)
    >>> choose_root_cause([first, second]).rank
    0
    """
    primary = [failure for failure in failures if not failure.collateral]
    return min(primary or failures, key=order)


def is_interrupt(event: RankFailed) -> bool:
    """The rank's function was interrupted (Jupyter's interrupt reached it too): the launch was stopped."""
    return event.exc_type == "builtins.KeyboardInterrupt"


def is_time_limit(event: Optional[RankFailed]) -> bool:
    """The rank was warned of its time limit, saved a checkpoint and stopped (``TimeLimitReached``): not a crash."""
    return event is not None and event.exc_type == "notebook_accel.errors.TimeLimitReached"


def is_system_exit(event: Optional[RankFailed]) -> bool:
    """The rank called ``sys.exit(n)`` with n != 0: a failure with an exit code, as for a script."""
    return event is not None and event.exc_type == "builtins.SystemExit"
