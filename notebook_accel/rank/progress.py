"""Progress bars that report to the kernel from inside a rank — for ``progress`` and for plain ``tqdm``.

``progress`` is a ``tqdm`` (a subclass of ``tqdm.std.tqdm`` by way of ``tqdm.asyncio``, so ``async for``
works as with ``tqdm.auto``) that overrides only the display: tqdm's own iteration fast path, ``mininterval``
/ ``miniters`` logic, EMA rates and ``format_dict`` are reused unchanged. Where tqdm would redraw a line on
the terminal, a rank sends one ``ProgressUpdate`` event instead (at most every ``mininterval``, plus one when
the bar opens and one when it closes). So a 1e6-iteration loop costs what it costs with plain tqdm.

Outside a launch, ``progress(...)`` simply *is* ``tqdm.auto.tqdm(...)``.

Inside a rank, ``patch_tqdm()`` (called by ``rank.run_rank`` before it unpickles the user's function) makes tqdm's
own frontends report too, two ways:

* module attributes: ``tqdm.tqdm``, ``tqdm.trange``, ``tqdm.auto.tqdm/trange``,
  ``tqdm.autonotebook.tqdm/trange``, ``tqdm.notebook.tqdm/trange/tqdm_notebook/tnrange`` become ``progress``
  / ``trange``. A module not imported yet is pre-registered as a small shim, so it never imports
  ipywidgets in a rank.
* the classes themselves: ``tqdm.std.tqdm`` and (if imported) ``tqdm.notebook.tqdm_notebook`` get the rank
  display methods. This covers names bound *before* the patch — ``from tqdm.auto import tqdm`` run in the
  kernel and inherited by a forked rank, or resolved by cloudpickle — and library subclasses of them
  (``huggingface_hub``'s tqdm, for instance), which keep their own ``__init__`` logic.

What cannot be patched: subclasses that override ``display`` themselves (``tqdm.rich``, ``tqdm.tk``,
``tqdm.gui``, a library's own renderer). They keep printing to the rank's stderr, which the kernel shows as
that rank's output (carriage-return redraws collapsed to the last frame).
"""
from __future__ import annotations

import itertools
import sys
import threading
import time
import types
from typing import Any, Callable, Dict, List, Optional

from tqdm.asyncio import tqdm_asyncio as _asyncio_tqdm
from tqdm.std import tqdm as _std_tqdm

from ..wire.channel import rank_channel
from ..wire.events import ProgressUpdate
from .device_memory import maybe_send_device_memory

__all__ = ["progress", "trange", "patch_tqdm"]

# tqdm.std.tqdm's own methods, saved before any patch: the rank methods below call these explicitly (never
# super()), so they can be installed on tqdm's classes without recursing into themselves.
_STD = dict(_std_tqdm.__dict__)

# format_dict keys a kernel-side view needs for format_meter; only plain values travel (a subclass may add
# objects that do not pickle).
_FORMAT_KEYS = ("n", "total", "elapsed", "ncols", "nrows", "prefix", "ascii", "unit", "unit_scale", "rate",
                "bar_format", "postfix", "unit_divisor", "initial", "colour")
_PLAIN = (str, int, float, bool, type(None))
_bar_ids = itertools.count(1)
# Floor of the send interval: a bar made with mininterval=0 still sends at most 50 states a second.
MIN_SEND_INTERVAL = 0.02


# --------------------------------------------------------------------------------- the rank display methods
# Plain functions taking the bar as ``self``: the ``progress`` class uses them, and ``patch_tqdm`` installs
# them on tqdm's own classes.

def _rank_init(self, iterable=None, *args, **kwargs):
    """tqdm.std.tqdm.__init__ in a rank: ``disable=None`` means "not a TTY → off"; a rank's stderr is a pipe,
    but its bar is shown in the kernel, so None means on."""
    if kwargs.get("disable", False) is None:
        kwargs["disable"] = False
    _STD["__init__"].__get__(self, type(self))(iterable, *args, **kwargs)


def _rank_display(self, msg=None, pos=None, **_notebook_options) -> bool:
    """Where tqdm redraws the terminal line: send the bar's state to the kernel instead.

    tqdm calls this after ``mininterval`` in ``update``/``__iter__``; direct ``refresh()`` calls
    (``set_postfix`` every step, ``tqdm.write``) are gated here to the same interval (at least
    ``MIN_SEND_INTERVAL``) so they cannot flood the pipe. A skipped state goes with the next one, or on close.
    """
    sender = rank_channel()
    if sender is None:
        return False
    now = time.monotonic()
    last = getattr(self, "_na_sent_at", None)
    if last is not None and now - last < max(self.mininterval or 0.0, MIN_SEND_INTERVAL):
        return True
    self._na_sent_at = now
    _send(self, sender, closed=False)
    return True


def _rank_close(self) -> None:
    """Send the exact final state once (n, total, overall rate), then forget the bar."""
    if getattr(self, "disable", True):
        return
    # tqdm's own close shows the overall average rate, not the last EMA.
    self._ema_dt = lambda: None
    sender = rank_channel()
    start_t = getattr(self, "start_t", None)
    never_shown = start_t is not None and self.delay > 0 and self.last_print_t < start_t + self.delay
    if sender is not None and not never_shown:
        _send(self, sender, closed=True)
    self.disable = True
    self._decr_instances(self)
    from . import metrics  # a loop's end is a natural point to deliver the last reported scalars

    metrics.flush()


def _rank_nothing(self, *_args, **_kwargs) -> None:
    """clear()/moveto(): terminal cursor work; a rank has no terminal."""


def _rank_status_printer(*_args, **_kwargs) -> Callable[[str], None]:
    """tqdm's line printer (std) or widget factory (notebook): in a rank, nothing is ever printed."""
    return _print_nothing


def _print_nothing(_text: str) -> None:
    pass


def _rank_notebook_init_for(notebook_class: type) -> Callable[..., None]:
    def __init__(self, *args, **kwargs) -> None:
        """tqdm.notebook's __init__ in a rank: skip its ipywidgets, keep the rest of the MRO (asyncio, std)."""
        kwargs.pop("display", None)
        super(notebook_class, self).__init__(*args, **kwargs)

    return __init__


def _send(bar: Any, sender: Any, closed: bool) -> None:
    fmt = bar.format_dict
    position = abs(getattr(bar, "pos", 0) or 0)
    leave = bar.leave if bar.leave is not None else position == 0
    bar_id = getattr(bar, "_na_bar_id", None)
    if bar_id is None:
        bar_id = bar._na_bar_id = next(_bar_ids)
    event = ProgressUpdate(
        rank=sender.rank, bar_id=bar_id, desc=bar.desc or "", n=bar.n, total=bar.total,
        elapsed=fmt.get("elapsed", 0.0), rate=fmt.get("rate"), postfix=bar.postfix, position=position,
        closed=closed, unit=fmt.get("unit") or "it",
        format_dict={k: fmt[k] for k in _FORMAT_KEYS if isinstance(fmt.get(k), _PLAIN)}, leave=bool(leave))
    try:
        sender.send(event)
    except (OSError, ValueError):  # the launch is over (pipe closed) while a bar is garbage-collected
        pass
    maybe_send_device_memory(sender)  # torch's peak device memory, at most once a second


# --------------------------------------------------------------------------------------------- the bar class

class progress(_asyncio_tqdm):
    """A tqdm bar that shows in the launch's dashboard; ``tqdm.auto.tqdm`` outside a launch.

    Same signature as ``tqdm``. Example::

        from notebook_accel import progress, report

        def train():
            for epoch in progress(range(3), desc="epoch"):
                for batch in progress(loader, desc="step", leave=False):
                    loss = step(batch)
                    report(loss=loss)

    Inside a rank nothing is written to the terminal; the bar's state travels to the kernel at most every
    ``mininterval`` seconds (default 0.1) and once, exactly, when it closes.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls is progress and rank_channel() is None:
            return _local_tqdm_class()(*args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, iterable: Any = None, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("disable", False) is None:  # see _rank_init
            kwargs["disable"] = False
        super().__init__(iterable, *args, **kwargs)

    display = _rank_display
    close = _rank_close
    clear = _rank_nothing
    moveto = _rank_nothing
    status_printer = staticmethod(_rank_status_printer)


def trange(*args: Any, **kwargs: Any) -> progress:
    """``progress(range(*args), **kwargs)``, as ``tqdm.trange``."""
    return progress(range(*args), **kwargs)


# ------------------------------------------------------------------------------------------------ patching

# Modules whose names resolve to our bar in a rank: module -> {attribute: replacement}.
def _module_patches() -> Dict[str, Dict[str, Any]]:
    return {
        "tqdm": {"tqdm": progress, "trange": trange},
        "tqdm.auto": {"tqdm": progress, "trange": trange},
        "tqdm.autonotebook": {"tqdm": progress, "trange": trange},
        "tqdm.notebook": {"tqdm": progress, "trange": trange, "tqdm_notebook": progress, "tnrange": trange},
    }


_STD_METHODS = {"__init__": _rank_init, "display": _rank_display, "close": _rank_close,
                "clear": _rank_nothing, "moveto": _rank_nothing,
                "status_printer": staticmethod(_rank_status_printer)}

_MISSING = object()


def _notebook_methods(notebook_class: type) -> Dict[str, Any]:
    # tqdm.notebook overrides these; its __iter__/update/reset wrap super() to colour a widget, which a rank
    # does not have, so std's plain versions are put back.
    return {"__init__": _rank_notebook_init_for(notebook_class), "display": _rank_display, "close": _rank_close,
            "clear": _rank_nothing, "status_printer": staticmethod(_rank_status_printer),
            "__iter__": _STD["__iter__"], "update": _STD["update"], "reset": _STD["reset"]}


def _local_tqdm_class() -> type:
    """What ``progress`` is outside a launch: tqdm.auto's class (imported only then: in a forked rank,
    importing tqdm.auto would pull in tqdm.notebook and ipywidgets)."""
    from tqdm.auto import tqdm as auto_tqdm

    return _asyncio_tqdm if auto_tqdm is progress else auto_tqdm  # (the former only while patched)


def patch_tqdm() -> Callable[[], None]:
    """Make every tqdm in this process report to the current launch; returns a function that undoes it.

    Called by ``rank.run_rank`` in each rank before it unpickles the user's function (so names that cloudpickle
    resolves by reference resolve to the patched objects), and by the inline backend around the function.
    The undo restores every attribute, class method and ``sys.modules`` entry, and delivers metrics that
    ``report`` was still holding back.

    Example::

        undo = patch_tqdm()
        try:
            run_user_function()
        finally:
            undo()
    """
    from . import metrics

    global _patch_depth, _patch_undo
    with _patch_lock:
        if _patch_depth == 0:  # the first rank of this process patches; ranks that are threads share it
            metrics.reset_for_rank()
            _patch_undo = _apply_patches()
        _patch_depth += 1
    done = False

    def unpatch() -> None:
        global _patch_depth
        nonlocal done
        if done:
            return
        done = True
        metrics.flush()
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0 and _patch_undo is not None:
                _patch_undo()

    return unpatch


_patch_lock = threading.Lock()
_patch_depth = 0   # ranks of this process inside patch_tqdm (several where ranks are threads: XLA)
_patch_undo: Optional[Callable[[], None]] = None


def _apply_patches() -> Callable[[], None]:
    """Patch tqdm's classes and modules; return what restores them."""
    undo: List[Callable[[], None]] = []

    def set_attr(owner: Any, name: str, value: Any) -> None:
        old = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
        setattr(owner, name, value)
        undo.append(lambda: setattr(owner, name, old) if old is not _MISSING else delattr(owner, name))

    # 1. tqdm's classes: names bound before the patch, and library subclasses, report too.
    for name, method in _STD_METHODS.items():
        set_attr(_std_tqdm, name, method)
    notebook_module = sys.modules.get("tqdm.notebook")
    notebook_class = getattr(notebook_module, "tqdm_notebook", None)
    if isinstance(notebook_class, type) and notebook_class is not progress:
        for name, method in _notebook_methods(notebook_class).items():
            set_attr(notebook_class, name, method)

    # 2. Module attributes; modules not imported yet get a shim (importing tqdm.notebook means ipywidgets).
    package = sys.modules["tqdm"]
    for module_name, attributes in _module_patches().items():
        module = sys.modules.get(module_name)
        if module is None:
            shim = types.ModuleType(module_name, f"notebook_accel's stand-in for {module_name} inside a rank")
            shim.__dict__.update(attributes)
            shim.__all__ = sorted(attributes)
            sys.modules[module_name] = shim
            undo.append(lambda name=module_name: sys.modules.pop(name, None))
            set_attr(package, module_name.rsplit(".", 1)[1], shim)
            continue
        for attribute, value in attributes.items():
            set_attr(module, attribute, value)

    def restore() -> None:
        for step in reversed(undo):
            step()

    return restore
