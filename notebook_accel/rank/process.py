"""Inside a rank process: bind it to the launch, capture its output at the fd level, then run the rank.

Knows nothing about display. Everything the rank tells the kernel goes through its event pipe
(``notebook_accel.wire.channel``) or through fds 1/2, which are pipes the kernel drains. What a rank does around
the user's function is ``notebook_accel.rank.run``, shared with every other backend.
"""
from __future__ import annotations

import _thread
import atexit
import ctypes
import faulthandler
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Tuple

from ..wire.channel import EventSender
from ..wire.commands import SocketAnswers
from ..wire.events import RankStarted
from ..wire.fds import take_fd
from .device_memory import send_peak_rss
from .leaving import wait_for_peers_to_finish
from .network import NETWORK_VARIABLE
from .prompts import forget_kernel_hooks
from .run import main_classes, remember_kernel_classes, run_rank
from .streams import flush_std_streams, libc, line_writer
from .time_warning import install_warning_handler

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
    # the kernel's os.environ when the launch was called, plus the launch's own (not in repr: the user's secrets)
    env: Mapping[str, str] = field(repr=False)
    cwd: str                       # the kernel's working directory then
    sys_path: List[str]            # and its sys.path
    payload: Any                   # payload.Payload (fork: inherited objects) or payload.PickledPayload
    send_result: bool
    stdout_fd: Any
    stderr_fd: Any
    events_fd: Any
    stacks_fd: Any
    lifeline_fd: Any
    # fork only: kernel-side fds the child inherited and must close (read ends, the lifeline's write end).
    inherited_fds: List[int] = field(default_factory=list)
    # fork only: how ``env`` differs from the kernel's os.environ at the fork (to set, to remove), worked out by
    # the kernel just before it forks: the rank then touches only those (see ``as_launched``).
    env_changes: Optional[Tuple[Dict[str, str], List[str]]] = field(default=None, repr=False)
    # fork only: what the rank's ``__main__`` (the kernel's) lacks and the classes it has, worked out by the kernel
    main_names: Optional[Tuple[Dict[str, Any], Dict[str, type]]] = None
    # The rank's end of the socket the kernel answers its prompts on (pdb, input(): ``rank.prompts``); None: a
    # rank whose answers come another way (a session's, on its command socket).
    answers_fd: Any = None
    post_mortem: bool = False      # open pdb in the frame that raised, before the failure is reported
    no_one_types: Optional[str] = None  # why no one can answer its prompts (a headless run), or None


def rank_main(spec: RankSpec) -> None:
    """Entry point of every rank process (the ``target`` of the multiprocessing Process)."""
    take_over_process(take_fd(spec.stacks_fd), spec.lifeline_fd, spec.inherited_fds)
    # The rank's main thread, as in any Python program: threads the function starts are non-daemon (and
    # waited for at the end) even when the launch forked from a daemon thread (``start_launch``, the panel).
    threading.current_thread()._daemonic = False  # type: ignore[attr-defined]  # no public setter once started
    as_launched(spec)
    _set_torch_threads(int(spec.env.get("OMP_NUM_THREADS", "0")))
    capture_output(take_fd(spec.stdout_fd), take_fd(spec.stderr_fd))
    answers = SocketAnswers(take_fd(spec.answers_fd)) if spec.answers_fd is not None else None
    sender = EventSender(take_fd(spec.events_fd), spec.rank, answers=answers)
    sender.no_one_types = spec.no_one_types
    sender.send(RankStarted(rank=spec.rank, pid=os.getpid(), network=os.environ.get(NETWORK_VARIABLE)))
    run = run_rank(lambda: register_in_main(spec.payload.load(), spec.main_names), sender,
                   send_result=spec.send_result, post_mortem=spec.post_mortem)
    send_peak_rss(sender)
    if run.exit_code == 0:
        wait_for_peers_to_finish()  # none ends while a peer's init_process_group may still be connecting to it
    end_like_python(spec.rank)
    sender.close()
    os._exit(run.exit_code)


def take_over_process(stacks_fd: int, lifeline: Any, inherited_fds: Iterable[int]) -> None:
    """The first steps of every process the launcher starts (a rank, the XLA host), before anything else runs:
    its own session and signal handlers, Python stacks on SIGUSR1 (``Launch.dump_stacks``), death with the
    kernel, the kernel's inherited fds closed, and no inherited ``atexit`` handlers.

    Example (the XLA host, whose own stacks go to the first rank's pipe)::

        take_over_process(pipes[0][3], spec.lifeline_fd, spec.inherited_fds)
    """
    detach_from_kernel_signals()
    # First after that, so that no SIGUSR1 can find the default action (terminate) in place.
    faulthandler.register(signal.SIGUSR1, file=stacks_fd, all_threads=True, chain=False)
    install_warning_handler(fresh=True)  # SIGUSR2, the time limit's warning: a flag, not the default death
    die_with_launcher(lifeline)
    for fd in inherited_fds:
        close_quietly(fd)
    forget_kernel_hooks()
    # What a forked rank inherited from the kernel (ipykernel's, zmq's handlers), or a forkserver child from
    # the server, is not this process's to run; what the rank registers itself runs when it ends.
    atexit._clear()


# ------------------------------------------------------------------------------------ a torchrun rank's world

def as_launched(spec: RankSpec) -> None:
    """The kernel's environment, working directory and sys.path as they were when the launch was called.

    A forked rank has them already; a forkserver rank would otherwise see the server's, from when the
    server started (variables set in a cell since then — NCCL_*, WANDB_*, CUDA_VISIBLE_DEVICES — missing).
    Inside the rank, multiprocessing's default start method is the platform's, as in a torchrun rank (a
    forkserver or spawn child otherwise inherits its own), so DataLoader workers fork as usual.
    """
    # Only what differs: each change is a putenv or unsetenv. A forked rank's environment is the kernel's, but
    # for the rank's variables, and the kernel worked those out before forking: comparing every variable here
    # would touch (and so copy, page by page) the kernel's environment in every rank.
    changes = getattr(spec, "env_changes", None)  # (the XLA host's spec has none)
    to_set, to_remove = changes if changes is not None else environ_changes(os.environ, spec.env)
    for name in to_remove:
        os.environ.pop(name, None)
    for name, value in to_set.items():
        os.environ[name] = value
    try:
        os.chdir(spec.cwd)
    except OSError:  # the kernel's directory is gone; stay where the rank started
        pass
    sys.path[:] = spec.sys_path
    multiprocessing.set_start_method(None, force=True)


def environ_changes(current: Mapping[str, str], wanted: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """What turns the environment ``current`` into ``wanted``: the variables to set, and those to remove."""
    return ({name: value for name, value in wanted.items() if current.get(name) != value},
            [name for name in current if name not in wanted])


# What a forked rank's ``__main__`` lacks (usually nothing), and the classes it has: see ``main_names_for_fork``.
MainNames = Tuple[Dict[str, Any], Dict[str, type]]


def register_in_main(call, worked_out: Optional[MainNames] = None):
    """Classes and functions the notebook defined resolve by name in the rank's ``__main__``.

    cloudpickle sends them by value; registering them in the rank's ``__main__`` lets ``pickle``,
    ``torch.save`` and DataLoader workers refer to them by name, as in the notebook. (A forked rank's
    ``__main__`` is the notebook's own: the kernel works out what little is left before forking, ``worked_out``.)
    """
    main = sys.modules["__main__"]
    missing, classes = worked_out if worked_out is not None else (names_main_lacks(call, vars(main)), None)
    for name, value in missing.items():
        setattr(main, name, value)
    remember_kernel_classes(vars(main), classes)  # what the rank sends back names these classes, not copies them
    return call


def names_main_lacks(call, main_namespace: Dict[str, Any]) -> Dict[str, Any]:
    """The notebook's classes and functions the call refers to that ``main_namespace`` does not have."""
    function, args, kwargs = call
    named = dict(getattr(function, "__globals__", {}))
    for value in (function, *args, *kwargs.values()):
        named.setdefault(getattr(value, "__name__", ""), value)
        named.setdefault(type(value).__name__, type(value))
    return {name: value for name, value in named.items()
            if name and getattr(value, "__module__", None) == "__main__" and name not in main_namespace
            and (isinstance(value, type) or callable(value))}


def main_names_for_fork(call) -> MainNames:
    """In the kernel, once per launch: ``register_in_main``'s work for the ranks it is about to fork, whose
    ``__main__`` is its own. Done in each rank, going through the notebook's whole namespace would touch every
    object in it — each page it lies on copied into every rank: at 16 ranks on 2 cores, a kernel with 30,000
    names took 0.15 s to launch instead of 0.10 s."""
    main = vars(sys.modules["__main__"])
    return names_main_lacks(call, main), main_classes(main)


EXIT_GRACE_VARIABLE = "NOTEBOOK_ACCEL_EXIT_GRACE"
DEFAULT_EXIT_GRACE = 30.0


def end_like_python(rank: int, *, ignore: Collection[threading.Thread] = (), exit_handlers: bool = True) -> None:
    """End the rank the way a Python program ends after its main code: wait for non-daemon threads
    (an async checkpoint writer, an uploader), run ``atexit`` handlers (wandb's finish, loggers' flush),
    join the rank's own non-daemon child processes, flush. Threads still running after the grace period
    (``NOTEBOOK_ACCEL_EXIT_GRACE`` seconds, 30 by default) are named on stderr and the rank ends anyway.

    A rank in a process that lives on (a Ray actor, whose worker keeps its own threads and ``atexit`` handlers)
    passes the threads that were there before its function ran as ``ignore``, and ``exit_handlers=False``: only
    the function's own threads are waited for, then the streams flushed."""
    grace = _exit_grace()
    deadline = time.monotonic() + grace
    ignored = set(ignore) | {threading.current_thread()}
    for thread in threading.enumerate():
        if thread in ignored or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    running = [thread.name for thread in threading.enumerate()
               if thread.is_alive() and not thread.daemon and thread not in ignored]
    if running:
        names = ", ".join(repr(name) for name in running)
        print(f"notebook_accel: rank {rank}'s function returned {grace:g} s ago, but non-daemon thread(s) "
              f"{names} still run; ending the rank (raise {EXIT_GRACE_VARIABLE} to wait longer)",
              file=sys.stderr)
    elif exit_handlers:
        atexit._run_exitfuncs()
        try:
            multiprocessing.util._exit_function()  # joins non-daemon children, as at a program's exit
        except Exception:
            pass
    if exit_handlers:
        try:
            import logging

            logging.shutdown()
        except Exception:
            pass
    flush_std_streams()


def _exit_grace() -> float:
    try:
        return max(0.0, float(os.environ.get(EXIT_GRACE_VARIABLE, DEFAULT_EXIT_GRACE)))
    except ValueError:
        return DEFAULT_EXIT_GRACE


# --------------------------------------------------------------------------------------------- process set-up

def detach_from_kernel_signals() -> None:
    """Own session: Jupyter's interrupt (SIGINT to the kernel's process group) reaches only the launcher,
    which then stops the ranks, and the launcher can kill a rank's whole group (its subprocesses too)."""
    try:
        os.setsid()
    except (OSError, AttributeError):  # already a group leader; no sessions (Windows)
        pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def die_with_launcher(lifeline_fd: Any) -> None:
    """No orphans: die when the launching kernel dies, even by SIGKILL.

    PR_SET_PDEATHSIG covers fork and spawn (the kernel is the parent); a forkserver rank's parent is the
    fork server, so a lifeline pipe covers all three: the kernel holds its only write end, and EOF on the
    read end means the kernel is gone.
    """
    if sys.platform.startswith("linux"):
        try:
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except Exception:
            pass
    lifeline = take_fd(lifeline_fd)

    def watch() -> None:
        try:
            while os.read(lifeline, 1):
                pass
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)

    # A bare thread: ``threading.Thread.start`` would wait until it runs (on a busy machine, a wait for the
    # scheduler in every rank's start). It only blocks in ``read``, and is never joined: a daemon's life.
    _thread.start_new_thread(watch, ())


def _set_torch_threads(threads: int) -> None:
    """A forked or fork-server rank inherited an initialized torch, which no longer reads OMP_NUM_THREADS."""
    torch = sys.modules.get("torch")
    if threads > 0 and torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(threads)


def capture_output(stdout_fd: int, stderr_fd: int) -> None:
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
    sys.stdout = sys.__stdout__ = line_writer(1)
    sys.stderr = sys.__stderr__ = line_writer(2)
    _rebind_logging_handlers(replaced)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    faulthandler.enable(file=sys.stderr)  # a segfault prints its Python stack on the captured stderr
    _line_buffer_c_stdio()
    os.environ["PYTHONUNBUFFERED"] = "1"  # Python subprocesses of the rank flush each line too


def _rebind_logging_handlers(replaced: Dict[int, int]) -> None:
    """Logging handlers the kernel set up before the fork still hold its old streams: point them at ours."""
    import logging

    # logging keeps every handler made in a list (weak references, for its shutdown): going through it, not
    # through every logger (torch alone has hundreds), a forked rank touches only the few handlers' pages.
    handlers = [ref() for ref in getattr(logging, "_handlerList", [])]
    if not hasattr(logging, "_handlerList"):  # another logging module: every logger's handlers
        loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                           if isinstance(logger, logging.Logger)]
        handlers = [handler for logger in loggers for handler in logger.handlers]
    for handler in handlers:
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in replaced:
            try:
                handler.stream = sys.stdout if replaced[id(handler.stream)] == 1 else sys.stderr
            except AttributeError:  # a stream that is a property (logging's last resort: sys.stderr, as it is now)
                pass


def _line_buffer_c_stdio() -> None:
    """C stdio fully buffers a pipe; line-buffer it so printf output is not lost if the rank crashes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        line_buffered = 1  # _IOLBF
        for name in ("stdout", "stderr"):
            stream = ctypes.c_void_p.in_dll(libc, name)
            libc.setvbuf(stream, None, line_buffered, 0)
    except Exception:
        pass


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
