"""A launch on a cluster (``cluster="ray"``), checked before anything connects: what each rank reserves, how the
ranks are spread, and which of the local launch's options make no sense there.

What the cluster itself can offer (a GPU on a CPU cluster, more nodes than it has) is the backend's to check once
it is connected (``backends.ray``), still before any rank starts.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..errors import LaunchConfigError
from ..wire.choices import Device, Placement, StartMethod
from .options import OPTIONS, defaults  # noqa: F401 -- defaults: the doctests use it
from .sites import RayCluster

# Options of a launch on this machine, or over nodes started by hand, that a cluster's placement replaces.
_LOCAL_ONLY = ("master_addr", "use_port", "compile_cache", "num_nodes", "node_rank", "rdzv_backend",
               "rdzv_endpoint", "rdzv_id", "rdzv_conf")
# Which cluster option needs ``cluster`` set.
CLUSTER_OPTIONS = ("resources_per_rank", "placement")


def check_cluster_options(options: Mapping[str, Any]) -> Optional[RayCluster]:
    """The site of a launch on a cluster (``plan.sites.RayCluster``) when ``options["cluster"]`` is set, else
    ``None``; a clear ``LaunchConfigError`` for an option that contradicts it (or a cluster option without it).
    ``options``: every launch setting, resolved. The one place where ``cluster="ray"`` becomes Ray.

    >>> check_cluster_options({**defaults(), "cluster": "ray", "device": "cuda"}).resources_per_rank
    {'CPU': 1.0, 'GPU': 1.0}
    >>> check_cluster_options({**defaults(), "placement": "SPREAD"})
    Traceback (most recent call last):
    ...
    notebook_accel.errors.LaunchConfigError: placement='SPREAD' places ranks on a cluster: give cluster='ray' too
    """
    if options["cluster"] is None:
        for name in CLUSTER_OPTIONS:
            if options[name] is not None:
                raise LaunchConfigError(f"{name}={options[name]!r} places ranks on a cluster: give cluster='ray' too")
        return None
    cluster = options["cluster"]
    for name in _LOCAL_ONLY:
        if options[name] != OPTIONS[name].default:
            raise LaunchConfigError(f"{name}={options[name]!r} does not apply with cluster={cluster!r}: Ray places "
                                    f"the ranks and they meet at rank 0's node")
    if options["start_method"] != StartMethod.AUTO:
        raise LaunchConfigError(f"start_method={options['start_method']!r} does not apply with cluster={cluster!r}: "
                                f"every rank is a Ray actor (a process Ray starts)")
    device = cluster_device(options["device"], options["resources_per_rank"])
    resources = {name: float(amount) for name, amount in (options["resources_per_rank"] or {}).items()}
    if options["resources_per_rank"] is None:
        resources = {"CPU": 1.0, "GPU": 1.0} if device == Device.CUDA else {"CPU": 1.0}
    if device == Device.CUDA and not resources.get("GPU"):
        raise LaunchConfigError(f"device='cuda' with cluster={cluster!r} needs a GPU per rank: "
                                f"resources_per_rank={dict(options['resources_per_rank'])!r} reserves none; "
                                f"add \"GPU\": 1")
    if not any(amount > 0 for amount in resources.values()):
        raise LaunchConfigError(f"resources_per_rank={dict(resources)!r} reserves nothing: Ray needs at least one "
                                f"resource per rank to place it, e.g. {{\"CPU\": 1}}")
    return RayCluster(resources_per_rank=resources, placement=options["placement"] or Placement.PACK.value,
                      max_restarts=int(options["max_restarts"]))


def cluster_device(device: Optional[str], resources_per_rank: Optional[Mapping[str, float]]) -> str:
    """The ranks' device on a cluster: the one given, else CUDA when each rank reserves a GPU, else the CPU (the
    kernel's own machine says nothing about the cluster's)."""
    if device is not None:
        if device not in (Device.CPU, Device.CUDA):
            raise LaunchConfigError(f"device={device!r} is not supported with cluster='ray' (cpu or cuda)")
        return device
    return Device.CUDA.value if (resources_per_rank or {}).get("GPU") else Device.CPU.value

