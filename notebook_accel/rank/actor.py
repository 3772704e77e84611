"""A rank inside a Ray actor: set up as a process rank is (``rank.process``), talking to the kernel through Ray.

The kernel side (``backends.ray``) makes ``RankActor`` a Ray actor whose methods run in concurrency groups
(``backends.ray.remote_rank``). The default one runs the rank — ``run`` (a launch's function) or ``serve`` (a warm
session's task loop) — in a thread Ray owns. The others are the rank's control threads, which the kernel calls while
the rank runs:

- ``poll``: the events since the last poll (output lines, progress, metrics, the result or the failure), waiting
  a moment for the first one. The kernel polls every rank all the time: nothing needs a port on the kernel's
  machine, and a kernel that reaches the cluster only through Ray (``ray://``) gets its dashboard too.
- ``stacks``: every thread's Python stack, in faulthandler's format (``Launch.dump_stacks``, a timeout).
- ``command``: a kernel → rank command (``wire.commands``): ``Interrupt`` (``KeyboardInterrupt`` in the rank's
  thread), and a warm session's tasks and ``BreakGroup``. One call per command, answered at once, in the order the
  kernel sent them (a group of one thread): the per-rank input channel, which also brings the line typed at the
  rank's prompt (``PromptAnswer``: pdb, ``input()``).

Output: fds 1 and 2 are pipes read by a thread of the actor (``OutputCapture``), so C/C++ and subprocess output is
captured as in a process rank; Ray's log files, and so its forwarding of worker output to the driver, never see
these lines. Nothing is written to a file.

The kernel side (``backends.ray``) makes one through Ray, never directly::

    actor = RankActor.options(...).remote(rank=0, node="node-a")
"""
from __future__ import annotations

import codecs
import ctypes
import faulthandler
import os
import queue
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..wire.commands import Command, Interrupt, PromptAnswer, QueuedAnswers
from ..wire.events import OutputLines, RankEvent, RankPrompt, ResourceSample, TaskDone
from ..wire.fds import pending_bytes
from .device_memory import send_peak_rss
from .leaving import wait_for_peers_to_finish
from .network import rank_network
from .process import _set_torch_threads, capture_output, end_like_python, register_in_main
from .run import run_rank
from .streams import flush_std_streams
from .time_warning import install_warning_handler

SAMPLE_SECONDS = 1.0   # how often a rank samples its own memory and CPU (the kernel may be on another machine)
_READ_BYTES = 1 << 16


@dataclass
class ActorRankSpec:
    """What a rank in an actor needs besides its function: torchrun's variables and the launch's own (set over
    the worker's environment, which Ray made: ``CUDA_VISIBLE_DEVICES``, its own variables), where it runs, and
    for a warm session its process group."""

    rank: int
    world_size: int
    env: Dict[str, str] = field(repr=False)  # variables we set, over the worker's: kept out of reprs all the same
    send_result: bool = False
    node: str = ""                        # the node's name, for the dashboard
    group_backend: Optional[str] = None   # a session's group: "gloo" | "nccl"; None: no group
    group_generation: int = 0
    no_one_types: Optional[str] = None    # why no one can answer a launch's prompts (a headless run), or None
    post_mortem: bool = False             # a launch's rank that raises opens pdb in the failing frame first


class EventQueue:
    """The rank's events, waiting in memory for the kernel's next ``poll``; thread-safe, in order.

    ``end`` marks the last event: the rank is done, and a poll that takes everything says so.
    """

    def __init__(self) -> None:
        self._events: List[RankEvent] = []
        self._ended = False
        self._condition = threading.Condition()

    def put(self, event: RankEvent) -> None:
        with self._condition:
            self._events.append(event)
            self._condition.notify_all()

    def end(self) -> None:
        with self._condition:
            self._ended = True
            self._condition.notify_all()

    def take(self, wait: float, linger: float = 0.0) -> Tuple[List[RankEvent], bool]:
        """Every waiting event (after up to ``wait`` s for the first), consecutive output merged; and whether
        these were the last. With ``linger``, up to that long more for what ends the batch — a session's
        ``TaskDone`` or the rank's last event — unless it came: a task's result and its end, or a short task's output
        and its end, go together (one write to a Slurm task's stdout: ``wire.text_frames``)."""
        with self._condition:
            if not self._events and not self._ended:
                self._condition.wait(wait)
            deadline = time.monotonic() + linger
            while self._events and not self._ended and not isinstance(self._events[-1], TaskDone):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._condition.wait(left)
            events, self._events = self._events, []
            return merge_output(events), self._ended


def merge_output(events: List[RankEvent]) -> List[RankEvent]:
    """Consecutive ``OutputLines`` of one stream as one event (a chatty rank: one event per poll, not per read)."""
    merged: List[RankEvent] = []
    for event in events:
        last = merged[-1] if merged else None
        if (isinstance(event, OutputLines) and isinstance(last, OutputLines) and last.stream == event.stream
                and last.rank == event.rank):
            merged[-1] = OutputLines(rank=last.rank, stream=last.stream, lines=last.lines + event.lines)
        else:
            merged.append(event)
    return merged


class QueueSender:
    """The rank's channel (``rank_channel()``): events go to the actor's ``EventQueue``; a prompt (breakpoint(),
    pdb, ``input()``, a post-mortem) is an event like any other, and its answer comes back as a ``PromptAnswer``
    command to the actor's command thread, which puts it into ``answers``."""

    def __init__(self, events: EventQueue, rank: int) -> None:
        self.events = events
        self.rank = rank
        self.answers: Any = QueuedAnswers()   # a session's rank puts its own here (``SessionRank``)
        self.no_one_types: Optional[str] = None  # why no one can answer (a headless launch): prompts are skipped
        # Called before a prompt is sent: the output written before it (pdb's "> file(line)") becomes events
        # first, as a process rank's is in its pipe before its prompt.
        self.before_prompt: Callable[[], None] = lambda: None
        self._asking = threading.Lock()
        self._prompts = 0

    def send(self, event: RankEvent) -> None:
        self.events.put(event)

    def ask(self, prompt: RankPrompt) -> PromptAnswer:
        """Send ``prompt`` and wait for the line typed at it (one prompt at a time: another thread of the rank
        waits its turn). The wait wakes often, so that an ``Interrupt`` raised in this thread lands."""
        with self._asking:
            self._prompts += 1
            prompt.seq = self._prompts
            self.before_prompt()
            self.send(prompt)
            return self.answers.next_answer(prompt.seq)

    def close(self) -> None:
        pass


class OutputCapture:
    """fds 1 and 2 on pipes that a thread of this process reads into ``OutputLines`` events, line by line.

    ``sync`` returns once every byte written before it (and flushed) is an event: a session's task says it is
    done only after its output. The reader reads and handles each chunk while holding a lock, so a moment when
    the pipes are empty under that lock is a moment when everything written so far was handled.
    """

    def __init__(self, events: EventQueue, rank: int) -> None:
        self.events = events
        self.rank = rank
        pipes = {"stdout": os.pipe(), "stderr": os.pipe()}
        self._reads = {read: name for name, (read, _) in pipes.items()}
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in pipes}
        self._partial = {name: "" for name in pipes}
        self._lock = threading.Lock()
        capture_output(pipes["stdout"][1], pipes["stderr"][1])  # closes the write ends once on fds 1/2
        threading.Thread(target=self._read, name="notebook_accel-output", daemon=True).start()

    def _read(self) -> None:
        open_fds = set(self._reads)
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [])
            with self._lock:
                for fd in ready:
                    chunk = os.read(fd, _READ_BYTES)
                    self._lines(self._reads[fd], chunk)
                    if not chunk:
                        open_fds.discard(fd)

    def _lines(self, stream: str, chunk: bytes) -> None:
        text = self._partial[stream] + self._decoders[stream].decode(chunk, final=not chunk)
        lines = text.split("\n")
        self._partial[stream] = lines.pop()
        if not chunk and self._partial[stream]:
            lines.append(self._partial[stream])
            self._partial[stream] = ""
        if "\r" in text:  # a progress bar's carriage returns: strip the line ends they leave
            lines = [line.rstrip("\r") for line in lines]
        if lines:
            self.events.put(OutputLines(rank=self.rank, stream=stream, lines=lines))

    def sync(self, timeout: float = 5.0) -> None:
        """Flush every stream, wait until all of it is events, and send what is left of an unfinished line."""
        flush_std_streams()
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if all(pending_bytes(fd) == 0 for fd in self._reads) or time.monotonic() > deadline:
                    for stream, partial in self._partial.items():
                        if partial:
                            self.events.put(OutputLines(rank=self.rank, stream=stream, lines=[partial]))
                            self._partial[stream] = ""
                    return
            time.sleep(0.001)


class CommandQueue:
    """A warm session's commands, as ``SessionRank`` reads them from its socket elsewhere: ``receive`` blocks for
    the next ``(command, attachments)``; ``None`` once the kernel said goodbye."""

    def __init__(self) -> None:
        self._queue: "queue.Queue[Optional[Tuple[Command, List[Any]]]]" = queue.Queue()

    def put(self, command: Optional[Command]) -> None:
        self._queue.put(None if command is None else (command, []))

    def receive(self) -> Optional[Tuple[Command, List[Any]]]:
        return self._queue.get()

    def close(self) -> None:
        pass


class RankActor:
    """One rank, in a Ray actor (see the module docstring). Plain Python: the kernel side wraps it with
    ``ray.remote`` and places it; nothing here imports Ray."""

    def __init__(self, rank: int, node: str = "") -> None:
        self.rank = rank
        self.node = node
        self.events = EventQueue()
        self.sender = QueueSender(self.events, rank)
        self._capture: Optional[OutputCapture] = None
        self._rank_thread: Optional[int] = None       # the thread running the rank (a Ray thread)
        self._busy = False                            # the function (or a session's task) is running
        self._store: Any = None
        self._commands: Optional[CommandQueue] = None
        self._session: Any = None                     # a warm session's task loop (``serve``)
        self._resources = _SelfSampler(rank)
        # SIGUSR2, the time limit's warning (``rank.time_warning``): a flag, not the default death. Ray runs an
        # actor's ``__init__`` in its worker's main thread, the only one that may install a handler; the handler then
        # runs there while the rank runs in a thread of Ray's.
        install_warning_handler(fresh=True)
        # Every rank needs torch.distributed (rank 0 hosts the store with it, each joins the group): imported now,
        # in every actor at once, not by rank 0 first while the others wait, then by each in turn (a second here).
        # Whoever needs torch next (the store, the rank's function, its result) joins this first: two threads importing
        # torch at once can give one of them the half-imported module ("partially initialized module 'torch' has no
        # attribute 'Tensor'", a Slurm rank's result once in a suite run), Python's import-deadlock escape.
        self._torch_import = threading.Thread(target=_import_torch_distributed, name="notebook_accel-import-torch",
                                              daemon=True)
        self._torch_import.start()

    # ------------------------------------------------------------------------------------- default group

    def describe(self, node_address: str = "") -> Dict[str, Any]:
        """Where this actor runs, as the kernel needs it to set the ranks' environment: its pid, the GPUs Ray
        gave it (``CUDA_VISIBLE_DEVICES`` as Ray set it; None without GPUs), and its ``network``: the interface of
        this node that carries ``node_address`` (the node's address as Ray reports it), found here since interface
        names are the node's own, with ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` unless this worker's environment
        sets them (``rank.network``)."""
        network = rank_network(node_address) if node_address else None
        return {"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "network": network}

    def host_store(self, world_size: int) -> int:
        """Rank 0 of a world: host the TCPStore every rank meets at (``TORCHELASTIC_USE_AGENT_STORE``), on a
        port the OS picks and this actor holds until it ends — no pick-then-release race. Returns the port."""
        from datetime import timedelta

        self._torch_import.join()
        from torch.distributed import TCPStore

        self._store = TCPStore("0.0.0.0", 0, world_size, is_master=True, timeout=timedelta(seconds=300),
                               wait_for_workers=False)
        return int(self._store.port)

    def run(self, spec: ActorRankSpec, payload: Any) -> int:
        """Run the launched function as rank ``spec.rank``; every event goes to the queue, the last one after
        the result or the failure. Returns the exit code a process rank would have."""
        try:
            before = self._start(spec)
            self.sender.no_one_types = spec.no_one_types
            self._busy = True
            try:
                run = run_rank(lambda: register_in_main(payload.load()), self.sender, send_result=spec.send_result,
                               post_mortem=spec.post_mortem)
            finally:
                self._busy = False
            send_peak_rss(self.sender)
            if run.exit_code == 0:
                wait_for_peers_to_finish()  # as a process rank does (rank/leaving.py)
            end_like_python(spec.rank, ignore=before, exit_handlers=False)
            return run.exit_code
        finally:
            self._finish()

    def serve(self, spec: ActorRankSpec) -> int:
        """A warm session's rank: join the process group, then run the tasks ``command`` brings until
        ``Shutdown`` (``rank.session.SessionRank``, as a session's process rank does)."""
        from .session import GroupKeeper, SessionRank

        try:
            before = self._start(spec)
            self._commands = CommandQueue()
            group = GroupKeeper(spec) if spec.group_backend else None
            self._session = SessionRank(self.sender, self._commands, group=group, generation=spec.group_generation,
                                        thread_rank=True, own_namespace=False, after_task=self._after_task)
            self._session.serve()
            send_peak_rss(self.sender)
            end_like_python(spec.rank, ignore=before, exit_handlers=False)
            return 0
        finally:
            self._finish()

    def _start(self, spec: ActorRankSpec) -> Set[threading.Thread]:
        """Set the rank up as ``rank.process`` does (environment, fd capture); returns the threads that were there
        before (Ray's: the rank does not wait for them at its end). The kernel says it started (``RankStarted``):
        it knows the node, and the row is there even for a rank that dies at once."""
        self._torch_import.join()  # before the rank's own code can import torch (see __init__)
        before = set(threading.enumerate())
        # Threads the function starts are non-daemon (waited for at its end), as in any program's main thread;
        # Ray runs this method in a thread of its own, a daemon.
        threading.current_thread()._daemonic = False  # type: ignore[attr-defined]  # no public setter once started
        self._rank_thread = threading.get_ident()
        os.environ.update(spec.env)
        _set_torch_threads(int(spec.env.get("OMP_NUM_THREADS", "0")))
        self._capture = OutputCapture(self.events, spec.rank)
        self.sender.before_prompt = self._sync_output
        return before

    def _sync_output(self) -> None:
        if self._capture is not None:
            self._capture.sync()

    def _after_task(self) -> None:
        """A session's task ended: its output first, then this rank's memory when the last sample is a second old.
        A warm run may end before any poll saw the rank busy; the session's row keeps what came last (it said "?"
        for every rank of a Ray session that only ran short tasks)."""
        self._sync_output()
        sample = self._resources.due()
        if sample is not None:
            self.events.put(sample)

    def _finish(self) -> None:
        self._sync_output()
        self.events.end()

    # ------------------------------------------------------------------------------------- control group

    def poll(self, wait: float, linger: float = 0.0) -> Tuple[List[RankEvent], bool]:
        """The events since the last poll (waiting up to ``wait`` s for one, and ``linger`` s more for a task's
        end: ``EventQueue.take``), with a sample of this rank's memory and CPU about once a second while it runs;
        ``True`` with the last of them."""
        busy = self._session.busy if self._session is not None else self._busy
        sample = self._resources.due() if busy else None
        if sample is not None:
            self.events.put(sample)
        return self.events.take(wait, linger)

    def stacks(self) -> str:
        """Every thread's Python stack but this control thread's own, in faulthandler's format."""
        read, write = os.pipe()
        chunks: List[bytes] = []
        reader = threading.Thread(target=_read_all, args=(read, chunks), daemon=True)
        reader.start()
        try:
            faulthandler.dump_traceback(file=write, all_threads=True)
        finally:
            os.close(write)
        reader.join(5.0)
        return _without_current_thread(b"".join(chunks).decode("utf-8", "replace"))

    def command(self, command: Command) -> None:
        """A command from the kernel, handled now: ``Interrupt`` raises ``KeyboardInterrupt`` in the rank's
        thread (Ray runs it in a thread: no signal reaches it); ``PromptAnswer`` is the line typed at the rank's
        prompt; a session's commands go to its task loop (which handles both as a process rank's does)."""
        if self._commands is not None:
            self._commands.put(command)
        elif isinstance(command, PromptAnswer):  # the line typed at a launch's prompt
            self.sender.answers.put(command)
        elif isinstance(command, Interrupt):
            self._interrupt()

    def _interrupt(self) -> None:
        if self._busy and self._rank_thread is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._rank_thread),
                                                       ctypes.py_object(KeyboardInterrupt))


def _import_torch_distributed() -> None:
    try:
        import torch.distributed  # noqa: F401
    except Exception:  # the rank's own import says what is wrong, where the user sees it
        pass


def _read_all(fd: int, chunks: List[bytes]) -> None:
    try:
        while True:
            chunk = os.read(fd, _READ_BYTES)
            if not chunk:
                return
            chunks.append(chunk)
    finally:
        os.close(fd)


def _without_current_thread(dump: str) -> str:
    """faulthandler's dump less the block of the thread that made it ("Current thread ..."): the control thread."""
    kept: List[str] = []
    skipping = False
    for line in dump.splitlines():
        if line.startswith(("Current thread ", "Thread ")):
            skipping = line.startswith("Current thread ")
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + ("\n" if kept else "")


@dataclass
class _SelfSampler:
    """This rank's memory and CPU (its process and children), sampled by itself: the kernel may be on another
    machine, where this pid names nothing."""

    rank: int
    peak_rss: int = 0
    _cpu_seconds: Optional[float] = None
    _sampled_at: float = 0.0
    _process: Any = field(default=None, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False)  # the control thread's poll, a task's end

    def due(self) -> Optional[ResourceSample]:
        with self._lock:
            return self._sample_if_due()

    def _sample_if_due(self) -> Optional[ResourceSample]:
        now = time.monotonic()
        if now - self._sampled_at < SAMPLE_SECONDS:
            return None
        import psutil

        if self._process is None:
            self._process = psutil.Process()
        try:
            processes = [self._process] + self._process.children(recursive=True)
        except psutil.Error:
            return None
        rss, cpu = 0, 0.0
        for process in processes:
            try:
                with process.oneshot():
                    rss += process.memory_info().rss
                    times = process.cpu_times()
                    cpu += times.user + times.system
            except psutil.Error:
                pass
        percent = None
        if self._cpu_seconds is not None and now > self._sampled_at:
            percent = max(0.0, 100.0 * (cpu - self._cpu_seconds) / (now - self._sampled_at))
        self._cpu_seconds, self._sampled_at = cpu, now
        self.peak_rss = max(self.peak_rss, rss)
        return ResourceSample(rank=self.rank, rss=rss, peak_rss=self.peak_rss, cpu_percent=percent)
