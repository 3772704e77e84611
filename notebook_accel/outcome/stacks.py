"""Ranks' Python stacks (faulthandler's dumps) folded for a message: the user's frames first, the rest counted.

A rank's dump lists every thread, each with the launcher's and the interpreter's own frames around the user's
(multiprocessing's bootstrap, ``run_rank``, ``threading``): about 30 lines per rank, of which one or two say
where the user's code was. ``LaunchTimeout.stacks`` and ``Launch.dump_stacks()`` keep the whole dumps.
"""
from __future__ import annotations

import os
import re
from typing import List, Tuple

from ..rank.tracebacks import is_launcher_frame

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ ")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line \d+ in ')
_PLUMBING = tuple(os.sep + part + os.sep for part in ("multiprocessing", "concurrent")) + (
    os.sep + "threading.py",)


def _is_plumbing(path: str) -> bool:
    """The launcher's frames and the interpreter's own thread and process plumbing."""
    return is_launcher_frame(path) or any(part in path for part in _PLUMBING)


def _threads(dump: str) -> List[Tuple[str, List[str]]]:
    threads: List[Tuple[str, List[str]]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append((line, []))
        elif threads and _FRAME.match(line):
            threads[-1][1].append(line.strip())
    return threads


def fold_stack_dump(dump: str) -> str:
    """Each thread that runs the user's code, with the user's frames only (innermost first, as in the dump),
    then one line counting what was folded. A dump with no user frame at all is returned as it is.

    >>> print(fold_stack_dump('Thread 0x1 (most recent call first):\\n'
    ...                       '  File "/usr/lib/python3.11/threading.py", line 320 in wait\\n'
    ...                       '  File "/home/me/train.py", line 12 in train\\n'
    ...                       'Thread 0x2 (most recent call first):\\n'
    ...                       '  File "/usr/lib/python3.11/threading.py", line 982 in run\\n'))
    Thread 0x1 (most recent call first):
      File "/home/me/train.py", line 12 in train
      [1 launcher frame and 1 other thread folded; the whole dump is kept in .stacks]
    """
    threads = _threads(dump)
    shown, folded_frames, other_threads = [], 0, 0
    for header, frames in threads:
        mine = [frame for frame in frames if not _is_plumbing(_FRAME.match("  " + frame).group("path"))]
        if not mine:
            other_threads += 1
            continue
        folded_frames += len(frames) - len(mine)
        shown.append(header)
        shown.extend("  " + frame for frame in mine)
    if not shown:
        return dump.strip()
    folded = [f"{folded_frames} launcher frame{'s' if folded_frames != 1 else ''}"] if folded_frames else []
    if other_threads:
        folded.append(f"{other_threads} other thread{'s' if other_threads != 1 else ''}")
    if folded:
        shown.append(f"  [{' and '.join(folded)} folded; the whole dump is kept in .stacks]")
    return "\n".join(shown)
