"""Where a launch's ranks run: one typed value per way, made once by planning (``plan.plan``), carried by the plan.

| site               | the ranks are                                                   | its own options          |
|--------------------|-----------------------------------------------------------------|--------------------------|
| ``InKernel``       | the kernel process itself (one rank, nothing started)           | the store's address      |
| ``LocalProcesses`` | processes of this machine: fork, a warm fork server, or spawn   | start method, store      |
| ``XlaHost``        | TPU cores: threads of ``xmp.spawn`` workers in one host process | those, the compile cache |
| ``SeveralNodes``   | this node's processes of a multi-node (or restarting) world     | start method, nodes      |
| ``RayCluster``     | Ray actors on a cluster, in one placement group                 | resources, placement,    |
|                    |                                                                 | restarts                 |
| ``SlurmAllocation``| the tasks of one Slurm job step (``srun``), in the kernel's job | nodes, ranks per node,   |
|                    | or in one asked for                                             | the job, sbatch options, |
|                    |                                                                 | restarts                 |

Each site carries only its own options; what every launch has (world size, device, precision, timeout, display)
is the plan's. ``backends.BACKENDS`` maps each site's type to the backend that runs it, for launches and
sessions. A new way of running ranks is one more class here, made by ``plan.plan``, and one line there.

>>> LocalProcesses(start_method="fork", master_addr="127.0.0.1", use_port=None).name
'processes'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

from .nodes import NodeOptions


@dataclass(frozen=True)
class Site:
    """Where ranks run. ``name``: how the dashboard and ``Session``'s repr say it where no start method does
    ("inline", "ray"), and the backend's name in ``backends.BACKENDS``."""

    name: ClassVar[str]

    @property
    def cpus_per_rank(self) -> Optional[float]:
        """CPUs reserved for each rank where the site reserves them (a cluster's bundle); None on this machine."""
        return None


@dataclass(frozen=True)
class InKernel(Site):
    """One rank in the kernel process itself; the kernel hosts the store it meets at (``master_addr``:
    ``use_port``, a free port when None)."""

    name: ClassVar[str] = "inline"
    master_addr: str
    use_port: Optional[int]


@dataclass(frozen=True)
class StartsProcesses(Site):
    """A site whose ranks are processes we start on this machine, with ``start_method``: "fork" | "forkserver" |
    "spawn", resolved (never "auto")."""

    start_method: str


@dataclass(frozen=True)
class LocalProcesses(StartsProcesses):
    """One process per rank on this machine; the kernel hosts the store they meet at."""

    name: ClassVar[str] = "processes"
    master_addr: str
    use_port: Optional[int]


@dataclass(frozen=True)
class XlaHost(LocalProcesses):
    """Every TPU core a rank, all in one host process (``start_method`` starts it; never a fork: see
    ``plan.plan``); ``compile_cache``: the root of torch_xla's persistent compilation caches, or None."""

    name: ClassVar[str] = "xla"
    compile_cache: Optional[str] = None


@dataclass(frozen=True)
class SeveralNodes(StartsProcesses):
    """This node's share of a world over several nodes (or one node with restarts), found by torch elastic's
    rendezvous (``nodes``); its ranks are local processes."""

    name: ClassVar[str] = "nodes"
    nodes: NodeOptions


@dataclass(frozen=True)
class RayCluster(Site):
    """Every rank a Ray actor: one bundle of ``resources_per_rank`` each, placed by ``placement`` (a
    ``wire.choices.Placement``); ``max_restarts`` whole-world restarts, each placed anew."""

    name: ClassVar[str] = "ray"
    resources_per_rank: Dict[str, float]
    placement: str
    max_restarts: int = 0

    @property
    def cpus_per_rank(self) -> Optional[float]:
        return self.resources_per_rank.get("CPU", 1)


@dataclass(frozen=True)
class SlurmAllocation(Site):
    """Every rank a task of one Slurm job step (``srun``): ``num_nodes`` nodes with ``ranks_per_node`` tasks each, in
    ``allocation`` (the kernel's own job id: a batchspawner notebook, ``salloc``) or, when None, in a job asked for
    with ``request`` (salloc's long options without dashes, as (option, value) pairs; a value "" is a flag) and given
    back when the launch ends; ``max_restarts`` whole-world restarts, each a new step of the same job. Made by
    ``plan.slurm.slurm_allocation`` only."""

    name: ClassVar[str] = "slurm"
    num_nodes: int
    ranks_per_node: int
    allocation: Optional[str]
    request: Tuple[Tuple[str, str], ...] = ()
    max_restarts: int = 0

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def request_options(self) -> Dict[str, str]:
        """``request`` as a mapping, in the order given."""
        return dict(self.request)
