"""``RankActor`` as Ray runs it: the kernel's calls to the rank's control thread run beside the rank.

Ray runs an actor's methods in its default concurrency group (one thread: the rank's ``run`` or ``serve``) unless a
method names another group. The groups are named here, on the methods (``ray.method``), not per call
(``.options(concurrency_group=...)``): Ray Client (``ray.init("ray://…")``) refuses that option on an actor method.
This class is importable by its name, so that a worker that loads actor classes by name and one that unpickles them
get the same methods with the same groups; it keeps ``RankActor``'s name, so the actors' processes are titled
``ray::RankActor``. Imported only for ``cluster="ray"`` (it imports Ray).

- ``control`` (two threads): ``poll`` — always one in flight — and ``stacks`` beside it;
- ``commands`` (one thread): ``command``, so that the kernel's commands reach the rank in the order it sent them
  (a push before the run that reads it); each is handled at once, never blocking the next.
"""
from __future__ import annotations

from typing import Any, List, Tuple

import ray

from ...rank.actor import RankActor as _Rank
from ...wire.commands import Command
from ...wire.events import RankEvent

CONTROL_GROUP = "control"
COMMAND_GROUP = "commands"
CONCURRENCY_GROUPS = {CONTROL_GROUP: 2, COMMAND_GROUP: 1}


class RankActor(_Rank):
    """``rank.actor.RankActor`` with its control methods in their concurrency groups (see the module docstring)."""

    @ray.method(concurrency_group=CONTROL_GROUP)
    def poll(self, wait: float) -> Tuple[List[RankEvent], bool]:
        return super().poll(wait)

    @ray.method(concurrency_group=CONTROL_GROUP)
    def stacks(self) -> str:
        return super().stacks()

    @ray.method(concurrency_group=COMMAND_GROUP)
    def command(self, command: Command) -> Any:
        return super().command(command)
