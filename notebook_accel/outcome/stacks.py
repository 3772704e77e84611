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


_WRAPPERS = {"wrapper", "inner", "wrapped", "_fn", "decorate_context", "decorated", "__call__"}


def where_waiting(dump: str) -> str:
    r"""Where a rank waits, from its stack dump: the call its code made into a library (torch.distributed's
    ``init_process_group``, ``all_reduce``, ``barrier``...) and the user's frame that made it, from the first
    thread that runs user code.

    >>> where_waiting('Current thread 0x1 (most recent call first):\n'
    ...               '  File "/x/torch/distributed/distributed_c10d.py", line 4 in _store_based_barrier\n'
    ...               '  File "/x/torch/distributed/distributed_c10d.py", line 9 in barrier\n'
    ...               '  File "/home/me/train.py", line 12 in train\n')
    'barrier, called from train.py:12 in train'
    """
    for _, frames in _threads(dump):  # innermost frame first
        for index, frame in enumerate(frames):
            path = _FRAME.match("  " + frame).group("path")
            if _is_plumbing(path) or f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}torch{os.sep}" in path:
                continue
            if index == 0:
                return _short_frame(frame)
            # the library function it called: past decorators' generic wrappers (torch wraps its collectives)
            names = [match.group(1) for match in (re.search(r" in (\S+)$", inner) for inner in frames[:index])
                     if match]
            called = next((name for name in reversed(names) if name not in _WRAPPERS), names[-1] if names else "")
            return f"{called or 'a call'}, called from {_short_frame(frame)}"
    return "somewhere its stack does not show"


def _short_frame(frame: str) -> str:
    """``File "/home/me/train.py", line 12 in train`` → ``train.py:12 in train``."""
    match = re.match(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<name>.+)$', frame.strip())
    if not match:
        return frame.strip()
    return f"{os.path.basename(match.group('path'))}:{match.group('line')} in {match.group('name')}"
