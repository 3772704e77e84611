"""Kernel → rank commands for a warm session (``notebook_accel.Session``).

A launch's ranks only talk back (``wire.channel``); a session's ranks also listen: each has one end of a Unix
stream socket whose other end only the kernel holds (like the event pipes: no listening socket, nothing else can
send a pickle). A command is a pickled dataclass framed with its length; the shared-memory files of a task's
large tensors and arrays travel beside it as ancillary data (``SCM_RIGHTS``), so a running rank receives them
as ``PickledPayload`` receives them at a launch — the same object sent again shares the same memory.

Task commands (a function, a cell's code) queue for the rank's main thread; control commands (break the
process group, shut down) are handled at once by the rank's reader thread, also while the main thread is
stuck in a collective.

A rank at a prompt (pdb, ``input()``: ``rank.prompts``) gets its line as a ``PromptAnswer``: on the command socket
of a session's rank (its reader thread hands it to ``QueuedAnswers``), on a socket of its own for a launch's rank
(``SocketAnswers``, read only while the rank asks). Another transport (a Ray actor's control call) only needs an
object with ``next_answer(seq)``.
"""
from __future__ import annotations

import os
import pickle
import queue
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

_HEADER = struct.Struct("!IH")   # pickle length, number of fds sent with it
MAX_FDS = 250                    # SCM_RIGHTS takes at most 253 fds per message on Linux


@dataclass
class Command:
    """Base of everything the kernel tells a session's rank."""


@dataclass
class RunFunction(Command):
    """Call a function in the rank's namespace: a ``PickledPayload``'s parts, its shared-memory files being the
    fds received with the command (in order). Rank 0 sends its return value back, every rank with
    ``return_all``."""

    task_id: int
    data: bytes
    storages: List[Any]
    buffers: List[Any]
    shared_sizes: List[int]
    return_all: bool = False
    post_mortem: bool = False   # an exception opens pdb in the frame that raised it, before it is reported
    no_one_types: Optional[str] = None  # why no one can answer the task's prompts (a headless run), or None
    # A rank that shares no memory with the kernel (a Ray cluster's): the large data itself, one blob per
    # storage and buffer (``PortablePayload``), instead of fds.
    blobs: Optional[List[Any]] = None


@dataclass
class ExecuteCode(Command):
    """Run a cell's source in the rank's namespace, as a notebook runs a cell (``%%ranks``)."""

    task_id: int
    code: str
    filename: str
    post_mortem: bool = False
    no_one_types: Optional[str] = None


@dataclass
class NewGroup(Command):
    """Replace the default process group by a fresh one (after a failure left the old one unusable)."""

    task_id: int
    generation: int


@dataclass
class BreakGroup(Command):
    """Make every collective in flight in this rank fail now: the run failed elsewhere, and a rank blocked in an
    all-reduce would otherwise wait for a peer that will never come. ``peer_pids``: the session's other ranks,
    whose connections (and only those) are cut; ``kernel_pid``: sockets the kernel has (a forked rank inherited
    them all: its store, Jupyter's) are never touched. ``peer_pids=None``: the peers run on other machines (a Ray
    cluster), and the rank cuts the connections its join of the group made, as it recorded them."""

    peer_pids: Optional[List[int]] = field(default_factory=list)
    kernel_pid: int = 0


@dataclass
class Interrupt(Command):
    """Raise ``KeyboardInterrupt`` in the task that runs (where a rank is a thread, not a process to signal)."""

    task_id: int = 0


@dataclass
class Shutdown(Command):
    """End the rank the way a Python program ends (threads joined, atexit handlers run)."""


@dataclass
class Debug(Command):
    """``Session.debug``: rank ``rank`` opens pdb post-mortem on the exception it raised in task ``failed_task``
    (the others have nothing to do)."""

    task_id: int
    rank: int
    failed_task: int
    no_one_types: Optional[str] = None


@dataclass
class PromptAnswer(Command):
    """The line typed at the rank's prompt number ``seq`` (``wire.events.RankPrompt``). ``line`` None: end of
    input (Ctrl-D). ``skipped``: no one can type where the launch was started (why, in a few words): the rank goes
    on without stopping."""

    seq: int
    line: Optional[str] = None
    skipped: Optional[str] = None


def session_socketpair() -> Tuple[socket.socket, socket.socket]:
    """``(kernel end, rank end)``: a connected pair of Unix stream sockets."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


class CommandSender:
    """Kernel side: sends commands (and the fds a task's payload needs) to one rank."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, command: Command, fds: Optional[List[int]] = None) -> None:
        fds = list(fds or [])
        if len(fds) > MAX_FDS:
            raise ValueError(f"a task may share at most {MAX_FDS} large tensors' files at once, got {len(fds)}")
        data = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
        header = _HEADER.pack(len(data), len(fds))
        with self._lock:
            if fds:
                socket.send_fds(self.sock, [header], fds)
            else:
                self.sock.sendall(header)
            self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class CommandReceiver:
    """Rank side: blocks for the next command; ``None`` once the kernel closed its end (or died)."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)

    def receive(self) -> Optional[Tuple[Command, List[int]]]:
        try:
            header, fds, _, _ = socket.recv_fds(self.sock, _HEADER.size, MAX_FDS)
        except OSError:
            return None
        if not header:
            return None
        header += self._exactly(_HEADER.size - len(header))
        length, count = _HEADER.unpack(header)
        if len(fds) != count:  # never expected: the fds come with the header's first byte
            raise RuntimeError(f"a session command came with {len(fds)} of its {count} files")
        return pickle.loads(self._exactly(length)), fds

    def _exactly(self, size: int) -> bytes:
        chunks = []
        while size > 0:
            chunk = self.sock.recv(min(size, 1 << 20))
            if not chunk:
                raise EOFError("the kernel closed the session's command socket mid-command")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class SocketAnswers:
    """A launch rank's answers: read from its own socket (the kernel holds the other end), only while it asks."""

    def __init__(self, fd: int) -> None:
        self.receiver = CommandReceiver(fd)

    def next_answer(self, seq: int) -> PromptAnswer:
        while True:
            try:
                received = self.receiver.receive()
            except EOFError:
                received = None
            if received is None:  # the kernel is gone (the lifeline ends this rank too)
                return PromptAnswer(seq, skipped="the launch ended")
            command, fds = received
            close_fds(fds)
            if isinstance(command, PromptAnswer) and command.seq == seq:  # never an answer to an older prompt
                return command


class QueuedAnswers:
    """A session rank's answers: its reader thread ``put``s them as they come on the command socket."""

    WAKE_SECONDS = 0.1  # a device thread's interrupt is raised in it only while it runs Python code

    def __init__(self) -> None:
        self._answers: "queue.Queue[PromptAnswer]" = queue.Queue()

    def put(self, answer: PromptAnswer) -> None:
        self._answers.put(answer)

    def next_answer(self, seq: int) -> PromptAnswer:
        while True:
            try:
                answer = self._answers.get(timeout=self.WAKE_SECONDS)
            except queue.Empty:
                continue
            if answer.seq == seq:
                return answer


def close_fds(fds: List[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
