"""How a rank that ended without an exception is described: one wording for every backend and node."""
from __future__ import annotations

from typing import Optional, Sequence

from ..formatting import signal_name
from ..wire.events import RankFailed
from .root_cause import is_system_exit

TAIL_LINES = 25  # last output lines of a rank that died without an exception, quoted in its LaunchError
CRASH_FRAMES = 6  # of faulthandler's dump after a crash: the crashing thread's innermost frames
_DUMP_START = "Fatal Python error:"


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
    """``"; its last output:\n    line\n    line"`` for the last ``TAIL_LINES`` lines, or ``""``.

    After a crash, faulthandler's dump (every thread's stack) would fill those lines: the rank's own last lines
    before the dump are quoted, then where it crashed (the dump's first line and the crashing thread's
    innermost ``CRASH_FRAMES`` frames); the whole dump stays in ``Launch.outputs``.

    >>> print(quote_last_output(["step 7", "Fatal Python error: Segmentation fault", "",
    ...                          "Current thread 0x1 (most recent call first):", '  File "t.py", line 3 in f',
    ...                          "", "Thread 0x2 (most recent call first):", '  File "t.py", line 9 in g']))
    ; its last output:
        step 7
    where it crashed:
        Fatal Python error: Segmentation fault
        Current thread 0x1 (most recent call first):
          File "t.py", line 3 in f
    """
    lines = list(lines)
    start = next((index for index in range(len(lines) - 1, -1, -1) if lines[index].startswith(_DUMP_START)), None)
    if start is None:
        tail = lines[-TAIL_LINES:]
        return ("; its last output:\n    " + "\n    ".join(tail)) if tail else ""
    own = lines[:start][-TAIL_LINES:]
    crash = [lines[start]]
    rest = lines[start + 1:]
    current = next((index for index, line in enumerate(rest)
                    if line.startswith(("Current thread", "Stack (most recent call first)"))), None)
    if current is not None:  # the crashing thread's header, then its innermost frames
        crash.append(rest[current])
        for line in rest[current + 1:current + 1 + CRASH_FRAMES]:
            if not line.startswith("  File "):
                break
            crash.append(line)
    if not own:  # it printed nothing of its own: its last output is the crash report
        return "; its last output, where it crashed:\n    " + "\n    ".join(crash)
    return "; its last output:\n    " + "\n    ".join(own) + "\nwhere it crashed:\n    " + "\n    ".join(crash)


def exit_code_of(event: Optional[RankFailed], exitcode: Optional[int]) -> Optional[int]:
    """The rank's exit code; for ``sys.exit(n)`` known only by its message (another node's rank), ``n``."""
    if exitcode is None and is_system_exit(event):
        code = event.message.strip()  # type: ignore[union-attr]
        return int(code) if code.lstrip("-").isdigit() else 1
    return exitcode
