"""Several nodes, and restarts: ``membership`` (torch elastic's rendezvous), ``attempt`` (one attempt seen from
one node: failures, stops and liveness through the shared store), ``backend`` (attempts, restarts, the outcome)."""
from .backend import NodesBackend

__all__ = ["NodesBackend"]
