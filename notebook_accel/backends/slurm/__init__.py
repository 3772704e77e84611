"""Ranks on Slurm (``cluster="slurm"``): one job step (``srun``) of the kernel's allocation or of one asked for.

| module        | what it does                                                                          |
|---------------|---------------------------------------------------------------------------------------|
| ``tools``     | Slurm's commands: found (or a clear error naming what is missing), run                |
| ``allocation``| outside an allocation: the request checked, ``salloc`` (held while the kernel lives), waited for, given back |
| ``step``      | ``srun`` with one task per rank (``rank.slurm_task``), its stdio relayed into pipes   |
| ``backend``   | ``SlurmBackend``: the step, the rendezvous at rank 0's node, supervision, cancel      |
| ``array``     | a sweep from a login node: one job array (``sbatch --array``), followed, cancelled    |
| ``array_task``| the driver of one array task: the trial's launch as a step of the task's job          |
| ``trial_folder`` | a trial's plan, events and ending on the shared file system (the seam between them) |
"""
from .backend import SlurmBackend

__all__ = ["SlurmBackend"]
