"""A sweep's trials as its table shows them, whoever runs them: launches from this kernel (``sweeps.Sweep``) or the
tasks of a Slurm job array (``backends.slurm.array.ArraySweep``)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from .errors import one_line
from .launcher import Launch
from .plan.plan import LaunchPlan
from .wire.events import ProgressUpdate, RankEvent


@dataclass
class Trial:
    """One config's launch, as the sweep's table shows it."""

    index: int
    config: Any
    plan: LaunchPlan
    launch: Optional[Launch] = None
    state: str = "waiting"          # waiting | running | finished | failed | stopped | timeout | not started
    progress: str = ""
    started: Optional[float] = None
    elapsed: Optional[float] = None
    result: Any = None
    error: Optional[BaseException] = None

    def row(self) -> List[str]:
        elapsed = self.elapsed if self.elapsed is not None else (
            time.monotonic() - self.started if self.started is not None and self.progress else None)
        outcome = (one_line(self.error) if self.error is not None
                   else short(repr(self.result)) if self.state == "finished" else self.progress)
        return [str(self.index), short(repr(self.config)), self.state,
                "" if elapsed is None else f"{elapsed:.1f} s", outcome]


class TrialView:
    """A trial launch's view: keeps its latest progress for the sweep's row (the rank-by-rank dashboard is the
    launch's own; a sweep shows one row per trial)."""

    def __init__(self, trial: Trial, changed: Callable[[], None]) -> None:
        self.trial = trial
        self.changed = changed

    def handle(self, event: RankEvent) -> None:
        if isinstance(event, ProgressUpdate) and event.rank == 0 and event.total:
            self.trial.progress = f"{event.desc + ' ' if event.desc else ''}{event.n:g}/{event.total:g}"
            self.changed()

    def tick(self) -> None:
        pass


class TrialRunner:
    """Runs a sweep's trials, at most ``max_concurrent`` at a time (None: the way's own default), and keeps ``table``
    up to date; ``stop`` ends it (thread-safe). ``run`` is each way's own."""

    def __init__(self, trials: List[Trial], max_concurrent: Optional[int], table: Any) -> None:
        self.trials = trials
        self.max_concurrent = max_concurrent
        self.table = table
        self._stop = threading.Event()

    def check(self) -> None:
        """Refuse, before anything starts, what this way cannot run (a ``LaunchConfigError``)."""

    def stop(self) -> None:
        """Stop every running trial and start no more (thread-safe)."""
        self._stop.set()

    def run(self) -> None:
        raise NotImplementedError


def note(error: BaseException, text: str) -> None:
    """``text`` added to ``error``'s notes, once."""
    if hasattr(error, "add_note") and text not in getattr(error, "__notes__", []):
        error.add_note(text)


def short(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis at the end when cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
