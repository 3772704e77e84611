"""What every relay shares, rank by rank: the stand-ins that let the supervisor watch ranks that run on other machines.

A relay (``ray.relay.ActorRelay`` for Ray's actors, ``relay.stream.StreamRelay`` for ranks whose launcher's stdio
carries them, as ``srun``'s does) writes each remote rank's output and events into local pipes; the supervisor
(``backends.supervisor``) reads them as a local rank's. ``RelayedRank`` is the relay's side of one rank: the write ends
of its pipes, and ``handle``, the ``RelayedRankProcess`` the supervisor holds (its read ends, a ``RelayedProcess``
whose sentinel fires when the relay finds the rank gone, and the supervisor's signals carried out by the relay).
``RelayedAnswers`` carries a line typed at the rank's prompt back through the relay.

A relay offers its ranks' handles three calls: ``command(rank, command)`` (an ``Interrupt``, a prompt's answer),
``kill(rank)`` (end it now) and ``ask_stacks(rank)`` (its Python stacks onto its stacks pipe; False when gone).
"""
from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ...wire.channel import EventSender
from ...wire.commands import Interrupt
from ...wire.events import OutputLine, OutputLines
from ...wire.fds import rank_pipes
from ..supervisor import RankProcess


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


@dataclass
class RelayedRankProcess(RankProcess):
    """A relayed rank's handle for the supervisor: local pipes the relay fills, and the supervisor's signals carried
    out by the relay — SIGTERM and SIGINT an ``Interrupt`` command (``KeyboardInterrupt`` in the rank), SIGKILL the
    relay's ``kill``; a stack dump is asked of the relay."""

    relay: Any = field(default=None, repr=False)

    def signal_group(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.relay.kill(self.rank)
        elif sig in (signal.SIGTERM, signal.SIGINT):
            self.relay.command(self.rank, Interrupt())

    def ask_stacks(self, pid: int) -> bool:
        return self.relay.ask_stacks(self.rank)


class RelayedRank:
    """The relay's side of rank ``rank`` (whose process elsewhere is ``pid``): the write ends of its pipes, and
    ``handle``, what the supervisor watches it through. ``finish`` once it is gone."""

    def __init__(self, relay: Any, rank: int, pid: int) -> None:
        pipes = rank_pipes()  # as a process rank's: the supervisor reads events from a socket pair
        self.rank = rank
        self.process = RelayedProcess(pid)
        self.stdout, self.stderr, self.stacks = pipes["stdout"][1], pipes["stderr"][1], pipes["stacks"][1]
        self.events = EventSender(pipes["events"][1], rank)
        self.closed = False
        self.handle = RelayedRankProcess(rank, self.process, pipes["stdout"][0], pipes["stderr"][0],
                                         pipes["events"][0], pipes["stacks"][0], answers=RelayedAnswers(relay, rank),
                                         relay=relay)

    def write(self, event: Any) -> None:
        """One event the rank made, into the pipe the supervisor reads it from: output lines into its stdout or
        stderr pipe, every other event into its event channel."""
        try:
            if isinstance(event, (OutputLine, OutputLines)):
                fd = self.stdout if event.stream == "stdout" else self.stderr
                _write_all(fd, ("\n".join(event.texts) + "\n").encode("utf-8", "surrogateescape"))
            else:
                self.events.send(event)
        except OSError:  # the supervisor closed its read end (it gave the pipe up): nobody reads it
            pass

    def write_stacks(self, text: str) -> None:
        """The rank's stack dump, into its stacks pipe."""
        try:
            _write_all(self.stacks, text.encode("utf-8", "replace"))
        except OSError:
            pass

    def finish(self, exitcode: Optional[int]) -> None:
        """The rank is gone: EOF on its pipes, then its sentinel (the supervisor reads to EOF first). Once."""
        if self.closed:
            return
        self.closed = True
        for fd in (self.stdout, self.stderr, self.stacks):
            try:
                os.close(fd)
            except OSError:
                pass
        self.events.close()
        self.process.gone(exitcode)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


class NoKernelStore:
    """A relayed launch's rendezvous: the ranks meet at a store rank 0 hosts on its own node (a Ray actor, a Slurm
    task), so the kernel hosts nothing and adds no variable."""

    def env(self) -> Dict[str, str]:
        return {}

    def close(self) -> None:
        pass
