"""fd-level output capture for the rank that runs in the kernel process itself.

A process rank's fds 1/2 are pipes the kernel drains; the in-kernel rank gets the same, temporarily: while
the function runs, fds 1 and 2 of the kernel process are pipes read by two threads that turn lines into
``OutputLine`` events, and ``sys.stdout`` / ``sys.stderr`` write to those fds, so Python prints, C/C++
output and subprocesses all arrive labelled and in order per stream. Afterwards the kernel's own fds
(ipykernel's capture pipes, or the terminal) are put back.

Whatever the view writes while it handles an event must reach the real output, not the capture: a
thread that is delivering an event writes through to the streams as they were before the capture.

The rank's pdb asks in the cell (``backends.prompts``): ``Capture.settle`` first delivers everything written so far
(pdb's lines come before its prompt), and ``Capture.paused`` puts the kernel's own fds back while ``input()`` runs.
"""
from __future__ import annotations

import codecs
import io
import os
import select
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, TextIO, Tuple

from ..rank.streams import flush_std_streams, line_writer
from ..wire.events import OutputLine, RankEvent
from .draining import PipeDrain, held_open_note

_READ_BYTES = 1 << 16

_delivering = threading.local()  # set while this thread hands an event to the view


def deliver_outside_capture(deliver: Callable[[RankEvent], None]) -> Callable[[RankEvent], None]:
    """``deliver`` made safe to call from any thread during the capture: one event at a time, and what the
    view writes goes to the real output."""
    lock = threading.RLock()

    def outside(event: RankEvent) -> None:
        with lock:
            _delivering.active = True
            try:
                deliver(event)
            finally:
                _delivering.active = False

    return outside


class _RankStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` during the capture: the rank's writes go to fd 1/2 (the capture pipes);
    a thread delivering an event writes through to the stream that was there before."""

    def __init__(self, fd: int, outside: TextIO) -> None:
        self._fd = fd
        self._outside = outside
        self._writer = line_writer(fd)

    def write(self, text: str) -> int:
        if getattr(_delivering, "active", False):
            return self._outside.write(text)
        return self._writer.write(text)

    def flush(self) -> None:
        self._writer.flush()

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True


class _PipeReader(threading.Thread):
    """Reads one capture pipe to EOF, delivering one ``OutputLine`` per line. Once the function ended
    (``ended``), a subprocess it left running may hold the pipe open: ``PipeDrain`` says when to stop."""

    def __init__(self, read_fd: int, stream: str, deliver: Callable[[RankEvent], None]) -> None:
        super().__init__(name=f"notebook_accel-inline-{stream}", daemon=True)
        self.read_fd = read_fd
        self.stream = stream
        self.deliver = deliver
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.partial = ""
        self.ended = threading.Event()    # the function ended and the capture's write ends are closed
        self.give_up = threading.Event()  # stop now (Ctrl-C while the capture ended)
        self._drain: Optional[PipeDrain] = None
        self._reading = threading.Lock()  # held from a read to the delivery of its lines

    def run(self) -> None:
        while not self.give_up.is_set():
            ready = bool(select.select([self.read_fd], [], [], 0.1)[0])
            if self.ended.is_set():
                if self._drain is None:  # what is in the pipe now is all the function wrote
                    self._drain = PipeDrain(self.read_fd, time.monotonic())
                why = self._drain.give_up(ready, time.monotonic())
                if why is not None:
                    self.flush_partial()
                    self.deliver(OutputLine(rank=0, stream="stderr", text=held_open_note(0, self.stream, why)))
                    return
            if not ready:
                continue
            with self._reading:
                chunk = os.read(self.read_fd, _READ_BYTES)
                if self._drain is not None:
                    self._drain.got(len(chunk), time.monotonic())
                if not chunk:
                    break
                lines = (self.partial + self.decoder.decode(chunk)).split("\n")
                self.partial = lines.pop()
                for line in lines:
                    self.deliver(OutputLine(rank=0, stream=self.stream, text=line.rstrip("\r")))
        self.flush_partial()

    def settle(self, timeout: float) -> str:
        """Wait (at most ``timeout`` s) until everything written to the pipe so far is delivered; return and take
        the unfinished last line."""
        deadline = time.monotonic() + timeout
        while True:
            with self._reading:
                if not select.select([self.read_fd], [], [], 0)[0] or time.monotonic() > deadline:
                    partial, self.partial = self.partial, ""
                    return partial
            time.sleep(0.005)

    def flush_partial(self) -> None:
        text, self.partial = self.partial + self.decoder.decode(b"", final=True), ""
        if text:
            self.deliver(OutputLine(rank=0, stream=self.stream, text=text.rstrip("\r")))


class Capture:
    """The capture while it runs, for the in-kernel rank's prompts."""

    SETTLE_SECONDS = 5.0

    def __init__(self, readers: List[_PipeReader], saved: Dict[int, int], previous: Tuple[TextIO, TextIO]) -> None:
        self.readers = readers
        self.saved = saved          # the kernel's own fds 1/2, as they were before
        self.previous = previous    # and its sys.stdout / sys.stderr

    def settle(self) -> str:
        """Deliver everything the function wrote so far; returns its unfinished stdout line (taken from the output:
        it goes before the prompt)."""
        flush_std_streams()
        before = ""
        for reader in self.readers:
            partial = reader.settle(self.SETTLE_SECONDS)
            if reader.stream == "stdout":
                before = partial
            elif partial:
                reader.deliver(OutputLine(rank=0, stream=reader.stream, text=partial))
        return before

    @contextmanager
    def paused(self) -> Iterator[None]:
        """fds 1/2 and ``sys.stdout``/``sys.stderr`` as they were before the capture (``input()`` in a terminal
        writes its prompt to fd 1), then the capture again."""
        flush_std_streams()
        capturing = {fd: os.dup(fd) for fd in (1, 2)}  # the capture pipes' write ends
        streams = (sys.stdout, sys.stderr)
        try:
            for fd, copy in self.saved.items():
                os.dup2(copy, fd)
            sys.stdout, sys.stderr = self.previous
            yield
        finally:
            flush_std_streams()
            sys.stdout, sys.stderr = streams
            for fd, end in capturing.items():
                os.dup2(end, fd)
                os.close(end)


@contextmanager
def captured_fds(deliver: Callable[[RankEvent], None]) -> Iterator[Capture]:
    """Capture fds 1/2 of this process (and ``sys.stdout``/``sys.stderr``) into ``deliver`` until exit.

    ``deliver`` must come from ``deliver_outside_capture``. Example::

        deliver = deliver_outside_capture(view.handle)
        with captured_fds(deliver):
            train()          # print(), C printf and subprocess output become OutputLine events
    """
    flush_std_streams()  # what the function left in buffers lands in the pipes
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    previous = (sys.stdout, sys.stderr)
    readers: List[_PipeReader] = []
    try:
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            readers.append(_PipeReader(read_fd, stream, deliver))
        sys.stdout = _RankStream(1, _outside_stream(previous[0], saved))
        sys.stderr = _RankStream(2, _outside_stream(previous[1], saved))
        for reader in readers:
            reader.start()
        yield Capture(readers, saved, previous)
    finally:
        flush_std_streams()
        sys.stdout, sys.stderr = previous
        for fd, copy in saved.items():
            os.dup2(copy, fd)  # closes the capture pipe's write end: the readers see EOF
            os.close(copy)
        try:
            for reader in readers:
                reader.ended.set()
            for reader in readers:
                reader.join()  # to EOF, however slow the view; bounded where a subprocess holds the pipe
        finally:
            for reader in readers:
                reader.give_up.set()  # only when the join was interrupted (Ctrl-C) is one still reading
                reader.join()
                os.close(reader.read_fd)


def _outside_stream(stream: TextIO, saved: dict) -> TextIO:
    """Where the view's writes go during the capture: the previous stream, unless it writes to fd 1/2
    itself (a terminal or a redirected script), whose fds are the capture pipes now."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return stream
    if isinstance(stream, io.TextIOWrapper) and fd in saved:
        return line_writer(saved[fd], stream.encoding)
    return stream
