"""Every allowed value of the launcher's options, once, as ``str`` Enums.

They live on the wire because they cross the process boundary: a rank reads its device and precision from
the environment the launch sets (``NOTEBOOK_ACCEL_DEVICE``, ``ACCELERATE_MIXED_PRECISION``) and events carry
them to the views. The launcher, the plan, the CLI, the config file, the panel and the Accelerator import
them from here. A member equals its value (``MixedPrecision.BF16 == "bf16"``), so plain strings keep working.

Each Enum has a ``Literal`` twin (``DeviceName``...) for the public signatures: editors complete its values and
type checkers check them; ``tests/test_entry_points.py`` ties each twin to its Enum.

>>> MixedPrecision.values()
('no', 'fp16', 'bf16')
>>> f"{Device.CPU}"
'cpu'
"""
from __future__ import annotations

import enum
from typing import Literal, Tuple


class Choice(str, enum.Enum):
    """A value that is also its string: compares, hashes, formats and pickles-by-name as one."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> Tuple[str, ...]:
        """The allowed strings, in declaration order (for messages, CLI choices, pickers)."""
        return tuple(member.value for member in cls)


class Device(Choice):
    """What the ranks run on."""

    CUDA = "cuda"
    CPU = "cpu"
    XLA = "xla"
    MPS = "mps"


class MixedPrecision(Choice):
    """The precision ranks compute in (exported as ``ACCELERATE_MIXED_PRECISION``)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"


class StartMethod(Choice):
    """How rank processes start: ``auto`` is fork when safe, else a warm fork server."""

    AUTO = "auto"
    FORK = "fork"
    FORKSERVER = "forkserver"
    SPAWN = "spawn"


class Display(Choice):
    """What the cell shows: ``auto`` is the dashboard in a notebook, text elsewhere."""

    AUTO = "auto"
    WIDGETS = "widgets"
    TEXT = "text"
    NONE = "none"


class RendezvousBackend(Choice):
    """torch elastic's rendezvous backends we offer by name (a registered plugin's name works too)."""

    STATIC = "static"
    C10D = "c10d"
    ETCD = "etcd"
    ETCD_V2 = "etcd-v2"


class Cluster(Choice):
    """Where the ranks run when not on this machine: ``ray``, a Ray cluster's actors; ``slurm``, a job step of a
    Slurm allocation (the kernel's own, or one asked for)."""

    RAY = "ray"
    SLURM = "slurm"


class Placement(Choice):
    """How a cluster's ranks are spread over its nodes: Ray's placement group strategies (one bundle per rank)."""

    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


# The allowed values as types, for signatures (the same strings as the Enums above: a test compares them).
DeviceName = Literal["cuda", "cpu", "xla", "mps"]
MixedPrecisionName = Literal["no", "fp16", "bf16"]
StartMethodName = Literal["auto", "fork", "forkserver", "spawn"]
DisplayName = Literal["auto", "widgets", "text", "none"]
RendezvousBackendName = Literal["static", "c10d", "etcd", "etcd-v2"]
ClusterName = Literal["ray", "slurm"]
PlacementName = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
