"""What every relay shares: the stand-ins that let the supervisor watch ranks that run on other machines.

A relay (``ray.relay.ActorRelay`` for Ray's actors, ``slurm.step.SlurmStep`` for a Slurm job step's tasks) writes each
remote rank's output and events into local pipes; the supervisor (``backends.supervisor``) reads them as a local
rank's. ``RelayedProcess`` stands in for the rank's process (a sentinel that fires when the relay finds it gone);
``RelayedAnswers`` carries a line typed at the rank's prompt back through the relay.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional


class RelayedProcess:
    """Stands in for a rank's ``multiprocessing.Process`` where the rank runs elsewhere: ``sentinel`` becomes
    readable (EOF) when the relay finds the rank gone (``gone``); ``exitcode`` is what its ``run`` returned (None
    when it died: its actor, its task)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode: Optional[int] = None
        self._gone = threading.Event()
        self.sentinel, self._write = os.pipe()

    def gone(self, exitcode: Optional[int]) -> None:
        if not self._gone.is_set():
            self.exitcode = exitcode
            os.close(self._write)
            self._gone.set()

    def join(self, timeout: Optional[float] = None) -> None:
        self._gone.wait(timeout)

    def is_alive(self) -> bool:
        return not self._gone.is_set()

    def close(self) -> None:
        try:
            os.close(self.sentinel)
        except OSError:
            pass


@dataclass
class RelayedAnswers:
    """Where the line typed at a relayed rank's prompt goes (a ``RankProcess.answers``): a ``PromptAnswer`` command
    to the rank, through its relay's ``command(rank, answer)``."""

    relay: Any
    rank: int

    def send(self, answer: Any) -> None:
        self.relay.command(self.rank, answer)


class NoKernelStore:
    """A relayed launch's rendezvous: the ranks meet at a store rank 0 hosts on its own node (a Ray actor, a Slurm
    task), so the kernel hosts nothing and adds no variable."""

    def env(self) -> Dict[str, str]:
        return {}

    def close(self) -> None:
        pass
