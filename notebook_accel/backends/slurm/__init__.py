"""Ranks on Slurm (``cluster="slurm"``): one job step (``srun``) of the kernel's allocation or of one asked for.

| module        | what it does                                                                          |
|---------------|---------------------------------------------------------------------------------------|
| ``tools``     | Slurm's commands: found (or a clear error naming what is missing), run                |
| ``allocation``| outside an allocation: the request checked, ``salloc`` (held while the kernel lives), waited for, given back |
| ``step``      | ``srun`` with one task per rank (``rank.slurm_task``), its stdio relayed into pipes   |
| ``backend``   | ``SlurmBackend``: the step, the rendezvous at rank 0's node, supervision, cancel      |
"""
from .backend import SlurmBackend

__all__ = ["SlurmBackend"]
