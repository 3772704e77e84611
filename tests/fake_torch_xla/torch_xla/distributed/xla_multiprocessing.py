"""Fake ``torch_xla.distributed.xla_multiprocessing`` (see the package docstring)."""
from .._internal import pjrt


def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn"):
    return pjrt.spawn(fn, nprocs, start_method, args)
