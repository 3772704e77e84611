"""Checking the launcher's options and turning them into a ``LaunchPlan`` — before any process starts."""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..errors import LaunchConfigError, LaunchConfigTypeError
from ..wire.channel import rank_channel
from ..wire.choices import MixedPrecision, StartMethod
from ..wire.events import LaunchStarted
from ..wire.payload import Payload
from . import devices as environment
from .options import LaunchOptions, check_precision_for_device
from .planners import checked_planner
from .sharding import check_sharding_for_device, sharding_environment
from .sites import Site, StartsProcesses

MIXED_PRECISIONS = MixedPrecision.values()  # kept for callers of the old names
START_METHODS = StartMethod.values()


@dataclass
class LaunchPlan:
    """A validated launch: what runs where, how ranks start, and what comes back."""

    function_name: str
    payload: Payload
    world_size: int
    device: str
    site: Site                   # where the ranks run, with that way's own options (``plan.sites``); its type
                                 # picks the backend (``backends.BACKENDS``)
    mixed_precision: str
    timeout: Optional[float]
    return_all: bool
    display: str
    # FSDP / DeepSpeed defaults as the variables HF accelerate's launcher sets (``plan.sharding``)
    sharding_env: Dict[str, str] = field(default_factory=dict)
    # The kernel as it is when the launch is called: every rank starts from it, whatever its start method. Never in
    # the plan's repr: the kernel's environment holds the user's secrets (HF_TOKEN, cloud keys), and a plan is
    # printed in tracebacks, logs and bug reports.
    kernel_env: Dict[str, str] = field(default_factory=lambda: dict(os.environ), repr=False)
    kernel_cwd: str = field(default_factory=os.getcwd)
    kernel_sys_path: List[str] = field(default_factory=lambda: list(sys.path))
    # One node's share of a multi-node world, set by the nodes backend once the rendezvous placed it:
    # ``world_size`` is then this node's count, and global rank = ``rank_offset`` + local rank.
    rank_offset: int = 0
    global_world_size: Optional[int] = None
    group_rank: int = 0
    post_mortem: bool = False  # a rank that raises opens pdb in the failing frame first (``pdb``, ``%pdb on``)

    @property
    def backend(self) -> str:
        """The name of the backend that runs the plan (the site's: "inline", "processes", "xla", "nodes", "ray",
        "slurm")."""
        return self.site.name

    @property
    def start_method(self) -> Optional[str]:
        """"fork" | "forkserver" | "spawn" where we start the ranks' processes; None in the kernel or on a cluster."""
        return self.site.start_method if isinstance(self.site, StartsProcesses) else None

    def started_event(self, **where: Any) -> LaunchStarted:
        """The first event of a launch; ``where`` adds a node's place (num_nodes, node_rank, ranks, world_size)."""
        fields = dict(rank=-1, world_size=self.world_size, device=self.device,
                      start_method=self.start_method or self.backend, mixed_precision=self.mixed_precision,
                      function_name=self.function_name)
        fields.update(where)
        return LaunchStarted(**fields)

    def global_rank(self, local_rank: int) -> int:
        return self.rank_offset + local_rank

    def sends_result(self, local_rank: int) -> bool:
        """Rank 0 (the node's lowest rank on other nodes) sends its return value; every rank with return_all."""
        return self.return_all or local_rank == 0

    def rank_env(self, rank: int, rendezvous_env: Dict[str, str]) -> Dict[str, str]:
        """The environment of local rank ``rank``: what torchrun sets, plus the precision HF accelerate reads."""
        world = self.global_world_size or self.world_size
        env = {
            "RANK": str(self.global_rank(rank)),
            "LOCAL_RANK": str(rank),
            "GROUP_RANK": str(self.group_rank),
            "ROLE_RANK": str(self.global_rank(rank)),
            "WORLD_SIZE": str(world),
            "ROLE_WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(self.world_size),
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision,
            "NOTEBOOK_ACCEL_DEVICE": self.device,
            "NOTEBOOK_ACCEL_MIXED_PRECISION": self.mixed_precision,
        }
        if self.device == "cpu":
            env["ACCELERATE_USE_CPU"] = "true"
        env.update(self.sharding_env)
        env["OMP_NUM_THREADS"] = str(self.threads_per_rank())
        env.update(rendezvous_env)
        return env

    def threads_per_rank(self) -> int:
        """torch's intra-op threads in each rank (a process rank also calls ``torch.set_num_threads`` with it).

        A forked rank always gets 1: GNU OpenMP's thread pool does not survive fork, so once the kernel
        ran one multi-threaded op, a forked rank using more than one thread hangs in its first one
        (torchrun's default for several ranks is 1 as well). Ranks started by the fork server or spawn
        have a fresh pool: they get the user's ``OMP_NUM_THREADS`` if set, else on CPU a share of the cores.
        """
        if self.start_method == "fork":
            return 1
        reserved = self.site.cpus_per_rank
        if reserved is not None:  # what a cluster reserved for the rank, as Ray itself sets OMP_NUM_THREADS
            return max(1, int(reserved))
        explicit = os.environ.get("OMP_NUM_THREADS", "")
        if explicit.isdigit() and int(explicit) > 0:
            return int(explicit)
        sharing = self.device in ("cpu", "xla")  # XLA workers' torch does the host-side (input) work
        return max(1, environment.cpu_count() // self.world_size) if sharing else 1


def plan_launch(function: Callable, args: Any = (), kwargs: Any = None, num_processes: Any = None, *,
                allow_inline: bool = True, **options: Any) -> LaunchPlan:
    """``make_plan`` from keywords, as a script or the CLI has them: each checked against ``plan.options`` first.

    >>> plan_launch(print, num_processes=1, device="cpu", start_method="spawn").backend  # doctest: +SKIP
    'processes'
    """
    return make_plan(function, args, kwargs, LaunchOptions.checked(num_processes=num_processes, **options),
                     allow_inline=allow_inline)


def make_plan(function: Callable, args: Any, kwargs: Any, options: LaunchOptions, *,
              allow_inline: bool = True) -> LaunchPlan:
    """Check what depends on this machine and on several options together (each option's type, range and choices
    were checked once, where ``options`` was made), decide where the ranks run (``plan.sites``), and serialize the
    function; raise a clear ``LaunchConfigError`` on the first problem, before any process starts.
    ``allow_inline``: one rank may run in the kernel itself (not for a launch in the background, nor a session).

    What every launch shares is checked here, once; where the ranks go is the planner's of ``options.cluster``
    (``plan.planners``): it refuses what does not apply there, finds the device (asked once) and places the ranks."""
    if rank_channel() is not None:
        raise RuntimeError("notebook_launcher was called inside a launched rank; launches cannot be nested")
    check_call(function, args, kwargs)
    settings = options.as_dict()
    planner = checked_planner(settings)
    sharding_env = sharding_environment(options.fsdp_config, options.deepspeed_config)
    devices = planner.devices(settings)
    check_sharding_for_device(options.fsdp_config, options.deepspeed_config, devices.kind)
    placed = planner.place(settings, devices, allow_inline)
    check_precision_for_device(options.mixed_precision, devices.kind)
    payload = Payload(function, args, kwargs or {})
    planner.ready(payload, placed.site)
    return LaunchPlan(
        function_name=getattr(function, "__qualname__", type(function).__name__), payload=payload,
        world_size=placed.world_size, device=devices.kind, site=placed.site, mixed_precision=options.mixed_precision,
        timeout=None if options.timeout is None else float(options.timeout), return_all=options.return_all,
        display=options.display, sharding_env=sharding_env, post_mortem=wants_post_mortem(options.pdb))


def wants_post_mortem(pdb: Optional[bool]) -> bool:
    """Whether a failing rank opens pdb: ``pdb`` when given, else IPython's ``%pdb`` switch (off outside IPython).

    >>> wants_post_mortem(True), wants_post_mortem(False)
    (True, False)
    """
    if pdb is not None:
        return bool(pdb)
    return bool(getattr(environment.ipython_shell(), "call_pdb", False))


def check_call(function: Any, args: Any, kwargs: Any) -> None:
    """What a launch or a session's run is given to call: a callable, a tuple of arguments, a dict of keywords."""
    if not callable(function):
        raise LaunchConfigTypeError(f"function must be callable, got {type(function).__name__}: {function!r}")
    if not isinstance(args, tuple):
        raise LaunchConfigTypeError(f"args must be a tuple, got {type(args).__name__}; for one argument write "
                                    f"args=(x,)")
    if kwargs is not None and (not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs)):
        raise LaunchConfigTypeError(f"kwargs must be a dict of str keys or None, got {type(kwargs).__name__}")


