"""Local ranks as processes: ``backend`` starts them (fork / forkserver / spawn), ``child`` sets each one up
inside its process, ``supervisor`` reads their pipes and sentinels in the kernel until all are gone."""
from .backend import ProcessBackend, RankProcess

__all__ = ["ProcessBackend", "RankProcess"]
