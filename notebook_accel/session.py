"""``Session``: ranks that stay warm across cells.

A launch starts from zero every time — interpreter, imports, data, model, process group — and throws it all away.
A session starts its ranks once; each ``run`` (or ``%%ranks`` cell) then executes on the live ranks, in each
rank's one persistent namespace, with the same dashboard, root cause, Stop and timeout as a launch::

    session = Session(num_processes=2)        # the launcher's options: device, start_method, display, ...
    session.run(load_data_and_model)          # state stays on the ranks
    session.run(train, args=(3e-4,))          # no start cost
    session.pull("loss")                      # [0.31, 0.29]: one value per rank
    session.close()                           # or: with Session(...) as session:

The ranks join the default process group once (gloo on CPU, nccl on CUDA); code that calls
``init_process_group`` itself gets the live group. A failed run leaves the ranks and their state; a process group
left half way through a collective is replaced; a rank that dies or does not come back restarts the session,
and the raised exception says so ("ranks restarted: state lost").
"""
from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple, Type, Union

from .backends import warm_ranks_for
from .backends.base import WarmRanks
from .backends.session import SessionRunBackend, TaskEnd, close_gracefully, quiet_task
from .errors import LaunchConfigError, LaunchConfigTypeError
from .formatting import count
from .launcher import Launch, leave_post_mortem_to_the_rank
from .outcome.raising import root_cause_exception
from .outcome.root_cause import Outcome
from .outcome.shown import show_from_the_call
from .plan.entry_points import entry_point
from .plan.options import LaunchOptions, PathLike
from .plan.plan import check_call, make_plan, wants_post_mortem
from .plan.planners import check_session_options
from .plan.devices import cuda_initialized
from .rank.session import set_on_rank, value_on_rank, value_on_rank_for_the_gpu
from .rank.tracebacks import without_launcher_frames
from .views import OutputView, make_view
from .monitor.resources import ResourceSampler
from .views.model import label_lines
from .views.session import SessionSummary, SessionView
from .wire.channel import rank_channel
from .wire.choices import ClusterName, DeviceName, DisplayName, MixedPrecisionName, PlacementName, StartMethodName
from .wire.commands import Command, Debug, ExecuteCode, NewGroup, RunFunction
from .wire.events import (OutputLine, OutputLines, RankEvent, ResourceSample, SessionNotice,
                          SessionStatus, Status)

START_TIMEOUT = 300.0           # s the ranks may take to start and join the process group
CLOSE_GRACE = 35.0              # s the ranks may take to end like a program (threads joined: 30 s by default)

_open_sessions: "List[weakref.ref[Session]]" = []


class Session:
    """Ranks that stay up across cells: ``run`` functions and ``%%ranks`` cells on them, keeping their state.

    Each rank keeps one namespace. A name the rank set itself (``global x`` in a run, a ``%%ranks`` cell,
    ``push``) is its own: a run's function sees it, and the kernel's same-named global never replaces it (a
    one-line note says so the first time). The kernel's other globals a function uses travel with each run,
    as they are in the kernel then.

    >>> session = Session(num_processes=2, display="none")        # doctest: +SKIP
    >>> session.run(lambda: __import__("os").environ["RANK"], return_all=True)   # doctest: +SKIP
    ['0', '1']
    """

    @entry_point("Session")
    def __init__(self, num_processes: Optional[int] = None, *,
                 device: Optional[DeviceName] = None,
                 mixed_precision: MixedPrecisionName = "no",
                 start_method: StartMethodName = "auto",
                 master_addr: str = "127.0.0.1",
                 use_port: Optional[int] = None,
                 timeout: Optional[float] = None,
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
                 recover_timeout: float = 5.0,
                 config: Union[bool, PathLike, None] = None) -> None:
        """Start the ranks — on this machine, or with ``cluster`` on a cluster, where that cluster places them — and
        join them in one process group.

        The launcher's options, less those of torch elastic's nodes and restarts (``notebook_launcher`` has them;
        ``num_nodes`` only where the cluster's planner takes it for a session: ``plan.planners``) and ``return_all``
        (chosen per run); ``timeout`` and ``display`` are the default of each run. On TPU (``device="xla"``) the XLA
        host's device threads are the warm ranks, each with a namespace of its own. On a cluster the ranks stay up,
        placed as the cluster's own options say, until ``close()``.
        ``display="none"`` turns the session's row and the runs' dashboards off; a ``%%ranks`` cell still shows
        what the ranks printed, labelled.

        Args:
            {options}
        """
        __tracebackhide__ = True  # noqa: F841
        # @entry_point resolved the options (given > saved config > defaults) and checked them, once
        options = LaunchOptions(
            num_processes=num_processes, device=device, mixed_precision=mixed_precision, start_method=start_method,
            master_addr=master_addr, use_port=use_port, timeout=timeout, display=display, pdb=pdb,
            compile_cache=compile_cache, fsdp_config=fsdp_config, deepspeed_config=deepspeed_config, cluster=cluster,
            resources_per_rank=resources_per_rank, placement=placement, slurm=slurm, num_nodes=num_nodes)
        check_session_options(options.as_dict())   # what a session may take there is its planner's to say
        self._plan = make_plan(_nothing, (), None, options, allow_inline=False)
        self._pdb = pdb  # each run's post-mortem switch, unless the run says (None: IPython's %pdb, then)
        self.recover_timeout = float(recover_timeout)
        self.num_processes = self._plan.world_size
        self.device = self._plan.device
        self.start_method = self._plan.start_method or self._plan.backend  # a cluster's: the cluster starts them
        self.runs = 0          # tasks run (functions and %%ranks cells)
        self.restarts = 0      # times the ranks were started afresh (restart(), a lost rank)
        self._tasks = itertools.count(1)
        self._generation = 0   # of the process group: each new group meets under its own keys in the store
        self._lock = threading.Lock()
        self._state = SessionStatus.STARTING
        self._closed = False
        # How this session's ranks are kept warm where the plan runs them (the backends' table says), and the store
        # they meet at for the session's life: the kernel's for local ranks; none on a cluster.
        self._ranks_class: Type[WarmRanks] = warm_ranks_for(self._plan)
        self._store = self._ranks_class.open_store(self._plan)
        self._ranks: Optional[WarmRanks] = None  # once started
        self.view = SessionView(self._plan.display)
        self._samples: Dict[int, ResourceSample] = {}
        self._sampler: Optional[ResourceSampler] = None
        self._notice: Optional[str] = None  # what the session last did on its own, until the next task
        # (task, root-cause rank, restarts then, the ranks that raised)
        self._last_failure: Optional[Tuple[int, int, int, List[int]]] = None
        self._noted_shadowed: Set[str] = set()  # kernel names already said to be the ranks' own
        # Garbage collection of a session ends its ranks (the kernel's exit does too: lifeline and PDEATHSIG).
        self._finalizer = weakref.finalize(self, lambda: None)  # replaced once the ranks exist
        try:
            self._start_ranks()
        except BaseException:
            self._shutdown(graceful=False)
            raise
        _open_sessions.append(weakref.ref(self))

    # ------------------------------------------------------------------------------------------ public API

    @entry_point("Session.run")
    def run(self, function: Callable[..., Any], args: tuple = (), kwargs: Optional[Dict[str, Any]] = None, *,
            timeout: Optional[float] = None,
            return_all: bool = False,
            display: Optional[DisplayName] = None,
            pdb: Optional[bool] = None) -> Any:
        """Run ``function(*args, **kwargs)`` on every rank, in its namespace; return rank 0's value (a list by
        rank with ``return_all``) or raise the root cause, as ``notebook_launcher`` does.

        The function's globals are the rank's namespace: names only the rank has resolve there, ``global x``
        keeps ``x`` on the rank for later runs, and the names it uses that the kernel has are sent with it —
        except those the rank set itself (``global``, ``%%ranks``, ``push``): the rank's own value wins.

        Args:
            {options}
        """
        __tracebackhide__ = True  # noqa: F841
        return self._run_function(function, args, kwargs, return_all=return_all, timeout=timeout, display=display,
                                  pdb=pdb)

    def _run_function(self, function: Callable[..., Any], args: tuple, kwargs: Optional[Dict[str, Any]], *,
                      return_all: bool, timeout: Optional[float], display: Optional[str], pdb: Optional[bool],
                      counted: bool = True) -> Any:
        """``run``'s work; ``counted``: a run of the user's (``pull`` and ``push`` are not counted as runs)."""
        __tracebackhide__ = True  # noqa: F841
        check_call(function, args, kwargs)
        command, fds, release = self._ranks_class.function_task(function, args, kwargs or {}, return_all)
        try:
            name = getattr(function, "__qualname__", type(function).__name__)
            return self._task(command, fds, name, return_all=return_all, timeout=timeout, display=display,
                              pdb=pdb, counted=counted)
        finally:
            release()

    @entry_point("Session.execute")
    def execute(self, code: str, *,
                timeout: Optional[float] = None,
                display: Optional[DisplayName] = None,
                pdb: Optional[bool] = None) -> None:
        """Run a cell's source on every rank, in its namespace (what ``%%ranks`` does); a last expression's
        value is printed by each rank, labelled with its rank. With ``display="none"`` the ranks' output is
        still shown (a cell the user typed shows what it printed), without a dashboard.

        Args:
            {options}
        """
        __tracebackhide__ = True  # noqa: F841
        if not isinstance(code, str):
            raise LaunchConfigTypeError(f"code must be a str, got {type(code).__name__}")
        try:
            compile(code, "<%%ranks>", "exec")
        except SyntaxError as error:  # the user's cell, said before anything is sent
            raise error.with_traceback(None) from None
        filename = f"<%%ranks cell {self.runs + 1}>"
        self._task(ExecuteCode(task_id=0, code=code, filename=filename), [], "%%ranks", return_all=False,
                   timeout=timeout, display=display, typed_cell=True, pdb=pdb)

    def pull(self, name: str, device: Optional[str] = None) -> List[Any]:
        """The value of ``name`` in each rank's namespace, as a list by rank.

        Its CUDA tensors come to host memory (large ones copied from the GPU straight into shared memory; the
        kernel initialises no CUDA) — or, with ``device="cuda"`` (the default where the kernel has CUDA live
        already), stay on the GPU: handed over by CUDA IPC and copied there, device to device."""
        __tracebackhide__ = True  # noqa: F841
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"name must be a variable name, got {name!r}")
        if device not in (None, "cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu' (None: 'cuda' where CUDA is live here), not {device!r}")
        local = self._plan.backend == "processes"  # CUDA IPC reaches only ranks on this machine's GPUs
        if device == "cuda" and not local:
            raise ValueError(f"pull(device='cuda') hands tensors over by CUDA IPC, which reaches only this machine's "
                             f"ranks, not a {self._plan.backend} session's; pull to the host (device='cpu')")
        if device is None:
            device = "cuda" if local and cuda_initialized() else "cpu"
        task = value_on_rank_for_the_gpu if device == "cuda" else value_on_rank
        return self._run_function(task, (name,), None, return_all=True, timeout=None, display="none", pdb=None,
                                  counted=False)

    def push(self, **values: Any) -> None:
        """Set each ``name=value`` in every rank's namespace (large tensors travel through shared memory)."""
        __tracebackhide__ = True  # noqa: F841
        if values:
            self._run_function(set_on_rank, (values,), None, return_all=False, timeout=None, display="none",
                               pdb=None, counted=False)

    def debug(self, rank: Optional[int] = None) -> None:
        """pdb on the last failed run, in the frame where rank ``rank`` raised (None: the root-cause rank), as
        IPython's ``%debug`` does for a cell: the ranks kept their state, and their exceptions with their frames.
        pdb asks in this cell (or terminal); ``q`` (or ``c``) ends it, and the session is ready for the next run.

        >>> session.run(train)        # doctest: +SKIP
        KeyError: 'labels'
        >>> session.debug()           # doctest: +SKIP
        [rank 1] > <ipython-input-3>(7)train()
        [rank 1] (Pdb) p batch.keys()
        """
        __tracebackhide__ = True  # noqa: F841
        self._check_open()
        if self._last_failure is None:
            raise RuntimeError("no run of this session has failed: there is nothing to debug")
        failed_task, root_rank, restarts, failed_ranks = self._last_failure
        if restarts != self.restarts:
            raise RuntimeError("the ranks were restarted after the run that failed: its frames are gone")
        rank = root_rank if rank is None else rank
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.num_processes:
            raise LaunchConfigTypeError(f"rank must be a rank of this session (0..{self.num_processes - 1}) or "
                                        f"None, got {rank!r}")
        # Said here, in one line, as above: not as a remote traceback from the rank's debug task.
        if not failed_ranks:
            raise RuntimeError("no rank raised in the last run (it was stopped, or timed out): nothing to debug")
        if rank not in failed_ranks:
            did = ("rank " if len(failed_ranks) == 1 else "ranks ") + " and ".join(map(str, failed_ranks))
            raise RuntimeError(f"rank {rank} did not fail in the last run ({did} did)")
        self._task(Debug(task_id=0, rank=rank, failed_task=failed_task), [], "debug", return_all=False,
                   timeout=None, display="none", typed_cell=True, debugging=True, counted=False)

    def restart(self) -> None:
        """End every rank and start them afresh (their state is lost; the process group is new)."""
        self._check_open()
        with self._exclusive():
            self._restart_ranks("restart() was called")

    def close(self) -> None:
        """End the ranks as programs end (threads joined, ``atexit`` handlers run); idempotent."""
        if self._closed:
            return
        with self._lock:
            self._shutdown(graceful=True)

    @property
    def status(self) -> SessionStatus:
        """``SessionStatus``: "starting", "idle", "busy" (a run or cell is running) or "closed" (a ``str``)."""
        return self._state

    @property
    def pids(self) -> List[int]:
        """The pid each rank runs in, by rank (on TPU: its worker process)."""
        if self._ranks is None:
            return []
        return [self._ranks.pids[rank] for rank in sorted(self._ranks.pids)]

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _ipython_display_(self) -> None:
        """``session`` as a cell's last line shows the session's live row again (a saved notebook's text follows it),
        not a snapshot that goes stale beside it ("idle, 0 runs" under a row that says "closed, 14 runs")."""
        if not self.view.show_again():
            print(repr(self))

    def __repr__(self) -> str:
        return (f"Session({count(self.num_processes, 'rank')}, device={self.device!r}, "
                f"start_method={self.start_method!r}, {self._state}, {count(self.runs, 'run')}, "
                f"{count(self.restarts, 'restart')})")

    # ------------------------------------------------------------------------------------------- tasks

    def _task(self, command: Command, fds: List[int], name: str, *, return_all: bool, timeout: Optional[float],
              display: Optional[str], typed_cell: bool = False, pdb: Optional[bool] = None,
              debugging: bool = False, counted: bool = True) -> Any:
        __tracebackhide__ = True  # noqa: F841
        self._check_open()
        plan = dataclasses.replace(self._plan, function_name=name, return_all=return_all,
                                   timeout=self._plan.timeout if timeout is None else float(timeout),
                                   display=display or self._plan.display,
                                   post_mortem=wants_post_mortem(pdb if pdb is not None else self._pdb))
        if isinstance(command, (RunFunction, ExecuteCode)):
            command.post_mortem = plan.post_mortem
        # No dashboard is no dashboard; but a cell the user typed shows what it printed.
        view = OutputView() if typed_cell and plan.display == "none" else make_view(plan.display)
        with self._exclusive():
            task_id = next(self._tasks)
            command.task_id = task_id  # type: ignore[attr-defined]
            notices: List[str] = []
            assert self._ranks is not None
            backend = SessionRunBackend(plan, ranks=self._ranks, task_id=task_id, command=command, fds=fds,
                                        recover_timeout=self.recover_timeout,
                                        after=lambda ended, deliver: notices.extend(self._recover(ended, deliver)))
            launch = Launch(plan, view=view, backend=backend)
            restarts = self.restarts  # a failure that costs the ranks (a death) restarts them before run() returns
            launch.resources.postpone_sample()  # a warm run may take milliseconds: sample once it lasts a second
            try:
                return launch.run()
            except BaseException as error:
                if error is not launch.error:
                    raise
                if not debugging:  # what Session.debug opens: the run's own failure, not a failed debug
                    self._last_failure = (task_id, launch.root_rank if launch.root_rank is not None else 0,
                                          restarts, sorted(set(launch.failed_ranks)))
                if plan.post_mortem and launch.root_rank is not None:
                    leave_post_mortem_to_the_rank()
                self._name_the_node(error, launch.root_rank)
                for notice in notices:
                    _add_note(error, f"notebook_accel: {notice}")
                raise show_from_the_call(without_launcher_frames(error))
            finally:
                if counted:  # the user's runs and cells; not pull, push or debug
                    self.runs += 1
                if backend.ended is not None:
                    self._note_shadowed(backend.ended.shadowed)
                # Ranks on another machine sample themselves while they run: the row keeps their last figures.
                self._samples.update({rank: sample for rank, sample in launch.resources.latest().items()
                                      if rank not in self._samples or sample.time >= self._samples[rank].time})

    def _name_the_node(self, error: BaseException, rank: Optional[int]) -> None:
        """On a cluster, the run's root cause says which node its rank ran on, as a launch's does (``error.node`` and a
        note; ``backends/relay/backend.py``): ranks on this machine have no ``node_of``."""
        node_of = getattr(self._ranks, "node_of", None)
        node = node_of(rank) if node_of is not None and rank is not None else None
        if node is None:
            return
        try:
            error.node = node  # type: ignore[attr-defined]
        except Exception:  # an exception type that takes no attributes
            return
        if f"node {node}" not in str(error):  # a death's message may say it already
            _add_note(error, f"(notebook_accel: rank {rank} ran on node {node})")

    def _note_shadowed(self, names: Iterable[str]) -> None:
        """Say once per name that a run used the ranks' own value of a name the kernel has too."""
        new = sorted(set(names) - self._noted_shadowed)
        if new:
            self._noted_shadowed.update(new)
            listed = ", ".join(f"`{name}`" for name in new)
            print(f"notebook_accel: runs use the ranks' own {listed} (set there by `global`, %%ranks or push), "
                  f"not the kernel's (said once per name)", file=sys.stderr)

    def _recover(self, ended: TaskEnd, deliver: Callable[[RankEvent], None]) -> List[str]:
        """After a task: restart the ranks if one is gone or stuck; replace the process group if the task left it
        half way through a collective (ranks' collective counts differ, or it was cut). Returns what was done."""
        lost = ended.ranks_lost()
        if lost is not None:
            notice = self._restart_ranks(lost)
        elif ended.group_left_broken:
            notice = self._replace_group()
        else:
            return []
        self._notice = notice
        deliver(SessionNotice(rank=-1, text=notice))
        return [notice]

    def _replace_group(self) -> str:
        self._generation += 1
        ended, _ = self._quiet_task(NewGroup(task_id=next(self._tasks), generation=self._generation), timeout=60.0)
        if ended.failed or ended.ranks_lost() is not None:
            return self._restart_ranks("a new process group could not be formed")
        return ("the process group was replaced: the run left it half way through a collective. The ranks and "
                "their state are kept; objects bound to the old group (a DDP-wrapped model) must be made again")

    def _quiet_task(self, command: Optional[Command], timeout: float) -> Tuple[TaskEnd, Outcome]:
        """Run a task of the session's own (start, new group) without a dashboard; output goes to stderr."""
        assert self._ranks is not None
        return quiet_task(self._ranks, command, timeout=timeout, recover_timeout=self.recover_timeout,
                          deliver=self._quiet_event)

    # ------------------------------------------------------------------------------------------- ranks

    def _start_ranks(self) -> None:
        """Start the rank processes and wait until each joined the process group (task 0)."""
        self._state = SessionStatus.STARTING
        ranks = self._ranks_class(self._plan, _group_backend(self._plan.device), self._generation)
        ranks.start(self._store.env())
        self._ranks = ranks
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, ranks.kill)
        self._samples = {}  # a rank that samples itself (a cluster's) sends its first figures as it joins the group
        ended, outcome = self._quiet_task(None, timeout=START_TIMEOUT)
        if outcome.status != Status.FINISHED or ended.lost or not ended.settled:
            self._kill_ranks()
            if outcome.root is not None:
                raise root_cause_exception(outcome.root, self._plan.world_size, exitcode=outcome.root.exitcode,
                                           last_output=[], local_exception=None)
            raise RuntimeError(f"the session's ranks did not start: {outcome.status}")
        ranks.pids.update(ended.pids)  # where each rank runs, as it said (a TPU rank: its worker)
        self._state = SessionStatus.IDLE
        self._sampler = ResourceSampler(self._keep_sample, device=self.device)
        for rank in range(self._plan.world_size):
            self._sampler.observe(ranks.started_event(rank))
        self._sampler.tick()
        self._show()

    def _quiet_event(self, event: RankEvent) -> None:
        """An event of the session's own tasks: output on stderr; a rank's own memory sample (a cluster rank's) kept."""
        _print_output(event)
        self._keep_sample(event)

    def _keep_sample(self, event: RankEvent) -> None:
        if isinstance(event, ResourceSample):
            self._samples[event.rank] = event

    def _show(self) -> None:
        """Update the session's row (memory sampled at most once a second)."""
        if self._sampler is not None and self._state != SessionStatus.CLOSED:
            self._sampler.tick()
        self.view.update(SessionSummary(
            num_processes=self.num_processes, device=self.device, start_method=str(self.start_method),
            status=self._state, runs=self.runs, restarts=self.restarts,
            samples=dict(self._samples), notice=self._notice))

    def _restart_ranks(self, reason: str) -> str:
        self._kill_ranks()
        self.restarts += 1
        self._generation += 1
        self._notice = f"ranks restarted: state lost ({reason})"  # what the row says once they are up again
        self._start_ranks()
        return self._notice

    def _kill_ranks(self) -> None:
        if self._ranks is not None:
            self._ranks.kill()
            self._ranks = None

    def _shutdown(self, *, graceful: bool) -> None:
        self._closed = True
        try:
            if graceful and self._ranks is not None:
                close_gracefully(self._ranks, CLOSE_GRACE, _print_output)
        finally:
            self._kill_ranks()
            self._finalizer.detach()
            if self._sampler is not None:
                self._sampler.close()
            self._store.close()
            self._state = SessionStatus.CLOSED
            self._notice = None
            self._show()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this session is closed; start a new Session")
        if rank_channel() is not None:
            raise RuntimeError("a Session cannot be used inside a launched rank")

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One task at a time: the session is "busy" meanwhile, and its row says so."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this session is busy with another run; wait for it (one task at a time)")
        self._state = SessionStatus.BUSY
        self._notice = None  # the row's "last: ..." told of the task before this one
        self._show()
        try:
            yield
        finally:
            self._state = SessionStatus.CLOSED if self._closed else SessionStatus.IDLE
            self._lock.release()
            self._show()


# --------------------------------------------------------------------------------------------- helpers

def _nothing() -> None:
    """The function a session's plan carries: its ranks run tasks instead."""


def _group_backend(device: str) -> Optional[str]:
    return "nccl" if device == "cuda" else None if device == "xla" else "gloo"


def _add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(note)


def _print_output(event: RankEvent) -> None:
    """Where a session's own tasks (start, new group, close) send their events: output, labelled, on stderr."""
    if isinstance(event, (OutputLine, OutputLines)):
        sys.stderr.write(label_lines(event.rank, event.texts))


def last_session() -> Optional[Session]:
    """The most recently opened session that is still open (what ``%%ranks`` uses without a name)."""
    for reference in reversed(_open_sessions):
        session = reference()
        if session is not None and session.status != SessionStatus.CLOSED:
            return session
    return None
