"""``accelerate.utils.random``'s names: ``set_seed`` (HF's parameters) and ``synchronize_rng_states``."""
from __future__ import annotations

from typing import Any, List, Optional, Union

import torch

from ..accelerator import operations, rng

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python's ``random``, numpy and torch. ``device_specific=True`` adds this rank's index to the seed;
    ``deterministic=True`` also makes torch use deterministic algorithms (``torch.use_deterministic_algorithms``).

    Example::

        set_seed(42)
    """
    from ..accelerator.partial_state import PartialState

    process_index = PartialState().process_index if device_specific else 0
    rng.set_seed(seed, device_specific=device_specific, process_index=process_index)
    if deterministic:
        torch.use_deterministic_algorithms(True)


# rng type -> (get the state, set the state); "generator" works on the generator given
_STATES = {
    "torch": (torch.get_rng_state, torch.set_rng_state),
    "cuda": (lambda: torch.cuda.get_rng_state(), lambda state: torch.cuda.set_rng_state(state)),
}


def synchronize_rng_state(rng_type: Optional[Any] = None, generator: Optional[torch.Generator] = None) -> None:
    """Every rank's ``rng_type`` generator ("torch", "cuda" or "generator": ``generator``) takes rank 0's state."""
    kind = getattr(rng_type, "value", rng_type)
    if kind == "generator":
        if generator is not None:
            generator.set_state(operations.broadcast_object(generator.get_state()))
        return
    if kind == "cuda" and not torch.cuda.is_available():
        return
    if kind not in _STATES:
        raise NotImplementedError(f"synchronize_rng_state({kind!r}) is not offered: the RNG types here are "
                                  f"{sorted(_STATES) + ['generator']}")  # fmt: skip
    get, put = _STATES[kind]
    put(operations.broadcast_object(get()))


def synchronize_rng_states(rng_types: List[Union[str, Any]], generator: Optional[torch.Generator] = None) -> None:
    """:func:`synchronize_rng_state` for each of ``rng_types``."""
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)
