"""Ranks on a Ray cluster (``cluster="ray"``): placed by Ray as actors, supervised with our events and rules.

Only this package imports Ray, and only when a launch or session asks for ``cluster="ray"``.

| module          | what it does                                                                        |
|-----------------|-------------------------------------------------------------------------------------|
| ``connection``  | import Ray (or say how to install it), connect as the kernel set it up              |
| ``placement``   | the placement group: checked against the nodes, waited for, each rank's node        |
| ``remote_rank`` | ``rank.actor.RankActor`` with its control methods in Ray concurrency groups          |
| ``actors``      | that class as a Ray actor, its resources, calls to its control thread               |
| ``world``       | one attempt's actors, torchrun's environment, kill                                  |
| ``relay``       | each rank's events polled through Ray into the pipes the ``Supervisor`` reads       |
| ``backend``     | ``RayBackend``: connect, object store, attempts (``max_restarts``), deaths named    |
| ``session``     | ``SessionRayActors``: a warm ``Session``'s ranks as actors                          |
| ``detached``    | ``detach=True``: a detached driver actor runs the launch; ``RayJobSource`` reads it   |
"""
from .backend import RayBackend

__all__ = ["RayBackend"]
