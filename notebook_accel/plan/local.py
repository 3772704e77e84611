"""Planning on this machine (``cluster=None``): the device found here, how many ranks it hosts, and whether they run
in the kernel, as local processes, in a TPU host, or as this node's share of several nodes (torch elastic).
``plan.planners``' first row."""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from typing import Any, Mapping, Optional

from ..errors import LaunchConfigError
from ..wire.choices import StartMethod
from ..wire.payload import Payload
from . import devices as environment
from .nodes import NodeOptions, check_node_options
from .options import NODE_OPTION_NAMES
from .planner import SESSION_NODES_ONLY_ON_SLURM, Devices, Placed, Planner
from .sites import InKernel, LocalProcesses, SeveralNodes, Site, StartsProcesses, XlaHost


class LocalPlanner(Planner):
    """The ranks run on this machine (see the module docstring)."""

    cluster = None
    session_refuses = (SESSION_NODES_ONLY_ON_SLURM,)

    def where(self, options: Mapping[str, Any]) -> str:
        """Where the ranks would run, for ``detach``'s refusal: on this machine, as torch elastic's nodes, on a TPU."""
        if options["device"] == "xla":
            return "on a TPU (device='xla')"
        if options["num_nodes"] != 1 or options["rdzv_endpoint"] is not None or options["max_restarts"]:
            return "for torch elastic's nodes (num_nodes, rdzv_*, max_restarts without cluster)"
        return "for ranks on this machine (cluster=None)"

    def devices(self, options: Mapping[str, Any]) -> Devices:
        """The device asked for, else the best one here (how many of it there are is ``place``'s to find: a sharding
        config that does not fit the device is refused first, before torch_xla is looked for)."""
        device = options["device"] or environment.best_device()
        if options["compile_cache"] is not None and device != "xla":
            raise LaunchConfigError(f"compile_cache is torch_xla's persistent compilation cache: it needs "
                                    f"device='xla', not {device!r}")
        return Devices(device, None)

    def place(self, options: Mapping[str, Any], devices: Devices, allow_inline: bool) -> Placed:
        nodes = check_node_options(**{name: options[name] for name in NODE_OPTION_NAMES})
        device, start_method = devices.kind, options["start_method"]
        world_size = _resolve_world_size(options["num_processes"], device, _check_device(device))
        # One rank runs in the kernel itself (no process to start) unless a start method was asked for, or the
        # launch runs in a background thread, where an in-kernel run could not be stopped.
        inline = (allow_inline and nodes is None and world_size == 1 and start_method == StartMethod.AUTO
                  and threading.current_thread() is threading.main_thread())
        if device == "xla" and nodes is not None:
            raise LaunchConfigError("several nodes and max_restarts are not supported on TPU (device='xla') yet")
        return Placed(_site_here(device, nodes, inline, start_method, options["master_addr"], options["use_port"],
                                 options["compile_cache"]), world_size)

    def ready(self, payload: Payload, site: Site) -> None:
        """Pickled now where the ranks do not fork from the kernel, so that what cannot be pickled is named before
        any process starts (a forked rank inherits the function as it is)."""
        if isinstance(site, StartsProcesses) and site.start_method in ("forkserver", "spawn"):
            payload.pickled()


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
