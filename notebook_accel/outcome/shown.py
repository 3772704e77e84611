"""How an exception raised at the user's call is shown in IPython: the user's frames and the message, none of ours.

IPython folds every frame that sets ``__tracebackhide__`` — except the last one, which it always shows, with its
source. An entry point re-raises a rank's exception, a refused option or an interrupt from its own frame, so that
frame is the last: the cell would show a few lines of notebook_accel's source (a comment, a 28-parameter
signature) between the user's call and the message. Python cannot raise from a caller's frame, so the exception
says how it is shown instead: ``_render_traceback_``, the hook IPython asks of an exception before formatting it
(ipyparallel's remote errors use it), formats it with the shell's own formatter (``%xmode``, colours, chained
causes such as a rank's ``RemoteTraceback``) without notebook_accel's hidden frames, the last one included.

Only exceptions that are not notebook_accel's bugs get it (``show_from_the_call``): a bug keeps every frame.
``sys.last_traceback``, ``%debug`` and ``%tb`` keep the whole traceback; outside IPython nothing changes.

>>> error = show_from_the_call(ValueError("bad batch"))
>>> hasattr(error, "_render_traceback_")
True
"""
from __future__ import annotations

import traceback
from types import TracebackType
from typing import List, Optional

from ..rank.tracebacks import is_launcher_frame

RENDER_HOOK = "_render_traceback_"


def show_from_the_call(error: BaseException) -> BaseException:
    """``error``, to be shown in IPython from the user's frames only (see the module's docstring); returned."""
    try:
        setattr(error, RENDER_HOOK, FromTheCall(error))
    except (AttributeError, TypeError):  # an exception type that refuses new attributes: shown as IPython shows it
        pass
    return error


def shown_from_the_call(error: BaseException) -> bool:
    """Whether ``show_from_the_call`` marked ``error`` (a launch's outcome, re-raised by an entry point's body)."""
    return isinstance(getattr(error, "__dict__", {}).get(RENDER_HOOK), FromTheCall)


def without_hidden_launcher_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """A copy of ``tb`` without notebook_accel's frames that hide themselves (``__tracebackhide__``): the entry
    points' and the launch's own. Frames of ours that the user's code called (an ``Accelerator`` method) stay."""
    kept = [entry for entry in _entries(tb) if not _hidden_launcher_frame(entry)]
    rebuilt: Optional[TracebackType] = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


class FromTheCall:
    """IPython's ``_render_traceback_`` for one exception: its structured traceback, our hidden frames left out.
    Pickles with its exception (an exception sent elsewhere keeps it, harmlessly)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self) -> List[str]:
        error = self.error
        tb = without_hidden_launcher_frames(error.__traceback__)
        try:
            from IPython import get_ipython

            shell = get_ipython()
            if shell is not None:
                return shell.InteractiveTB.structured_traceback(type(error), error, tb)
        except Exception:  # IPython gone or changed: Python's own formatting, still without our frames
            pass
        return "".join(traceback.format_exception(type(error), error, tb)).splitlines()

    def __reduce__(self):
        return (FromTheCall, (self.error,))


def _entries(tb: Optional[TracebackType]) -> List[TracebackType]:
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    return entries


def _hidden_launcher_frame(entry: TracebackType) -> bool:
    frame = entry.tb_frame
    return bool(frame.f_locals.get("__tracebackhide__")) and is_launcher_frame(frame.f_code.co_filename)


__all__ = ["show_from_the_call", "shown_from_the_call", "without_hidden_launcher_frames", "FromTheCall", "RENDER_HOOK"]
