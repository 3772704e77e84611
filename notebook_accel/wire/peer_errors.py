"""What a rank raises *because* a peer died or was stopped: gloo's "Connection closed by peer", NCCL aborts, an XLA
pool breaking. Both sides read it: the kernel never names such a failure the root cause when another exists
(``outcome.root_cause``), and a rank in post-mortem mode does not open pdb on one (``rank.run``): only the root
cause is debugged."""
from __future__ import annotations

import re

__all__ = ["COLLATERAL_ERRORS", "reacts_to_a_peer"]

COLLATERAL_ERRORS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(abort|timeout)|Socket Timeout|"
    r"Connection refused|DistNetworkError|DistBackendError|Read error|recvValue failed|"
    r"BrokenProcessPool|Exception in device=",
    re.IGNORECASE)


def reacts_to_a_peer(text: str) -> bool:
    """``text`` (an exception's type and message) says the rank failed because a peer died or was stopped.

    >>> reacts_to_a_peer("RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1454")
    True
    >>> reacts_to_a_peer("ValueError: bad batch")
    False
    """
    return bool(COLLATERAL_ERRORS.search(text))
