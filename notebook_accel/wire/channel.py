"""Rank → kernel event transport.

Each rank owns one end of an anonymous Unix stream socket pair whose other end only the launching kernel holds
(``fds.rank_pipes``); events are pickled and framed with a 4-byte length. There is deliberately no listening
socket: nothing outside the launcher and its children can inject a pickle. A socket rather than a pipe so that
an event can carry files: a result's large tensors travel as shared-memory files beside it (``wire.results``).

Inside a rank, ``rank_channel()`` returns the sender ``rank.run_rank`` installed (or the inline backend's direct
sink), and ``None`` outside a launch, so helpers such as ``progress`` and ``report`` degrade to local
behaviour in a plain script.

A sender also *asks*: a rank at a prompt (pdb, ``input()``) sends a ``RankPrompt`` and waits for the line typed
where the launch was started (``ask``). Where that line comes from is the sender's ``answers``: any object with
``next_answer(seq) -> PromptAnswer`` (``wire.commands``: a socket of the rank's own, a session's command socket).
"""
from __future__ import annotations

import errno
import os
import pickle
import socket
import stat
import struct
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .commands import PromptAnswer
from .events import RankEvent, RankPrompt, RankResult

_HEADER = struct.Struct("!I")
MAX_FDS = 253              # SCM_RIGHTS's most fds in one message (Linux): a receiver never truncates them
def receive(fd: int, size: int) -> Tuple[bytes, List[int]]:
    """Read up to ``size`` bytes from an event channel's kernel end, with the fds that came with them (received
    close-on-exec). A pipe (no fds) is read as a pipe. Never waits: ``BlockingIOError`` when nothing is there
    (the kernel's loop reads only what a poll said is there, and must not hang when another read took it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
    sock.setblocking(False)  # the fd stays non-blocking (the supervisor's), whatever setdefaulttimeout says
    try:
        data, fds, _, _ = socket.recv_fds(sock, size, MAX_FDS, getattr(socket, "MSG_CMSG_CLOEXEC", 0))
        return data, fds
    except OSError as error:
        if error.errno != errno.ENOTSOCK:
            raise
        return os.read(fd, size), []
    finally:
        sock.detach()  # the fd stays the caller's


def _socket_on(fd: int) -> socket.socket:
    """A socket object over ``fd`` (``detach`` it after use: the fd is not its own), blocking whatever
    ``socket.setdefaulttimeout`` the user's code chose."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
    sock.setblocking(True)
    return sock


class EventSender:
    """Writes events to an event channel's rank end (or a pipe). Thread-safe: tqdm's monitor thread and the main
    thread may both send.

    ``answers``: where the lines typed at this rank's prompts come from (None: nowhere; every prompt is skipped).
    """

    def __init__(self, fd: int, rank: int, answers: Any = None) -> None:
        self.fd = fd
        self.rank = rank
        self.answers = answers
        self.no_one_types: Optional[str] = None  # set once told no one can type (why): prompts are skipped
        self._lock = threading.Lock()
        try:
            self.passes_files = stat.S_ISSOCK(os.fstat(fd).st_mode)  # an event channel; a pipe cannot
        except OSError:
            self.passes_files = False
        self._asking = threading.Lock()
        self._prompts = 0

    def ask(self, prompt: RankPrompt) -> PromptAnswer:
        """Send ``prompt`` and block until the kernel answers it. One prompt at a time per rank (another thread of
        the rank waits its turn)."""
        with self._asking:
            self._prompts += 1
            prompt.seq = self._prompts
            if self.answers is None:
                return _unanswerable(prompt.seq)
            self.send(prompt)
            return self.answers.next_answer(prompt.seq)

    def send(self, event: RankEvent, fds: Sequence[int] = ()) -> None:
        """Send ``event``; ``fds`` (at most ``MAX_FDS``, only where ``passes_files``) travel with its first bytes,
        and stay the caller's to close."""
        data = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
        frame = _HEADER.pack(len(data)) + data
        sock = _socket_on(self.fd) if fds else None
        with self._lock:
            # Only bytes and ints inside the lock (and the socket made before it): neither is tracked by the
            # cyclic GC, so no collection (which may finalize a tqdm bar that sends from this same thread) can
            # start in here.
            try:
                if sock is not None:
                    frame = frame[socket.send_fds(sock, [frame], list(fds)):]
            finally:
                if sock is not None:
                    sock.detach()
            while frame:
                written = os.write(self.fd, frame)
                frame = frame[written:]

    def close(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class DirectSender:
    """The inline backend's sender: hands events straight to a callback in the kernel process, and prompts to
    ``ask`` (which returns the ``PromptAnswer``)."""

    def __init__(self, rank: int, deliver: Callable[[RankEvent], None],
                 ask: Optional[Callable[[RankPrompt], PromptAnswer]] = None) -> None:
        self.rank = rank
        self._deliver = deliver
        self._ask = ask
        self.no_one_types: Optional[str] = None
        self._prompts = 0

    passes_files = False  # the value itself reaches the kernel: no shared memory needed

    def send(self, event: RankEvent, fds: Sequence[int] = ()) -> None:
        self._deliver(event)

    def ask(self, prompt: RankPrompt) -> PromptAnswer:
        self._prompts += 1
        prompt.seq = self._prompts
        return self._ask(prompt) if self._ask is not None else _unanswerable(prompt.seq)

    def close(self) -> None:
        pass


def _unanswerable(seq: int) -> PromptAnswer:
    return PromptAnswer(seq, skipped="this rank has no way to ask")


class EventDecoder:
    """Kernel side: turns the bytes read from a rank's event channel into events (frames may arrive split).

    Files arrive with the first bytes of the event that carries them, so they queue here in order until that
    event is complete; a result's are then mapped (``SharedPieces.receive``) and closed."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._fds: List[int] = []

    def feed(self, chunk: bytes, fds: Sequence[int] = ()) -> List[RankEvent]:
        self._buffer += chunk
        self._fds.extend(fds)
        events: List[RankEvent] = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            event = pickle.loads(bytes(self._buffer[_HEADER.size:end]))
            del self._buffer[:end]
            if isinstance(event, RankResult) and event.shared is not None:
                count = event.shared.files
                taken, self._fds = self._fds[:count], self._fds[count:]
                event.shared.receive(taken)
            events.append(event)
        return events

    def close(self) -> None:
        """The channel is closed: files of an event that never completed (its rank died mid-send) are let go."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._buffer.clear()


_process_channel: Optional[object] = None   # the rank's channel, seen by every thread of a process rank
_thread_channel = threading.local()           # per thread, where ranks are threads of one process (TPU)


def rank_channel():
    """The event sender of the current rank, or ``None`` when not running inside a launch.

    A thread's own channel wins; other threads of a rank (tqdm's monitor, a DataLoader's pin-memory
    thread, the user's own) see the process's.
    """
    own = getattr(_thread_channel, "sender", None)
    return own if own is not None else _process_channel


def set_rank_channel(sender, *, thread_only: bool = False) -> None:
    """Installed by ``rank.run_rank`` for the duration of the rank's function (``None`` removes it).

    ``thread_only``: for this thread alone, where several ranks are threads of one process.
    """
    global _process_channel
    if thread_only:
        _thread_channel.sender = sender
    else:
        _process_channel = sender
