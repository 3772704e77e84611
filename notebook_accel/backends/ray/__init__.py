"""Ranks on a Ray cluster (``cluster="ray"``): placed by Ray as actors, supervised with our events and rules.

Only this package imports Ray, and only when a launch or session asks for ``cluster="ray"``.

| module          | what it does                                                                        |
|-----------------|-------------------------------------------------------------------------------------|
| ``connection``  | import Ray (or say how to install it), connect as the kernel set it up              |
| ``placement``   | the placement group: checked against the nodes, waited for, each rank's node        |
| ``world``       | one attempt's actors (``rank.actor.RankActor``), torchrun's environment, kill       |
| ``supervisor``  | poll every rank's control thread; root cause, stop, timeout, stacks, deaths         |
| ``backend``     | ``RayBackend``: connect, object store, attempts (``max_restarts``)                  |
"""
from .backend import RayBackend

__all__ = ["RayBackend"]
