"""A sweep on Slurm from outside an allocation: ONE job array, ``sbatch --array=0-(N-1)%max_concurrent``.

Each array task is one trial: its own allocation (the ``slurm={...}`` options' partition, time, ... and the trial's
nodes and ranks per node), in which the driver (``array_task``) runs the trial's launch as a launch inside an
allocation runs — its ranks a step of that job. Slurm runs ``max_concurrent`` tasks at once and queues the rest
(``max_concurrent=None``: as many as the cluster has room for, as Slurm schedules any array).

The kernel and the tasks meet in a folder on the shared file system (``trial_folder``: per trial its plan, its
events and its ending), under ``$NOTEBOOK_ACCEL_SWEEP_DIR`` or ``~/.notebook_accel/sweeps``, removed when the sweep
returns. The kernel follows it: each trial's events feed its row (progress), its ending gives its result or its
root cause (the rank's own exception and traceback); ``squeue`` says which tasks run, and a task that left the queue
without an ending (killed, its node lost) fails with the tail of its output. Ctrl-C and ``last_sweep().stop()``
cancel the array (``scancel``): no task is left in the queue when the call returns.
"""
from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

from ...errors import LaunchError
from ...plan.plan import LaunchPlan
from ...trials import Trial, TrialRunner, TrialView, note, short
from ...wire.events import Status
from .allocation import asks_for_gpus, check_request
from .backend import job_name, site_of
from .tools import require_tools, run_tool
from .trial_folder import TrialFolder

TOOLS = ("sbatch", "squeue", "scancel", "scontrol")
DRIVER = "notebook_accel.backends.slurm.array_task"
FOLDER_VARIABLE = "NOTEBOOK_ACCEL_SWEEP_DIR"
FOLLOW_EVERY = 0.2      # s between reads of the trials' files
QUEUE_EVERY = 1.0       # s between asks of the queue
LOST_AFTER = 10.0       # s a task may be gone from the queue before its ending must have appeared
UNLISTED_WAIT = 30.0    # s, at most, for an ended or cancelled array to leave the queue


def sweep_root(environ: Optional[Dict[str, str]] = None) -> str:
    """Where sweeps keep their folders: a place every node sees (the home directory, on a cluster)."""
    environ = os.environ if environ is None else environ
    return environ.get(FOLDER_VARIABLE) or os.path.join(os.path.expanduser("~"), ".notebook_accel", "sweeps")


def sbatch_command(plan: LaunchPlan, count: int, max_concurrent: Optional[int], folder: str, name: str,
                   python: str = sys.executable) -> List[str]:
    """The ``sbatch`` of the array: ``count`` tasks, ``max_concurrent`` at a time (None: as many as the cluster
    has room for, Slurm's own limit), each with the trial's nodes and
    ranks per node (and one GPU per rank, unless the options ask for GPUs themselves), each ``slurm`` option as a
    long option, its output in its trial's folder, the driver as its command.

    >>> from notebook_accel.plan.sites import SlurmAllocation
    >>> plan = LaunchPlan("f", None, 2, "cpu", SlurmAllocation(1, 2, None, (("time", "5"),)), "no", None, False,
    ...                   "none")
    >>> sbatch_command(plan, 4, 2, "/s", "n", python="python3")[:6]
    ['sbatch', '--parsable', '--array=0-3%2', '--job-name=n', '--nodes=1', '--ntasks-per-node=2']
    >>> sbatch_command(plan, 4, 2, "/s", "n", python="python3")[6:]
    ['--output=/s/%a/slurm.out', '--time=5', '--wrap', 'exec python3 -u -m notebook_accel.backends.slurm.array_task /s']
    >>> sbatch_command(plan, 4, None, "/s", "n", python="python3")[2]
    '--array=0-3'
    """
    slurm = site_of(plan)
    limit = f"%{max_concurrent}" if max_concurrent is not None else ""
    argv = ["sbatch", "--parsable", f"--array=0-{count - 1}{limit}", f"--job-name={name}",
            f"--nodes={slurm.num_nodes}", f"--ntasks-per-node={slurm.ranks_per_node}",
            f"--output={os.path.join(folder, '%a', 'slurm.out')}"]
    if plan.device == "cuda" and not asks_for_gpus(slurm.request_options):
        argv.append(f"--gpus-per-node={slurm.ranks_per_node}")
    for key, value in slurm.request_options.items():
        argv.append(f"--{key}={value}" if value != "" else f"--{key}")
    # exec: the driver is the batch step's process itself, so that Slurm's SIGTERM (a scancel, the time limit)
    # reaches it and it can say why its trial ended before the SIGKILL that follows
    return argv + ["--wrap", "exec " + shlex.join([python, "-u", "-m", DRIVER, folder])]


def runs_as_array(plan: LaunchPlan) -> bool:
    """Whether a sweep of ``plan``'s trials is a job array: on Slurm, outside an allocation (inside one, each trial
    is a step of the kernel's job, as any launch there)."""
    site = plan.site
    return getattr(site, "name", None) == "slurm" and getattr(site, "allocation", "") is None


class ArraySweep(TrialRunner):
    """The trials of a sweep as the tasks of one job array (see the module docstring)."""

    def __init__(self, trials: List[Trial], max_concurrent: Optional[int], table) -> None:
        super().__init__(trials, max_concurrent, table)
        self.array_id: Optional[str] = None
        self.name: Optional[str] = None     # the array's name in squeue: ours alone (a tag of its own)
        self.folder: Optional[str] = None
        self._folders: Dict[int, TrialFolder] = {}
        self._views: Dict[int, TrialView] = {}
        self._gone_since: Dict[int, float] = {}

    def check(self) -> None:
        """Refuse, before anything is submitted, what cannot run: Slurm's commands missing, a request the cluster
        could never grant."""
        require_tools(TOOLS)
        slurm = site_of(self.trials[0].plan)
        check_request(slurm.request_options, slurm.num_nodes)

    def run(self) -> None:
        self.table.show(self.trials)
        try:
            self._submit()
            self._follow()
            if not self._until_unlisted():   # every trial ended, a task still listed after the bound: cancelled
                self._cancel()
        except KeyboardInterrupt:
            self._cancel()
            left = [trial for trial in self.trials if trial.state in ("waiting", "not started")]
            for trial in self.trials:
                if trial.state in ("waiting", "running"):
                    trial.state = "stopped" if trial.state == "running" else "not started"
            self.table.changed(self.trials)
            cancelled = f"Slurm job array {self.array_id} was cancelled" if self.array_id else "nothing was submitted"
            raise KeyboardInterrupt(f"the sweep was interrupted; {cancelled}, {len(left)} trial(s) not started") \
                from None
        except BaseException:   # anything unforeseen while following: no array left running without its folder
            self._cancel()
            raise
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    # ------------------------------------------------------------------------------------------- submit

    def _submit(self) -> None:
        first = self.trials[0].plan
        name = self.name = f"{job_name(first)}.sweep.{secrets.token_hex(3)}"[:100]
        root = sweep_root()
        os.makedirs(root, mode=0o700, exist_ok=True)
        self.folder = os.path.join(root, f"{first.function_name[:40]}-{time.strftime('%Y%m%d-%H%M%S')}-"
                                         f"{secrets.token_hex(3)}")
        os.makedirs(self.folder, mode=0o700)
        for trial in self.trials:
            folder = self._folders[trial.index] = TrialFolder(os.path.join(self.folder, str(trial.index)))
            folder.make(trial.plan)
            self._views[trial.index] = TrialView(trial, lambda: self.table.changed(self.trials))
        if self._stop.is_set():
            raise KeyboardInterrupt
        argv = sbatch_command(first, len(self.trials), self.max_concurrent, self.folder, name)
        submitted = run_tool(argv)
        if submitted.returncode != 0:
            raise LaunchError(f"Slurm refused the sweep's job array ({shlex.join(argv[1:-2])}):\n"
                              f"{submitted.stderr.strip() or submitted.stdout.strip()}")
        self.array_id = submitted.stdout.strip().split(";")[0]

    # ------------------------------------------------------------------------------------------- follow

    def _follow(self) -> None:
        asked_at = 0.0
        while any(trial.state in ("waiting", "running") for trial in self.trials):
            if self._stop.is_set():
                raise KeyboardInterrupt
            for trial in self.trials:
                if trial.state in ("waiting", "running"):
                    self._read(trial)
            now = time.monotonic()
            if now - asked_at >= QUEUE_EVERY:
                asked_at = now
                self._ask_queue(now)
            time.sleep(FOLLOW_EVERY)

    def _read(self, trial: Trial) -> None:
        folder = self._folders[trial.index]
        for event in folder.read_events():
            if trial.state == "waiting":
                self._started(trial)
            self._views[trial.index].handle(event)
        ending = folder.ending()
        if ending is None:
            return
        try:
            result, error = ending.value(), ending.exception()
        except Exception as unloadable:   # a result whose class this kernel cannot import: that trial's error
            result, error = None, LaunchError(f"trial {trial.index}'s result came back but cannot be loaded here: "
                                              f"{type(unloadable).__name__}: {unloadable}")
        self._trial_ended(trial, ending.status if error is None or ending.error is not None else Status.FAILED.value,
                          result, error, ending.ended - ending.started)

    def _ask_queue(self, now: float) -> None:
        """Which tasks run (their rows say so), and which left the queue without an ending (lost)."""
        try:
            listed = run_tool(["squeue", "-h", "-r", "-j", str(self.array_id), "-o", "%K %T"], timeout=30)
        except subprocess.TimeoutExpired:
            return   # a busy controller: ask again
        if listed.returncode != 0 and "Invalid job id" not in listed.stderr:
            return   # the controller did not answer this time: ask again
        states = dict(line.split()[:2] for line in listed.stdout.splitlines() if len(line.split()) >= 2)
        for trial in self.trials:
            if trial.state not in ("waiting", "running"):
                continue
            state = states.get(str(trial.index))
            if state == "RUNNING" and trial.state == "waiting":
                self._started(trial)
            if state is not None:
                self._gone_since.pop(trial.index, None)
                continue
            gone = self._gone_since.setdefault(trial.index, now)
            if now - gone >= LOST_AFTER:
                self._read(trial)   # its last events, and the ending if it came meanwhile
                if trial.state in ("waiting", "running"):
                    tail = self._folders[trial.index].output_tail()
                    self._trial_ended(trial, Status.FAILED.value, None, LaunchError(
                        f"Slurm array task {self.array_id}_{trial.index} left the queue without a result (cancelled, "
                        f"killed, or its node lost)" + (f"; its output ended with:\n{tail}" if tail else "")), None)

    def _started(self, trial: Trial) -> None:
        trial.state, trial.started = "running", time.monotonic()
        self.table.changed(self.trials, trial)

    def _trial_ended(self, trial: Trial, status: str, result, error: Optional[BaseException],
                     elapsed: Optional[float]) -> None:
        trial.state, trial.result, trial.error = status, result, error
        trial.elapsed = elapsed if elapsed is not None else (
            time.monotonic() - trial.started if trial.started is not None else None)
        if error is not None:
            note(error, f"(notebook_accel: sweep trial {trial.index}, config={short(repr(trial.config))}, "
                         f"Slurm array task {self.array_id}_{trial.index})")
        self.table.changed(self.trials, trial)

    # ------------------------------------------------------------------------------------------- cancel

    def _cancel(self) -> None:
        """``scancel`` of the whole array, then until ``squeue`` lists none of its tasks. Interrupted while ``sbatch``
        ran, the array may exist with no id known here: it is cancelled by its name, which no other job has."""
        if self.array_id is None:
            if self.name is not None:
                run_tool(["scancel", "--quiet", f"--name={self.name}", f"--user={os.getuid()}"], timeout=30)
            return
        run_tool(["scancel", "--quiet", self.array_id], timeout=30)
        self._until_unlisted()

    def _until_unlisted(self) -> bool:
        """Until ``squeue`` lists none of the array's tasks (True), or :data:`UNLISTED_WAIT` s (False). A task whose
        driver wrote its trial's ending is still in the queue for a moment (COMPLETING while its node cleans up: on a
        loaded machine, past the sweep's return), so a sweep that ended waits here too: it returns when nothing of it
        is left, as Slurm shows it. A ``squeue`` that cannot answer ends the wait."""
        if self.array_id is None:
            return True
        deadline = time.monotonic() + UNLISTED_WAIT
        while True:
            try:
                listed = run_tool(["squeue", "-h", "-r", "-j", self.array_id, "-o", "%i"], timeout=30)
            except (OSError, subprocess.SubprocessError):
                return True
            if listed.returncode != 0 or not listed.stdout.strip():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
