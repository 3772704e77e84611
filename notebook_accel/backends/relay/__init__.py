"""Ranks that run on other machines, relayed: what Ray's and Slurm's backends (and the next cluster's) share.

The supervisor (``backends.supervisor``) watches ranks through local pipes, a process sentinel and signals; a rank
on another machine has none of these here, so a relay makes them, and these classes are the rest of such a backend.
A relayed backend fills in only what differs: how a world of ranks starts for an attempt, which node a rank is on,
how a death is told, and the command transport (``ray.relay.ActorRelay``: calls to each actor; ``stream.StreamRelay``:
a launcher's stdio, as ``srun``'s).

| module        | what it does                                                                                  |
|---------------|-----------------------------------------------------------------------------------------------|
| ``ranks``     | one rank's stand-ins: its pipes' write ends, its sentinel, the supervisor's handle, its answers |
| ``stream``    | ``StreamRelay``: ranks started by one launcher whose stdin and stdout carry every rank's frames |
| ``backend``   | ``RelayedBackend``: attempts, each a world supervised and ended; the root cause named with its node |
| ``warm``      | ``RelayedWarmRanks``: a ``Session``'s ranks there, their commands through the transport        |
"""
from .backend import RelayedBackend
from .ranks import NoKernelStore, RelayedAnswers, RelayedProcess, RelayedRank, RelayedRankProcess
from .stream import StreamRelay, TaskHello, task_setup
from .warm import RelayedCommandSender, RelayedWarmRanks

__all__ = ["NoKernelStore", "RelayedAnswers", "RelayedBackend", "RelayedCommandSender", "RelayedProcess",
           "RelayedRank", "RelayedRankProcess", "RelayedWarmRanks", "StreamRelay", "TaskHello", "task_setup"]
