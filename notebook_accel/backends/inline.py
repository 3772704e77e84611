"""One rank on one device: run the function in the kernel process itself, with the same events and errors.

No process to start means no launch overhead and no pickling; the rank still sees torchrun's environment,
its output and progress still reach the view, and a failure still ends the launch the same way. Its pdb asks in
the cell as a process rank's does (``backends.prompts``), in this same thread.
"""
from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

from ..outcome.root_cause import Failure, Outcome
from ..rank.run import run_rank, to_cpu
from ..rank.tracebacks import hide_launcher_frames
from ..wire.channel import DirectSender, set_rank_channel
from ..wire.commands import PromptAnswer
from ..wire.events import RankExited, RankPrompt, RankStarted, Status
from .base import Backend, LaunchSink, StopPolicy
from .environ import temporary_environ
from .kernel_capture import Capture, captured_fds, deliver_outside_capture
from .prompts import NoOneTypes, PromptDesk


class _InlineTimeout(BaseException):
    """Raised into the function by the timer; a BaseException so ``except Exception`` does not swallow it."""


class InlineBackend(Backend):
    """Runs the plan's single rank in the calling (main) thread."""

    name = "inline"

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        self._rendezvous_env = rendezvous_env  # nothing to start: the rank is this thread, in _supervise

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        """Run the function here; the policy's deadline becomes an alarm, its Stop a real SIGINT."""
        deliver = deliver_outside_capture(sink.deliver)  # the capture's reader threads deliver too
        desk = PromptDesk(sink.asker, deliver)
        deliver(RankStarted(rank=0, pid=os.getpid()))
        try:
            with temporary_environ(self.plan.rank_env(0, self._rendezvous_env)), \
                    captured_fds(deliver) as capture, _alarm(policy.remaining()), \
                    _interrupt_on(policy.stop_requested):
                sender = DirectSender(0, deliver, ask=lambda prompt: self._ask(prompt, desk, capture))
                sender.no_one_types = desk.asker.absent
                run = run_rank(self.plan.payload.load, sender, send_result=False,
                               passthrough=(_InlineTimeout, KeyboardInterrupt), post_mortem=self.plan.post_mortem)
        except _InlineTimeout:
            run, outcome = None, Outcome(Status.TIMEOUT, still_running=[0])
        except KeyboardInterrupt:
            run, outcome = None, Outcome(Status.STOPPED, still_running=[0])
        finally:
            set_rank_channel(None)
            _end_one_rank_group()
        if run is not None and run.exception is None:
            outcome = Outcome(Status.FINISHED, results={0: to_cpu(run.value)}, exitcodes={0: 0})
        elif run is not None:
            # run_rank already delivered the failure event; the outcome keeps the exception object itself,
            # raised in the kernel starting at the user's code, as a rank's traceback does.
            hide_launcher_frames(run.exception)
            outcome = Outcome(Status.FAILED, root=Failure(0, time.monotonic(), event=run.failure),
                              local_exception=run.exception, exitcodes={0: run.exit_code})
        deliver(RankExited(rank=0, exitcode=outcome.exitcodes.get(0),
                           stopped=outcome.status in (Status.TIMEOUT, Status.STOPPED)))
        return outcome

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        """The kernel's own threads: the rank's function runs in its main thread."""
        return {0: format_thread_stacks()}

    @staticmethod
    def _ask(prompt: RankPrompt, desk: PromptDesk, capture: Capture) -> PromptAnswer:
        """The rank's pdb asks, in this thread: its output so far shown first, the kernel's own fds back while
        ``input()`` waits, the timeout's alarm held meanwhile. Stop and Ctrl-C interrupt the wait."""
        desk.deliver(prompt)
        desk.arrived(prompt)
        before = capture.settle()
        try:
            with capture.paused(), _alarm_held():
                line = desk.asker.ask(desk.label(prompt, before))
        except NoOneTypes as why:
            return desk.skipped(prompt, str(why))
        except BaseException:
            desk.withdraw(0)
            raise
        return desk.answered(prompt, line)


def _end_one_rank_group() -> None:
    """The one-rank process group an Accelerator made for DeepSpeed or FSDP2's offload in this run ends with it: left
    in the kernel, it would refuse every later forked launch. Only looked up where the Accelerator was imported."""
    state = sys.modules.get("notebook_accel.accelerator.state")
    if state is not None:
        state.end_one_rank_group()


def format_thread_stacks() -> str:
    """Every thread's Python stack in this process, most recent call first (as faulthandler prints them)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        lines = "".join(reversed(traceback.format_stack(frame)))
        parts.append(f"Thread {ident:#x} ({names.get(ident, '?')}, most recent call first):\n{lines}")
    return "\n".join(parts)


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


@contextmanager
def _alarm_held() -> Iterator[None]:
    """The timeout's alarm stands still while the rank waits at a prompt (someone is debugging it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left)


def _interrupt_main_thread() -> None:
    """Ctrl-C for the main thread: a real SIGINT, so a blocking call (sleep, a wait) is interrupted too;
    only a simulated one where SIGINT is not Python's to handle (sending it would kill the process)."""
    if callable(signal.getsignal(signal.SIGINT)):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:
        _thread.interrupt_main()


@contextmanager
def _interrupt_on(stop_requested: threading.Event) -> Iterator[None]:
    """``Launch.stop()`` from another thread interrupts the function as Ctrl-C would."""
    finished = threading.Event()
    lock = threading.Lock()  # no interrupt may be issued once the function is over

    def watch() -> None:
        while not finished.is_set():
            if stop_requested.wait(0.1):
                with lock:
                    if not finished.is_set():
                        _interrupt_main_thread()
                return

    # A process started with SIGINT ignored (a background job of a script's shell, `python train.py &`) would
    # let the stop only set a flag, which a blocking call (a sleep, a wait) never sees: Python's own Ctrl-C
    # handler is in place while the function runs, and the ignore back after.
    ignored = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=watch, name="notebook_accel-inline-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with lock:
            finished.set()
        watcher.join()
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
