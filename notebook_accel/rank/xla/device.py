"""Inside a TPU worker process, in the thread torch_xla runs for one device: the rank side of the launch.

Once per worker process: put the pre-made pipes of this process (picked by torch_xla's local process index)
on fds 1/2, so C-level output of the process (libtpu, XLA) is labelled with its first device's rank, and make
``sys.stdout`` / ``sys.stderr`` route each thread's writes to its own rank's pipes. Per device thread: its
rank is its global ordinal (what ``xmp.spawn`` passes and ``xr.global_ordinal()`` returns); it gets its own
pipes, its own event channel and progress rows, and runs ``rank.run_rank`` like every other backend.
"""
from __future__ import annotations

import ctypes
import faulthandler
import io
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ...wire.channel import EventSender
from ...wire.commands import SocketAnswers
from ...wire.events import RankExited, RankStarted
from ..device_memory import send_peak_rss
from ..run import failure_event, run_rank
from ..streams import flush_std_streams, line_writer
from . import cpu_client

_setup_lock = threading.Lock()
_set_up_in: Optional[int] = None  # pid of the process already set up (a forked worker inherits the host's)
_call: Any = None                 # (function, args, kwargs), unpickled once in the host, inherited by fork
_call_taken_in: Optional[int] = None


def set_call(call: Any) -> Any:
    """In the host, before ``xmp.spawn``: the launched function and its arguments, for every device."""
    global _call
    _call = call
    return call


def take_call() -> Any:
    """This device thread's ``(function, args, kwargs)``. The first thread of a process takes the objects it
    inherited from the host (copy-on-write: no copy); the others get their own copies, since device threads
    of one process would otherwise share one model object, one optimizer, one list."""
    global _call_taken_in
    with _setup_lock:
        first = _call_taken_in != os.getpid()
        _call_taken_in = os.getpid()
    if first:
        return _call
    import cloudpickle

    return cloudpickle.loads(cloudpickle.dumps(_call))


@dataclass
class DeviceLayout:
    """Plain data handed through ``xmp.spawn`` to every device thread (pickled into each worker's task)."""

    world_size: int
    return_all: bool
    pipes: List[Tuple[int, ...]]          # per rank: stdout, stderr, events, stacks write ends (inherited)
    registry_fd: int                      # "pid rank" lines for the host's WorkerWatcher
    host_pid: int
    compile_cache: Optional[str] = None
    command_fds: Optional[List[int]] = None   # a warm session's command sockets, by rank (inherited)
    answer_fds: Optional[List[int]] = None    # a launch's: the sockets each rank's prompts are answered on
    post_mortem: bool = False
    no_one_types: Optional[str] = None        # why no one can answer the prompts (a headless run), or None


def run_device(index: int, layout: DeviceLayout) -> None:
    """``xmp.spawn``'s function: run the launched function as rank ``index`` (the global ordinal)."""
    rank = index
    stdout_fd, stderr_fd, events_fd, _ = layout.pipes[rank]
    os.write(layout.registry_fd, f"{os.getpid()} {rank}\n".encode())
    answers = SocketAnswers(layout.answer_fds[rank]) if layout.answer_fds is not None else None
    sender = EventSender(events_fd, rank, answers=answers)
    sender.no_one_types = layout.no_one_types
    sender.send(RankStarted(rank=rank, pid=os.getpid()))
    exit_code = 1
    routes = []
    try:
        _set_up_process(layout)
        routes = [stream for stream in (sys.stdout, sys.stderr) if isinstance(stream, ThreadRoutedStream)]
        for stream, fd in zip(routes, (stdout_fd, stderr_fd)):
            stream.route_this_thread(fd)
        if layout.command_fds is not None:  # a warm session: serve tasks until the kernel says stop
            serve_session(sender, layout.command_fds[rank])
            exit_code = 0
        else:
            exit_code = run_rank(take_call, sender, send_result=layout.return_all or rank == 0,
                                 thread_only=True, post_mortem=layout.post_mortem).exit_code
        send_peak_rss(sender)  # the worker process's, as each of its device threads ends
    except BaseException as exc:  # the set-up failed (e.g. the compile cache): this rank's failure, named
        sender.send(failure_event(rank, exc))
    finally:
        for stream in routes:
            stream.unroute_this_thread()
        # A thread's end is this rank's end, though its process lives on (peers may still run, or hang in a
        # collective after this rank failed): the supervisor then knows it is not among those to stop.
        sender.send(RankExited(rank=rank, exitcode=exit_code))


def serve_session(sender: Any, command_fd: int) -> None:
    """A warm session's device thread: its own namespace, tasks from its own command socket, interrupted by
    the kernel's ``Interrupt`` (a thread cannot be signalled), and no process group (XLA has its own)."""
    from ..session import SessionRank

    SessionRank(sender, command_fd, thread_rank=True).serve()


def _set_up_process(layout: DeviceLayout) -> None:
    global _set_up_in
    with _setup_lock:
        if _set_up_in == os.getpid():
            return
        _set_up_in = os.getpid()
        local_index = int(os.environ.get("PJRT_LOCAL_PROCESS_RANK", "0"))
        processes = int(os.environ.get("PJRT_LOCAL_PROCESS_COUNT", "1"))
        devices_here = max(1, layout.world_size // max(1, processes))
        if os.getpid() != layout.host_pid:  # a worker xmp.spawn forked
            _die_with_host()
            first_rank = min(local_index * devices_here, layout.world_size - 1)
            flush_std_streams()
            os.dup2(layout.pipes[first_rank][0], 1)
            os.dup2(layout.pipes[first_rank][1], 2)
            faulthandler.register(signal.SIGUSR1, file=layout.pipes[first_rank][3], all_threads=True,
                                  chain=False)
        if devices_here == 1:  # torchrun's per-rank variables make sense where a process is one rank
            rank = local_index if layout.world_size > 1 else 0
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
        if layout.compile_cache:
            _initialize_compile_cache(layout.compile_cache, local_index)
        cpu_client.serialize_graph_cuts()  # XLA's CPU client only: its device threads must not compile at once
        if not isinstance(sys.stdout, ThreadRoutedStream):
            sys.stdout = ThreadRoutedStream(sys.stdout)
            sys.stderr = ThreadRoutedStream(sys.stderr)


def _initialize_compile_cache(root: str, local_index: int) -> None:
    """torch_xla's persistent compilation cache, one directory per worker process (a writer each), so a
    relaunch of the same program loads its executables instead of compiling them again."""
    import torch_xla.runtime as xr

    path = os.path.join(os.path.expanduser(root), f"process-{local_index}")
    os.makedirs(path, exist_ok=True)
    xr.initialize_cache(path, readonly=False)


def _die_with_host() -> None:
    """A worker must not outlive the host (killed by the launcher, or by the kernel's death)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:
            pass


class ThreadRoutedStream(io.TextIOBase):
    """``sys.stdout`` / ``sys.stderr`` of a process whose ranks are threads: each device thread's writes go to
    its own rank's pipe; other threads (torch_xla's, the user's) write where the process's fds 1/2 go."""

    def __init__(self, default: io.TextIOBase) -> None:
        super().__init__()
        self.default = default
        self._local = threading.local()

    def route_this_thread(self, fd: int) -> None:
        self._local.stream = line_writer(fd)

    def unroute_this_thread(self) -> None:
        stream = getattr(self._local, "stream", None)
        if stream is not None:
            stream.flush()
            self._local.stream = None

    @property
    def target(self) -> io.TextIOBase:
        return getattr(self._local, "stream", None) or self.default

    def write(self, text: str) -> int:
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()

    def fileno(self) -> int:
        return self.default.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"
