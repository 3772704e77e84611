"""A rank's failure as the exception the kernel raises: its own type with the remote traceback attached."""
from __future__ import annotations

import pickle
from typing import Optional

from ..errors import LaunchError, RemoteTraceback
from ..wire.events import RankFailed


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
