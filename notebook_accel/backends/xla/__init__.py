"""TPU cores (``device="xla"``) through torch_xla's own launcher.

``backend`` (in the kernel) starts one host process per machine and supervises it with the supervisor every
local backend uses (``backends.supervisor``); ``host`` (in that process) calls ``xmp.spawn``, which forks a worker
per TPU chip and runs a thread per device; ``device`` (in every device thread) puts the shared rank side around
the user's function.
"""
from .backend import XlaBackend

__all__ = ["XlaBackend"]
