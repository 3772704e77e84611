"""``accelerate.utils.tqdm``: a ``tqdm`` progress bar shown on the local main process only (by default)."""
from __future__ import annotations

from typing import Any

__all__ = ["tqdm"]


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every rank but each node's first with ``main_process_only``.
    (``notebook_accel.progress`` draws one row per rank on the launch's dashboard instead.)"""
    from tqdm.auto import tqdm as _tqdm

    from ..accelerator.partial_state import PartialState

    if args and isinstance(args[0], bool):
        raise ValueError("Passing `True` or `False` as the first argument to Accelerate's `tqdm` wrapper is "
                         "unsupported. Please use the `main_process_only` keyword argument instead.")  # fmt: skip
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = PartialState().local_process_index != 0
    return _tqdm(*args, **kwargs, disable=disable)
