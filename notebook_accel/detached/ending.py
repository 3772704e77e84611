"""How a detached launch ended, as a small picklable record: what ``attach`` returns or raises, as the launch would.

The result and the root cause travel cloudpickled inside it (bytes), so that the record itself always loads, even in
a kernel that lacks a class the result needs: that kernel gets the ``ImportError`` when it asks for the result.
An exception loses its ``__cause__`` (the rank's remote traceback) and ``__traceback__`` when pickled; the cause is
pickled beside it and put back, so the re-raised exception shows the same traceback text as an attached launch's.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Optional

import cloudpickle

from ..errors import LaunchError, RemoteTraceback, one_line
from ..wire.events import Status


@dataclass(frozen=True)
class Ending:
    """``status``: a ``Status`` value (finished, failed, stopped, timeout); ``result``: the launch's result,
    cloudpickled (rank 0's, or every rank's with ``return_all``); ``error``: the root cause and its cause, cloudpickled;
    ``error_text``: its one-line description (for listings, and when it cannot be unpickled); ``elapsed``: seconds."""

    status: str
    elapsed: float = 0.0
    result: Optional[bytes] = None
    error: Optional[bytes] = None
    error_text: Optional[str] = None

    @classmethod
    def finished(cls, result: Any, elapsed: float) -> "Ending":
        return cls(Status.FINISHED.value, elapsed, result=cloudpickle.dumps(result))

    @classmethod
    def raised(cls, status: str, error: BaseException, elapsed: float) -> "Ending":
        return cls(str(status), elapsed, error=pickled_error(error), error_text=one_line(error))

    @classmethod
    def of_launch(cls, launch: Any, elapsed: float) -> "Ending":
        """The ending of a ``Launch`` that ended (its ``status``, ``result``, ``error``)."""
        status = getattr(launch.status, "value", launch.status)
        if launch.error is not None:
            return cls.raised(status, launch.error, elapsed)
        return cls.finished(launch.result, elapsed)

    def outcome(self) -> Any:
        """The result, or the root cause raised (its own type, message, notes and remote traceback as ``__cause__``)."""
        __tracebackhide__ = True  # noqa: F841
        if self.error is not None or self.status != Status.FINISHED.value:
            raise self.exception()
        return pickle.loads(self.result) if self.result is not None else None

    def exception(self) -> BaseException:
        """The root cause as an exception object (a ``LaunchError`` with the text when it cannot be rebuilt)."""
        if self.error is not None:
            try:
                error, cause = pickle.loads(self.error)
                error.__cause__ = cause
                return error
            except Exception:  # a class the kernel cannot import: the words are still the rank's
                pass
        text = self.error_text or f"the detached launch ended: {self.status}"
        return KeyboardInterrupt(text) if self.status == Status.STOPPED.value else LaunchError(text)


def pickled_error(error: BaseException) -> bytes:
    """``error`` and its ``__cause__``, cloudpickled; an exception that does not pickle becomes a ``LaunchError``
    with its words (its cause, the remote traceback text, kept)."""
    cause = error.__cause__
    try:
        return cloudpickle.dumps((error, cause))
    except Exception:
        text = cause.full_text if isinstance(cause, RemoteTraceback) else None
        return cloudpickle.dumps((LaunchError(one_line(error)), RemoteTraceback(str(cause), text) if cause else None))
