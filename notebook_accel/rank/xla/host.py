"""Inside the TPU host process: set it up like any process rank, then let ``xmp.spawn`` start the devices.

``xmp.spawn(device.run_device, nprocs=None)`` forks one worker per TPU chip (their number and each one's
devices are torch_xla's business) and runs ``run_device`` in a thread per device. The workers are the host's
children, not the kernel's: a ``WorkerWatcher`` thread here tells the kernel, on the dead rank's own event
pipe, when one dies and how (a segfault, the OOM killer), since torch_xla itself would only say
``BrokenProcessPool``. ``nprocs=1`` (one device) runs the rank right here in the host's main thread.
"""
from __future__ import annotations

import multiprocessing
import os
import select
import signal
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from ...formatting import signal_name
from ...wire.channel import EventSender
from ...wire.events import RankExited
from ...wire.fds import take_fd
from .. import process
from ..run import failure_event
from ..streams import flush_std_streams
from . import device
from .device import DeviceLayout

WATCH_SECONDS = 0.05


@dataclass
class XlaHostSpec:
    """What the kernel hands the host: per rank (global ordinal) its stdout, stderr and event pipe ends
    (``PassedFd`` objects, as for a process rank), and the launch's environment and function."""

    world_size: int
    env: Dict[str, str] = field(repr=False)  # the kernel's environment: the user's secrets, never in a repr
    cwd: str
    sys_path: List[str]
    payload: Any                            # payload.PickledPayload
    return_all: bool
    nprocs: Optional[int]                   # xmp.spawn's: 1 (one device) or None (every device)
    pipes: List[Tuple[Any, Any, Any, Any]]  # stdout, stderr, events, stacks
    lifeline_fd: Any
    inherited_fds: List[int] = field(default_factory=list)
    compile_cache: Optional[str] = None
    # A warm session's: each rank's end of its command socket (``PassedFd``); its device thread then serves
    # tasks (``rank.session``) instead of running one function.
    command_fds: Optional[List[Any]] = None
    # A launch's: each rank's end of the socket its prompts (pdb, input()) are answered on (``PassedFd``).
    answer_fds: Optional[List[Any]] = None
    post_mortem: bool = False  # a device thread's failure opens pdb in the frame that raised
    no_one_types: Optional[str] = None  # why no one can answer the ranks' prompts (a headless run), or None


def host_main(spec: XlaHostSpec) -> None:
    """Entry point of the host process (the ``target`` of its multiprocessing Process)."""
    pipes = [tuple(take_fd(passed) for passed in rank) for rank in spec.pipes]
    # Set up like a process rank; the host's own stacks go to the first rank's pipe (each worker registers its
    # own, see device.py).
    process.take_over_process(pipes[0][3], spec.lifeline_fd, spec.inherited_fds)
    process.as_launched(spec)  # the kernel's environment, working directory and sys.path (not the server's)
    tempfile.tempdir = None  # found again from the new TMPDIR (the launch's own, removed when it ends)
    # No torch.set_num_threads here (unlike a process rank): it would start torch's thread pools in the host,
    # and the workers forked from it would inherit them broken. They read OMP_NUM_THREADS themselves.
    # The host's own output (torch_xla's warnings, a failing xmp.spawn) is labelled as the first device's.
    process.capture_output(os.dup(pipes[0][0]), os.dup(pipes[0][1]))
    registry_read, registry_write = os.pipe()
    layout = DeviceLayout(world_size=spec.world_size, return_all=spec.return_all,
                          pipes=pipes, registry_fd=registry_write, host_pid=os.getpid(),
                          compile_cache=spec.compile_cache,
                          command_fds=None if spec.command_fds is None else [take_fd(fd) for fd in spec.command_fds],
                          answer_fds=None if spec.answer_fds is None else [take_fd(fd) for fd in spec.answer_fds],
                          post_mortem=spec.post_mortem, no_one_types=spec.no_one_types)
    watcher = WorkerWatcher(registry_read, pipes)
    watcher.start()
    exit_code = 0
    try:
        # Unpickled once, here: the workers are forks of the host and inherit it (see device.take_call).
        device.set_call(process.register_in_main(spec.payload.load()))
    except BaseException as exc:  # nothing started yet: the first rank's failure, with its own exception
        EventSender(pipes[0][2], 0).send(failure_event(0, exc, loading=True))
        watcher.stop()
        os._exit(1)
    try:
        import torch_xla.distributed.xla_multiprocessing as xmp

        # fork: the host never touches an XLA device, so its workers may be forks of it, and they inherit
        # the pipes (spawn would re-import the notebook's function and drop every pipe).
        xmp.spawn(device.run_device, args=(layout,), nprocs=spec.nprocs, start_method="fork")
    except BaseException:  # e.g. BrokenProcessPool after a worker died: the watcher already named it
        traceback.print_exc()
        exit_code = 1
    watcher.stop()
    flush_std_streams()
    os._exit(exit_code)


class WorkerWatcher(threading.Thread):
    """Reports a worker that died on its own, with its exit code, on the event pipe of each rank it ran.

    Device threads register ``pid rank`` lines on ``registry_fd`` when they start. Workers that torch_xla's
    pool terminated (SIGTERM) because another one died are reported as stopped: collateral, not a failure.
    """

    def __init__(self, registry_fd: int, pipes: List[Tuple[int, ...]]) -> None:
        super().__init__(name="notebook_accel-xla-watcher", daemon=True)
        self.registry_fd = registry_fd
        self.pipes = pipes
        self.ranks_of: Dict[int, List[int]] = {}
        self.workers: Dict[int, multiprocessing.process.BaseProcess] = {}
        self.reported: Set[int] = set()
        self._stopped = threading.Event()
        self._partial = b""

    def stop(self) -> None:
        self._stopped.set()
        self.join(1.0)

    def run(self) -> None:
        while not self._stopped.is_set():
            self._read_registry(WATCH_SECONDS)
            for worker in multiprocessing.active_children():  # the workers xmp.spawn's pool started
                self.workers.setdefault(worker.pid, worker)
            dead = [(pid, worker.exitcode) for pid, worker in list(self.workers.items())
                    if pid not in self.reported and worker.exitcode is not None]
            self.reported.update(pid for pid, _ in dead)
            self._read_registry(0)
            for pid, exitcode in dead:
                self._report(pid, exitcode)

    def _read_registry(self, wait: float) -> None:
        if not select.select([self.registry_fd], [], [], wait)[0]:
            return
        self._partial += os.read(self.registry_fd, 4096)
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines:
            pid, rank = (int(part) for part in line.split())
            self.ranks_of.setdefault(pid, []).append(rank)

    def _report(self, pid: int, exitcode: int) -> None:
        if exitcode == 0:
            return
        # SIGTERM is how torch_xla's pool ends the other workers once one died (and how the launcher stops
        # them all): a reaction, never a cause.
        stopped = exitcode == -signal.SIGTERM
        for rank in self.ranks_of.get(pid, []):
            EventSender(self.pipes[rank][2], rank).send(
                RankExited(rank=rank, exitcode=exitcode, signal_name=signal_name(exitcode), stopped=stopped))
        if not stopped:
            print(f"notebook_accel: XLA worker process {pid} (ranks {self.ranks_of.get(pid, '?')}) died: "
                  f"{signal_name(exitcode) or f'exit code {exitcode}'}", file=sys.stderr, flush=True)
