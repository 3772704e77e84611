"""Ranks whose launcher's stdio carries them: one command (``srun``; any launcher that forwards its stdin to every
rank and their stdout to its own) starts one task per rank, and its stdio, relayed into the pipes the supervisor reads.

The tasks (``rank.slurm_task``) write frame lines (``wire.text_frames``) onto the launcher's stdout, and read the
kernel's from its stdin: nothing of ours listens on a port. ``StreamRelay`` reads them in a thread of its own:

- before the ranks run, each task's ``hello`` (its node, pid, job step, address and interface) and rank 0's store
  port; ``wait_ready`` waits for all of them (bounded by Stop and the timeout);
- then (``attach``) each rank's events into its ``RelayedRank``'s pipes, as ``ray.relay.ActorRelay`` does for Ray
  ranks. A rank's ``returned`` — or the launcher saying the task ended (``task_ended``, from its stderr: each launcher
  says it in its own words, ``_launcher_said`` reads them), or the launcher ending — closes its pipes and fires its
  sentinel: the supervisor then counts it gone, exactly as a local process.

To a rank go ``command`` (a ``Command``: ``Interrupt``, a prompt's answer), ``("stacks",)`` and ``("kill",)`` (the
task ends at once; ``KILL_GRACE`` s later, if it did not, every task is ended by ``cancel``). ``cancel`` ends the
launcher's whole process group; ``end`` makes sure everything is gone and closed.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from ...wire.events import RankStarted
from ...wire.text_frames import EVERY_RANK, FrameWriter, LineDecoder
from .ranks import RelayedRank, RelayedRankProcess

if TYPE_CHECKING:  # pragma: no cover
    from ...plan.plan import LaunchPlan

_EXIT_CODE = re.compile(r"exit code (\d+)")
LAUNCHER_END_WAIT = 5.0   # s the launcher may take to end after its tasks were told to end
KILL_GRACE = 3.0          # s a task told to end may take before every task is ended
STDOUT_DRAIN_WAIT = 30.0   # s, at most, for the launcher's stdout to be read to its end once the launcher ended
TASK_END_GRACE = 1.0      # s between the launcher saying a task ended and counting it gone (its last output may come)
# Each task's own place, from its launcher: never taken from the kernel's environment (``rank.slurm_task``).
TASK_OWN_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE",
                      "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")


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


def task_setup(plan: "LaunchPlan", relay: "StreamRelay", ranks_per_node: int, attempt: int = 0,
               **more: Any) -> Dict[str, Any]:
    """What every task needs to run (the ``("run", setup)`` message): the launch's environment (each task's place is
    its launcher's), the rendezvous at rank 0's node, the function; ``attempt``: which one this is
    (``TORCHELASTIC_RESTART_COUNT``); ``more``: a warm session's (``serve``, ``group_backend``...)."""
    rank0 = relay.hellos[0]
    env = plan.rank_env(0, {"MASTER_ADDR": rank0.address, "MASTER_PORT": str(relay.store_port),
                            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(attempt)})
    for name in TASK_OWN_VARIABLES:
        env.pop(name, None)
    return {"env": env, "ranks_per_node": ranks_per_node, "return_all": plan.return_all,
            "post_mortem": plan.post_mortem, "no_one_types": None,
            "payload": None if more.get("serve") else plan.payload.portable(), **more}


class StreamRelay:
    """The launcher ``argv`` (one task per rank, ``world_size`` in all), relayed (see the module docstring)."""

    def __init__(self, argv: Sequence[str], world_size: int, env: Optional[Dict[str, str]] = None) -> None:
        self.world_size = world_size
        self.argv = list(argv)
        self.hellos: Dict[int, TaskHello] = {}
        self.store_port: Optional[int] = None
        self.launcher_errors: List[str] = []     # what the launcher said on its stderr, but for task ends
        self.ended: Dict[int, str] = {}          # rank -> how the launcher said its task ended
        self.handles: List[RelayedRankProcess] = []
        self._relayed: Dict[int, RelayedRank] = {}
        self._early: Dict[int, List[Any]] = {}   # messages of a rank before ``attach``
        self._lock = threading.Condition()
        self._launcher_done = False
        self.launcher = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env, start_new_session=True)
        self._writer = FrameWriter(self.launcher.stdin.fileno(), EVERY_RANK)
        self._threads = [threading.Thread(target=self._read_stdout, name="notebook_accel-relay-out", daemon=True),
                         threading.Thread(target=self._read_stderr, name="notebook_accel-relay-err", daemon=True)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------------------------------------ start

    def wait_ready(self, stopped: Callable[[], bool], tick: Callable[[], None]) -> bool:
        """Until every task said hello and rank 0 its store's port (True), Stop or the timeout (False), or the
        launcher ended first (``RuntimeError`` with what it said)."""
        while True:
            with self._lock:
                if len(self.hellos) == self.world_size and self.store_port is not None:
                    return True
                if self._launcher_done:
                    said = "\n".join(self.launcher_errors[-20:]) or f"exit code {self.launcher.poll()}"
                    raise RuntimeError(f"{self.argv[0]} ended before the ranks started:\n{said}")
                if stopped():
                    return False
                self._lock.wait(0.1)
            tick()

    def attach(self) -> List[RelayedRankProcess]:
        """The supervisor's handles, one per rank, fed from now on; each rank's ``RankStarted`` first."""
        with self._lock:
            for rank in range(self.world_size):
                hello = self.hellos[rank]
                relayed = RelayedRank(self, rank, hello.pid)
                relayed.events.send(RankStarted(rank=rank, pid=hello.pid, host=hello.node, reports_resources=True))
                self._relayed[rank] = relayed
                self.handles.append(relayed.handle)
            for rank, messages in self._early.items():
                for message in messages:
                    self._on_message(rank, message)
            self._early.clear()
            for rank, how in list(self.ended.items()):
                self.task_ended(rank, how)
            if self._launcher_done:
                self._finish_all()
        return self.handles

    # ------------------------------------------------------------------------------------------------ to ranks

    def send(self, message: Any, rank: int = EVERY_RANK) -> bool:
        """``message`` to one rank (or every rank); False when the launcher is gone."""
        try:
            self._writer.send(message, rank=rank)
            return True
        except (OSError, ValueError):
            return False

    def command(self, rank: int, command: Any) -> bool:
        """A ``Command`` to the rank (a relay's call: ``ranks.RelayedRankProcess``)."""
        return self.send(command, rank)

    def ask_stacks(self, rank: int) -> bool:
        return self.send(("stacks",), rank)

    def kill(self, rank: int) -> None:
        """End the rank now: a ``kill`` message, which its task obeys at once — unless it cannot read it (stuck in C
        code that holds the GIL); then, ``KILL_GRACE`` s later, every task is ended (only a stopping launch kills its
        ranks, so nothing of the launcher's is to live on)."""
        self.send(("kill",), rank)

        def unless_gone() -> None:
            relayed = self._relayed.get(rank)
            if relayed is not None and not relayed.closed:
                self.cancel()

        timer = threading.Timer(KILL_GRACE, unless_gone)
        timer.daemon = True
        timer.start()

    def cancel(self) -> None:
        """End every task: the launcher's process group, SIGTERM (a launcher whose tasks run on other machines
        ends them on it, as ``srun`` does; ``slurm.step.SlurmStep`` asks Slurm first)."""
        if self.launcher.poll() is None:
            try:
                os.killpg(self.launcher.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def end(self) -> None:
        """After a launch or a session: every task ended unless each is gone already, then ``close``."""
        if self.launcher.poll() is None and (not self.handles or any(h.process.is_alive() for h in self.handles)):
            self.cancel()   # stopped, timed out, failed or interrupted: nothing of the tasks may go on
        self.close()

    def close(self) -> None:
        """Make sure the tasks and the launcher are gone, and close every pipe still open."""
        try:
            self.launcher.stdin.close()   # the tasks see their stdin end
        except OSError:
            pass
        try:
            self.launcher.wait(LAUNCHER_END_WAIT)
        except subprocess.TimeoutExpired:
            self.cancel()
            try:
                self.launcher.wait(LAUNCHER_END_WAIT)
            except subprocess.TimeoutExpired:
                os.killpg(self.launcher.pid, signal.SIGKILL)
                self.launcher.wait()
        for thread in self._threads:
            thread.join(5.0)
        with self._lock:
            self._finish_all()
        for relayed in self._relayed.values():
            relayed.process.close()
        for stream in (self.launcher.stdout, self.launcher.stderr):
            stream.close()

    # ------------------------------------------------------------------------------------------------ reading

    def _read_stdout(self) -> None:
        decoder = LineDecoder()
        for raw in self.launcher.stdout:
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
        for raw in self.launcher.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self._launcher_said(line)
                self._lock.notify_all()
        self.launcher.wait()
        # The launcher has ended, but what its tasks wrote last (a result) may still be in its stdout pipe, which the
        # other thread reads: a rank counted gone before that was read lost its result (a Slurm step's rank 1 under
        # load, `return_all`). Its stdout reaches EOF once read, the launcher being gone.
        self._threads[0].join(STDOUT_DRAIN_WAIT)
        with self._lock:
            self._launcher_done = True
            if self._relayed:
                self._finish_all()
            self._lock.notify_all()

    def _launcher_said(self, line: str) -> None:
        """A line of the launcher's stderr (the lock held): a subclass finds the tasks it says ended there
        (``task_ended``); the rest is kept, for a launcher that ends before the ranks start."""
        if line.strip():
            self.launcher_errors.append(line)

    def _on_message(self, rank: int, message: Any) -> None:
        relayed = self._relayed[rank]
        if relayed.closed:
            return
        kind = message[0]
        if kind == "events":
            for event in message[1]:
                relayed.write(event)
        elif kind == "stacks":
            relayed.write_stacks(message[1])
        elif kind == "returned":
            relayed.finish(int(message[1]))

    def task_ended(self, rank: int, how: str) -> None:
        """The launcher says the task ended (``how``: its words, with "exit code N" where it gave one). What the task
        wrote before comes on the launcher's stdout, which another thread reads: it is counted gone a moment later
        (``TASK_END_GRACE``), unless its own last message came first. Called with the lock held."""
        self.ended[rank] = how
        relayed = self._relayed.get(rank)
        if relayed is not None and not relayed.closed:
            code = _EXIT_CODE.search(how)
            timer = threading.Timer(TASK_END_GRACE, self._finish_late, (relayed, int(code.group(1)) if code else None))
            timer.daemon = True
            timer.start()

    def _finish_late(self, relayed: RelayedRank, exitcode: Optional[int]) -> None:
        with self._lock:
            relayed.finish(exitcode)

    def _finish_all(self) -> None:
        for relayed in self._relayed.values():
            relayed.finish(None)
