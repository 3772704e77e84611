"""Tracebacks that start at the user's code: the launcher's own frames are hidden, not lost.

A rank's exception passes through notebook_accel's machinery on its way to the user's function
(``rank.run_rank``, the in-kernel backend). Those frames say nothing about the user's bug, so — as
pytest (``__tracebackhide__``) and IPython do for their own frames — the traceback shown in the dashboard and
attached to the raised exception drops the *leading* frames that belong to notebook_accel. Frames further
down (notebook_accel's ``Accelerator`` called by the user, torch, ...) stay: they are part of the story.

The full text is kept next to the short one (``RankFailed.full_traceback``,
``RemoteTraceback.full_text``), for a bug report.

Example::

    shown, full = format_user_traceback(exc)   # shown starts at the first frame outside notebook_accel
"""
from __future__ import annotations

import os
import traceback
from types import TracebackType
from typing import Optional, Tuple

# The package root (this file is notebook_accel/rank/tracebacks.py): every notebook_accel frame is the launcher's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN_NOTE = "  [{count} notebook_accel launcher frame{s} hidden; the full traceback is kept for bug reports]\n"


def is_launcher_frame(filename: str) -> bool:
    """True for a frame of the launch machinery: notebook_accel's own files, and ``runpy``, through which
    ``notebook-accel launch`` runs a script or module as ``__main__``."""
    if filename == "<frozen runpy>" or os.path.basename(filename) == "runpy.py":
        return True
    try:
        path = os.path.abspath(filename)
    except (TypeError, ValueError):
        return False
    return path == PACKAGE_DIR or path.startswith(PACKAGE_DIR + os.sep)


def skip_launcher_frames(tb: Optional[TracebackType], *,
                         keep_if_all: bool = True) -> Tuple[Optional[TracebackType], int]:
    """``tb`` without its leading launcher frames, and how many were skipped.

    Nothing is skipped when every frame is the launcher's (a bug in notebook_accel itself must stay visible),
    unless ``keep_if_all`` is False (the kernel re-raising a rank's exception: its frames are all ours).
    """
    skipped, current = 0, tb
    while current is not None and is_launcher_frame(current.tb_frame.f_code.co_filename):
        current, skipped = current.tb_next, skipped + 1
    if current is None and keep_if_all:
        return tb, 0
    return current, skipped


def format_user_traceback(exc: BaseException) -> Tuple[str, str]:
    """(shown, full): ``exc``'s formatted traceback starting at the user's code, and the complete one.

    Only the outermost exception's leading frames are trimmed; chained causes are formatted as Python does.

    >>> try:
    ...     raise ValueError("bad batch")
    ... except ValueError as error:
    ...     shown, full = format_user_traceback(error)
    >>> shown.splitlines()[-1]
    'ValueError: bad batch'
    """
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    user_tb, skipped = skip_launcher_frames(exc.__traceback__)
    if not skipped:
        return full, full
    chained = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    chained.stack = traceback.StackSummary.extract(traceback.walk_tb(user_tb), capture_locals=False)
    lines = list(chained.format())
    note = HIDDEN_NOTE.format(count=skipped, s="" if skipped == 1 else "s")
    header = "Traceback (most recent call last):\n"
    index = len(lines) - 1 - lines[::-1].index(header) if header in lines else None
    if index is not None:
        lines.insert(index + 1, note)
    return "".join(lines), full


def hide_launcher_frames(exc: BaseException) -> BaseException:
    """Drop ``exc``'s leading launcher frames in place (for an exception raised in the kernel, inline)."""
    user_tb, skipped = skip_launcher_frames(exc.__traceback__)
    if skipped:
        exc.__traceback__ = user_tb
    return exc


def without_launcher_frames(error: BaseException) -> BaseException:
    """``error`` with the launcher's leading frames dropped, even when every frame is ours: for the kernel
    re-raising (or the CLI printing) a rank's exception, whose own traceback travels as its ``__cause__``."""
    return error.with_traceback(skip_launcher_frames(error.__traceback__, keep_if_all=False)[0])
