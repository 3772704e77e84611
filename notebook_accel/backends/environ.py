"""Set environment variables for a while in the kernel process, and put them back."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Dict, Iterator


@contextmanager
def temporary_environ(values: Dict[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``values`` inside the block; each variable as it was (or unset) after.

    Example::

        with temporary_environ({"RANK": "0"}):
            run()
    """
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
