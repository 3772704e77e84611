"""A way of placing ranks, as ``plan.planners``' table has one per value of ``cluster``: the ``Planner`` base and
what a planner answers (``Devices``, ``Placed``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional, Tuple

from ..errors import LaunchConfigError
from ..wire.choices import StartMethod
from ..wire.payload import Payload
from .options import OPTIONS
from .sites import Site


@dataclass(frozen=True)
class Devices:
    """What a planner found the ranks will use: ``kind`` ("cpu", "cuda", "xla", "mps") and, where known, how many a
    node has (``per_node``: the default world size's unit; None where only the cluster knows)."""

    kind: str
    per_node: Optional[int]


@dataclass(frozen=True)
class Placed:
    """Where a planner placed the ranks: the site and the world size."""

    site: Site
    world_size: int


class Planner:
    """One row of the table (see the module docstring). A subclass names its ``cluster`` value and says:

    - ``own``: the options only it takes (given without its ``cluster``, they are refused, naming it) and
      ``own_means``, what they do, for that message;
    - ``refuses``: the options that do not apply there (refused unless left at their default), ``placed_by`` why,
      and ``rank_is``, what a rank is there (set: a start method is refused too, as nothing is started here);
    - ``session_refuses``: the options a ``Session`` may not take there (unless left at their default), each with
      why;
    - ``devices``: the ranks' device, asked once per plan; ``place``: the site and the world size.
    """

    cluster: ClassVar[Optional[str]] = None
    own: ClassVar[Tuple[str, ...]] = ()
    own_means: ClassVar[str] = ""
    refuses: ClassVar[Tuple[str, ...]] = ()
    placed_by: ClassVar[str] = ""
    rank_is: ClassVar[Optional[str]] = None
    session_refuses: ClassVar[Tuple[Tuple[str, str], ...]] = ()
    detaches: ClassVar[bool] = False   # runs ``detach=True`` launches (a job that outlives the kernel)

    def check(self, options: Mapping[str, Any]) -> None:
        """Refuse what does not apply with this row's ``cluster`` (``options``: every launch setting, resolved)."""
        for name in self.refuses:
            if options[name] != OPTIONS[name].default:
                raise LaunchConfigError(f"{name}={options[name]!r} does not apply with cluster={self.cluster!r}: "
                                        f"{self.placed_by}")
        if self.rank_is is not None and options["start_method"] != StartMethod.AUTO:
            raise LaunchConfigError(f"start_method={options['start_method']!r} does not apply with "
                                    f"cluster={self.cluster!r}: every rank is {self.rank_is}")
        if options.get("detach"):
            self.check_detach(options)

    def check_detach(self, options: Mapping[str, Any]) -> None:
        """Refuse ``detach=True`` where no job can outlive the kernel, and with what needs the kernel alive."""
        if not self.detaches:
            raise LaunchConfigError(f"detach=True is not supported {self.where(options)} yet: a detached launch runs as "
                                    f"a job of a cluster that keeps its events without the kernel (cluster='slurm' or 'ray')")
        if options.get("pdb"):
            raise LaunchConfigError("pdb=True cannot go with detach=True: a post-mortem prompt asks in the kernel, "
                                    "which a detached launch does not need or wait for")

    def where(self, options: Mapping[str, Any]) -> str:
        """Where this row runs the ranks, for messages."""
        return f"with cluster={self.cluster!r}"

    def check_session(self, options: Mapping[str, Any]) -> None:
        """Refuse the options a ``Session`` may not take with this row's ``cluster``."""
        for name, why in self.session_refuses:
            if options[name] != OPTIONS[name].default:
                raise LaunchConfigError(f"Session({name}={options[name]!r}): {why}")

    def devices(self, options: Mapping[str, Any]) -> Devices:  # pragma: no cover - every row says
        raise NotImplementedError

    def place(self, options: Mapping[str, Any], devices: Devices, allow_inline: bool) -> Placed:  # pragma: no cover
        raise NotImplementedError

    def ready(self, payload: Payload, site: Site) -> None:
        """Serialize what must be before any rank starts (what cannot be pickled is named now): a cluster's ranks
        run on other machines, so their function travels portably."""
        payload.portable()


# Why a session takes no num_nodes on this machine or Ray (the rows that say so).
SESSION_NODES_ONLY_ON_SLURM = ("num_nodes", "a session's ranks span several nodes only with cluster='slurm' (on Ray "
                               "the cluster places them; for torch elastic's nodes, notebook_launcher)")


