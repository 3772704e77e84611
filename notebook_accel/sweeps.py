"""``sweep``: run ``function(config)`` for every config of a list, each trial its own launch, N at a time.

Every trial is an ordinary launch (``launcher.Launch``, its own ranks, rendezvous and outcome): nothing here starts a
process itself. All trials are planned first — the options, every config's pickling — so that a user's error is
raised before any process starts; then at most ``max_concurrent`` run at once, and one table (one row per trial: its
state, its progress, its result or error) follows them.

>>> results = sweep(train, [{"lr": 1e-3}, {"lr": 3e-4}], num_processes=2)   # doctest: +SKIP
"""
from __future__ import annotations

import concurrent.futures as futures
import html
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

from .errors import LaunchConfigError, LaunchConfigTypeError
from .launcher import Launch
from .outcome.shown import show_from_the_call
from .plan.entry_points import resolve_options
from .plan.options import START_LAUNCH, LaunchOptions
from .plan.plan import LaunchPlan, make_plan
from .rank.tracebacks import without_launcher_frames
from .trials import Trial, TrialRunner, TrialView, note, short
from .views import NullView, in_notebook_kernel
from .wire.events import Status

ERRORS = ("raise", "return")   # what a failing trial does to the call: raise once all ended, or stand in the list
WAIT_STEP = 0.1                # how often the scheduler looks for a trial that ended (s)


class SweepTable:
    """The one table of a sweep: text lines (a trial's start and end) or an HTML table in a notebook, updated."""

    HEADERS = ["trial", "config", "state", "time", "result / progress"]

    def __init__(self, display: str) -> None:
        self.display = display
        self.html = display == "widgets" or (display == "auto" and in_notebook_kernel())
        self._handle: Any = None
        self._lock = threading.Lock()

    def show(self, trials: Sequence[Trial]) -> None:
        if self.display == "none" or not self.html:
            return
        from IPython.display import HTML, display

        self._handle = display(HTML(self._render(trials)), display_id=True)

    def changed(self, trials: Sequence[Trial], trial: Optional[Trial] = None) -> None:
        """``trial`` started or ended (text: one line), or any row changed (HTML: the table redrawn)."""
        if self.display == "none":
            return
        with self._lock:
            if self.html and self._handle is not None:
                from IPython.display import HTML

                self._handle.update(HTML(self._render(trials)))
            elif not self.html and trial is not None:
                index, config, state, elapsed, outcome = trial.row()
                print(f"[sweep] trial {index} {config}: {state}" + (f" ({elapsed})" if elapsed else "")
                      + (f": {outcome}" if outcome else ""), flush=True)

    def _render(self, trials: Sequence[Trial]) -> str:
        head = "".join(f"<th style='text-align:left'>{name}</th>" for name in self.HEADERS)
        rows = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(cell)}</td>"
                                        for cell in trial.row()) + "</tr>" for trial in trials)
        return f"<table><tr>{head}</tr>{rows}</table>"


class Sweep(TrialRunner):
    """A sweep's trials as launches from this kernel, ``max_concurrent`` at a time; ``sweep`` makes one and runs it in
    the calling thread."""

    def run(self) -> None:
        self.table.show(self.trials)
        waiting = list(self.trials)
        running: List[Trial] = []
        try:
            while waiting or running:
                while waiting and len(running) < (self.max_concurrent or 1) and not self._stop.is_set():
                    running.append(self._start(waiting.pop(0)))
                if self._stop.is_set():
                    raise KeyboardInterrupt
                # each launch's public future: woken by whichever trial ends first, and by Stop every WAIT_STEP s
                futures.wait([trial.launch.future for trial in running],  # type: ignore[union-attr]
                             timeout=WAIT_STEP, return_when=futures.FIRST_COMPLETED)
                for trial in [trial for trial in running if trial.launch.done]:  # type: ignore[union-attr]
                    running.remove(trial)
                    self._ended(trial)
        except KeyboardInterrupt:
            for trial in running:
                trial.launch.stop()  # type: ignore[union-attr]
            for trial in running:   # every trial's ranks gone before the call returns
                futures.wait([trial.launch.future])  # type: ignore[union-attr]
                self._ended(trial)
            for trial in waiting:
                trial.state = "not started"
            self.table.changed(self.trials)
            raise KeyboardInterrupt("the sweep was interrupted; every running trial's ranks were stopped, "
                                    f"{len(waiting)} trial(s) not started") from None

    def _start(self, trial: Trial) -> Trial:
        launch = Launch(trial.plan, view=TrialView(trial, lambda: self.table.changed(self.trials)))
        trial.launch, trial.state, trial.started = launch, "running", time.monotonic()
        launch.run_in_background()
        self.table.changed(self.trials, trial)
        return trial

    def _ended(self, trial: Trial) -> None:
        launch = trial.launch
        assert launch is not None
        trial.elapsed = time.monotonic() - (trial.started or time.monotonic())
        trial.state = launch.status.value if isinstance(launch.status, Status) else str(launch.status)
        trial.result = launch.result
        if launch.error is not None:
            trial.error = without_launcher_frames(launch.error)
            note(trial.error, f"(notebook_accel: sweep trial {trial.index}, config={short(repr(trial.config))})")
        launch.view = NullView()
        self.table.changed(self.trials, trial)


_last_sweep: Optional[Sweep] = None


def last_sweep() -> Optional[Sweep]:
    """The most recent ``Sweep`` of this kernel: its ``trials`` (each with ``config``, ``state``, ``result``,
    ``error`` and its ``launch``), also after a sweep raised."""
    return _last_sweep


def sweep(function: Callable[..., Any], configs: Sequence[Any], num_processes: Optional[int] = None, *,
          max_concurrent: Optional[int] = None, errors: str = "raise", display: str = "auto",
          **launch_options: Any) -> List[Any]:
    """Run ``function(config)`` for every config in ``configs``, each trial an independent launch of
    ``num_processes`` ranks (its own rendezvous, outcome and traceback), at most ``max_concurrent`` at a time,
    and return the trials' return values (rank 0's, as ``notebook_launcher`` returns) in the order of ``configs``.

    Args:
        function: called as ``function(config)`` on every rank of the trial (cloudpickled, as a launch's).
        configs: a non-empty list of configs (anything picklable: a dict, a number, a dataclass).
        num_processes: ranks per trial (as ``notebook_launcher``'s).
        max_concurrent: how many trials run at once; None = 1 (trials on one machine share its devices and cores:
            raise it when several trials fit, e.g. small CPU trials, or on a cluster with room), except for a job
            array on Slurm (``cluster="slurm"`` from a login node), where None lets Slurm run as many as fit.
        errors: ``"raise"`` (default): every trial runs to its end, then the first failing trial's own exception
            (in the order of ``configs``, as a launch raises it, with its rank's traceback) is raised, noted with
            its trial and how many failed; ``last_sweep().trials`` has every result. ``"return"``: a failing
            trial's exception stands in the returned list in its place.
        display: ``"auto"`` (a table in a notebook, lines elsewhere), ``"widgets"`` (the table), ``"text"``,
            ``"none"``: one row per trial, its state, progress and result or error.
        **launch_options: any option of ``start_launch`` (``device``, ``timeout``, ``cluster``, ``slurm``, ...),
            the same for every trial; each is checked before any process starts.

    Raises:
        LaunchConfigError: an empty ``configs``, an unpicklable config, a bad ``max_concurrent`` or ``errors``, an
            option a launch would refuse — before any process starts.
        Exception: with ``errors="raise"``, the first failing trial's exception, once every trial ended.
        KeyboardInterrupt: the sweep was interrupted (Ctrl-C, ``last_sweep().stop()``); every running trial's ranks
            were stopped and no more started.

    >>> sweep(lambda lr: lr * 2, [0.1, 0.2, 0.3], num_processes=1, display="none")   # doctest: +SKIP
    [0.2, 0.4, 0.6]
    """
    __tracebackhide__ = True  # noqa: F841
    global _last_sweep
    try:
        trials = _planned_trials(function, configs, num_processes, max_concurrent, errors, display, launch_options)
        running = _sweep_class(trials[0].plan)(trials, max_concurrent, SweepTable(display))
        running.check()
    except LaunchConfigError as refused:
        refused.entry_point = "sweep"
        raise show_from_the_call(without_launcher_frames(refused)) from None
    _last_sweep = running
    running.run()
    failed = [trial for trial in trials if trial.error is not None]
    if failed and errors == "raise":
        first = failed[0].error
        assert first is not None
        note(first, f"(notebook_accel: {len(failed)} of {len(trials)} sweep trials failed: "
                     f"{', '.join(str(trial.index) for trial in failed)}; every trial's result or error is in "
                     f"notebook_accel.last_sweep().trials)")
        raise show_from_the_call(first)
    return [trial.error if trial.error is not None else trial.result for trial in trials]


def _sweep_class(plan: LaunchPlan) -> type:
    """How the trials run: on Slurm outside an allocation, as one job array (``backends.slurm.array``); elsewhere
    as launches from this kernel, N at a time (on Ray each trial its own placement group)."""
    from .backends.slurm.array import ArraySweep, runs_as_array

    return ArraySweep if runs_as_array(plan) else Sweep


def _planned_trials(function: Callable[..., Any], configs: Any, num_processes: Optional[int],
                    max_concurrent: Optional[int], errors: str, display: str,
                    launch_options: dict) -> List[Trial]:
    """Every trial planned (options checked, function and config pickled), or the user's error, before any
    process starts."""
    if isinstance(configs, (str, bytes)) or not isinstance(configs, Sequence):
        raise LaunchConfigTypeError(f"configs must be a list of configs, got {type(configs).__name__}")
    if len(configs) == 0:
        raise LaunchConfigError("configs is empty: give at least one config to run")
    if max_concurrent is not None and (isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int)
                                       or max_concurrent < 1):
        raise LaunchConfigError(f"max_concurrent must be a whole number >= 1 (or None: the default), "
                                f"got {max_concurrent!r}")
    if errors not in ERRORS:
        raise LaunchConfigError(f"errors={errors!r} is not one of {', '.join(repr(choice) for choice in ERRORS)}")
    for taken_here in ("args", "kwargs", "view"):
        if taken_here in launch_options:
            raise LaunchConfigTypeError(f"sweep calls function(config): {taken_here}= is not taken (put what a "
                                        f"trial needs in its config)")
    given = dict(launch_options, num_processes=num_processes, display=display)
    values = resolve_options(START_LAUNCH, given)
    values["display"] = "none"   # each trial's own dashboard: the sweep's table shows the trials
    options = LaunchOptions(**values)
    trials = []
    for index, config in enumerate(configs):
        try:
            plan = make_plan(function, (config,), None, options, allow_inline=False)
            # Pickled now, even where the ranks would inherit it (fork): a config that cannot travel is named
            # before any trial starts, the same on this machine as on a cluster.
            plan.payload.pickled()
        except LaunchConfigError as refused:
            raise LaunchConfigError(f"trial {index} (config={short(repr(config))}): {refused}") from None
        trials.append(Trial(index, config, plan))
    return trials
