"""How a rank that ended without an exception is described: one wording for every backend and node."""
from __future__ import annotations

from typing import Optional, Sequence

from ..formatting import signal_name
from ..wire.events import RankFailed
from .root_cause import is_system_exit

TAIL_LINES = 25  # last output lines of a rank that died without an exception, quoted in its LaunchError


def describe_death(exitcode: Optional[int]) -> str:
    """``"was killed by SIGKILL"``, ``"exited with code 3"``, or the os._exit hint for code 0.

    >>> describe_death(-9), describe_death(3)
    ('was killed by SIGKILL', 'exited with code 3')
    """
    name = signal_name(exitcode)
    if name:
        return f"was killed by {name}"
    if exitcode == 0:
        return "exited with code 0 without returning a result (os._exit?)"
    return f"exited with code {exitcode}"


def quote_last_output(lines: Sequence[str]) -> str:
    """``"; its last output:\n    line\n    line"`` for the last ``TAIL_LINES`` lines, or ``""``."""
    tail = list(lines)[-TAIL_LINES:]
    return ("; its last output:\n    " + "\n    ".join(tail)) if tail else ""


def exit_code_of(event: Optional[RankFailed], exitcode: Optional[int]) -> Optional[int]:
    """The rank's exit code; for ``sys.exit(n)`` known only by its message (another node's rank), ``n``."""
    if exitcode is None and is_system_exit(event):
        code = event.message.strip()  # type: ignore[union-attr]
        return int(code) if code.lstrip("-").isdigit() else 1
    return exitcode
