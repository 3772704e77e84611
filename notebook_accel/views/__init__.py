"""Frontends of a launch, fed only by events. ``make_view`` picks one from the ``display`` option."""
from __future__ import annotations

import sys

from ..wire.choices import Display
from .base import NullView, View
from .text import OutputView, TextView

DISPLAYS = Display.values()


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
        if display == "auto" and not enable_colab_widgets():
            return TextView()
        from .widgets import WidgetView

        return WidgetView()
    return TextView()


def enable_colab_widgets() -> bool:
    """In Colab, ipywidgets 8 needs Colab's custom widget manager: turn it on (once per kernel).

    Returns False (after a one-line hint) when that is not possible, so the text view is used instead of a
    dashboard that would render as nothing. Anywhere else (JupyterLab, Notebook 7, VS Code): True.
    """
    colab = sys.modules.get("google.colab")
    if colab is None:
        return True
    try:
        from google.colab import output  # type: ignore[import-not-found]

        output.enable_custom_widget_manager()
        return True
    except Exception as error:
        print(f"notebook_accel: Colab's widget manager could not be enabled ({type(error).__name__}: {error}); "
              "showing text progress instead. Run `from google.colab import output; "
              "output.enable_custom_widget_manager()` and launch again for the dashboard.", file=sys.stderr)
        return False


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


__all__ = ["View", "NullView", "TextView", "OutputView", "make_view", "DISPLAYS", "in_notebook_kernel",
           "enable_colab_widgets"]
