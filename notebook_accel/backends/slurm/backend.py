"""Ranks as the tasks of one Slurm job step (``cluster="slurm"``): Slurm places them, our events and rules supervise
them.

``SlurmBackend.run`` is the local sequence with Slurm underneath. Inside an allocation (the kernel's environment has
``SLURM_JOB_ID``: a batchspawner notebook, ``salloc``), the ranks are a new step of it — no new job. Outside one, the
launch asks for one with the ``slurm={...}`` options (``allocation``), checked first, waited for while the view says
why it pends, and given back when the launch ends. ``srun`` starts
one task per rank (``rank.slurm_task``) on ``num_nodes`` nodes; each says where it runs, rank 0 hosts the store every
rank meets at, and the kernel then sends every task the launch: torchrun's variables come from Slurm's
(``SLURM_PROCID``...), ``MASTER_ADDR`` is rank 0's node address and ``MASTER_PORT`` its store's port. Their events
come back through ``srun``'s stdout (``step``) into the launch's own ``Supervisor``: the same root cause (named with
its node), Stop, timeout and stack dumps as local ranks. At the end, whatever happened, the step is cancelled
(``scancel``) if it still runs, and ``srun`` is gone.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Optional

from ...errors import LaunchError
from ...outcome.root_cause import Outcome
from ...plan.plan import LaunchPlan
from ...plan.sites import SlurmAllocation
from ...plan.slurm_names import PER_TASK_GPU_VARIABLES
from ...wire.events import SessionNotice, Status
from ..base import LaunchSink, StopPolicy
from ..relay import NoKernelStore, RelayedBackend, task_setup
from ..supervisor import RankProcess
from .allocation import Allocation, allocation_name, check_request, salloc_command
from .step import SlurmStep
from .tools import require_tools

TOOLS = ("srun", "scancel", "squeue")
ALLOCATION_TOOLS = ("salloc", "scontrol")   # to ask for an allocation, outside one
TASK_MODULE = "notebook_accel.rank.slurm_task"


def site_of(plan: LaunchPlan) -> SlurmAllocation:
    """The plan's Slurm site (``plan.slurm.slurm_allocation`` made it)."""
    assert isinstance(plan.site, SlurmAllocation), plan.site
    return plan.site


def job_name(plan: LaunchPlan, session: bool = False) -> str:
    """What ``squeue`` shows for the launch's job and step: ours, and the function's name (or "session").

    >>> job_name(LaunchPlan("train", None, 2, "cpu", SlurmAllocation(2, 1, "7"), "no", None, False, "none"))
    'notebook_accel:train'
    """
    return f"notebook_accel:{'session' if session else plan.function_name}"[:100]


def srun_command(plan: LaunchPlan, job: Optional[str], python: str = sys.executable,
                 session: bool = False) -> List[str]:
    """The ``srun`` that starts the launch's ranks: one task per rank, spread evenly over the nodes, every task's
    stdin from ``srun``'s (the kernel's messages), no task's failure ending the others (the supervisor decides).

    >>> plan = LaunchPlan("f", None, 4, "cpu", SlurmAllocation(2, 2, "7"), "no", None, False, "none")
    >>> srun_command(plan, "7", python="python3")[:6]
    ['srun', '--nodes=2', '--ntasks=4', '--ntasks-per-node=2', '--input=all', '--kill-on-bad-exit=0']
    """
    slurm = site_of(plan)
    argv = ["srun", f"--nodes={slurm.num_nodes}", f"--ntasks={slurm.world_size}",
            f"--ntasks-per-node={slurm.ranks_per_node}", "--input=all", "--kill-on-bad-exit=0",
            f"--job-name={job_name(plan, session)}"]
    if job is not None:
        argv.append(f"--jobid={job}")
    if plan.device == "cuda":   # every GPU of the node visible to each of its ranks: LOCAL_RANK picks its own
        argv.append(f"--gpus-per-node={slurm.ranks_per_node}")
    return argv + [python, "-u", "-m", TASK_MODULE]


def srun_environment(plan: LaunchPlan, environ: Optional[Dict[str, str]] = None) -> Optional[Dict[str, str]]:
    """The environment ``srun`` runs in: the kernel's, less the per-task GPU binding it would otherwise inherit for a
    CUDA launch (``plan.slurm_names.PER_TASK_GPU_VARIABLES``; None: the kernel's, unchanged).

    >>> plan = LaunchPlan("f", None, 2, "cuda", SlurmAllocation(1, 2, "7"), "no", None, False, "none")
    >>> sorted(srun_environment(plan, {"SLURM_JOB_ID": "7", "SLURM_GPUS_PER_TASK": "1"}))
    ['SLURM_JOB_ID']
    """
    if plan.device != "cuda":
        return None
    environ = dict(os.environ if environ is None else environ)
    for name in PER_TASK_GPU_VARIABLES:
        environ.pop(name, None)
    return environ


class SlurmBackend(RelayedBackend):
    """Every rank a task of one Slurm job step (see the module docstring); the attempts, their supervision and the
    root cause named with its node are ``relay.RelayedBackend``'s.

    Example::

        notebook_launcher(train, num_processes=4, num_nodes=2, cluster="slurm")   # inside an allocation
    """

    name = "slurm"

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(plan)
        self.site = site_of(plan)
        self.world: Optional[SlurmStep] = None   # the current step
        self.allocation: Optional[Allocation] = None
        self._job: Optional[str] = None   # the job the attempts' steps run in
        self._checked = False

    def open_rendezvous(self) -> NoKernelStore:  # type: ignore[override]
        """Refuse, in the caller's cell, what cannot run: Slurm's commands missing here, and outside an allocation
        a request the cluster could never grant (``allocation.check_request``)."""
        slurm = self.site
        if slurm.allocation is None:
            require_tools(TOOLS + ALLOCATION_TOOLS)
            check_request(slurm.request_options, slurm.num_nodes)
        else:
            require_tools(TOOLS)
        self._checked = True
        return super().open_rendezvous()

    def allocate(self, stopped: Callable[[], bool], tick: Callable[[], None],
                 notice: Callable[[str], None], session: bool = False) -> Optional[str]:
        """The job the step runs in: the kernel's, else one asked for now and waited for (None: stopped first)."""
        slurm = self.site
        if slurm.allocation is not None:
            return slurm.allocation
        name = allocation_name(job_name(self.plan, session))  # unique: release may cancel it by name
        self.allocation = Allocation(salloc_command(slurm.request_options, slurm.num_nodes, slurm.ranks_per_node,
                                                    name, gpus=self.plan.device == "cuda"))
        # the same words for a launch and a session, with what only a launch has (its Stop button, its timeout)
        how_to_stop = "interrupting the kernel (Ctrl-C) ends the wait" + ("" if session else ", as do Stop and the timeout")
        granted = self.allocation.wait(stopped, tick, notice, how_to_stop=how_to_stop)
        return self.allocation.job_id if granted else None

    def release(self) -> None:
        """Give back the job asked for, if any."""
        allocation, self.allocation = self.allocation, None
        if allocation is not None:
            allocation.release()

    def _before_attempts(self, sink: LaunchSink, policy: StopPolicy) -> Optional[Outcome]:
        """The job every attempt's step runs in (with ``max_restarts``, each attempt is a new step of it)."""
        if not self._checked:
            self.open_rendezvous()
        self._job = self.allocate(lambda: policy.reason() is not None, sink.tick,
                                  lambda text: sink.deliver(SessionNotice(rank=-1, text=text)))
        if self._job is None:  # stopped or timed out while the job pended: say so, not "ranks still running: none"
            return Outcome(policy.reason() or Status.STOPPED,
                           waiting=self.allocation.never_started() if self.allocation is not None else None)
        return None

    def start_step(self, job: Optional[str], session: bool = False) -> SlurmStep:
        """``srun`` of the launch's (or the session's) tasks in ``job``."""
        self.world = SlurmStep(srun_command(self.plan, job, session=session), self.plan.world_size,
                               env=srun_environment(self.plan))
        return self.world

    def _start_world(self, attempt: int, sink: LaunchSink, policy: StopPolicy) -> Optional[List[RankProcess]]:
        """One attempt: a step of the job with every rank, running the launch."""
        step = self.start_step(self._job)
        try:
            ready = step.wait_ready(lambda: policy.reason() is not None, sink.tick)
        except RuntimeError as error:
            raise LaunchError(f"the Slurm job step did not start: {error}") from None
        if not ready:
            return None
        handles = step.attach()
        step.send(("run", self.setup(step, attempt=attempt)))
        return list(handles)

    def setup(self, step: SlurmStep, attempt: int = 0, **more: Any) -> Dict[str, Any]:
        """What every task needs to run (``relay.task_setup``), its ranks per node Slurm's."""
        return task_setup(self.plan, step, self.site.ranks_per_node, attempt, **more)

    def node_of(self, rank: int) -> str:
        hello = self.world.hellos.get(rank) if self.world is not None else None
        return hello.node if hello is not None else "?"

    def death_of(self, rank: int) -> Optional[str]:
        ended = self.world.ended.get(rank) if self.world is not None else None
        return ended or "it ended without a result"

    def ran_on(self, rank: int, node: str) -> str:
        return f"rank {rank} ran on node {node}, Slurm step {self.world.step_id if self.world is not None else '?'}"

    def _close(self) -> None:
        super()._close()
        self.release()   # the job asked for is given back, whatever happened
