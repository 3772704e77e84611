"""``notebook_launcher``: run a function on N ranks from a notebook cell and bring back what it returns.

The flow: ``make_plan`` checks the options (one ``LaunchOptions``) and pickles the function (errors before any process
starts) → the plan's backend hosts the rendezvous → the backend starts, supervises and cleans up the
ranks, turning what they send into events for the view → the outcome is returned or raised.
"""
from __future__ import annotations

import asyncio
import threading
import time
import warnings
import weakref
from collections import defaultdict
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

from .backends import Backend, LaunchSink, backend_for
from .backends.prompts import asker_here
from .backends.rendezvous import HostedStore
from .errors import LaunchConfigError, LaunchError, LaunchTimeout, one_line
from .monitor.metric_log import MetricLog
from .monitor.resources import ResourceSampler
from .outcome.oom import explain as explain_out_of_memory
from .outcome.oom import cuda_oom_figures, kind_of_failure, oom_kill_count
from .outcome.raising import root_cause_exception
from .outcome.shown import show_from_the_call
from .outcome.root_cause import Outcome
from .outcome.stacks import fold_inherited_frames, fold_stack_dump
from .plan.devices import ipython_shell
from .plan.entry_points import entry_point
from .plan.options import LaunchOptions, PathLike
from .plan.plan import LaunchPlan, make_plan
from .rank.tracebacks import without_launcher_frames
from .views import NullView, View, make_view
from .wire.choices import (ClusterName, DeviceName, DisplayName, MixedPrecisionName, PlacementName,
                           RendezvousBackendName, StartMethodName)
from .wire.events import LaunchFinished, MetricReport, OutputLine, OutputLines, RankEvent, RankFailed, Status


class Launch:
    """One launch, as a job object: wait on it, stop it, read its output.

    ``notebook_launcher`` makes one and waits in the calling thread; ``start_launch`` runs it in a
    background thread (the launch panel's Launch button) and returns at once.

    ``job.future`` is a ``concurrent.futures.Future`` completed when the launch ends (with the result, or the
    root cause as its exception), for ``add_done_callback``, ``concurrent.futures.wait`` and
    ``asyncio.wrap_future``; a ``Launch`` is also awaitable (``value = await start_launch(...)`` in a cell).
    It is not itself a ``Future``: ``result``, ``error`` and ``done`` stay the attributes users read.

    >>> job = start_launch(train, num_processes=2, display="none")   # doctest: +SKIP
    >>> job.future.add_done_callback(lambda future: print("done"))   # doctest: +SKIP
    >>> job.stop(); job.wait()                                        # doctest: +SKIP
    """

    def __init__(self, plan: LaunchPlan, view: Optional[View] = None, backend: Optional[Backend] = None) -> None:
        self.plan = plan
        self.backend = backend if backend is not None else backend_for(plan)  # a session passes its own
        self.view: View = view if view is not None else make_view(plan.display)
        if hasattr(self.view, "on_dump_stacks"):  # the dashboard's "where is each rank?" button
            # Weakly: the widget outlives the launch in the notebook's output, and must not keep its result alive.
            self.view.on_dump_stacks = _while_alive(self.dump_stacks, {})  # type: ignore[attr-defined]
        self.status = Status.STARTING  # then RUNNING, then FINISHED | FAILED | STOPPED | TIMEOUT (see ``Status``)
        self.outputs: Dict[int, List[str]] = defaultdict(list)  # by global rank
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.root_rank: Optional[int] = None  # the root-cause rank of a failure
        self.failed_ranks: List[int] = []     # the ranks that raised, in the order their failures came
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self.future: "Future[Any]" = Future()  # completed by _end, with the result or the root cause
        # Running from the start: a launch is stopped with stop(), never cancelled (future.cancel() is False).
        self.future.set_running_or_notify_cancel()
        self._thread: Optional[threading.Thread] = None
        self.metric_log = MetricLog()
        self.resources = ResourceSampler(self._deliver, device=plan.device)  # memory/CPU/GPU per rank
        self.out_of_memory: Optional[str] = None  # the one-line explanation when a rank ran out of memory
        self._oom_kills_before: Optional[int] = None
        global _last_launch
        _last_launch = self

    @property
    def metrics(self) -> Any:
        """Every value the ranks reported with ``report``: a pandas DataFrame with columns rank, step, time,
        name, value. Readable while the launch runs. Without pandas an ``ImportError`` says what to install;
        ``metric_log.rows()`` gives the same rows as ``MetricRow`` named tuples.

        >>> job.metrics.groupby(["name", "rank"])["value"].min()   # doctest: +SKIP
        """
        return self.metric_log.table()

    # ------------------------------------------------------------------------------------------- control

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def stop(self) -> None:
        """Ask every rank to stop (thread-safe); ``wait`` then raises ``KeyboardInterrupt``."""
        self._stop_requested.set()

    def dump_stacks(self, timeout: float = 2.0, *, full: bool = False) -> Dict[int, str]:
        """Where is each rank? Every running rank's Python stacks, all threads (faulthandler's format), by
        rank — for a rank stuck in a collective or a deadlock. The view shows them too. A forked rank's main
        thread also holds the kernel's stack from the moment of the fork (IPython, ipykernel, the cell's line):
        folded into one line, unless ``full``.

        >>> job = start_launch(train, num_processes=2)        # doctest: +SKIP
        >>> print(job.dump_stacks()[1])                         # doctest: +SKIP
        Current thread 0x00007f... (most recent call first):
          File "/tmp/ipykernel_4711/3127.py", line 12 in train
          ...
          File ".../multiprocessing/process.py", line 314 in _bootstrap
          [27 frames from before the rank started (the kernel's own, if forked) folded; full=True has them]
        """
        if self.done:
            return {}
        stacks = self.backend.dump_stacks(timeout)
        return stacks if full else {rank: fold_inherited_frames(text) for rank, text in stacks.items()}

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the launch ends; return the result or raise the root cause."""
        __tracebackhide__ = True  # noqa: F841 -- IPython and pytest fold this frame: the rank's frames matter
        if not self._done.wait(timeout):
            raise TimeoutError(f"the launch is still running after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result

    def __await__(self):
        """``await job``: the result, or the root cause raised, without blocking the notebook's event loop."""
        return asyncio.wrap_future(self.future).__await__()

    def run(self) -> Any:
        """Run the launch in this thread (``notebook_launcher`` does this)."""
        __tracebackhide__ = True  # noqa: F841
        store = self._host_store()
        unexpected: Optional[BaseException] = None
        try:
            self._run(store)
        except BaseException as error:
            unexpected = error
            raise
        finally:
            self._end(unexpected)
        return self.wait()

    def run_in_background(self) -> "Launch":
        """Start the launch in a daemon thread and return at once (port errors still raise here)."""
        store = self._host_store()
        self._thread = threading.Thread(target=self._run_quietly, args=(store,), name="notebook_accel-launch",
                                        daemon=True)
        self._thread.start()
        return self

    def _run_quietly(self, store: HostedStore) -> None:
        try:
            self._run(store)
        except BaseException as unexpected:  # kept for wait(); a background thread must not print it
            if self.error is None:
                self.error = unexpected
        finally:
            self._end()

    def _end(self, unexpected: Optional[BaseException] = None) -> None:
        """The launch is over: ``wait`` returns, and the future completes (its callbacks run in this thread)."""
        self._done.set()
        error = self.error if self.error is not None else unexpected
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(self.result)

    # ------------------------------------------------------------------------------------------- the run

    def _host_store(self) -> HostedStore:
        return self.backend.open_rendezvous()

    def _deliver(self, event: RankEvent) -> None:
        self.resources.observe(event)
        if isinstance(event, (OutputLine, OutputLines)):
            self.outputs[event.rank].extend(event.texts)
        elif isinstance(event, MetricReport):
            self.metric_log.add(event)
        elif isinstance(event, RankFailed):  # (not how a rank felt our stop: the supervisor keeps that back)
            self.failed_ranks.append(event.rank)
        try:
            self.view.handle(event)
        except Exception as error:  # a display bug must not abandon running ranks or lose the result
            self._view_failed(error)

    def _tick(self) -> None:
        self.resources.tick()  # about once a second: a ResourceSample per running rank, to the view
        try:
            self.view.tick()
        except Exception as error:
            self._view_failed(error)

    def _view_failed(self, error: Exception) -> None:
        warnings.warn(f"notebook_accel: the {type(self.view).__name__} display failed and was turned off "
                      f"({type(error).__name__}: {error}); the launch goes on", RuntimeWarning, stacklevel=2)
        self.view = NullView()

    def _run(self, store: HostedStore) -> None:
        plan = self.plan
        started = time.monotonic()
        self._asker = asker_here()  # a rank's pdb asks in this thread's cell or terminal, if anyone can type
        self._oom_kills_before = oom_kill_count()  # a SIGKILL counts as OOM only if this goes up
        try:
            if not self.backend.announces_start:  # the nodes backend says it once the rendezvous placed this node
                self._deliver(plan.started_event(start_up=_start_up(plan)))
            self.status = Status.RUNNING
            try:
                outcome = self._run_backend(store)
            except KeyboardInterrupt:
                outcome = Outcome(Status.STOPPED)
                # Ctrl-C landed in the kernel's own waiting (the supervisor's poll, selectors): those frames say
                # nothing to the user; raised, the interrupt starts at the call in their cell, as a rank's error
                # does, and says what became of the ranks.
                self.error = KeyboardInterrupt(f"the {self.backend.job} was interrupted; every rank was stopped")
            self._finish(outcome, time.monotonic() - started)
        finally:
            self.resources.close()
            # No reference cycle keeps an ended launch (and its result) alive: a session's next result goes into
            # the memory this one's frees (``wire.results.ResultPool``) only once it is freed.
            self.resources.deliver = _discard
            store.close()

    def _run_backend(self, store: HostedStore) -> Outcome:
        return self.backend.run(store.env(), LaunchSink(self._deliver, self._tick, self._stop_requested,
                                                        asker=self._asker))

    def _finish(self, outcome: Outcome, elapsed: float) -> None:
        """Turn the outcome into ``result`` / ``error`` and tell the view how it ended."""
        self.status = outcome.status
        root = outcome.root
        if outcome.status == Status.FINISHED:
            ranks = outcome.ranks if outcome.ranks is not None else list(range(self.plan.world_size))
            expected = ranks if self.plan.return_all else ranks[:1]
            missing = [rank for rank in expected if rank not in outcome.results]
            if missing:
                self.error = LaunchError(f"rank {missing[0]} ended without returning a result", rank=missing[0])
                self.status = Status.FAILED
            else:  # this node's lowest rank (rank 0 on node 0), or all of this node's ranks in order
                self.result = ([outcome.results[rank] for rank in ranks] if self.plan.return_all
                               else outcome.results[ranks[0]])
        elif outcome.status == Status.FAILED and root is not None:
            self.root_rank = root.rank
            self.error = self._root_cause_error(root, outcome)
            self._explain_out_of_memory(root, outcome)
        elif outcome.status == Status.TIMEOUT and outcome.waiting:
            self.error = LaunchTimeout(f"the {self.backend.job} ran past timeout={self.plan.timeout:g} s before any "
                                       f"rank started: {outcome.waiting}", still_running=[], stacks={})
        elif outcome.status == Status.TIMEOUT:
            ranks = ", ".join(str(rank) for rank in outcome.still_running) or "none"
            where = "".join(f"\n[rank {rank}] {fold_stack_dump(text)}"
                            for rank, text in sorted(outcome.stacks.items()))
            self.error = LaunchTimeout(
                f"the {self.backend.job} ran past timeout={self.plan.timeout:g} s and was stopped; ranks still "
                f"running: {ranks}" + (f". Where they were:{where}" if where else ""),
                still_running=outcome.still_running, stacks=outcome.stacks)
        elif outcome.status == Status.STOPPED and self.error is None:
            self.error = outcome.local_exception or KeyboardInterrupt(f"the {self.backend.job} was stopped")
        failure = root.event if root is not None else None
        self._deliver(LaunchFinished(
            rank=-1, status=self.status, elapsed=elapsed, root_rank=root.rank if root else None,
            error=self.out_of_memory or (None if self.error is None else one_line(self.error)),
            traceback=failure.traceback if failure is not None else None,
            still_running=outcome.still_running))

    def _explain_out_of_memory(self, root, outcome: Outcome) -> None:
        """When the root cause ran out of memory, say so in one line with every rank's peak and what to try:
        the first line of a ``LaunchError``, a note on a rank's own exception, the dashboard's error line."""
        kind = kind_of_failure(root.event, outcome.exitcodes.get(root.rank, root.exitcode), self._oom_kills_before)
        if kind is None:
            return
        figures = cuda_oom_figures(root.event.message) if kind == "gpu" and root.event is not None else None
        self.out_of_memory = explain_out_of_memory(kind, root.rank, self.resources.peaks(), figures)
        error = self.error
        if isinstance(error, LaunchError) and root.event is None:
            self.error = LaunchError(f"{self.out_of_memory}\n{error}", rank=error.rank, exitcode=error.exitcode,
                                     signal_name=error.signal_name)
        elif error is not None and hasattr(error, "add_note"):
            error.add_note(f"(notebook_accel: {self.out_of_memory})")

    def _root_cause_error(self, root, outcome: Outcome) -> BaseException:
        return root_cause_exception(root, self.plan.world_size,
                                    exitcode=outcome.exitcodes.get(root.rank, root.exitcode),
                                    last_output=self.outputs.get(root.rank, []),
                                    local_exception=outcome.local_exception)


_last_launch: Optional[Launch] = None


def _start_up(plan: LaunchPlan) -> str:
    """What the fork server's warm start at import spent, for a launch whose ranks come from it."""
    if plan.start_method != "forkserver":
        return ""
    from .backends.processes.warm_start import describe

    return describe()


def _discard(event: RankEvent) -> None:
    pass


def _while_alive(method: Callable[..., Any], otherwise: Any) -> Callable[..., Any]:
    """``method`` (bound), held weakly: once its object is gone, calling it returns ``otherwise``."""
    weak = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = weak()
        return otherwise if bound is None else bound(*args, **kwargs)
    return call


def leave_post_mortem_to_the_rank() -> None:
    """The failing rank opened pdb in its own frame (``pdb``, ``%pdb on``): IPython's ``%pdb`` must not open a second
    one in the kernel's frames on the exception the cell raises now. Switched off until the cell ends."""
    shell: Any = ipython_shell()
    if shell is None or not getattr(shell, "call_pdb", False):
        return
    shell.call_pdb = False

    def switch_back(*args: Any) -> None:
        shell.call_pdb = True
        shell.events.unregister("post_run_cell", switch_back)

    shell.events.register("post_run_cell", switch_back)


def last_launch() -> Optional[Launch]:
    """The most recent ``Launch`` of this kernel (``notebook_launcher`` returns only the result).

    >>> notebook_launcher(train, num_processes=2)        # doctest: +SKIP
    >>> last_launch().metrics                             # doctest: +SKIP
    """
    return _last_launch


@entry_point("notebook_launcher")
def notebook_launcher(function: Callable[..., Any], args: tuple = (), kwargs: Optional[Dict[str, Any]] = None,
                      num_processes: Optional[int] = None, *,
                      device: Optional[DeviceName] = None,
                      mixed_precision: MixedPrecisionName = "no",
                      start_method: StartMethodName = "auto",
                      master_addr: str = "127.0.0.1",
                      use_port: Optional[int] = None,
                      timeout: Optional[float] = None,
                      return_all: bool = False,
                      display: DisplayName = "auto",
                      pdb: Optional[bool] = None,
                      compile_cache: Optional[PathLike] = None,
                      fsdp_config: Optional[Mapping[str, Any]] = None,
                      deepspeed_config: Optional[Mapping[str, Any]] = None,
                      cluster: Optional[ClusterName] = None,
                      resources_per_rank: Optional[Mapping[str, float]] = None,
                      placement: Optional[PlacementName] = None,
                      slurm: Optional[Mapping[str, Any]] = None,
                      num_nodes: int = 1,
                      node_rank: Optional[int] = None,
                      rdzv_backend: Union[RendezvousBackendName, str] = "static",
                      rdzv_endpoint: Optional[str] = None,
                      rdzv_id: Optional[str] = None,
                      rdzv_conf: Optional[Dict[str, Any]] = None,
                      max_restarts: int = 0,
                      monitor_interval: float = 0.1,
                      config: Union[bool, PathLike, None] = None) -> Any:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` ranks and return rank 0's return value.

    Each rank gets torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``, ...), so ``torch.distributed.init_process_group()`` (gloo on CPU, nccl on CUDA),
    notebook_accel's ``Accelerator`` and HF accelerate work unchanged inside it.

    Args:
        function: any callable, also one defined in the notebook, a closure or a lambda (it is cloudpickled).
        args: its positional arguments, a tuple.
        kwargs: its keyword arguments.
        {options}

    Every option is checked before any process starts (``LaunchConfigError``, naming this function); with
    ``config``, what this call writes wins over the saved file, even a value equal to the default.

    On a TPU (``device="xla"``, the default on a TPU runtime) every rank is a TPU core: the launcher starts
    one host process that calls ``torch_xla``'s ``xmp.spawn``; ``RANK`` is set where a process drives one
    core, and ``torch_xla.runtime.global_ordinal()`` is the rank everywhere.

    Raises:
        Exception: the root-cause rank's own exception, of its own type (its remote traceback as ``__cause__``).
        LaunchError: a rank died without an exception (a signal, ``os._exit``, a segfault).
        LaunchTimeout: ``timeout`` passed (a ``LaunchError`` and a ``TimeoutError``).
        KeyboardInterrupt: the launch was interrupted; every rank was stopped.

    Example:
        >>> def train(lr):
        ...     import torch.distributed as dist
        ...     dist.init_process_group("gloo")
        ...     return dist.get_rank() * lr
        >>> notebook_launcher(train, args=(0.1,), num_processes=2, return_all=True)  # doctest: +SKIP
        [0.0, 0.1]
    """
    __tracebackhide__ = True  # noqa: F841
    # @entry_point resolved the options (given > saved config > defaults) and checked them, once
    options = LaunchOptions(
        num_processes=num_processes, device=device, mixed_precision=mixed_precision, start_method=start_method,
        master_addr=master_addr, use_port=use_port, timeout=timeout, return_all=return_all, display=display, pdb=pdb,
        compile_cache=compile_cache, fsdp_config=fsdp_config, deepspeed_config=deepspeed_config, cluster=cluster,
        resources_per_rank=resources_per_rank, placement=placement, slurm=slurm, num_nodes=num_nodes,
        node_rank=node_rank,
        rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_conf=rdzv_conf,
        max_restarts=max_restarts, monitor_interval=monitor_interval)
    plan = make_plan(function, args, kwargs, options)
    launch = Launch(plan)
    try:
        return launch.run()
    except BaseException as root_cause:
        if root_cause is not launch.error:  # not the launch's outcome: a bug of ours, shown whole
            raise
        if plan.post_mortem and launch.root_rank is not None:
            leave_post_mortem_to_the_rank()
        # The launcher's own frames (the job's run and wait) say nothing about the failure: they are dropped,
        # the user's kept (an in-kernel rank's exception has them); IPython shows it from the user's call.
        raise show_from_the_call(without_launcher_frames(root_cause))


@entry_point("start_launch")
def start_launch(function: Callable[..., Any], args: tuple = (), kwargs: Optional[Dict[str, Any]] = None,
                 num_processes: Optional[int] = None, *,
                 view: Optional[View] = None,
                 device: Optional[DeviceName] = None,
                 mixed_precision: MixedPrecisionName = "no",
                 start_method: StartMethodName = "auto",
                 master_addr: str = "127.0.0.1",
                 use_port: Optional[int] = None,
                 timeout: Optional[float] = None,
                 return_all: bool = False,
                 display: DisplayName = "auto",
                 compile_cache: Optional[PathLike] = None,
                 fsdp_config: Optional[Mapping[str, Any]] = None,
                 deepspeed_config: Optional[Mapping[str, Any]] = None,
                 cluster: Optional[ClusterName] = None,
                 resources_per_rank: Optional[Mapping[str, float]] = None,
                 placement: Optional[PlacementName] = None,
                 slurm: Optional[Mapping[str, Any]] = None,
                 num_nodes: int = 1,
                 node_rank: Optional[int] = None,
                 rdzv_backend: Union[RendezvousBackendName, str] = "static",
                 rdzv_endpoint: Optional[str] = None,
                 rdzv_id: Optional[str] = None,
                 rdzv_conf: Optional[Dict[str, Any]] = None,
                 max_restarts: int = 0,
                 monitor_interval: float = 0.1,
                 detach: bool = False) -> Any:
    """Like ``notebook_launcher`` but in a background thread: returns a ``Launch`` at once.

    Options (the same as ``notebook_launcher``'s, below) are checked, and errors raised, before it returns.
    One rank runs as a process here, not in the kernel, so that ``Launch.stop()`` can always stop it.

    With ``detach=True`` (``cluster="slurm"`` or ``"ray"``) the launch is a job of the cluster that outlives the
    kernel, and a ``notebook_accel.DetachedJob`` is returned instead: ``notebook_accel.attach(job.id)`` from any later
    kernel shows its dashboard and returns its result (docs/slurm.md, "Detached launches"; docs/clusters.md).

    Args:
        view: where the launch's events go (a dashboard, a recorder); None = the ``display`` option's.
        {options}

    >>> job = start_launch(train, num_processes=2, display="none")   # doctest: +SKIP
    >>> job.wait()                                                     # doctest: +SKIP
    """
    # @entry_point resolved the options (given > defaults) and checked them, once
    options = LaunchOptions(
        num_processes=num_processes, device=device, mixed_precision=mixed_precision, start_method=start_method,
        master_addr=master_addr, use_port=use_port, timeout=timeout, return_all=return_all, display=display,
        compile_cache=compile_cache, fsdp_config=fsdp_config, deepspeed_config=deepspeed_config, cluster=cluster,
        resources_per_rank=resources_per_rank, placement=placement, slurm=slurm, num_nodes=num_nodes,
        node_rank=node_rank,
        rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_conf=rdzv_conf,
        max_restarts=max_restarts, monitor_interval=monitor_interval, detach=detach)
    if detach and view is not None:
        raise LaunchConfigError("view= cannot go with detach=True: a detached launch records its events where its "
                                "cluster keeps them; notebook_accel.attach(job) shows them in the dashboard")
    plan = make_plan(function, args, kwargs, options, allow_inline=False)
    if detach:
        from .detached.submit import submit_detached

        return submit_detached(plan, options)
    return Launch(plan, view=view).run_in_background()
