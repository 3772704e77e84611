"""A rank's failure as the exception the kernel raises: its own type with the remote traceback attached."""
from __future__ import annotations

import pickle
from typing import Optional, Sequence

from ..errors import LaunchError, RemoteTraceback
from ..formatting import signal_name
from ..wire.events import RankFailed
from .death import describe_death, exit_code_of, quote_last_output
from .root_cause import Failure, is_system_exit


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
        said = f"{failure.exc_type}: {failure.message}" if failure.message else failure.exc_type
        exc = LaunchError(f"{said} ({where})", rank=failure.rank)
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


def root_cause_exception(root: Failure, world_size: int, *, exitcode: Optional[int] = None,
                         last_output: Sequence[str] = (), where: str = "",
                         local_exception: Optional[BaseException] = None) -> BaseException:
    """What the kernel raises for the root-cause failure of a launch (every backend and node uses this).

    ``sys.exit(n)`` in a rank ends it as it ends a script: a ``LaunchError`` with exit code n, not an exception
    to re-raise (IPython would only print it). An exception the rank sent is rebuilt with its own type
    (the in-kernel rank's ``local_exception`` is the object itself). A death without one is a ``LaunchError``
    naming the signal or exit code and quoting the rank's last output. ``where`` names the node
    (``" on node 1 (host-b)"``).

    >>> error = root_cause_exception(Failure(1, 0.0, exitcode=-9), world_size=2, last_output=["step 7"])
    >>> str(error).splitlines()[0]
    'rank 1 was killed by SIGKILL; its last output:'
    """
    code = exit_code_of(root.event, root.exitcode if exitcode is None else exitcode)
    if is_system_exit(root.event):
        return LaunchError(f"rank {root.rank}{where} called sys.exit({root.event.message or ''}) and exited "
                           f"with code {code}", rank=root.rank, exitcode=code)
    if local_exception is not None:
        return local_exception
    if root.event is not None:
        return rebuild_exception(root.event, world_size)
    return LaunchError(f"rank {root.rank}{where} {describe_death(code)}{quote_last_output(last_output)}",
                       rank=root.rank, exitcode=code, signal_name=signal_name(code))
