"""The rank → kernel events: the only thing views and the supervisor ever see.

Every event is a small, picklable dataclass carrying the rank it came from. Ranks send them over a pipe
(`notebook_accel.wire.channel`); the supervisor adds the launch-level ones (`LaunchStarted`, `RankExited`,
`LaunchFinished`). Views consume them and nothing else, so a new frontend needs no knowledge of processes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .choices import Choice


class Status(Choice):
    """How a launch stands. STARTING → RUNNING → one of FINISHED, FAILED (the root cause is raised), STOPPED
    (interrupt, Stop button, or a node stopped the world), TIMEOUT. A ``str``: equal to its value
    (``Status.FAILED == "failed"``), so events and outcomes read the same in logs, tests and old pickles."""

    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    TIMEOUT = "timeout"


class RankStatus(Choice):
    """How one rank stands, as the views show it. STARTING → RUNNING → FINISHED (returned), FAILED (raised),
    EXITED (died without an exception, or exited non-zero), STOPPED (ended by the launcher) or CHECKPOINTED (saved a
    checkpoint before its time limit and stopped: ``TimeLimitReached``). RUNNING ⇄
    AT_PROMPT while the rank waits for a line typed by whoever launched (pdb, ``input()``)."""

    STARTING = "starting"
    RUNNING = "running"
    AT_PROMPT = "at a prompt"
    FINISHED = "finished"
    FAILED = "failed"
    EXITED = "exited"
    STOPPED = "stopped"
    CHECKPOINTED = "checkpointed"  # warned of its time limit, saved a checkpoint and stopped (TimeLimitReached)


class PromptKind(Choice):
    """Why a rank waits for a line: pdb stopped at a breakpoint (``breakpoint()``, ``pdb.set_trace()``,
    ``torch.distributed.breakpoint``), pdb opened on a failure (post-mortem), or the rank called ``input()``."""

    BREAKPOINT = "breakpoint"
    POST_MORTEM = "post-mortem"
    INPUT = "input"


class SessionStatus(Choice):
    """How a warm ``Session`` stands (``Session.status``, its row). STARTING → IDLE ⇄ BUSY (a run or ``%%ranks``
    cell, one at a time); a restart — asked, or after a run lost a rank — goes → STARTING → IDLE; ``close()``
    (or a start that failed) → CLOSED, which is final. A ``str``: ``session.status == "idle"``."""

    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    CLOSED = "closed"


@dataclass
class RankEvent:
    """Base of every event. ``rank`` is the global rank (-1 for launch-level events)."""

    rank: int


@dataclass
class RankStarted(RankEvent):
    """A rank runs. ``host``: the node it runs on, where that is not this machine (a cluster's); such a rank
    samples its own memory and CPU (``ResourceSample`` events: ``reports_resources``), since its pid means
    nothing here. ``network``: the interface and address it offers its peers (``"eth1 10.77.0.2"``), where the
    launcher chose them (a launch across hosts: ``rank.network``)."""

    pid: int
    host: Optional[str] = None
    reports_resources: bool = False
    network: Optional[str] = None


@dataclass
class OutputLine(RankEvent):
    """One line a rank wrote to fd 1 or 2 (Python print, logging, C/C++, subprocesses), without its newline."""

    stream: str  # "stdout" | "stderr"
    text: str

    @property
    def texts(self) -> List[str]:
        """The lines this event carries (one): read ``texts`` to handle ``OutputLines`` alike."""
        return [self.text]


@dataclass
class OutputLines(RankEvent):
    """Every whole line one read of a rank's output pipe held, in order, without their newlines. The
    supervisor sends these (a chatty rank writes thousands of lines a second: one event per read, not per
    line); views label and write them as one block."""

    stream: str  # "stdout" | "stderr"
    lines: List[str]

    @property
    def texts(self) -> List[str]:
        return self.lines


@dataclass
class ProgressUpdate(RankEvent):
    """State of one progress bar in a rank (sent at most every ``mininterval`` seconds, plus open/close).

    ``bar_id`` is unique within the rank; ``position`` is the nesting depth (0 = outermost).
    ``format_dict`` is tqdm's own ``format_dict`` (n, total, elapsed, rate, unit, postfix, ...), so a view
    can render it with ``tqdm.format_meter`` and stay consistent with plain tqdm.
    """

    bar_id: int
    desc: str
    n: float
    total: Optional[float]
    elapsed: float
    rate: Optional[float]
    postfix: Optional[str] = None
    position: int = 0
    closed: bool = False
    unit: str = "it"
    format_dict: Dict[str, Any] = field(default_factory=dict)
    leave: bool = True  # tqdm's ``leave`` (None resolved): a closed bar with leave=False disappears


@dataclass
class MetricReport(RankEvent):
    """Scalars a rank reported with ``report(step=..., **metrics)``.

    A rank sends at most ~50 of these a second; calls in between are merged (latest value per name) into
    the next one, so ``metrics`` may hold names reported at different steps; ``rows`` keeps each call.
    ``seq`` counts the rank's ``report`` calls.
    """

    step: Optional[int]
    metrics: Dict[str, float]
    time: float = field(default_factory=time.time)
    seq: int = 0
    # Every ``report`` call merged into this event, in order, as (step, time, seq, metrics); empty when it
    # carries a single call. Views plot the merged values; ``Launch.metrics`` keeps every call.
    rows: List[Tuple[Optional[int], float, int, Dict[str, float]]] = field(default_factory=list)

    def calls(self) -> List[Tuple[Optional[int], float, int, Dict[str, float]]]:
        """The ``report`` calls this event carries, oldest first: (step, time, seq, metrics)."""
        return self.rows or [(self.step, self.time, self.seq, self.metrics)]


@dataclass
class RankResult(RankEvent):
    """The function's return value, cloudpickled in the rank (tensors already moved to CPU). ``shared``: where
    its large tensors and arrays lie, in the shared-memory files sent with this event (``wire.results``)."""

    payload: bytes
    shared: Optional[Any] = None   # results.SharedPieces


@dataclass
class RankFailed(RankEvent):
    """The function raised. ``exception`` is the cloudpickled exception, or None if it could not be pickled.

    ``traceback`` starts at the user's code (the launcher's leading frames hidden, see ``tracebacks``);
    ``full_traceback`` keeps every frame, for a bug report.
    """

    exc_type: str
    message: str
    traceback: str
    exception: Optional[bytes]
    time: float = field(default_factory=time.time)
    full_traceback: Optional[str] = None
    loading: bool = False  # raised while loading (unpickling) the function in the rank, before it ran


@dataclass
class RankExited(RankEvent):
    """Made by the supervisor when a rank's process is gone. ``signal_name`` is set when it died by a signal;
    ``stopped`` when the launcher ended it."""

    exitcode: Optional[int]
    signal_name: Optional[str] = None
    stopped: bool = False  # ended by the launcher (fail-fast, Stop, timeout, interrupt), not by itself


@dataclass
class DeviceMemoryReport(RankEvent):
    """Sent by a rank (at most about once a second, and when it fails): what its framework says about device
    memory. ``peak_allocated`` is ``torch.cuda.max_memory_allocated()``, ``peak_reserved`` what torch's caching
    allocator held from the device at most (``max_memory_reserved``: what the process really took, its CUDA
    context aside); ``used``/``total`` come from torch_xla's ``get_memory_info`` on TPU. Only sent once the rank
    uses the device."""

    peak_allocated: Optional[int] = None
    peak_reserved: Optional[int] = None
    used: Optional[int] = None
    total: Optional[int] = None
    source: str = "torch.cuda"


@dataclass
class PeakMemoryReport(RankEvent):
    """Sent by a rank process when its function ended: the process's peak resident set size in bytes (the
    OS's ``getrusage`` high-water mark), so a run shorter than the kernel's sampling interval has a peak too."""

    peak_rss: int


@dataclass
class ResourceSample(RankEvent):
    """Made in the kernel about once a second per running rank (``resources.ResourceSampler``).

    Host figures come from psutil (the rank's process plus its children, e.g. DataLoader workers); device
    figures from NVML for the rank's GPU, and from the rank's own ``DeviceMemoryReport``. None = unknown.
    """

    rss: Optional[int] = None               # bytes
    peak_rss: Optional[int] = None          # highest rss sampled
    cpu_percent: Optional[float] = None     # 100 = one core busy
    device_used: Optional[int] = None       # bytes in use on the rank's GPU (whole device, NVML)
    device_total: Optional[int] = None
    device_peak: Optional[int] = None       # highest device_used sampled
    device_util: Optional[float] = None     # percent of time a kernel ran (NVML)
    device_peak_allocated: Optional[int] = None  # the rank's framework peak (torch.cuda.max_memory_allocated)
    time: float = field(default_factory=time.time)


@dataclass
class RankPrompt(RankEvent):
    """The rank waits for a line typed where the launch was started (``rank.prompts``): pdb's ``(Pdb) ``, or the
    prompt of an ``input()``. Its output up to this point is already in its pipes. ``seq`` counts the rank's
    prompts: the answer names the one it answers. ``filename``/``lineno``: the frame pdb stands in."""

    prompt: str
    seq: int = 0
    kind: PromptKind = PromptKind.INPUT
    filename: Optional[str] = None
    lineno: Optional[int] = None

    @property
    def where(self) -> str:
        """``train.py:12`` (the file's name, not its path), or "" when the rank is not in pdb."""
        if self.filename is None:
            return ""
        return f"{self.filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{self.lineno}"

    def describe(self) -> str:
        """How the views say it: ``at breakpoint (train.py:12)``, ``post-mortem (train.py:12)``, ``waiting for
        input``."""
        where = f" ({self.where})" if self.where else ""
        if self.kind == PromptKind.BREAKPOINT:
            return f"at breakpoint{where}"
        if self.kind == PromptKind.POST_MORTEM:
            return f"post-mortem{where}"
        return "waiting for input"


@dataclass
class PromptAnswered(RankEvent):
    """Made in the kernel: rank ``rank``'s prompt ``seq`` got its line (or was withdrawn): it runs again.
    ``ran_on``: the line lets it run on (pdb's ``c``, ``q``; a withdrawn prompt), not a step it soon comes back from
    (``n``, ``p x``)."""

    seq: int = 0
    ran_on: bool = True


@dataclass
class RankStacks(RankEvent):
    """Where a rank is: its Python stacks, every thread (faulthandler's format), when asked for with
    ``Launch.dump_stacks()`` or when a timeout stopped the launch. ``text`` is for people (the frames a forked
    rank inherited from the kernel folded into one line), ``full`` the dump as faulthandler wrote it."""

    text: str
    full: str = ""


@dataclass
class PeersWaiting(RankEvent):
    """Made by the supervisor (rank = -1) when a rank ended normally while others still run: they may be waiting
    for it forever (a collective it never joined), and nothing else would say so. One line for people:
    ``text`` names the finished rank, how long the others waited and where (the frame from their stacks)."""

    finished_rank: int
    waiting: List[int]
    seconds: float
    text: str


@dataclass
class LaunchStarted(RankEvent):
    """First event of every launch (rank = -1)."""

    world_size: int
    device: str
    start_method: str
    mixed_precision: str = "no"
    function_name: str = ""
    # Several nodes: this node's place, and the global ranks it runs (None: every rank of world_size).
    num_nodes: int = 1
    node_rank: int = 0
    ranks: Optional[List[int]] = None
    # How the ranks' start was prepared, for the header: "fork server warm (started at import, ready in 3.9 s)"
    start_up: str = ""


@dataclass
class AttemptStarted(RankEvent):
    """A launch with restarts runs the whole world again (rank = -1): attempt 1 is the first restart.

    ``previous_errors`` holds one line per earlier attempt's root cause, oldest first.
    """

    attempt: int
    max_restarts: int
    previous_errors: List[str] = field(default_factory=list)


@dataclass
class TaskDone(RankEvent):
    """A session's rank finished one task (a run, a ``%%ranks`` cell, a new group) and is idle again; sent after
    its result or failure. ``group_sequence``: how many collectives its default process group has run (ranks
    that disagree left a collective half done), None without a group. ``shadowed``: names the run brought from
    the kernel that the rank has its own of (the rank's were used)."""

    task_id: int
    group_sequence: Optional[int] = None
    shadowed: List[str] = field(default_factory=list)


@dataclass
class SessionNotice(RankEvent):
    """Something a session did on its own that the user must know (rank = -1): "ranks restarted: state lost",
    "the process group was replaced"."""

    text: str


@dataclass
class LaunchFinished(RankEvent):
    """Last event of every launch (rank = -1).

    ``status`` is a ``Status``: FINISHED, FAILED, STOPPED (interrupt / Stop button) or TIMEOUT.
    ``root_rank`` is the root-cause rank of a failure; ``error`` a one-line description,
    ``traceback`` the root cause's remote traceback text when there was one.
    """

    status: Status
    elapsed: float
    root_rank: Optional[int] = None
    error: Optional[str] = None
    traceback: Optional[str] = None
    still_running: List[int] = field(default_factory=list)
