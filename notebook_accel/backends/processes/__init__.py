"""Local ranks as processes: ``backend`` starts them (fork / forkserver / spawn) and hands them to the supervisor
(``backends.supervisor``); ``starting`` makes each child run the kernel's copy of the package."""
from .backend import ProcessBackend

__all__ = ["ProcessBackend"]
