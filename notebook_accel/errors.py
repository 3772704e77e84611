"""Errors the launcher raises, and how a rank's exception is rebuilt in the kernel."""
from __future__ import annotations

import pickle
from typing import Dict, Iterable, Optional

from .events import RankFailed


class LaunchError(RuntimeError):
    """A launch failed without a re-raisable exception (a rank died, or its exception could not be rebuilt).

    ``rank``, ``exitcode`` and ``signal_name`` say which rank and how, when known.
    """

    def __init__(self, message: str, *, rank: Optional[int] = None, exitcode: Optional[int] = None,
                 signal_name: Optional[str] = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.signal_name = signal_name


class LaunchTimeout(LaunchError, TimeoutError):
    """The launch ran past ``timeout``; every rank was stopped. ``still_running`` lists the ranks that were,
    ``stacks`` where each was (its Python stacks, all threads, by rank)."""

    def __init__(self, message: str, *, still_running: Iterable[int] = (),
                 stacks: Optional[Dict[int, str]] = None) -> None:
        super().__init__(message)
        self.still_running = list(still_running)
        self.stacks = dict(stacks or {})


class LaunchConfigError(ValueError):
    """Bad input to the launcher, raised before any process starts."""


def one_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"``, for headers and status lines."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the ``__cause__`` of the re-raised exception.

    The same trick as ``concurrent.futures.process``: the kernel's traceback shows the launcher frames,
    then "The above exception was the direct cause...", then the rank's own frames.
    """

    def __init__(self, traceback_text: str, full_text: Optional[str] = None) -> None:
        super().__init__(traceback_text)
        self.traceback_text = traceback_text
        self.full_text = full_text or traceback_text  # with the launcher's frames, for a bug report

    def __str__(self) -> str:
        return self.traceback_text


def rebuild_exception(failure: RankFailed, world_size: int) -> BaseException:
    """The rank's exception as the kernel will raise it: its own type when it unpickles, else LaunchError.

    The remote traceback is attached as ``__cause__`` and the rank named in a note and in ``exc.rank``.
    """
    where = f"raised in rank {failure.rank} of {world_size}"
    exc: Optional[BaseException] = None
    if failure.exception is not None:
        try:
            exc = pickle.loads(failure.exception)
        except Exception:  # a custom exception whose __init__ does not round-trip, a missing module, ...
            exc = None
    if not isinstance(exc, BaseException):
        exc = LaunchError(f"{failure.exc_type}: {failure.message} ({where})", rank=failure.rank)
    else:
        if hasattr(exc, "add_note"):
            exc.add_note(f"(notebook_accel: {where})")
        try:
            exc.rank = failure.rank  # type: ignore[attr-defined]
        except Exception:  # exceptions with __slots__ or read-only attributes
            pass
    full = failure.full_traceback or failure.traceback
    exc.__cause__ = RemoteTraceback(f'\n"""\n[rank {failure.rank}] {failure.traceback.rstrip()}\n"""',
                                    full_text=f"[rank {failure.rank}] {full.rstrip()}")
    # Python prints the cause, then "The above exception was the direct cause...", then this exception's
    # own kernel-side frames: the launcher's, which IPython and pytest fold (``__tracebackhide__``).
    return exc
