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
from .cluster import check_cluster_options, cluster_device
from .nodes import NodeOptions, check_node_options
from .options import NODE_OPTION_NAMES, LaunchOptions, check_precision_for_device
from .sharding import check_sharding_for_device, sharding_environment
from .sites import InKernel, LocalProcesses, RayCluster, SeveralNodes, Site, SlurmAllocation, StartsProcesses, XlaHost
from .slurm import check_slurm_option, slurm_allocation, slurm_device

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
    ``allow_inline``: one rank may run in the kernel itself (not for a launch in the background, nor a session)."""
    num_processes = options.num_processes
    device, mixed_precision, start_method = options.device, options.mixed_precision, options.start_method
    master_addr, use_port, timeout = options.master_addr, options.use_port, options.timeout
    return_all, display, compile_cache = options.return_all, options.display, options.compile_cache
    post_mortem = wants_post_mortem(options.pdb)
    if rank_channel() is not None:
        raise RuntimeError("notebook_launcher was called inside a launched rank; launches cannot be nested")
    check_call(function, args, kwargs)
    settings = options.as_dict()
    check_slurm_option(settings)
    if options.cluster == "slurm":
        return _plan_on_slurm(function, args, kwargs, options, slurm_allocation(settings), post_mortem)
    cluster = check_cluster_options(settings)
    if cluster is not None:
        return _plan_on_cluster(function, args, kwargs, options, cluster, post_mortem)
    nodes = check_node_options(**{name: settings[name] for name in NODE_OPTION_NAMES})
    sharding_env = sharding_environment(options.fsdp_config, options.deepspeed_config)

    device = device or environment.best_device()
    check_sharding_for_device(options.fsdp_config, options.deepspeed_config, device)
    if compile_cache is not None and device != "xla":
        raise LaunchConfigError(f"compile_cache is torch_xla's persistent compilation cache: it needs "
                                f"device='xla', not {device!r}")
    available = _check_device(device)
    world_size = _resolve_world_size(num_processes, device, available)
    check_precision_for_device(mixed_precision, device)
    # One rank runs in the kernel itself (no process to start) unless a start method was asked for, or the
    # launch runs in a background thread, where an in-kernel run could not be stopped.
    inline = (allow_inline and nodes is None and world_size == 1 and start_method == StartMethod.AUTO
              and threading.current_thread() is threading.main_thread())
    if device == "xla" and nodes is not None:
        raise LaunchConfigError("several nodes and max_restarts are not supported on TPU (device='xla') yet")
    site = _site_here(device, nodes, inline, start_method, master_addr, use_port, compile_cache)

    payload = Payload(function, args, kwargs or {})
    if isinstance(site, StartsProcesses) and site.start_method in ("forkserver", "spawn"):
        payload.pickled()  # now, so that what cannot be pickled is named before any process starts
    return LaunchPlan(
        function_name=getattr(function, "__qualname__", type(function).__name__),
        payload=payload,
        world_size=world_size, device=device, site=site, mixed_precision=mixed_precision,
        timeout=None if timeout is None else float(timeout),
        return_all=return_all, display=display,
        sharding_env=sharding_env, post_mortem=post_mortem,
    )


def _site_here(device: str, nodes: Optional[NodeOptions], inline: bool, start_method: str, master_addr: str,
               use_port: Optional[int], compile_cache: Any) -> Site:
    """Where the ranks run when they run on this machine (or this node's share of several)."""
    if device == "xla":
        # XLA ranks always start in a host process: using an XLA device in the kernel would initialize the
        # runtime there, after which torch_xla can start no TPU process at all (pytorch/xla#7765).
        return XlaHost(start_method=_resolve_xla_start_method(start_method), master_addr=master_addr,
                       use_port=use_port, compile_cache=None if compile_cache is None
                       else os.path.abspath(os.path.expanduser(compile_cache)))
    if nodes is not None:
        return SeveralNodes(start_method=_resolve_start_method(start_method), nodes=nodes)
    if inline:
        return InKernel(master_addr=master_addr, use_port=use_port)
    return LocalProcesses(start_method=_resolve_start_method(start_method), master_addr=master_addr,
                          use_port=use_port)


def wants_post_mortem(pdb: Optional[bool]) -> bool:
    """Whether a failing rank opens pdb: ``pdb`` when given, else IPython's ``%pdb`` switch (off outside IPython).

    >>> wants_post_mortem(True), wants_post_mortem(False)
    (True, False)
    """
    if pdb is not None:
        return bool(pdb)
    return bool(getattr(environment.ipython_shell(), "call_pdb", False))


def _plan_on_cluster(function: Callable, args: Any, kwargs: Any, options: LaunchOptions,
                     cluster: RayCluster, post_mortem: bool) -> LaunchPlan:
    """A launch whose ranks are a cluster's actors (``backends.ray``): nothing of this machine's devices is asked;
    the function is pickled now (``PortablePayload``: what cannot be pickled is named before anything connects)."""
    device = cluster_device(options.device, options.resources_per_rank)
    check_sharding_for_device(options.fsdp_config, options.deepspeed_config, device)
    check_precision_for_device(options.mixed_precision, device)
    num_processes = options.num_processes
    if num_processes is None and device != "cpu":
        raise LaunchConfigError(f"cluster={options.cluster!r} with device={device!r}: give num_processes, the number "
                                f"of ranks in all (each reserves resources_per_rank={cluster.resources_per_rank!r})")
    payload = Payload(function, args, kwargs or {})
    payload.portable()
    return LaunchPlan(
        function_name=getattr(function, "__qualname__", type(function).__name__), payload=payload,
        world_size=int(num_processes or 1), device=device, site=cluster,
        mixed_precision=options.mixed_precision,
        timeout=None if options.timeout is None else float(options.timeout), return_all=options.return_all,
        display=options.display, sharding_env=sharding_environment(options.fsdp_config, options.deepspeed_config),
        post_mortem=post_mortem)


def _plan_on_slurm(function: Callable, args: Any, kwargs: Any, options: LaunchOptions, site: SlurmAllocation,
                   post_mortem: bool) -> LaunchPlan:
    """A launch whose ranks are the tasks of a Slurm job step (``backends.slurm``); the function is pickled now."""
    device, _ = slurm_device(options.as_dict())
    check_sharding_for_device(options.fsdp_config, options.deepspeed_config, device)
    check_precision_for_device(options.mixed_precision, device)
    payload = Payload(function, args, kwargs or {})
    payload.portable()
    return LaunchPlan(
        function_name=getattr(function, "__qualname__", type(function).__name__), payload=payload,
        world_size=site.world_size, device=device, site=site, mixed_precision=options.mixed_precision,
        timeout=None if options.timeout is None else float(options.timeout), return_all=options.return_all,
        display=options.display, sharding_env=sharding_environment(options.fsdp_config, options.deepspeed_config),
        post_mortem=post_mortem)


def check_call(function: Any, args: Any, kwargs: Any) -> None:
    """What a launch or a session's run is given to call: a callable, a tuple of arguments, a dict of keywords."""
    if not callable(function):
        raise LaunchConfigTypeError(f"function must be callable, got {type(function).__name__}: {function!r}")
    if not isinstance(args, tuple):
        raise LaunchConfigTypeError(f"args must be a tuple, got {type(args).__name__}; for one argument write "
                                    f"args=(x,)")
    if kwargs is not None and (not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs)):
        raise LaunchConfigTypeError(f"kwargs must be a dict of str keys or None, got {type(kwargs).__name__}")


def _check_device(device: str) -> int:
    """How many ranks ``device`` can host, or a clear error when it is not here."""
    if device == "xla":
        return _check_xla()
    info = environment.describe(device)
    if info.count < 1:
        here = environment.available_devices()
        raise LaunchConfigError(
            f"device={device!r} was asked for, but none is available here: {environment.why_absent(device)}. "
            f"This machine has {', '.join(found.description for found in here)}: pass device={here[0].kind!r}, "
            f"or leave device out for the best one here")
    return info.count


def _check_xla() -> int:
    """XLA devices a TPU launch can use, or a clear error: torch_xla missing, no TPU, runtime already up."""
    if not environment.torch_xla_importable():
        raise LaunchConfigError(
            "device='xla' needs torch_xla, which is not installed. On Colab/Kaggle TPU runtimes it "
            "comes preinstalled; elsewhere see https://github.com/pytorch/xla#installation")
    if environment.tpu.runtime_initialized():
        raise LaunchConfigError(
            "the XLA runtime is already initialized in this notebook (an XLA device or tensor was used "
            "here), and torch_xla cannot start TPU processes after that (pytorch/xla#7765). Restart the "
            "runtime and launch before touching an XLA device in the notebook")
    info = environment.describe("xla")
    if info.count < 1:
        old_colab = " (COLAB_TPU_ADDR is set: Colab's retired TPU node runtime is not supported)" \
            if "COLAB_TPU_ADDR" in os.environ else ""
        raise LaunchConfigError(f"device='xla' was asked for, but no TPU is attached here{old_colab}; "
                                f"set PJRT_DEVICE=CPU to use torch_xla's CPU client")
    return info.count


def _resolve_world_size(num_processes: Any, device: str, available: int) -> int:
    if num_processes is None:
        return 1 if device == "cpu" else available
    if device == "xla" and num_processes not in (1, available):
        # xmp.spawn runs on one device (nprocs=1) or on all of them (nprocs=None), nothing in between.
        raise LaunchConfigError(
            f"num_processes={num_processes}: on XLA a launch runs on 1 device or on all {available} "
            f"(torch_xla's xmp.spawn allows nothing in between); use num_processes=None or 1")
    if device == "cpu":
        return _cpu_ranks(int(num_processes), available)
    if num_processes > available:  # a GPU or TPU core cannot be shared between ranks
        hint = " (for CPU ranks, pass device='cpu')" if device == "cuda" else ""
        raise LaunchConfigError(f"num_processes={num_processes} is more than the {available} {device} devices "
                                f"here{hint}")
    return int(num_processes)


CPU_RANKS_PER_CORE = 16  # past this, more CPU ranks than cores is a typo, not a test of distributed code


def _cpu_ranks(num_processes: int, cores: int) -> int:
    """CPU ranks may outnumber the cores, as with torchrun: trying 4 or 8 ranks on a 2-core runtime before
    paying for GPUs is what people do. They then share the cores with 1 torch thread each (``threads_per_rank``),
    and one line says so."""
    limit = max(64, CPU_RANKS_PER_CORE * cores)
    if num_processes > limit:
        raise LaunchConfigError(f"num_processes={num_processes} is more than the {limit} CPU ranks this machine's "
                                f"{cores} CPU cores can take ({CPU_RANKS_PER_CORE} per core)")
    if num_processes > cores:
        print(f"notebook_accel: {num_processes} CPU ranks share the {cores} CPU cores here (1 torch thread each)",
              file=sys.stderr)
    return num_processes


def _resolve_xla_start_method(start_method: str) -> str:
    """The XLA host is never a fork of the kernel: it forks the workers itself, and torch in a process forked
    twice from a kernel whose torch thread pools were started is broken (the autograd engine's threads abort
    with "Invalid thread pool", GNU OpenMP hangs in its first parallel region). A fork-server child (warm,
    torch preloaded but unused) or a spawned one forks cleanly."""
    if start_method == "fork":
        raise LaunchConfigError("start_method='fork' is not supported with device='xla': the TPU host process "
                                "forks the workers itself, and a fork of a fork of the kernel cannot use torch "
                                "safely. Use start_method='auto' (forkserver) or 'spawn'")
    return _resolve_start_method(StartMethod.FORKSERVER if start_method == StartMethod.AUTO else start_method)


def _resolve_start_method(start_method: str) -> str:
    """"auto": fork when safe (fastest), else a forkserver that keeps torch preloaded (warm after once)."""
    safe, reason = environment.fork_safety()
    available = multiprocessing.get_all_start_methods()
    if start_method == StartMethod.AUTO:
        if safe:
            return "fork"
        return "forkserver" if "forkserver" in available else "spawn"
    if start_method == "fork" and not safe:
        raise LaunchConfigError(f"start_method='fork' is not safe here: {reason}. "
                                f"Use start_method='auto' (forkserver) or 'spawn'")
    if start_method not in available:
        raise LaunchConfigError(f"start_method={start_method!r} is not available on this platform "
                                f"(available: {', '.join(available)})")
    return start_method
