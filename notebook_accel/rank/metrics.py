"""``report(step=None, **metrics)``: scalars from a rank to the dashboard's plots and the bars' postfix.

Runs inside ranks: imports neither torch nor ipywidgets. A value may be anything ``float()`` accepts — a
Python number, a NumPy scalar, a one-element tensor (``float(t)`` does ``t.item()``; on a GPU that is a
device sync, as logging a loss always is).

Sending is cheap but not free (a pickle and a pipe write), and a loop may call ``report`` every iteration,
so a rank sends at most one ``MetricReport`` every ``MIN_INTERVAL`` seconds. Calls in between are merged —
the latest value of each name wins, so a name reported once per epoch is never dropped — and delivered by
the next call, by a short timer, when a progress bar closes, or by ``flush()``.
"""
from __future__ import annotations

import math
import threading
import time
from numbers import Number
from typing import Any, Dict, Optional

from ..wire.channel import rank_channel
from ..wire.events import MetricReport
from .device_memory import maybe_send_device_memory

__all__ = ["report", "flush"]

MIN_INTERVAL = 0.02  # seconds between two MetricReports of one rank (≤ 50 a second)

_lock = threading.Lock()


class _RankThrottle:
    """One rank's report state. Per channel, since the ranks of an XLA worker are threads of one process."""

    def __init__(self, sender: Any) -> None:
        self.sender = sender
        self.last_sent = 0.0
        self.seq = 0
        self.pending: Optional[MetricReport] = None
        self.timer: Optional[threading.Timer] = None


_throttles: Dict[int, _RankThrottle] = {}  # id(sender) -> its state (the sender is kept alive in it)


def report(step: Optional[int] = None, **metrics: Any) -> None:
    """Report scalars (loss, accuracy, lr...) from the current rank; the dashboard plots one line per rank.

    ``step`` is the x position (default: the number of ``report`` calls so far in this rank). Example::

        from notebook_accel import progress, report

        def train():
            for step, batch in enumerate(progress(loader)):
                loss = training_step(batch)
                report(step=step, loss=loss, lr=scheduler.get_last_lr()[0])

    Outside a launch the values go to the postfix of the innermost open tqdm bar, if any.
    """
    values = {str(name): _scalar(name, value) for name, value in metrics.items()}
    if step is not None:
        step = int(step)
    sender = rank_channel()
    if sender is None:
        _show_locally(values)
        return
    with _lock:
        state = _throttles.get(id(sender))
        if state is None:
            state = _throttles[id(sender)] = _RankThrottle(sender)
        state.seq += 1
        event = MetricReport(rank=sender.rank, step=step, metrics=values, seq=state.seq)
        pending = state.pending
        if pending is not None:  # merge: the latest value of each name wins; every call kept in rows
            event.rows = pending.calls() + [(step, event.time, state.seq, values)]
            event.metrics = {**pending.metrics, **values}
            event.step = step if step is not None else pending.step
            state.pending = None
        now = time.monotonic()
        if now - state.last_sent >= MIN_INTERVAL:
            state.last_sent = now
            _send(sender, event)
        else:
            state.pending = event
            _arm_timer(state)


def flush() -> None:
    """Send the values ``report`` is holding back now, for every rank of this process (the end of a rank,
    in ``rank.run_rank``)."""
    with _lock:
        for state in _throttles.values():
            event, state.pending = state.pending, None
            if event is not None:
                state.last_sent = time.monotonic()
                _send(state.sender, event)


def reset_for_rank() -> None:
    """Forget state inherited from a forked parent (called when a rank process starts)."""
    global _lock, _throttles
    _lock = threading.Lock()  # a forked child may inherit it held by a thread that does not exist there
    _throttles = {}


def _send(sender: Any, event: MetricReport) -> None:
    try:
        sender.send(event)
    except (OSError, ValueError):  # the rank's channel is already closed
        pass
    maybe_send_device_memory(sender)  # torch's peak device memory, at most once a second


def _arm_timer(state: _RankThrottle) -> None:
    if state.timer is not None and state.timer.is_alive():
        return
    state.timer = threading.Timer(MIN_INTERVAL, flush)
    state.timer.daemon = True
    state.timer.start()


def _scalar(name: str, value: Any) -> float:
    if isinstance(value, Number):
        return float(value)
    try:
        return float(value)  # numpy scalars, one-element tensors (→ .item())
    except (TypeError, ValueError):
        raise TypeError(f"report({name}=...) needs a number or a one-element tensor, "
                        f"got {type(value).__name__}: {value!r:.80}") from None


def _show_locally(values: Dict[str, float]) -> None:
    """Outside a launch: put the values in the postfix of the innermost open tqdm bar (plain tqdm behaviour)."""
    from tqdm.std import tqdm as std_tqdm

    bars = [bar for bar in list(std_tqdm._instances) if not getattr(bar, "disable", True)]
    if not bars:
        return
    bar = max(bars, key=lambda b: abs(getattr(b, "pos", 0)))
    bar.set_postfix({name: _short(value) for name, value in values.items()}, refresh=False)


def _short(value: float) -> str:
    if math.isfinite(value) and value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"
