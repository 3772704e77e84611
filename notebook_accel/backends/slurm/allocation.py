"""A Slurm allocation asked for by the launch (``cluster="slurm"`` outside one): checked, waited for, given back.

``check_request`` asks the controller (``scontrol show partition``) before anything waits in the queue, and refuses
what would pend for ever: an unknown partition, a time limit above the partition's, more nodes than it has — a
``LaunchConfigError`` naming it. ``Allocation`` then asks for one with ``salloc`` (the ``slurm={...}`` options as its
long options), says while it waits that the job is "pending in the queue (reason)" as ``squeue`` gives the reason,
and ``release`` gives it back (``scancel``) when the launch ends, whatever happened.

The allocation is held by ``salloc`` running a command that waits for the end of its stdin, a pipe only the kernel
holds: if the kernel dies — even by SIGKILL, where no ``finally`` or ``atexit`` runs — the pipe ends, the command
ends, and ``salloc`` gives the job back. (``salloc --no-shell`` would keep it until its time limit.)

>>> minutes("1-02:03:04"), minutes("90"), minutes("01:30:00"), minutes("UNLIMITED")
(1563.0666666666666, 90.0, 90.0, inf)
"""
from __future__ import annotations

import math
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional

from ...errors import LaunchConfigError, LaunchError
from ...plan.slurm_names import GPU_REQUEST_OPTIONS
from .tools import run_tool

_GRANTED = re.compile(r"Granted job allocation (\d+)")
_PENDING = re.compile(r"Pending job allocation (\d+)")
REASON_EVERY = 1.0   # s between asks of the queue for the reason a job is pending


def minutes(text: str) -> float:
    """A Slurm time limit in minutes ("minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
    "days-hours:minutes", "days-hours:minutes:seconds"); ``inf`` for UNLIMITED/INFINITE."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return math.inf
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
        parts = [int(part) for part in text.split(":")]
        hours, mins, secs = (parts + [0, 0, 0])[:3]
    else:
        parts = [int(part) for part in text.split(":")]
        if len(parts) == 1:
            hours, mins, secs = 0, parts[0], 0
        elif len(parts) == 2:
            hours, mins, secs = 0, parts[0], parts[1]
        else:
            hours, mins, secs = parts[:3]
    return days * 1440 + hours * 60 + mins + secs / 60


def partitions() -> Dict[str, Dict[str, str]]:
    """Every partition the controller knows, by name: its ``scontrol show partition`` fields."""
    listed = run_tool(["scontrol", "show", "partition", "--oneliner"])
    if listed.returncode != 0:
        raise LaunchError(f"cannot ask the Slurm controller for its partitions (scontrol: "
                          f"{listed.stderr.strip() or listed.returncode}): is it reachable from here?")
    found: Dict[str, Dict[str, str]] = {}
    for line in listed.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "PartitionName" in fields:
            found[fields["PartitionName"]] = fields
    return found


def check_request(request: Mapping[str, str], num_nodes: int,
                  known: Optional[Dict[str, Dict[str, str]]] = None) -> str:
    """Refuse, before anything waits, what the cluster can never grant; returns the partition asked for."""
    known = partitions() if known is None else known
    asked = request.get("partition")
    if asked:
        names = asked.split(",")
        unknown = [name for name in names if name not in known]
        if unknown:
            raise LaunchConfigError(f"slurm={{'partition': {asked!r}}}: no partition {unknown[0]!r} on this Slurm "
                                    f"cluster (it has {', '.join(sorted(known)) or 'none'})")
        partition = names[0]
    else:
        defaults = [name for name, fields in known.items() if fields.get("Default") == "YES"]
        if not defaults:
            raise LaunchConfigError(f"this Slurm cluster has no default partition: give slurm={{'partition': ...}} "
                                    f"(one of {', '.join(sorted(known))})")
        partition = defaults[0]
    fields = known[partition]
    limit = request.get("time")
    if limit:
        try:
            asked_minutes = minutes(limit)
        except ValueError:
            raise LaunchConfigError(f"slurm={{'time': {limit!r}}} is not a Slurm time limit (e.g. '01:00:00', "
                                    f"'90', '1-00:00:00')") from None
        if asked_minutes > minutes(fields.get("MaxTime", "UNLIMITED")):
            raise LaunchConfigError(f"slurm={{'time': {limit!r}}} is above partition {partition!r}'s time limit "
                                    f"({fields['MaxTime']}): the job would pend for ever")
    total = fields.get("TotalNodes", "")
    if total.isdigit() and num_nodes > int(total):
        raise LaunchConfigError(f"num_nodes={num_nodes} is more than the {total} node(s) of partition {partition!r}")
    most = fields.get("MaxNodes", "UNLIMITED")
    if most.isdigit() and num_nodes > int(most):
        raise LaunchConfigError(f"num_nodes={num_nodes} is more than partition {partition!r} gives one job "
                                f"(MaxNodes={most})")
    return partition


# Slurm's --signal=USR2@N before a time limit: the ranks' warning (``accelerator/time_limit.py``: they agree on a
# step, save a checkpoint and stop). 90 s as submitit asks; at most half of a short limit (Slurm may send it up to a
# minute early, and a job of one minute would be warned as it starts).
WARNING_SECONDS = 90


def time_limit_warning(request: Mapping[str, str]) -> Optional[str]:
    """The ``--signal`` asked for a job with a time limit (None without one, or when the options give their own).

    >>> time_limit_warning({"time": "02:00:00"}), time_limit_warning({"time": "1"}), time_limit_warning({})
    ('--signal=USR2@90', '--signal=USR2@30', None)
    >>> time_limit_warning({"time": "10", "signal": "USR2@300"}) is None
    True
    """
    limit = request.get("time")
    if not limit or "signal" in request or math.isinf(minutes(limit)):
        return None
    return f"--signal=USR2@{max(1, min(WARNING_SECONDS, int(minutes(limit) * 60) // 2))}"


# salloc's command: holds the allocation until its stdin (our pipe) ends. It ignores the time limit's warning: under
# LaunchParameters=use_interactive_step it is a step of the job, and SIGUSR2's default action would end it, and the job.
HOLD = ["sh", "-c", "trap '' USR2; cat >/dev/null"]


def asks_for_gpus(request: Mapping[str, str]) -> bool:
    """Whether the ``slurm`` options ask for GPUs themselves.

    >>> asks_for_gpus({"gres": "gpu:a100:4"}), asks_for_gpus({"gpus-per-node": "2"}), asks_for_gpus({"time": "1"})
    (True, True, False)
    """
    return any(key in request for key in GPU_REQUEST_OPTIONS if key != "gres") or "gpu" in request.get("gres", "")


def allocation_name(base: str) -> str:
    """The job's name in ``squeue``: ``base`` and a tag of its own. A job whose id ``salloc`` never printed (it
    died first) is cancelled by name, and no other job of the user's may have that name — a second notebook
    launching its own ``train`` would otherwise lose its job too.

    >>> re.fullmatch(r"notebook_accel:train\\.[0-9a-f]{6}", allocation_name("notebook_accel:train")) is not None
    True
    """
    return f"{base[:93]}.{secrets.token_hex(3)}"


def salloc_command(request: Mapping[str, str], num_nodes: int, ranks_per_node: int, name: str,
                   gpus: bool = False) -> List[str]:
    """``salloc`` for the launch: :func:`job_request`, then the command that holds the allocation while
    the kernel lives (see the module docstring).

    >>> salloc_command({"partition": "gpu", "exclusive": ""}, 2, 4, "notebook_accel")[:7]
    ['salloc', '--nodes=2', '--ntasks-per-node=4', '--job-name=notebook_accel', '--partition=gpu', '--exclusive', 'sh']
    >>> salloc_command({}, 2, 4, "notebook_accel", gpus=True)[4]
    '--gpus-per-node=4'
    """
    return ["salloc"] + job_request(request, num_nodes, ranks_per_node, name, gpus) + HOLD


def job_request(request: Mapping[str, str], num_nodes: int, ranks_per_node: int, name: str,
                gpus: bool = False) -> List[str]:
    """What a job for the launch asks of Slurm (``salloc``'s and ``sbatch``'s options alike): its nodes and tasks
    (and with ``gpus``, one GPU per rank unless the options ask for GPUs themselves), each ``slurm`` option as a long
    option, the warning before a ``time`` limit (:func:`time_limit_warning`)."""
    argv = [f"--nodes={num_nodes}", f"--ntasks-per-node={ranks_per_node}", f"--job-name={name}"]
    if gpus and not asks_for_gpus(request):
        argv.append(f"--gpus-per-node={ranks_per_node}")
    for key, value in request.items():
        argv.append(f"--{key}={value}" if value != "" else f"--{key}")
    warning = time_limit_warning(request)
    return argv + ([warning] if warning else [])


class Allocation:
    """A job asked for with ``salloc`` (see the module docstring); ``job_id`` once Slurm named it."""

    def __init__(self, argv: List[str]) -> None:
        self.argv = argv
        self.name = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--job-name=")), None)
        self.job_id: Optional[str] = None
        self.granted = False
        self.said: List[str] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="notebook_accel-salloc", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            line = line.rstrip("\n")
            with self._lock:
                granted, pending = _GRANTED.search(line), _PENDING.search(line)
                if granted:
                    self.job_id, self.granted = granted.group(1), True
                elif pending:
                    self.job_id = pending.group(1)
                elif line.strip():
                    self.said.append(line)

    def wait(self, stopped: Callable[[], bool], tick: Callable[[], None], notice: Callable[[str], None],
             how_to_stop: str = "interrupting the kernel (Ctrl-C) ends the wait") -> bool:
        """Until the allocation is granted (True) or ``stopped()`` (False); ``notice`` gets "pending in the queue
        (reason)" each time the reason changes, and ``how_to_stop``. A refusal by Slurm is a ``LaunchConfigError``
        with its words."""
        reason: Optional[str] = None
        asked_at = 0.0
        began = time.monotonic()
        while True:
            with self._lock:
                if self.granted:
                    if reason is not None:   # it was said to pend: say how long it did
                        notice(f"Slurm job {self.job_id} started after {time.monotonic() - began:.0f} s in the queue")
                    return True
                job = self.job_id
            if self.process.poll() is not None:
                self._reader.join(5.0)
                said = "\n".join(self.said[-10:]) or f"salloc ended with {self.process.returncode}"
                raise LaunchConfigError(f"Slurm did not grant the allocation ({' '.join(self.argv[1:])}):\n{said}")
            if stopped():
                return False
            now = time.monotonic()
            if job is not None and now - asked_at >= REASON_EVERY:
                asked_at = now
                listed = run_tool(["squeue", "-h", "-j", job, "-o", "%r"], timeout=30)
                current = listed.stdout.strip()
                if current and current != reason and current != "None":
                    reason = current
                    notice(f"Slurm job {job} is pending in the queue ({reason}); {how_to_stop}")
            tick()
            time.sleep(0.1)

    def never_started(self) -> str:
        """What a launch that ended while this job pends says of it, with ``squeue``'s reason asked now."""
        if self.job_id is None:
            return "salloc's request had no job id from Slurm yet; it was withdrawn"
        reason = run_tool(["squeue", "-h", "-j", self.job_id, "-o", "%r"], timeout=30).stdout.strip()
        reason = f" ({reason})" if reason and reason != "None" else ""
        return (f"Slurm job {self.job_id} never left the queue{reason} and was cancelled; the timeout counts the "
                f"wait in the queue: squeue shows what holds the nodes")

    def release(self) -> None:
        """Give the allocation back (``scancel``), whatever state it is in; ``salloc`` gone too."""
        try:
            self.process.stdin.close()   # the holding command ends: salloc relinquishes the job
        except OSError:
            pass
        if self.job_id is not None:
            run_tool(["scancel", "--quiet", self.job_id], timeout=30)
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)   # a pending salloc withdraws its request
            except ProcessLookupError:
                pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reader.join(5.0)
        if self.job_id is None and self.name is not None:   # salloc ended before naming the job: ours, by its own name
            run_tool(["scancel", "--quiet", f"--name={self.name}", f"--user={os.getuid()}"], timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()
