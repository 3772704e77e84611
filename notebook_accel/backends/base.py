"""The one protocol every way of starting ranks implements.

A backend gets a validated ``LaunchPlan``, the rendezvous environment the kernel hosts, and a ``LaunchSink``
(where events go, a clock tick for the view, whether Stop was pressed). It owns its whole sequence — start
the ranks, supervise them, clean up — and returns how the launch ended as an ``Outcome``. It never raises
for a rank's failure (that is an ``Outcome``), only ``KeyboardInterrupt`` after it stopped every rank, or a
``LaunchConfigError`` found before any rank started.

Shaped after Lightning's ``fabric/strategies/launchers`` (one small base, one class per mechanism).
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Dict

from ..wire.events import RankEvent
from ..outcome.root_cause import Outcome

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.plan import LaunchPlan
    from .rendezvous import HostedStore


@dataclass
class LaunchSink:
    """Where a backend sends what happens: ``deliver`` every event in order, ``tick`` about every 0.1 s
    (the view's clock), and ``stop_requested`` set when the user pressed Stop or called ``Launch.stop()``."""

    deliver: Callable[[RankEvent], None]
    tick: Callable[[], None]
    stop_requested: threading.Event


class Backend(ABC):
    """How ranks start. Subclasses set ``name`` (the value of ``LaunchPlan.backend``) and implement ``run``.

    Example::

        backend = backend_for(plan)
        store = backend.open_rendezvous()
        try:
            outcome = backend.run(store.env(), LaunchSink(view.handle, view.tick, threading.Event()))
        finally:
            store.close()
    """

    name: ClassVar[str]

    def __init__(self, plan: "LaunchPlan") -> None:
        self.plan = plan

    def open_rendezvous(self) -> "HostedStore":
        """Host the store the ranks meet at, synchronously, so a busy port fails in the caller's cell.
        Backends whose ranks meet elsewhere (several nodes) override this."""
        from .rendezvous import HostedStore

        return HostedStore(self.plan.master_addr, self.plan.use_port, self.plan.world_size)

    @abstractmethod
    def run(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> Outcome:
        """Start every rank, supervise it to the end, leave nothing running; return how it ended."""

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        """Every running rank's Python stacks (all threads), by rank; callable from any thread while
        ``run`` runs. A rank that does not answer within ``timeout`` seconds is left out."""
        return {}
