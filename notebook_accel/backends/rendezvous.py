"""The launch's TCPStore, hosted by the kernel for the ranks (as torch elastic's agent does).

Binding port 0 lets the OS pick a free port that the launcher then *holds* for the whole launch: there is
no pick-then-release race, and two notebooks launching at once never collide. The ranks get
``TORCHELASTIC_USE_AGENT_STORE=True``, so ``init_process_group`` with ``env://`` connects to this store as a
client instead of rank 0 trying to bind the port itself.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Dict, Optional

from ..errors import LaunchConfigError


class HostedStore:
    """A TCPStore server on ``addr``; ``port`` is the bound port. Close it when the launch ends."""

    def __init__(self, addr: str, port: Optional[int], world_size: int) -> None:
        from torch.distributed import TCPStore

        self.addr = addr
        try:
            self._store = TCPStore(addr, port or 0, world_size, is_master=True,
                                   timeout=timedelta(seconds=300), wait_for_workers=False)
        except Exception as err:  # DistNetworkError: address in use, cannot bind, bad address
            if port:
                raise LaunchConfigError(
                    f"use_port={port} cannot be used on {addr}: {err}. Pick another port, or pass "
                    f"use_port=None to let the launcher choose a free one."
                ) from err
            raise LaunchConfigError(f"cannot host the rendezvous store on {addr}: {err}") from err
        self.port = self._store.port

    def env(self) -> Dict[str, str]:
        return {
            "MASTER_ADDR": self.addr,
            "MASTER_PORT": str(self.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
        }

    def close(self) -> None:
        self._store = None
