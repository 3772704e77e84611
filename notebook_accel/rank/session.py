"""Inside a warm session's rank: join the process group once, then run what the kernel sends, in one namespace.

A session's rank process starts like a launch's (``rank.process``: its own session, death with the kernel,
fd-level output, the kernel's environment), joins the default process group, and then serves tasks until the
kernel says stop: a function (``Session.run``), a cell's code (``%%ranks``), a fresh process group. Every task
runs through ``rank.run_rank`` — the same failure events, results and tqdm capture as a launch — in the rank's
one persistent namespace, its ``__main__``: a function the kernel sends gets that namespace as its globals
(``rank_namespace``), so names only the rank has resolve and ``global x`` sets ``x`` for later runs and cells;
the kernel's values it brings never replace a name the rank set itself (``wire.payload.RankNames``).

A reader thread takes commands off the socket: tasks queue for the main thread; ``BreakGroup`` is done at once,
so a rank blocked in a collective whose peer failed gets an error instead of waiting for ever; a ``PromptAnswer``
(the line typed at the rank's pdb) goes to the task that waits for it.

A task's exception is kept (with its frames) until the next one fails: ``Session.debug`` opens pdb on it
(``Debug``).
"""
from __future__ import annotations

import ast
import ctypes
import linecache
import os
import queue
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..wire.channel import EventSender
from ..wire.commands import (BreakGroup, CommandReceiver, Debug, ExecuteCode, Interrupt, NewGroup, PromptAnswer,
                             QueuedAnswers, RunFunction, Shutdown, close_fds)
from ..wire.events import RankStarted, TaskDone
from ..wire.fds import take_fd
from ..wire.payload import PickledPayload, PortablePayload, RankNames, rank_namespace, set_thread_rank_names
from ..wire.results import CudaHandover, ResultPool
from .device_memory import send_peak_rss
from .process import (RankSpec, _set_torch_threads, as_launched, capture_output, end_like_python,
                      take_over_process)
from .prompts import post_mortem as open_post_mortem
from .run import failure_event, remember_kernel_classes, run_rank
from .streams import flush_std_streams

GROUP_PREFIX = "notebook_accel/session/group"   # each generation of the process group meets under its own keys


@dataclass
class SessionRankSpec(RankSpec):
    """A launch's ``RankSpec`` plus the rank's end of the session's command socket."""

    command_fd: Any = None
    group_backend: Optional[str] = None   # "gloo" | "nccl"; None: no process group
    group_generation: int = 0             # the session's count of groups so far: this one meets under its own keys


def session_rank_main(spec: SessionRankSpec) -> None:
    """Entry point of a session's rank process: set up as a launch's rank does, then serve tasks."""
    take_over_process(take_fd(spec.stacks_fd), spec.lifeline_fd, spec.inherited_fds)
    threading.current_thread()._daemonic = False  # type: ignore[attr-defined]  # see rank_main
    as_launched(spec)
    _set_torch_threads(int(spec.env.get("OMP_NUM_THREADS", "0")))
    capture_output(take_fd(spec.stdout_fd), take_fd(spec.stderr_fd))
    sender = EventSender(take_fd(spec.events_fd), spec.rank)
    sender.send(RankStarted(rank=spec.rank, pid=os.getpid()))
    group = GroupKeeper(spec) if spec.group_backend else None
    SessionRank(sender, take_fd(spec.command_fd), group=group, generation=spec.group_generation).serve()
    send_peak_rss(sender)
    end_like_python(spec.rank)
    leave_group()
    sender.close()
    os._exit(0)


class SessionRank:
    """The task loop of one rank, in the thread that calls ``serve``.

    A process rank (``thread_rank=False``) is interrupted by SIGINT (the kernel's interrupt, or a peer's
    failure), which also cuts a blocking system call short; between tasks SIGINT is ignored, so a late one cannot
    end the rank. A rank that is a thread of a process shared with others (a TPU device) cannot be signalled: the
    kernel sends ``Interrupt``, and the reader thread raises ``KeyboardInterrupt`` in the task's thread, which
    takes effect when it next runs Python code. Such a rank has a namespace of its own, not its process's
    ``__main__``. ``names`` keeps whose each name of the namespace is (the rank's own, or the kernel's).
    """

    def __init__(self, sender: Any, commands: Any, *, group: Optional["GroupKeeper"] = None,
                 generation: int = 0, thread_rank: bool = False, own_namespace: Optional[bool] = None,
                 after_task: Optional[Callable[[], None]] = None) -> None:
        """``commands``: the rank's end of the command socket (an fd), or any object whose ``receive()`` gives the
        next ``(command, fds)`` and ``None`` at the end (a Ray actor's queue). ``own_namespace`` (default:
        ``thread_rank``): a namespace of the rank's own instead of ``__main__``'s — a rank that is a thread but
        alone in its process (a Ray actor's) keeps ``__main__``. ``after_task``: called once a task's output is
        flushed, before ``TaskDone`` (a Ray actor waits there until its output is events)."""
        self.sender = sender
        self.commands = commands if hasattr(commands, "receive") else CommandReceiver(commands)
        self.answers = QueuedAnswers()  # lines typed at this rank's prompts, from the reader thread
        sender.answers = self.answers
        if getattr(sender, "passes_files", False):  # results through shared memory: keep the files warm
            sender.result_pool = ResultPool()
        self.failure: Optional[Tuple[int, BaseException]] = None  # (task, exception) of the last failed task
        self.tasks: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self.busy = False
        self.group = group
        self.generation = generation
        self.thread_rank = thread_rank
        self.after_task = after_task
        self._task_thread = threading.current_thread()
        if own_namespace if own_namespace is not None else thread_rank:
            import builtins

            self.names = RankNames({"__name__": "__main__", "__builtins__": builtins})
        else:
            self.names = RankNames(sys.modules["__main__"].__dict__)  # a forked rank's: the kernel's names
        if not thread_rank:
            signal.signal(signal.SIGINT, self._on_interrupt)
        threading.Thread(target=self._read_commands, name="notebook_accel-session-commands", daemon=True).start()

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.busy:
            raise KeyboardInterrupt

    def _interrupt_task_thread(self) -> None:
        if self.busy:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._task_thread.ident),
                                                       ctypes.py_object(KeyboardInterrupt))

    def _read_commands(self) -> None:
        while True:
            received = self.commands.receive()
            if received is None:  # the kernel closed the session (or died: the lifeline ends us too)
                self.tasks.put(None)
                return
            command, fds = received
            if isinstance(command, BreakGroup):
                close_fds(fds)
                if self.group is not None and command.peer_pids is None:  # peers elsewhere: what it recorded
                    self.group.cut_own_connections()
                elif self.group is not None:
                    self.group.cut_connections(command.peer_pids, command.kernel_pid)
                continue
            if isinstance(command, Interrupt):
                close_fds(fds)
                self._interrupt_task_thread()
                continue
            if isinstance(command, PromptAnswer):
                close_fds(fds)
                self.answers.put(command)
                continue
            self.tasks.put((command, fds))

    def serve(self) -> None:
        """Join the group (task 0: the session is ready once every rank says it is done), then run tasks until
        ``Shutdown`` or the kernel is gone."""
        set_thread_rank_names(self.names)
        try:
            self._task(0, self._start_group if self.group is not None else (lambda: None))
            while True:
                try:
                    item = self.tasks.get()
                except KeyboardInterrupt:  # a thread rank's Interrupt that arrived as its task ended: too late
                    continue
                if item is None or isinstance(item[0], Shutdown):
                    return
                command, fds = item
                if isinstance(command, RunFunction):
                    self._run_function(command, fds)
                elif isinstance(command, ExecuteCode):
                    # rank 0 answers None, as a launch's rank 0 returns its function's value
                    self._task(command.task_id, lambda: execute_cell(command.code, command.filename),
                               send_result=self.sender.rank == 0, keep_failure=True, post_mortem=command.post_mortem,
                               no_one_types=command.no_one_types)
                elif isinstance(command, Debug):
                    close_fds(fds)
                    self._task(command.task_id, lambda: self._debug(command), send_result=self.sender.rank == 0,
                               no_one_types=command.no_one_types)
                elif isinstance(command, NewGroup):
                    close_fds(fds)
                    self._task(command.task_id,
                               lambda: self.group.replace(command.generation) if self.group else None)
        finally:
            set_thread_rank_names(None)

    def _start_group(self) -> None:
        assert self.group is not None
        self.group.replace(self.generation)

    def _run_function(self, command: RunFunction, fds: List[int]) -> None:
        def load():
            payload: Any = (PortablePayload(command.data, command.storages, command.buffers, command.blobs)
                            if command.blobs is not None else
                            PickledPayload(command.data, command.storages, command.buffers, shared_fds=fds,
                                           shared_sizes=command.shared_sizes))
            function, args, kwargs = payload.load()  # the notebook's functions get the rank's namespace
            remember_kernel_classes(rank_namespace())
            return function, args, kwargs

        send_result = command.return_all or self.sender.rank == 0
        self._task(command.task_id, load, loader=True, send_result=send_result, keep_failure=True,
                   post_mortem=command.post_mortem, no_one_types=command.no_one_types)

    def _debug(self, command: Debug) -> None:
        """``Session.debug``'s task: pdb on this rank's exception of task ``failed_task``, if this is the rank."""
        if command.rank != self.sender.rank:
            return
        if self.failure is None or self.failure[0] != command.failed_task:
            raise RuntimeError(f"rank {command.rank} has no exception of that run to debug (it did not fail "
                               f"there, or a later run failed too)")
        open_post_mortem(self.failure[1])

    def _task(self, task_id: int, work: Any, *, loader: bool = False, send_result: bool = False,
              keep_failure: bool = False, post_mortem: bool = False, no_one_types: Optional[str] = None) -> None:
        """Run one task through ``run_rank`` (failure event or result, tqdm capture), then say it is done. The
        exception of a user's task (a run, a cell: ``keep_failure``) is kept for ``Session.debug``. ``no_one_types``:
        why no one can answer the task's prompts, if no one can."""
        load = work if loader else (lambda: (work, (), {}))
        self.sender.no_one_types = no_one_types
        self.busy = True
        try:
            run = run_rank(load, self.sender, send_result=send_result, thread_only=self.thread_rank,
                           post_mortem=post_mortem)
            if keep_failure and run.exception is not None:
                self.failure = (task_id, run.exception)
        except BaseException as late:  # an interrupt that came between run_rank's own steps: still a failure
            try:
                self.sender.send(failure_event(self.sender.rank, late))
            except Exception:
                pass
        finally:
            self.busy = False
            flush_std_streams()  # before TaskDone: the kernel reads the output pipes up to it
            if self.after_task is not None:
                self.after_task()
            self.sender.send(TaskDone(rank=self.sender.rank, task_id=task_id,
                                      group_sequence=self.group.sequence() if self.group else None,
                                      shadowed=self.names.settle()))


# ------------------------------------------------------------------------------------------- the namespace

def value_on_rank(name: str) -> Any:
    """``Session.pull``'s task: ``name`` in this rank's namespace."""
    namespace = rank_namespace()
    if name not in namespace:
        raise NameError(f"name {name!r} is not defined on rank {os.environ.get('RANK', '?')}")
    return namespace[name]


def value_on_rank_for_the_gpu(name: str) -> Any:
    """``Session.pull(name, device="cuda")``'s task: ``name``, its CUDA tensors (in dicts, lists, tuples) handed
    over by CUDA IPC (``wire.results.CudaHandover``): the kernel copies them on the device."""
    return _handed_over(value_on_rank(name))


def _handed_over(value: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    if isinstance(value, torch.Tensor):
        return CudaHandover(value) if value.is_cuda else value
    if isinstance(value, dict):
        return {key: _handed_over(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_handed_over(item) for item in value)
    return value


def set_on_rank(values: Dict[str, Any]) -> None:
    """``Session.push``'s task: set each name in this rank's namespace."""
    rank_namespace().update(values)


def execute_cell(code: str, filename: str) -> None:
    """Run ``code`` in the rank's namespace as a notebook runs a cell: statements, then the last expression's
    value printed (its repr) when it is not None. The source is registered so tracebacks show its lines."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    namespace = rank_namespace()
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        value = eval(compile(last, filename, "eval"), namespace)
        if value is not None:
            print(repr(value))


# --------------------------------------------------------------------------------------- the process group

class GroupKeeper:
    """The session's default process group: joined at start, replaced after a failure broke it, kept alive
    across runs. User code written for a fresh process (``init_process_group``, ``destroy_process_group`` at
    the end of a DDP script) gets the live group instead of an error or a torn-down group."""

    def __init__(self, spec: SessionRankSpec) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.backend = spec.group_backend
        self.rank = spec.rank
        self.world_size = spec.world_size
        self.env = spec.env
        self._store: Any = None
        self._connections: Set[Tuple[int, Any, Any]] = set()  # (fd, laddr, raddr) the group's join made
        c10d = dist.distributed_c10d
        self._original_init = c10d.init_process_group
        self._original_destroy = c10d.destroy_process_group
        keep_session_group(c10d, self._original_init, self._original_destroy)

    def replace(self, generation: int) -> None:
        """Join generation ``generation`` of the group (tearing down the one before): every rank does this
        together, meeting under keys of their own in the kernel's store."""
        dist = self.dist
        if dist.is_initialized():
            self._original_destroy()
        if self.backend == "nccl":
            import torch

            torch.cuda.set_device(int(self.env.get("LOCAL_RANK", "0")))
        if self._store is None:
            self._store = dist.TCPStore(self.env["MASTER_ADDR"], int(self.env["MASTER_PORT"]), is_master=False)
        store = dist.PrefixStore(f"{GROUP_PREFIX}{generation}/", self._store)
        before = _tcp_connections()
        self._original_init(self.backend, store=store, rank=self.rank, world_size=self.world_size)
        store_port = int(self.env["MASTER_PORT"])
        self._connections = {key for key in _tcp_connections() - before
                             if store_port not in (key[1].port, key[2].port)}  # the store's are not the group's

    def sequence(self) -> Optional[int]:
        """How many collectives the default group ran; ranks whose counts differ left one half done."""
        try:
            if not self.dist.is_initialized():
                return None
            return int(self.dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
        except Exception:
            return None

    def cut_connections(self, peer_pids: List[int], kernel_pid: int) -> None:
        """Make collectives in flight fail now. NCCL communicators are aborted; gloo's TCP connections to the
        session's other ranks (and only those: not the store's, not the user's own) are shut down, which a
        blocked gloo call sees at once as "Connection closed by peer"."""
        if self.backend == "nccl":
            try:
                self.dist.distributed_c10d._abort_process_group()
            except Exception:
                pass
            return
        cut_peer_connections(peer_pids, kernel_pid)

    def cut_own_connections(self) -> int:
        """``cut_connections`` where the peers run on other machines (a Ray cluster), whose pids mean nothing here:
        NCCL is aborted; of gloo's connections, those this rank's last join made (and only those: not the store's,
        not Ray's) are shut down. Returns how many were cut."""
        if self.backend == "nccl":
            self.cut_connections([], 0)
            return 0
        cut = 0
        for fd, _, _ in self._connections:
            cut += _shut_down(fd)
        return cut


def _tcp_connections() -> Set[Tuple[int, Any, Any]]:
    """This process's connected TCP sockets, as ``(fd, local address, remote address)``."""
    import psutil

    return {(connection.fd, connection.laddr, connection.raddr)
            for connection in psutil.Process().net_connections("tcp") if connection.fd >= 0 and connection.raddr}


def _shut_down(fd: int) -> int:
    """Shut the socket behind ``fd`` down for reading and writing (in every process sharing it); 1 if it was."""
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return 0
    try:
        duplicate.shutdown(socket.SHUT_RDWR)  # acts on the socket gloo holds, not only on this duplicate
        return 1
    except OSError:
        return 0
    finally:
        duplicate.close()


def _ports(pid: int) -> Set[int]:
    import psutil

    try:
        return {connection.laddr.port for connection in psutil.Process(pid).net_connections("tcp")}
    except psutil.Error:
        return set()


def cut_peer_connections(peer_pids: List[int], kernel_pid: int) -> int:
    """Shut down this process's TCP connections to ports the processes ``peer_pids`` own; how many were cut.

    Never one whose port the kernel owns: a forked rank inherited the kernel's sockets (the store's server and
    its accepted connections, Jupyter's), and a shutdown acts on the socket itself, in every process sharing it.
    """
    import psutil

    peer_ports: Set[int] = set()
    for pid in peer_pids:
        peer_ports |= _ports(pid)
    kernel_ports = _ports(kernel_pid) if kernel_pid else set()
    cut = 0
    for connection in psutil.Process().net_connections("tcp"):
        if connection.fd < 0 or not connection.raddr or connection.raddr.port not in peer_ports:
            continue
        if connection.laddr.port in kernel_ports or connection.raddr.port in kernel_ports:
            continue
        cut += _shut_down(connection.fd)
    return cut


def keep_session_group(c10d: Any, original_init: Any, original_destroy: Any) -> None:
    """``init_process_group`` returns at once while the session's group lives (a DDP script's set-up, code
    written for ``notebook_launcher``), and ``destroy_process_group()`` of the default group leaves it for the
    next run; other groups are created and destroyed as usual."""
    import torch.distributed as dist

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if c10d.is_initialized():
            return None
        return original_init(*args, **kwargs)

    def destroy_process_group(group: Any = None) -> None:
        if group is None or group is c10d.GroupMember.WORLD:
            return None
        return original_destroy(group)

    init_process_group.__doc__ = original_init.__doc__
    destroy_process_group.__doc__ = original_destroy.__doc__
    destroy_process_group.__wrapped_original__ = original_destroy  # type: ignore[attr-defined]  # leave_group
    for module in (dist, c10d):
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group


def leave_group() -> None:
    """At the session's end the group is torn down for real (a clean exit, as a script's last line does)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_initialized():
            dist.distributed_c10d.destroy_process_group.__wrapped_original__()  # type: ignore[attr-defined]
    except Exception:
        pass
