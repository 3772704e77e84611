"""One rank on one device: run the function in the kernel process itself, with the same events and errors.

No process to start means no launch overhead and no pickling; the rank still sees torchrun's environment,
its output and progress still reach the view, and a failure still ends the launch the same way.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional

from ..channel import DirectSender, set_rank_channel
from ..events import OutputLine, RankEvent, RankExited, RankStarted
from ..payload import loads_payload
from ..plan import LaunchPlan
from ..supervisor import Failure, Outcome
from ..tracebacks import hide_launcher_frames
from ..worker import failure_event, to_cpu


class _InlineTimeout(BaseException):
    """Raised into the function by the timer; a BaseException so ``except Exception`` does not swallow it."""


class InlineBackend:
    """Runs the plan's single rank in the calling (main) thread."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan

    def run(self, deliver: Callable[[RankEvent], None], rendezvous_env: Dict[str, str]) -> Outcome:
        function, args, kwargs = loads_payload(self.plan.payload)
        from ..progress import patch_tqdm

        original_streams = (sys.stdout, sys.stderr)

        def deliver_outside_capture(event: RankEvent) -> None:
            # A view writing to sys.stdout must reach the real cell output, not our capture again.
            captured = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = original_streams
            try:
                deliver(event)
            finally:
                sys.stdout, sys.stderr = captured

        sender = DirectSender(0, deliver_outside_capture)
        deliver(RankStarted(rank=0, pid=os.getpid()))
        undo_patch = patch_tqdm()
        set_rank_channel(sender)
        try:
            with _environment(self.plan.rank_env(0, rendezvous_env)), \
                    _captured_output(deliver_outside_capture), _alarm(self.plan.timeout):
                value = function(*args, **kwargs)
            outcome = Outcome("finished", results={0: to_cpu(value)}, exitcodes={0: 0})
        except _InlineTimeout:
            outcome = Outcome("timeout", still_running=[0])
        except KeyboardInterrupt:
            outcome = Outcome("stopped", still_running=[0])
        except BaseException as exc:
            event = failure_event(0, exc)
            hide_launcher_frames(exc)  # raised in the kernel: starts at the user's code, as a rank's does
            outcome = Outcome("failed", root=Failure(0, time.monotonic(), event=event), local_exception=exc)
        finally:
            undo_patch()  # as in a worker: metrics report() held back arrive before the rank's end
            set_rank_channel(None)
        if outcome.root is not None:
            deliver(outcome.root.event)
        exitcode = {"finished": 0, "failed": 1}.get(outcome.status)
        deliver(RankExited(rank=0, exitcode=exitcode, stopped=outcome.status in ("timeout", "stopped")))
        return outcome


@contextmanager
def _environment(values: Dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class _LineCapture:
    """A text stream that turns writes into ``OutputLine`` events, one per complete line."""

    def __init__(self, stream: str, deliver: Callable[[RankEvent], None], original) -> None:
        self._stream = stream
        self._deliver = deliver
        self._original = original
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._deliver(OutputLine(rank=0, stream=self._stream, text=line))
        return len(text)

    def flush(self) -> None:
        pass

    def close_partial(self) -> None:
        if self._partial:
            self._deliver(OutputLine(rank=0, stream=self._stream, text=self._partial))
            self._partial = ""

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str):  # encoding, fileno, ... of the stream it replaces
        return getattr(self._original, name)


@contextmanager
def _captured_output(deliver: Callable[[RankEvent], None]) -> Iterator[None]:
    """Python-level capture (fd-level capture would need a reader thread inside the kernel process)."""
    original = (sys.stdout, sys.stderr)
    captures = (_LineCapture("stdout", deliver, sys.stdout), _LineCapture("stderr", deliver, sys.stderr))
    sys.stdout, sys.stderr = captures
    try:
        yield
    finally:
        sys.stdout, sys.stderr = original
        for capture in captures:
            capture.close_partial()


@contextmanager
def _alarm(seconds: Optional[float]) -> Iterator[None]:
    """Interrupt the function after ``seconds`` (main thread only, where signal handlers run)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _InlineTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
