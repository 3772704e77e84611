"""Frontends of a launch, fed only by events. ``make_view`` picks one from the ``display`` option."""
from __future__ import annotations

from .base import NullView, View
from .text import TextView

DISPLAYS = ("auto", "widgets", "text", "none")


def in_notebook_kernel() -> bool:
    """True inside an IPython kernel (Jupyter, Colab), where widgets can render; False in a terminal."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_view(display: str) -> View:
    """The view for ``display`` ("auto": widgets in a kernel with ipywidgets, text elsewhere)."""
    if display == "none":
        return NullView()
    if display == "text":
        return TextView()
    if display == "widgets" or (display == "auto" and in_notebook_kernel() and _widgets_available()):
        from .widgets import WidgetView

        return WidgetView()
    return TextView()


def _widgets_available() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    try:
        from . import widgets  # noqa: F401
    except ImportError:
        return False
    return True


__all__ = ["View", "NullView", "TextView", "make_view", "DISPLAYS", "in_notebook_kernel"]
