"""Kernel side of a rank at a prompt: ask whoever launched, one prompt at a time, and send the line back.

A rank's pdb (``rank.prompts``) sends a ``RankPrompt`` and waits. The supervisor keeps waiting prompts in a
``PromptDesk``; its loop asks for one line at a time through an ``Asker``: ``input()`` in the thread that launched
— the notebook's input box (a cell run with ``allow_stdin``), or the terminal. ``input()`` blocks, so while it waits
the supervisor's loop runs on in another thread (``ask_while``): the other ranks' output, events, deaths, Stop and
the failure rule go on, and when the launch ends or the rank goes away the question is withdrawn (a SIGINT of our
own interrupts ``input()``).

The turn: a rank keeps the prompt while it comes back to it (pdb's ``n``, ``s``, ``p``...); it passes to the next
waiting rank (in the order they arrived) when the rank runs on (``c``, ``q``) or has not come back within
``TURN_GRACE`` seconds (a step into a collective that waits for a rank still at its prompt).

No one to type (a launch in a background thread, a notebook run without stdin, stdin not a terminal): the answer
says so at once, and the rank goes on.

Example (what a supervisor's loop does)::

    desk = PromptDesk(asker_here(), deliver)
    desk.arrived(prompt_event)                          # from the rank's event pipe
    prompt = desk.next_prompt()
    line = ask_while(desk.asker, desk.label(prompt), step_the_loop, lambda: desk.is_waiting(prompt))
    send(desk.answered(prompt, line))
"""
from __future__ import annotations

import builtins
import signal
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from ..plan.devices import ipython_shell
from ..wire.commands import PromptAnswer
from ..wire.events import PromptAnswered, RankEvent, RankPrompt

TURN_GRACE = 1.0  # s a rank that stepped (n, s) keeps the turn before another waiting rank is asked
# pdb commands after which the rank runs on (continue, quit): the next waiting rank is asked at once.
RUNS_ON = frozenset({"c", "cont", "continue", "q", "quit", "exit", "EOF", "run", "restart"})


NO_STDIN = "this notebook runs without input boxes (nbclient, papermill, nbval)"


class NoOneTypes(Exception):
    """No one can type where the launch was started; the message says why."""


class PromptWithdrawn(BaseException):
    """The question was withdrawn while it was asked: its rank went away, or the launch is ending.
    (A ``BaseException``: ipykernel's input loop lets it through, as it lets ``KeyboardInterrupt``.)"""


class Asker:
    """Where the person who launched types: ``read`` (``input``: the notebook's input box or the terminal), or
    ``absent``: why no one can (then every prompt is answered "skipped")."""

    def __init__(self, read: Optional[Callable[[str], str]] = None, absent: Optional[str] = None) -> None:
        self.read = read
        self.absent = absent if read is not None or absent else "no one can type here"

    def ask(self, text: str) -> Optional[str]:
        """The line typed after ``text`` (None: end of input, Ctrl-D); ``NoOneTypes`` when no one can type."""
        if self.absent is not None or self.read is None:
            raise NoOneTypes(self.absent)
        try:
            return self.read(text)
        except EOFError:
            return None
        except NotImplementedError:  # IPython's StdinNotImplementedError: a front end without input boxes
            self.absent = NO_STDIN
            raise NoOneTypes(self.absent) from None


def asker_here() -> Asker:
    """The ``Asker`` for a launch started from the calling thread: ``input()`` where someone can answer it (the
    main thread of a Jupyter kernel, or of a program whose stdin is a terminal)."""
    if threading.current_thread() is not threading.main_thread():
        return Asker(absent="the launch runs in a background thread (start_launch, the launch panel)")
    kernel = getattr(ipython_shell(), "kernel", None)
    if kernel is not None:
        if getattr(kernel, "_allow_stdin", True) is False:  # the cell was sent without stdin (ipykernel's flag)
            return Asker(absent=NO_STDIN)
        return Asker(builtins.input)  # ipykernel's: the cell's input box
    try:
        terminal = sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if terminal:
        return Asker(builtins.input)
    return Asker(absent="stdin is not a terminal")


class PromptDesk:
    """The prompts waiting for a line, and whose turn it is. Used by one thread at a time (the supervisor's loop,
    or the thread that runs it while the loop's own thread asks)."""

    def __init__(self, asker: Optional[Asker], deliver: Callable[[RankEvent], None]) -> None:
        self.asker = asker if asker is not None else Asker()
        self.deliver = deliver
        self.waiting: Dict[int, RankPrompt] = {}  # by rank, in the order they arrived
        self._turn: Optional[int] = None
        self._answered_at = 0.0
        self._ran_on = True

    def arrived(self, prompt: RankPrompt) -> None:
        self.waiting.pop(prompt.rank, None)
        self.waiting[prompt.rank] = prompt

    def is_waiting(self, prompt: RankPrompt) -> bool:
        waiting = self.waiting.get(prompt.rank)
        return waiting is not None and waiting.seq == prompt.seq

    def withdraw(self, rank: int) -> None:
        """``rank`` no longer waits (it ended, failed, finished its task): its prompt is dropped."""
        prompt = self.waiting.pop(rank, None)
        if prompt is not None:
            self.deliver(PromptAnswered(rank=rank, seq=prompt.seq))
        if self._turn == rank:
            self._ran_on = True

    def next_prompt(self, now: Optional[float] = None) -> Optional[RankPrompt]:
        """The prompt to ask now, or None (none waits, or the rank that has the turn may come back to it)."""
        if not self.waiting:
            return None
        if self._turn in self.waiting:
            return self.waiting[self._turn]
        now = time.monotonic() if now is None else now
        if self._turn is not None and not self._ran_on and now - self._answered_at < TURN_GRACE:
            return None
        prompt = next(iter(self.waiting.values()))
        self._turn = prompt.rank
        return prompt

    def label(self, prompt: RankPrompt, before: str = "") -> str:
        """What the person sees: ``[rank 1] (Pdb) `` (``before``: the rank's unfinished output line)."""
        return f"[rank {prompt.rank}] {before}{prompt.prompt}"

    def answered(self, prompt: RankPrompt, line: Optional[str]) -> PromptAnswer:
        """``line`` was typed at ``prompt`` (None: end of input): the answer to send to its rank."""
        self.waiting.pop(prompt.rank, None)
        self._answered_at = time.monotonic()
        words = (line or "").split()
        self._ran_on = line is None or (bool(words) and words[0] in RUNS_ON)
        self.deliver(PromptAnswered(rank=prompt.rank, seq=prompt.seq, ran_on=self._ran_on))
        return PromptAnswer(prompt.seq, line)

    def skipped(self, prompt: RankPrompt, why: str) -> PromptAnswer:
        """No one can type: the answer that lets the rank go on."""
        self.waiting.pop(prompt.rank, None)
        self.deliver(PromptAnswered(rank=prompt.rank, seq=prompt.seq))
        return PromptAnswer(prompt.seq, skipped=why)


class _Withdrawal:
    """The SIGINT handler while ``ask_while`` asks: our own SIGINT (``withdraw``) raises ``PromptWithdrawn``, the
    user's (Ctrl-C, Jupyter's interrupt) stays a ``KeyboardInterrupt``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asking = False
        self.withdrawn = False
        self.handled = threading.Event()

    def __call__(self, signum: int, frame) -> None:
        if not self.withdrawn:
            raise KeyboardInterrupt
        self.handled.set()
        if self.asking:
            raise PromptWithdrawn()

    def withdraw(self) -> None:
        with self.lock:
            if self.asking and not self.withdrawn:
                self.withdrawn = True
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def ask_while(asker: Asker, text: str, meanwhile: Callable[[], None], wanted: Callable[[], bool]) -> Optional[str]:
    """``asker.ask(text)`` in this thread (the main thread: where ``input()`` can be interrupted), while another
    thread calls ``meanwhile()`` over and over (the supervisor's loop: it must not block for long). When ``wanted()``
    turns false the question is withdrawn: ``PromptWithdrawn``. An error of ``meanwhile`` is raised here."""
    withdrawal = _Withdrawal()
    stop = threading.Event()
    failed: List[BaseException] = []

    def pump() -> None:
        try:
            while not stop.is_set():
                meanwhile()
                if not wanted():
                    withdrawal.withdraw()
                    return
        except BaseException as error:  # a bug in the loop: the main thread raises it, after the ask ends
            failed.append(error)
            withdrawal.withdraw()

    previous = signal.signal(signal.SIGINT, withdrawal)
    with withdrawal.lock:
        withdrawal.asking = True
    thread = threading.Thread(target=pump, name="notebook_accel-prompt", daemon=True)
    thread.start()
    try:
        return asker.ask(text)
    finally:
        with withdrawal.lock:
            withdrawal.asking = False
        stop.set()
        thread.join()
        if withdrawal.withdrawn:  # our SIGINT may still be on its way: it must find our handler, not Python's
            withdrawal.handled.wait(1.0)
        signal.signal(signal.SIGINT, previous)
        if failed:
            raise failed[0]
