"""One job step of ranks: the ``srun`` that starts them, and its stdio relayed into the pipes the supervisor reads.

``srun`` starts one task per rank (``rank.slurm_task``) and forwards every task's stdout to its own, and its own stdin
to every task — Slurm's channel, authenticated by munge; nothing of ours listens on a port. What the tasks write
there are frame lines (``wire.text_frames``). ``SlurmStep`` reads them in a thread of its own:

- before the ranks run, each task's ``hello`` (its node, pid, job step, address and interface) and rank 0's store
  port; ``wait_ready`` waits for all of them (bounded by Stop and the timeout);
- then (``attach``) each rank's events into local pipes, as ``ActorRelay`` does for Ray ranks: output lines into its
  stdout/stderr pipes, events into its event channel, stack dumps into its stacks pipe. A rank's ``returned`` — or
  ``srun`` saying the task ended (its stderr), or ``srun`` ending — closes its pipes and fires its sentinel: the
  supervisor then counts it gone, exactly as a local process.

``SlurmRankProcess`` maps the supervisor's signals onto the task: SIGTERM and SIGINT are an ``Interrupt`` sent to it,
SIGKILL a ``kill`` message (the task ends at once); ``cancel`` is ``scancel`` of the whole step, ``close`` makes sure
``srun`` is gone.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from ...wire.channel import EventSender
from ...wire.commands import Interrupt
from ...wire.events import OutputLine, OutputLines, RankStarted
from ...wire.fds import rank_pipes
from ...wire.text_frames import EVERY_RANK, FrameWriter, LineDecoder
from ..relay import RelayedAnswers, RelayedProcess
from ..supervisor import RankProcess

# srun's own words when a task ended without saying so itself: "srun: error: n1: task 3: Exited with exit code 2",
# "srun: error: n1: tasks 0-1: Killed".
_TASK_ENDED = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<how>.*)$")
_EXIT_CODE = re.compile(r"exit code (\d+)")
SRUN_END_WAIT = 5.0   # s srun may take to end after its step was cancelled
KILL_GRACE = 3.0      # s a task told to end may take before the whole step is cancelled
TASK_END_GRACE = 1.0  # s between srun saying a task ended and counting it gone (its last output may still come)


@dataclass
class TaskHello:
    """What a task said first: where it runs."""

    rank: int
    node: str
    pid: int
    step: str
    address: str
    interface: Optional[str]
    local_rank: int
    node_rank: int


@dataclass
class SlurmRankProcess(RankProcess):
    """A Slurm rank's handle for the supervisor: local pipes the step fills, signals the step carries out."""

    step: Any = field(default=None, repr=False)

    def signal_group(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.step.kill(self.rank)
        elif sig in (signal.SIGTERM, signal.SIGINT):
            self.step.send(Interrupt(), self.rank)

    def ask_stacks(self, pid: int) -> bool:
        return self.step.send(("stacks",), self.rank)


class _StepAnswers(RelayedAnswers):
    """Where the line typed at a Slurm rank's prompt goes: a ``PromptAnswer`` to the task."""

    def send(self, answer: Any) -> None:
        self.relay.send(answer, self.rank)


@dataclass
class _Relayed:
    """The step's side of one attached rank: the write ends of its pipes."""

    hello: TaskHello
    process: RelayedProcess
    stdout: int
    stderr: int
    events: EventSender
    stacks: int
    closed: bool = False


class SlurmStep:
    """``srun`` running ``argv`` (one task per rank, ``world_size`` in all), relayed (see the module docstring)."""

    def __init__(self, argv: Sequence[str], world_size: int, env: Optional[Dict[str, str]] = None) -> None:
        self.world_size = world_size
        self.argv = list(argv)
        self.hellos: Dict[int, TaskHello] = {}
        self.store_port: Optional[int] = None
        self.srun_errors: List[str] = []        # what srun said on its stderr, but for task ends
        self.ended: Dict[int, str] = {}         # rank -> how srun said its task ended
        self.handles: List[SlurmRankProcess] = []
        self._relayed: Dict[int, _Relayed] = {}
        self._early: Dict[int, List[Any]] = {}   # messages of a rank before ``attach``
        self._lock = threading.Condition()
        self._srun_done = False
        self.srun = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, start_new_session=True)
        self._writer = FrameWriter(self.srun.stdin.fileno(), EVERY_RANK)
        self._threads = [threading.Thread(target=self._read_stdout, name="notebook_accel-srun-out", daemon=True),
                         threading.Thread(target=self._read_stderr, name="notebook_accel-srun-err", daemon=True)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------------------------------------ start

    @property
    def step_id(self) -> Optional[str]:
        """``jobid.stepid`` once a task said it."""
        for hello in self.hellos.values():
            if not hello.step.endswith("?"):
                return hello.step
        return None

    def wait_ready(self, stopped: Callable[[], bool], tick: Callable[[], None]) -> bool:
        """Until every task said hello and rank 0 its store's port (True), Stop or the timeout (False), or ``srun``
        ended first (``RuntimeError`` with what it said)."""
        while True:
            with self._lock:
                if len(self.hellos) == self.world_size and self.store_port is not None:
                    return True
                if self._srun_done:
                    said = "\n".join(self.srun_errors[-20:]) or f"exit code {self.srun.poll()}"
                    raise RuntimeError(f"srun ended before the ranks started:\n{said}")
                if stopped():
                    return False
                self._lock.wait(0.1)
            tick()

    def attach(self) -> List[SlurmRankProcess]:
        """The supervisor's handles, one per rank, fed from now on; each rank's ``RankStarted`` first."""
        with self._lock:
            for rank in range(self.world_size):
                hello = self.hellos[rank]
                pipes = rank_pipes()
                process = RelayedProcess(hello.pid)
                relayed = _Relayed(hello, process, pipes["stdout"][1], pipes["stderr"][1],
                                   EventSender(pipes["events"][1], rank), pipes["stacks"][1])
                relayed.events.send(RankStarted(rank=rank, pid=hello.pid, host=hello.node, reports_resources=True))
                self._relayed[rank] = relayed
                self.handles.append(SlurmRankProcess(rank, process, pipes["stdout"][0], pipes["stderr"][0],
                                                     pipes["events"][0], pipes["stacks"][0],
                                                     answers=_StepAnswers(self, rank), step=self))
            for rank, messages in self._early.items():
                for message in messages:
                    self._on_message(rank, message)
            self._early.clear()
            for rank, how in list(self.ended.items()):
                self._task_ended(rank, how)
            if self._srun_done:
                self._finish_all()
        return self.handles

    # ------------------------------------------------------------------------------------------------ to ranks

    def send(self, message: Any, rank: int = EVERY_RANK) -> bool:
        """``message`` to one rank (or every rank); False when ``srun`` is gone."""
        try:
            self._writer.send(message, rank=rank)
            return True
        except (OSError, ValueError):
            return False

    def kill(self, rank: int) -> None:
        """End the rank now: a ``kill`` message, which its task obeys at once — unless it cannot read it (stuck in C
        code that holds the GIL); then, ``KILL_GRACE`` s later, the whole step is cancelled (only a stopping launch
        kills its ranks, so nothing of the step is to live on)."""
        self.send(("kill",), rank)

        def unless_gone() -> None:
            relayed = self._relayed.get(rank)
            if relayed is not None and not relayed.closed:
                self.cancel()

        timer = threading.Timer(KILL_GRACE, unless_gone)
        timer.daemon = True
        timer.start()

    def cancel(self) -> None:
        """End the step: ``scancel`` of it (every task, on every node), and of ``srun`` too."""
        step = self.step_id
        if step is not None:
            subprocess.run(["scancel", "--quiet", step], capture_output=True, timeout=30)
        if self.srun.poll() is None:
            try:
                os.killpg(self.srun.pid, signal.SIGTERM)   # srun ends its step on SIGTERM (before it knew the id too)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Make sure the step and ``srun`` are gone, and close every pipe still open."""
        try:
            self.srun.stdin.close()   # the tasks see their stdin end
        except OSError:
            pass
        try:
            self.srun.wait(SRUN_END_WAIT)
        except subprocess.TimeoutExpired:
            self.cancel()
            try:
                self.srun.wait(SRUN_END_WAIT)
            except subprocess.TimeoutExpired:
                os.killpg(self.srun.pid, signal.SIGKILL)
                self.srun.wait()
        for thread in self._threads:
            thread.join(5.0)
        with self._lock:
            self._finish_all()
        for relayed in self._relayed.values():
            relayed.process.close()
        for stream in (self.srun.stdout, self.srun.stderr):
            stream.close()

    # ------------------------------------------------------------------------------------------------ reading

    def _read_stdout(self) -> None:
        decoder = LineDecoder()
        for raw in self.srun.stdout:
            decoded = decoder.feed(raw.decode("ascii", "replace"))
            if decoded is None:
                continue
            rank, message = decoded
            with self._lock:
                if message[0] == "hello":
                    info = message[1]
                    self.hellos[rank] = TaskHello(rank, info["node"], info["pid"], info["step"], info["address"],
                                                  info["interface"], info["local_rank"], info["node_rank"])
                elif message[0] == "store":
                    self.store_port = int(message[1])
                elif rank in self._relayed:
                    self._on_message(rank, message)
                else:
                    self._early.setdefault(rank, []).append(message)
                self._lock.notify_all()

    def _read_stderr(self) -> None:
        for raw in self.srun.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            ended = _TASK_ENDED.match(line)
            with self._lock:
                if ended:
                    for rank in _task_ids(ended.group("tasks")):
                        self._task_ended(rank, ended.group("how"))
                elif line.strip():
                    self.srun_errors.append(line)
                self._lock.notify_all()
        self.srun.wait()
        with self._lock:
            self._srun_done = True
            if self._relayed:
                self._finish_all()
            self._lock.notify_all()

    def _on_message(self, rank: int, message: Any) -> None:
        relayed = self._relayed[rank]
        if relayed.closed:
            return
        kind = message[0]
        try:
            if kind == "events":
                for event in message[1]:
                    if isinstance(event, (OutputLine, OutputLines)):
                        fd = relayed.stdout if event.stream == "stdout" else relayed.stderr
                        _write_all(fd, ("\n".join(event.texts) + "\n").encode("utf-8", "surrogateescape"))
                    else:
                        relayed.events.send(event)
            elif kind == "stacks":
                _write_all(relayed.stacks, message[1].encode("utf-8", "replace"))
            elif kind == "returned":
                self._finish(relayed, int(message[1]))
        except OSError:  # the supervisor gave the pipe up: nobody reads it
            pass

    def _task_ended(self, rank: int, how: str) -> None:
        """srun says the task ended. What it wrote before comes on srun's stdout, which another thread reads: it is
        counted gone a moment later (``TASK_END_GRACE``), unless its own last message came first."""
        self.ended[rank] = how
        relayed = self._relayed.get(rank)
        if relayed is not None and not relayed.closed:
            code = _EXIT_CODE.search(how)
            timer = threading.Timer(TASK_END_GRACE, self._finish_late, (relayed, int(code.group(1)) if code else None))
            timer.daemon = True
            timer.start()

    def _finish_late(self, relayed: _Relayed, exitcode: Optional[int]) -> None:
        with self._lock:
            self._finish(relayed, exitcode)

    def _finish_all(self) -> None:
        for relayed in self._relayed.values():
            self._finish(relayed, None)

    def _finish(self, relayed: _Relayed, exitcode: Optional[int]) -> None:
        """The rank is gone: EOF on its pipes, then its sentinel."""
        if relayed.closed:
            return
        relayed.closed = True
        for fd in (relayed.stdout, relayed.stderr, relayed.stacks):
            try:
                os.close(fd)
            except OSError:
                pass
        relayed.events.close()
        relayed.process.gone(exitcode)


def _task_ids(text: str) -> List[int]:
    """srun's task list ("0-1,3") as numbers."""
    ids: List[int] = []
    for part in text.split(","):
        if "-" in part:
            first, last = part.split("-", 1)
            ids.extend(range(int(first), int(last) + 1))
        elif part:
            ids.append(int(part))
    return ids


def _write_all(fd: int, data: bytes) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]

