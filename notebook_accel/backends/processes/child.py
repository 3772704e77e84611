"""Inside a rank process: bind it to the launch, capture its output at the fd level, then run the rank.

Knows nothing about display. Everything the rank tells the kernel goes through its event pipe
(``notebook_accel.channel``) or through fds 1/2, which are pipes the kernel drains. What a rank does around
the user's function is ``notebook_accel.rank``, shared with every other backend.
"""
from __future__ import annotations

import ctypes
import faulthandler
import io
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List

from ...channel import EventSender
from ...events import RankStarted
from ...payload import loads_payload
from ...rank import run_rank

# Written into os.environ of every rank, so that code made for torchrun or HF accelerate works unchanged.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT")


@dataclass
class RankSpec:
    """Everything a rank needs. Plain data: it is pickled for spawn/forkserver, inherited for fork.

    The ``*_fd`` fields are ``backend.PassedFd`` objects: pipe ends that multiprocessing
    duplicates into a spawned or forkserver child, and that a forked child simply inherits.
    """

    rank: int
    world_size: int
    env: Dict[str, str]
    payload: bytes
    send_result: bool
    stdout_fd: Any
    stderr_fd: Any
    events_fd: Any
    lifeline_fd: Any
    # fork only: kernel-side fds the child inherited and must close (read ends, the lifeline's write end).
    inherited_fds: List[int] = field(default_factory=list)


def rank_main(spec: RankSpec) -> None:
    """Entry point of every rank process (the ``target`` of the multiprocessing Process)."""
    _detach_from_kernel_signals()
    _die_with_launcher(spec)
    for fd in spec.inherited_fds:
        _close_quietly(fd)
    os.environ.update(spec.env)
    _set_torch_threads(int(spec.env.get("OMP_NUM_THREADS", "0")))
    _capture_output(_take_fd(spec.stdout_fd), _take_fd(spec.stderr_fd))
    sender = EventSender(_take_fd(spec.events_fd), spec.rank)
    sender.send(RankStarted(rank=spec.rank, pid=os.getpid()))
    run = run_rank(lambda: loads_payload(spec.payload), sender, send_result=spec.send_result)
    _flush_streams()
    sender.close()
    # os._exit: a forked rank must not run the kernel's atexit handlers (ipykernel, zmq) it inherited.
    os._exit(run.exit_code)


# --------------------------------------------------------------------------------------------- process set-up

def _detach_from_kernel_signals() -> None:
    """Own session: Jupyter's interrupt (SIGINT to the kernel's process group) reaches only the launcher,
    which then stops the ranks, and the launcher can kill a rank's whole group (its subprocesses too)."""
    try:
        os.setsid()
    except OSError:  # already a group leader
        pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _die_with_launcher(spec: RankSpec) -> None:
    """No orphans: die when the launching kernel dies, even by SIGKILL.

    PR_SET_PDEATHSIG covers fork and spawn (the kernel is the parent); a forkserver rank's parent is the
    fork server, so a lifeline pipe covers all three: the kernel holds its only write end, and EOF on the
    read end means the kernel is gone.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except Exception:
            pass
    lifeline = _take_fd(spec.lifeline_fd)

    def watch() -> None:
        try:
            while os.read(lifeline, 1):
                pass
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="notebook_accel-lifeline", daemon=True).start()


def _set_torch_threads(threads: int) -> None:
    """A forked or fork-server rank inherited an initialized torch, which no longer reads OMP_NUM_THREADS."""
    torch = sys.modules.get("torch")
    if threads > 0 and torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(threads)


def _take_fd(passed: Any) -> int:
    """The fd number behind a ``PassedFd`` (or a plain int)."""
    return passed if isinstance(passed, int) else passed.fd


def _capture_output(stdout_fd: int, stderr_fd: int) -> None:
    """Put the kernel's pipes on fds 1/2, so C/C++ and subprocess output is captured too; line-buffer all."""
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.close(stdout_fd)
    os.close(stderr_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # A forked rank inherited ipykernel's OutStream objects; replace them with writers on the real fds.
    replaced = {id(sys.stdout): 1, id(sys.__stdout__): 1, id(sys.stderr): 2, id(sys.__stderr__): 2}
    sys.stdout = sys.__stdout__ = _line_writer(1)
    sys.stderr = sys.__stderr__ = _line_writer(2)
    _rebind_logging_handlers(replaced)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    faulthandler.enable(file=sys.stderr)  # a segfault prints its Python stack on the captured stderr
    _line_buffer_c_stdio()
    os.environ["PYTHONUNBUFFERED"] = "1"  # Python subprocesses of the rank flush each line too


def _rebind_logging_handlers(replaced: Dict[int, int]) -> None:
    """Logging handlers the kernel set up before the fork still hold its old streams: point them at ours."""
    import logging

    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in replaced:
                handler.stream = sys.stdout if replaced[id(handler.stream)] == 1 else sys.stderr


def _line_writer(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True)


def _line_buffer_c_stdio() -> None:
    """C stdio fully buffers a pipe; line-buffer it so printf output is not lost if the rank crashes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        line_buffered = 1  # _IOLBF
        for name in ("stdout", "stderr"):
            stream = ctypes.c_void_p.in_dll(libc, name)
            libc.setvbuf(stream, None, line_buffered, 0)
    except Exception:
        pass


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
