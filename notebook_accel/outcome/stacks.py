"""Ranks' Python stacks (faulthandler's dumps) folded for people: the user's frames first, the rest counted.

A rank's dump lists every thread, each with the launcher's and the interpreter's own frames around the user's
(multiprocessing's bootstrap, ``run_rank``, ``threading``). A forked rank's main thread also carries, under
its process's start (multiprocessing's ``Process._bootstrap``), the whole stack of the process it was forked
from — for a rank forked from a Jupyter kernel some twenty frames of IPython, ipykernel, asyncio and tornado
and the cell's own line — which never run again in the rank. ``fold_inherited_frames`` folds those into one
line (``Launch.dump_stacks()``, the dashboard); ``fold_stack_dump`` keeps only the user's frames (a timeout's
message). ``LaunchTimeout.stacks`` and ``Launch.dump_stacks(full=True)`` keep the whole dumps.
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
_PROCESS_START = os.sep + os.path.join("multiprocessing", "process.py")  # Process._bootstrap: a rank's first frame
INHERITED_NOTE = ("  [{count} frame{s} from before the rank started (the kernel's own, if forked) folded; "
                  "full=True has them]")


def _is_plumbing(path: str) -> bool:
    """The launcher's frames and the interpreter's own thread and process plumbing."""
    return is_launcher_frame(path) or any(part in path for part in _PLUMBING)


def _is_process_start(frame: str) -> bool:
    """The frame where a rank's process begins (``Process._bootstrap``): below it, what it was forked from."""
    match = _FRAME.match("  " + frame.strip())
    return bool(match) and match.group("path").endswith(_PROCESS_START) and frame.rstrip().endswith(" in _bootstrap")


def _own_frames(frames: List[str]) -> Tuple[List[str], int]:
    """A thread's frames (innermost first) down to its process's start, and how many older ones follow it."""
    for index, frame in enumerate(frames):
        if _is_process_start(frame):
            return frames[:index + 1], len(frames) - index - 1
    return frames, 0


def _threads(dump: str) -> List[Tuple[str, List[str], int]]:
    """Each thread of a dump: its header, its own frames, and how many inherited frames were under them."""
    threads: List[Tuple[str, List[str]]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append((line, []))
        elif threads and _FRAME.match(line):
            threads[-1][1].append(line.strip())
    return [(header, *_own_frames(frames)) for header, frames in threads]


def fold_inherited_frames(dump: str) -> str:
    """``dump`` with each thread's frames from before its process started folded into one line; the rest as
    faulthandler wrote it.

    >>> print(fold_inherited_frames('Current thread 0x1 (most recent call first):\\n'
    ...                             '  File "/home/me/train.py", line 12 in train\\n'
    ...                             '  File "/py/multiprocessing/process.py", line 314 in _bootstrap\\n'
    ...                             '  File "/py/multiprocessing/popen_fork.py", line 71 in _launch\\n'
    ...                             '  File "/tmp/ipykernel_1/2.py", line 9 in <module>\\n'))
    Current thread 0x1 (most recent call first):
      File "/home/me/train.py", line 12 in train
      File "/py/multiprocessing/process.py", line 314 in _bootstrap
      [2 frames from before the rank started (the kernel's own, if forked) folded; full=True has them]
    """
    shown: List[str] = []
    inherited = -1  # frames folded so far in this thread; -1 until its process's start was seen
    for line in dump.splitlines():
        if inherited >= 0 and _FRAME.match(line):  # an inherited frame
            inherited += 1
            continue
        if inherited >= 0 and line.startswith(" "):  # faulthandler's "..." after too many frames, or our note
            shown.append(line)
            continue
        _close_inherited(shown, inherited)
        inherited = 0 if _is_process_start(line) else -1
        shown.append(line)
    _close_inherited(shown, inherited)
    return "\n".join(shown)


def _close_inherited(shown: List[str], count: int) -> None:
    if count > 0:
        shown.append(INHERITED_NOTE.format(count=count, s="" if count == 1 else "s"))


def fold_stack_dump(dump: str) -> str:
    """Each thread that runs the user's code, with the user's frames only (innermost first, as in the dump),
    then one line counting what was folded. A dump with no user frame at all is returned as it is (its
    inherited frames folded).

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
    shown, folded_frames, inherited_frames, other_threads = [], 0, 0, 0
    for header, frames, inherited in threads:
        mine = [frame for frame in frames if not _is_plumbing(_FRAME.match("  " + frame).group("path"))]
        if not mine:
            other_threads += 1
            continue
        folded_frames += len(frames) - len(mine)
        inherited_frames += inherited
        shown.append(header)
        shown.extend("  " + frame for frame in mine)
    if not shown:
        return fold_inherited_frames(dump).strip()
    folded = [f"{folded_frames} launcher frame{'s' if folded_frames != 1 else ''}"] if folded_frames else []
    if inherited_frames:
        folded.append(f"{inherited_frames} frame{'s' if inherited_frames != 1 else ''} from before the rank "
                      f"started (the kernel's own, if forked)")
    if other_threads:
        folded.append(f"{other_threads} other thread{'s' if other_threads != 1 else ''}")
    if folded:
        listed = ", ".join(folded[:-1]) + " and " + folded[-1] if len(folded) > 1 else folded[0]
        shown.append(f"  [{listed} folded; the whole dump is kept in .stacks]")
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
    for _, frames, _ in _threads(dump):  # innermost frame first, down to the rank's start
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
