"""A launch on a cluster (``cluster="ray"``), checked before anything connects: what each rank reserves, how the
ranks are spread, and which of the local launch's options make no sense there.

What the cluster itself can offer (a GPU on a CPU cluster, more nodes than it has) is the backend's to check once
it is connected (``backends.ray``), still before any rank starts.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import LaunchConfigError
from ..wire.choices import Device, Placement
from .options import defaults  # noqa: F401 -- the doctests use it
from .planner import SESSION_NODES_ONLY_ON_SLURM, Devices, Placed, Planner
from .sites import RayCluster


class RayPlanner(Planner):
    """Every rank a Ray actor (``plan.planners``' row for ``cluster="ray"``).

    >>> planner = RayPlanner()
    >>> options = {**defaults(), "cluster": "ray", "device": "cuda", "num_processes": 2}
    >>> planner.place(options, planner.devices(options), True).site.resources_per_rank
    {'CPU': 1.0, 'GPU': 1.0}
    """

    cluster = "ray"
    own = ("resources_per_rank", "placement")
    own_means = "places ranks on a cluster"
    # Options of a launch on this machine, or over nodes started by hand, that a cluster's placement replaces.
    refuses = ("master_addr", "use_port", "compile_cache", "num_nodes", "node_rank", "rdzv_backend", "rdzv_endpoint",
               "rdzv_id", "rdzv_conf")
    placed_by = "Ray places the ranks and they meet at rank 0's node"
    rank_is = "a Ray actor (a process Ray starts)"
    session_refuses = (SESSION_NODES_ONLY_ON_SLURM,)
    detaches = True   # a detached driver actor runs the launch inside the cluster (``backends.ray.detached``)

    def devices(self, options: Mapping[str, Any]) -> Devices:
        """The one given, else CUDA when each rank reserves a GPU, else the CPU (the kernel's own machine says nothing
        about the cluster's)."""
        device, resources = options["device"], options["resources_per_rank"]
        if device is not None:
            if device not in (Device.CPU, Device.CUDA):
                raise LaunchConfigError(f"device={device!r} is not supported with cluster='ray' (cpu or cuda)")
            return Devices(str(device), None)
        return Devices(Device.CUDA.value if (resources or {}).get("GPU") else Device.CPU.value, None)

    def place(self, options: Mapping[str, Any], devices: Devices, allow_inline: bool) -> Placed:
        """What each rank reserves and how the ranks are spread; the world is ``num_processes`` (1 on CPU)."""
        device, given = devices.kind, options["resources_per_rank"]
        resources = {name: float(amount) for name, amount in (given or {}).items()}
        if given is None:
            resources = {"CPU": 1.0, "GPU": 1.0} if device == Device.CUDA else {"CPU": 1.0}
        if device == Device.CUDA and not resources.get("GPU"):
            raise LaunchConfigError(f"device='cuda' with cluster='ray' needs a GPU per rank: "
                                    f"resources_per_rank={dict(given)!r} reserves none; add \"GPU\": 1")
        if not any(amount > 0 for amount in resources.values()):
            raise LaunchConfigError(f"resources_per_rank={dict(resources)!r} reserves nothing: Ray needs at least "
                                    f"one resource per rank to place it, e.g. {{\"CPU\": 1}}")
        num_processes = options["num_processes"]
        if num_processes is None and device != "cpu":
            raise LaunchConfigError(f"cluster='ray' with device={device!r}: give num_processes, the number of ranks "
                                    f"in all (each reserves resources_per_rank={resources!r})")
        site = RayCluster(resources_per_rank=resources, placement=options["placement"] or Placement.PACK.value,
                          max_restarts=int(options["max_restarts"]))
        return Placed(site, int(num_processes or 1))
