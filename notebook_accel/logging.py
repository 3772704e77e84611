"""``accelerate.logging``: ``get_logger(__name__)``, a logger that knows the ranks.

    logger = get_logger(__name__, log_level="INFO")
    logger.info("starting")                              # on the main process only (the default)
    logger.info("my shard has %d rows", n, main_process_only=False)            # every rank
    logger.info("in rank order", main_process_only=False, in_order=True)        # rank 0, then 1, ...

As HF's ``MultiProcessAdapter``: the state must exist first (an ``Accelerator()`` or ``PartialState()``).
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, MutableMapping, Optional, Tuple

__all__ = ["MultiProcessAdapter", "get_logger"]


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger adapter whose calls take ``main_process_only`` (default True) and ``in_order`` (default False)."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        from .accelerator.partial_state import PartialState

        return not main_process_only or PartialState().is_main_process

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        from .accelerator.partial_state import PartialState

        if not PartialState._shared_state:
            raise RuntimeError("You must initialize the accelerate state by calling either `PartialState()` or "
                               "`Accelerator()` before using the logging utility.")  # fmt: skip
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        if self._should_log(main_process_only):
            msg, kwargs = self.process(msg, kwargs)
            self.logger.log(level, msg, *args, **kwargs)
        elif in_order:
            state = PartialState()
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    msg, kwargs = self.process(msg, kwargs)
                    self.logger.log(level, msg, *args, **kwargs)
                state.wait_for_everyone()

    @functools.lru_cache(None)  # noqa: B019 - once per distinct message, as HF's
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning``, but only the first time with these arguments."""
        self.warning(*args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> Tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs


def get_logger(name: str, log_level: Optional[str] = None) -> MultiProcessAdapter:
    """The named logger, wrapped in :class:`MultiProcessAdapter`; ``log_level`` (or ``ACCELERATE_LOG_LEVEL``) sets
    its level."""
    if log_level is None:
        log_level = os.environ.get("ACCELERATE_LOG_LEVEL", None)
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
