"""The state of one launch as the views see it, rebuilt from events only (no widgets, no torch).

``LaunchState.apply(event)`` keeps: the header facts (device, world size, status, elapsed), per rank its
bars (in display slots), latest metrics and status, per metric one ``Series`` per rank, and the outcome.
The widget view and the text view both render from it, so they always agree — and the text summary a
widget leaves in the saved notebook is the same one a terminal prints.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from tqdm.std import tqdm as _tqdm_format  # formatting helpers only (format_meter, format_interval)

from ..formatting import format_bytes, format_value  # noqa: F401  (views.model.format_* for views and tests)
from ..monitor.metric_log import MetricSummary
from ..outcome.root_cause import is_interrupt, is_time_limit
from ..wire.events import (AttemptStarted, LaunchFinished, LaunchStarted, MetricReport, OutputLine, OutputLines,
                           PeersWaiting, ProgressUpdate, PromptAnswered, RankEvent, RankExited, RankFailed, RankPrompt,
                           RankResult, RankStarted, RankStatus, ResourceSample, SessionNotice, Status)

# Colours of ranks 0..9 (matplotlib's tab10), reused in the plots and the rank rows.
STALL_AFTER_SECONDS = 10.0  # a rank whose progress has not moved this long while its peers advance is stalled
SLOWEST_RATIO = 0.8         # a rank is marked slowest when its rate is below this fraction of the others' median

RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

STATUS_COLOURS = {Status.STARTING: "#7f7f7f", Status.RUNNING: "#1f77b4", Status.FINISHED: "#2ca02c",
                  Status.FAILED: "#d62728", Status.STOPPED: "#ff7f0e", Status.TIMEOUT: "#d62728",
                  RankStatus.AT_PROMPT: "#9467bd", RankStatus.CHECKPOINTED: "#17becf"}
# a rank that raised keeps the status its exception gave it (failed; checkpointed: TimeLimitReached)
_RAISED = (RankStatus.FAILED, RankStatus.CHECKPOINTED)


def rank_colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def label_lines(rank: int, lines: List[str]) -> str:
    """``"[rank 1] line\n[rank 1] line\n"``: every line labelled, as one string (one write per block: a C-level
    join, no Python call per line unless a carriage return needs ``clean_line``)."""
    prefix = f"[rank {rank}] "
    text = prefix + ("\n" + prefix).join(lines) + "\n"
    if "\r" in text:  # looked for once in the whole block, not line by line
        text = prefix + ("\n" + prefix).join(clean_line(line) for line in lines) + "\n"
    return text


def format_interval(seconds: float) -> str:
    return _tqdm_format.format_interval(max(0.0, seconds))


def clean_line(text: str) -> str:
    """A captured output line as a terminal would leave it: only the last carriage-return frame."""
    if "\r" in text:
        frames = [frame for frame in text.split("\r") if frame.strip()]
        return frames[-1] if frames else ""
    return text


def resource_text(sample: Optional[ResourceSample], final: bool = False) -> str:
    """``RSS 512 MiB · CPU 98% · GPU 3.1/80 GiB (peak 5.0, torch 4.2) · util 87%`` (``final``: the peaks)."""
    if sample is None:
        return ""
    parts = []
    if final:
        parts.append(f"peak RSS {format_bytes(sample.peak_rss)}")
    elif sample.rss is not None:  # a peak reported by the rank comes before any sample in a short run
        parts.append(f"RSS {format_bytes(sample.rss)}")
        if sample.cpu_percent is not None:
            parts.append(f"CPU {sample.cpu_percent:.0f}%")
    if sample.device_used is not None:
        peaks = [f"peak {format_bytes(sample.device_peak)}"]
        if sample.device_peak_allocated is not None:
            peaks.append(f"torch peak {format_bytes(sample.device_peak_allocated)}")
        used = (f"GPU {format_bytes(sample.device_used)}/{format_bytes(sample.device_total)}" if not final
                else "GPU")
        parts.append(f"{used} ({', '.join(peaks)})")
        if sample.device_util is not None and not final:
            parts.append(f"util {sample.device_util:.0f}%")
    elif sample.device_peak_allocated is not None:
        parts.append(f"torch peak {format_bytes(sample.device_peak_allocated)}")
    return " · ".join(parts)


class Series:
    """Points of one metric from one rank, at most ``max_points`` kept (older ones thinned 2:1 when full)."""

    def __init__(self, max_points: int = 2000) -> None:
        self.max_points = max_points
        self.points: List[Tuple[float, float]] = []
        self._stride = 1
        self._skipped = 0
        self.last: Optional[Tuple[float, float]] = None

    def add(self, x: float, y: float) -> None:
        self.last = (x, y)
        self._skipped += 1
        if self._skipped < self._stride:
            return
        self._skipped = 0
        self.points.append((x, y))
        if len(self.points) > self.max_points:
            self.points = self.points[::2]
            self._stride *= 2

    def view(self) -> List[Tuple[float, float]]:
        """The kept points, always ending with the latest one."""
        if self.last is not None and (not self.points or self.points[-1] != self.last):
            return self.points + [self.last]
        return self.points


@dataclass
class BarState:
    """One progress bar of one rank: its latest ``ProgressUpdate`` and the slot that shows it."""

    rank: int
    bar_id: int
    update: ProgressUpdate
    slot: int

    @property
    def closed(self) -> bool:
        return self.update.closed

    @property
    def complete(self) -> bool:
        total = self.update.total
        return bool(total) and self.update.n >= total

    def meter(self, extra_postfix: str = "", ascii: Optional[bool] = None, ncols: Optional[int] = None) -> str:
        """tqdm's own line for this bar (``desc: 45%|████▌ | 45/100 [00:01<00:01, 40.1it/s, loss=0.3]``)."""
        return _tqdm_format.format_meter(**self._format_args(extra_postfix, ascii=ascii, ncols=ncols))

    def right_text(self, extra_postfix: str = "") -> str:
        """What follows the bar: ``45% 45/100 [00:01<00:01, 40.1it/s, loss=0.3]``."""
        args = self._format_args(extra_postfix)
        args["prefix"] = ""
        if args.get("total"):
            args["bar_format"] = "{percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
        else:
            args["bar_format"] = "{n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]"
        try:
            return _tqdm_format.format_meter(**args).strip()
        except Exception:  # a user bar_format/unit that does not format: still show the counts
            return f"{self.update.n}/{self.update.total}"

    def _format_args(self, extra_postfix: str, ascii: Optional[bool] = None,
                     ncols: Optional[int] = None) -> Dict[str, object]:
        update = self.update
        args: Dict[str, object] = dict(update.format_dict) if update.format_dict else {
            "n": update.n, "total": update.total, "elapsed": update.elapsed, "rate": update.rate,
            "unit": update.unit, "prefix": update.desc, "postfix": update.postfix}
        args.update(n=update.n, total=update.total, elapsed=update.elapsed)
        args.pop("nrows", None)
        args["ncols"] = ncols
        if ascii is not None:
            args["ascii"] = ascii
        postfix = ", ".join(part for part in (update.postfix or "", extra_postfix) if part)
        args["postfix"] = postfix or None
        if args.get("total") is not None and update.n > (args["total"] or 0):
            args["total"] = update.n  # tqdm's own behaviour when n overshoots total
        return args

    def summary_line(self) -> str:
        """A finished loop in one compact line: ``epoch 1: 100/100 [00:03, 33.0it/s, loss=0.3]``."""
        args = self._format_args("")
        args["prefix"] = ""
        args["bar_format"] = ("{n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]" if args.get("total")
                              else "{n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]")
        try:
            counts = _tqdm_format.format_meter(**args).strip()
        except Exception:
            counts = f"{self.update.n}/{self.update.total}"
        return f"{self.desc}: {counts}" if self.desc else counts

    @property
    def desc(self) -> str:
        return (self.update.desc or "").rstrip().rstrip(":")


@dataclass
class RankState:
    """One rank: status, pid, bars by slot, latest metrics, its failure if it had one."""

    rank: int
    status: RankStatus = RankStatus.STARTING
    pid: Optional[int] = None
    host: Optional[str] = None   # the node it runs on, when not this machine (a cluster's)
    network: Optional[str] = None  # the interface and address it offers its peers, where the launcher chose them
    exitcode: Optional[int] = None
    signal_name: Optional[str] = None
    bars: Dict[int, BarState] = field(default_factory=dict)  # bar_id -> state, open and kept ones
    slots: List[Optional[int]] = field(default_factory=list)  # slot -> bar_id shown there
    metrics: Dict[str, float] = field(default_factory=dict)
    failure: Optional[RankFailed] = None
    root_cause: bool = False
    output_lines: int = 0
    resources: Optional[ResourceSample] = None  # the latest sample (memory, CPU, GPU)
    # finished leave=True loops whose slot a new loop took: one summary line each (the last few kept)
    finished_loops: List[str] = field(default_factory=list)
    finished_loop_count: int = 0
    last_progress_at: Optional[float] = None  # monotonic time a bar of this rank last moved (or it reported)
    last_output_at: Optional[float] = None    # wall-clock time of its last output line
    prompt: Optional[RankPrompt] = None       # what it waits for while AT_PROMPT (pdb at a breakpoint, input())

    def archive(self, bar: BarState, keep: int = 8) -> None:
        self.finished_loops.append(bar.summary_line())
        self.finished_loop_count += 1
        del self.finished_loops[:-keep]

    def visible_bars(self) -> List[BarState]:
        return [self.bars[bar_id] for bar_id in self.slots if bar_id is not None]

    def metrics_bar(self) -> Optional[BarState]:
        """The bar whose postfix shows the reported metrics: the innermost open bar, else the last shown."""
        bars = self.visible_bars()
        if not bars:
            return None
        open_bars = [bar for bar in bars if not bar.closed]
        return max(open_bars or bars, key=lambda bar: (bar.update.position, bar.slot))

    def metrics_postfix(self) -> str:
        return ", ".join(f"{name}={format_value(value)}" for name, value in self.metrics.items())


class LaunchState:
    """Everything a view shows about a launch, updated by ``apply(event)``."""

    def __init__(self) -> None:
        self.started: Optional[LaunchStarted] = None
        self.finished: Optional[LaunchFinished] = None
        self.status = Status.STARTING
        self.start_time = time.monotonic()
        self.ranks: Dict[int, RankState] = {}
        self.series: Dict[str, Dict[int, Series]] = {}  # metric -> rank -> points
        self.x_is_time: Dict[str, bool] = {}  # metric -> x is seconds since the start (reported without step)
        self.metric_summary = MetricSummary()
        self.start_wall = time.time()
        self.stall_after = STALL_AFTER_SECONDS
        self.attempt: Optional[AttemptStarted] = None    # set once a restart began
        self.peers_waiting: Optional[PeersWaiting] = None  # a rank finished while others still run
        self.session_notices: List[str] = []  # what a warm session did after this run ("ranks restarted: ...")
        self.prompt_left_at: Optional[float] = None  # when a rank last left a prompt (peers waited for it till then)

    # ------------------------------------------------------------------------------------------ reading
    @property
    def world_size(self) -> int:
        return self.started.world_size if self.started else len(self.ranks)

    @property
    def device(self) -> str:
        return self.started.device if self.started else "?"

    def elapsed(self) -> float:
        if self.finished is not None:
            return self.finished.elapsed
        return time.monotonic() - self.start_time

    def rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank)
        return state

    # ------------------------------------------------------------------------------------------ writing
    def apply(self, event: RankEvent) -> Optional[object]:
        """Update the state; return the object that changed (a BarState, a RankState, a metric name...)."""
        if isinstance(event, ProgressUpdate):
            return self._on_progress(event)
        if isinstance(event, MetricReport):
            return self._on_metrics(event)
        if isinstance(event, PeersWaiting):
            self.peers_waiting = event
            return self
        if isinstance(event, SessionNotice):
            self.session_notices.append(event.text)
            return self
        if isinstance(event, (OutputLine, OutputLines)):
            state = self.rank(event.rank)
            state.output_lines += len(event.texts)
            state.last_output_at = time.time()
            return state
        if isinstance(event, ResourceSample):
            state = self.rank(event.rank)
            state.resources = event
            return state
        if isinstance(event, LaunchStarted):
            self.started = event
            self.start_time = time.monotonic()
            self.start_wall = time.time()
            for rank in (event.ranks if event.ranks is not None else range(event.world_size)):
                self.rank(rank)
            return self
        if isinstance(event, AttemptStarted):
            self.attempt = event
            for rank in list(self.ranks):  # the whole world runs again: every row starts over (the metric
                self.ranks[rank] = RankState(rank)  # series go on: attempt 2's curve continues attempt 1's)
            self.status = Status.STARTING
            return self
        if isinstance(event, RankStarted):
            state = self.rank(event.rank)
            state.pid = event.pid
            state.host = event.host
            state.network = event.network
            state.status = RankStatus.RUNNING
            if self.status == Status.STARTING and all(r.status != RankStatus.STARTING for r in self.ranks.values()):
                self.status = Status.RUNNING
            return state
        if isinstance(event, RankPrompt):
            state = self.rank(event.rank)
            if state.status in (RankStatus.STARTING, RankStatus.RUNNING, RankStatus.AT_PROMPT):
                state.status, state.prompt = RankStatus.AT_PROMPT, event
            return state
        if isinstance(event, PromptAnswered):
            state = self.rank(event.rank)
            if state.status == RankStatus.AT_PROMPT:
                # It runs again; the time at the prompt was no stall.
                state.status, state.prompt = RankStatus.RUNNING, None
                self.prompt_left_at = time.monotonic()
            return state
        if isinstance(event, RankResult):
            self.rank(event.rank).status = RankStatus.FINISHED
            return self.rank(event.rank)
        if isinstance(event, RankFailed):
            state = self.rank(event.rank)
            state.failure = event
            state.status = RankStatus.CHECKPOINTED if is_time_limit(event) else RankStatus.FAILED
            return state
        if isinstance(event, RankExited):
            state = self.rank(event.rank)
            state.exitcode, state.signal_name = event.exitcode, event.signal_name
            if event.stopped and state.status not in _RAISED:  # a rank that raised stays as it said (root cause)
                state.status = RankStatus.STOPPED
            elif state.status in (RankStatus.STARTING, RankStatus.RUNNING, RankStatus.AT_PROMPT):
                state.status = RankStatus.FINISHED if event.exitcode == 0 else RankStatus.EXITED
            return state
        if isinstance(event, LaunchFinished):
            self.finished = event
            self.status = event.status
            if event.root_rank in self.ranks:  # on another node's dashboard the root rank has no row
                self.ranks[event.root_rank].root_cause = True
            for state in self.ranks.values():
                if _interrupted_by_the_stop(state, event.status):
                    state.status = RankStatus.STOPPED  # the stop's own interrupt, raised in it: stopped, not failed
                    continue
                if state.root_cause or state.status in (RankStatus.FINISHED, *_RAISED):
                    continue
                if event.status == Status.FINISHED:
                    state.status = RankStatus.FINISHED
                    continue
                if state.rank in event.still_running or state.status in (RankStatus.STARTING, RankStatus.RUNNING,
                                                                         RankStatus.AT_PROMPT):
                    state.status = RankStatus.STOPPED
            return self
        return None

    def _on_progress(self, event: ProgressUpdate) -> Optional[BarState]:
        state = self.rank(event.rank)
        if state.status == RankStatus.STARTING:
            state.status = RankStatus.RUNNING
        bar = state.bars.get(event.bar_id)
        if bar is None or bar.update.n != event.n:
            state.last_progress_at = time.monotonic()
        if bar is None:
            slot = self._free_slot(state, event.position)
            bar = state.bars[event.bar_id] = BarState(event.rank, event.bar_id, event, slot)
            state.slots[slot] = event.bar_id
        bar.update = event
        if event.closed and not event.leave:  # leave=False: the bar disappears, as in tqdm
            state.slots[bar.slot] = None
            del state.bars[event.bar_id]
        return bar

    @staticmethod
    def _free_slot(state: RankState, position: int) -> int:
        """A slot for a new bar: an empty one, or one whose bar is closed at the same nesting position
        (a new epoch's inner bar replaces the last one instead of adding a row), else a new slot."""
        for slot, bar_id in enumerate(state.slots):
            if bar_id is None:
                return slot
        for slot, bar_id in enumerate(state.slots):
            old = state.bars.get(bar_id)
            if old is not None and old.closed and old.update.position == position:
                del state.bars[bar_id]
                if old.update.leave:  # tqdm's leave=True: the finished loop stays, as one summary line
                    state.archive(old)
                return slot
        state.slots.append(None)
        return len(state.slots) - 1

    def _on_metrics(self, event: MetricReport) -> List[str]:
        state = self.rank(event.rank)
        state.metrics.update(event.metrics)
        state.last_progress_at = time.monotonic()
        self.metric_summary.add(event)
        for step, when, _seq, values in event.calls():
            for name, value in values.items():
                # x is the step; a metric first reported without one is plotted against time instead
                by_time = self.x_is_time.setdefault(name, step is None)
                if by_time:
                    x = when - self.start_wall
                elif step is not None:
                    x = float(step)
                else:  # a step-less call of a metric plotted by step: right after its last point
                    last = self.series.get(name, {}).get(event.rank)
                    x = last.last[0] + 1 if last is not None and last.last is not None else 0.0
                self.series.setdefault(name, {}).setdefault(event.rank, Series()).add(x, float(value))
        return list(event.metrics)

    # ------------------------------------------------------------------------------------ stragglers
    def stalled_for(self, state: RankState, now: Optional[float] = None) -> Optional[float]:
        """Seconds since ``state``'s progress last moved, when that is ``stall_after`` or more while a peer
        moved within ``stall_after`` (a rank that is merely waiting with everyone else is not stalled). While a rank
        sits at a prompt (pdb), and until ``stall_after`` after it left one, no rank is stalled: its peers may be
        waiting for it in a collective, and the person debugging it is no slow code."""
        if self.finished is not None or state.status != RankStatus.RUNNING or len(self.ranks) < 2:
            return None
        if any(peer.status == RankStatus.AT_PROMPT for peer in self.ranks.values()):
            return None
        now = time.monotonic() if now is None else now
        since = state.last_progress_at if state.last_progress_at is not None else self.start_time
        if self.prompt_left_at is not None:
            since = max(since, self.prompt_left_at)
        idle = now - since
        if idle < self.stall_after:
            return None
        peers_moving = any(peer.last_progress_at is not None and now - peer.last_progress_at < self.stall_after
                           for peer in self.ranks.values() if peer is not state)
        return idle if peers_moving else None

    def slowest_rank(self) -> Optional[Tuple[int, float, float]]:
        """(rank, its rate, the others' median rate) when one running rank's innermost loop is clearly slower
        than the same loop on every peer (below ``SLOWEST_RATIO`` of their median), else None."""
        if self.finished is not None or len(self.ranks) < 2:
            return None
        rates: Dict[int, float] = {}
        loops = set()
        for state in self.ranks.values():
            bar = state.metrics_bar()
            if state.status != RankStatus.RUNNING or bar is None or bar.closed or not bar.update.rate:
                return None
            rates[state.rank] = float(bar.update.rate)
            loops.add((bar.desc, bar.update.position))
        if len(loops) != 1:  # not the same loop everywhere: rates are not comparable
            return None
        slowest = min(rates, key=rates.__getitem__)
        others = sorted(rate for rank, rate in rates.items() if rank != slowest)
        median = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1]
                                                                    + others[len(others) // 2]) / 2
        if rates[slowest] < SLOWEST_RATIO * median:
            return slowest, rates[slowest], median
        return None

    def straggler_text(self, state: RankState, now: Optional[float] = None) -> str:
        """``no progress for 42 s (last output 12:03:04)`` / ``slowest: 12.0 it/s (others 30.1 it/s)`` / ""."""
        stalled = self.stalled_for(state, now)
        if stalled is not None:
            last = (time.strftime("%H:%M:%S", time.localtime(state.last_output_at))
                    if state.last_output_at is not None else "none yet")
            return f"no progress for {stalled:.0f} s (last output {last})"
        slowest = self.slowest_rank()
        if slowest is not None and slowest[0] == state.rank:
            unit = (state.metrics_bar().update.unit or "it") if state.metrics_bar() else "it"
            return f"slowest: {slowest[1]:.3g} {unit}/s (others {slowest[2]:.3g} {unit}/s)"
        return ""

    # ------------------------------------------------------------------------------------------ summary
    def header_text(self) -> str:
        started = self.started
        parts = [f"{self.world_size} × {self.device}"]
        if started is not None:
            if started.function_name:
                parts.insert(0, launch_title(started.function_name))
            if started.mixed_precision and started.mixed_precision != "no":
                parts.append(started.mixed_precision)
            if started.start_up:
                parts.append(started.start_up)
        parts += [f"{name} {value}" for name, value in self.place()]
        parts.append(self.status)
        parts.append(format_interval(self.elapsed()))
        return " · ".join(parts)

    def place(self) -> List[Tuple[str, str]]:
        """``("node rank", "1 of 2")`` for a multi-node launch (a node rank, like ``node_rank`` and the errors'
        "on node 1": not a count beside the attempt's), ``("attempt", "2/3")`` once a restart began."""
        items = []
        if self.started is not None and self.started.num_nodes > 1:
            items.append(("node rank", f"{self.started.node_rank} of {self.started.num_nodes}"))
        if self.attempt is not None:
            items.append(("attempt", f"{self.attempt.attempt + 1}/{self.attempt.max_restarts + 1}"))
        return items

    def resource_totals(self) -> str:
        """The header's totals over the ranks: ``RSS 1.0 GiB · CPU 196% · GPU 6.2/160 GiB``."""
        samples = [state.resources for state in self.ranks.values() if state.resources is not None]
        if not samples:
            return ""
        live = self.finished is None
        rss = sum((s.rss if live else s.peak_rss) or 0 for s in samples)
        parts = [f"RSS {format_bytes(rss)}" if live else f"peak RSS {format_bytes(rss)}"]
        if live:
            parts.append(f"CPU {sum(s.cpu_percent or 0.0 for s in samples):.0f}%")
        devices = [s for s in samples if s.device_used is not None]
        if devices:
            used = sum((s.device_used if live else s.device_peak) or 0 for s in devices)
            total = sum(s.device_total or 0 for s in devices)
            parts.append(f"GPU {format_bytes(used)}/{format_bytes(total)}" if live
                         else f"peak GPU {format_bytes(used)}")
        return " · ".join(parts)

    def rank_status_text(self, state: RankState, mark_root: bool = True) -> str:
        if state.status == RankStatus.AT_PROMPT and state.prompt is not None:
            return state.prompt.describe()  # "at breakpoint (train.py:12)"
        text = str(state.status)
        if state.root_cause and mark_root:
            text += " (root cause)"
        if state.status == RankStatus.EXITED or (state.status == RankStatus.FAILED and state.failure is None):
            if state.signal_name:
                text += f", {state.signal_name}"
            elif state.exitcode is not None:
                text += f", exit code {state.exitcode}"
        return text

    def summary_lines(self, ascii: bool = True, ncols: Optional[int] = None,
                      closed_loops: bool = True) -> List[str]:
        """A readable final (or current) summary: header, then one line per bar per rank, then the error.

        ``closed_loops=False`` leaves out the loops that closed (the text view printed each one's last line as it
        closed: the summary repeated them); the open ones, where a failed or stopped rank was, stay."""
        lines = [f"notebook_accel: {self.header_text()}"]
        for rank in sorted(self.ranks):
            state = self.ranks[rank]
            prefix = f"[rank {rank}] "
            bars = state.visible_bars()
            metrics_bar = state.metrics_bar()
            earlier = state.finished_loop_count - len(state.finished_loops)
            if earlier and closed_loops:
                lines.append(prefix + f"… {earlier} earlier finished loop{'s' if earlier > 1 else ''}")
            lines.extend(prefix + "✓ " + line if not ascii else prefix + "done " + line
                         for line in (state.finished_loops if closed_loops else ()))
            for bar in bars if closed_loops else [bar for bar in bars if not bar.closed]:
                extra = state.metrics_postfix() if bar is metrics_bar else ""
                lines.append(prefix + bar.meter(extra, ascii=ascii, ncols=ncols))
            if not bars and state.metrics:
                lines.append(prefix + state.metrics_postfix())
            resources = resource_text(state.resources, final=self.finished is not None)
            where = (f" · on {state.host}" if state.host else "") + (f" via {state.network}" if state.network else "")
            lines.append(prefix + self.rank_status_text(state) + where + (f" · {resources}" if resources else ""))
        if self.attempt is not None:
            lines += [f"attempt {number + 1}: {error}" for number, error in enumerate(self.attempt.previous_errors)]
        finished = self.finished
        if finished is not None and finished.error:
            lines.append(f"error: {finished.error}")
        if finished is not None and self.metric_summary:
            lines.append("metrics:")
            lines.extend("  " + line for line in self.metric_summary.text().splitlines())
        return lines


def launch_title(function_name: str) -> str:
    """``train()`` for a function; a script launch's ``python train.py --lr 3`` is shown as it is."""
    return f"{function_name}()" if function_name.replace(".", "").isidentifier() else function_name


def _interrupted_by_the_stop(state: "RankState", status: Status) -> bool:
    """A rank that raised ``KeyboardInterrupt`` in a launch ended by Ctrl-C, Stop or a timeout, without being its
    root cause: the interrupt the stop sent it (a relayed rank on Ray or Slurm is interrupted, not killed). Its row
    says "stopped", as the headline does, instead of "failed"."""
    failure = state.failure
    return (status in (Status.STOPPED, Status.TIMEOUT) and state.status == RankStatus.FAILED and not state.root_cause
            and failure is not None and is_interrupt(failure))
