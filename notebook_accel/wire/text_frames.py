"""Messages as short text lines, for a channel that carries lines and nothing else: ``srun``'s stdio.

A Slurm job step's tasks talk to the kernel through the stdin and stdout ``srun`` forwards (munge-authenticated,
no port of ours; ``backends.slurm``, ``rank.slurm_task``). That channel is line-oriented: slurmstepd forwards a
task's output a line at a time (lines longer than its 1 KiB buffer in pieces), and ``srun`` writes the pieces of
all tasks to its one stdout as they come, so a long line of one task may be cut by another's. So a message is
pickled, base64-encoded and cut into lines well under that size, each naming its sender, its message and its
place::

    @na <rank> <message id> <index> <count> <base64 piece>

``LineDecoder`` puts the pieces of each (rank, message) together, whatever else came between them, and ignores lines
that are not frames. Only the two ends of one launch write frames: ``srun`` carries nothing else on these streams.

>>> lines = encode(3, ("hello", {"node": "n1"}), message_id=7)
>>> decoder = LineDecoder()
>>> [decoder.feed(line) for line in lines][-1]
(3, ('hello', {'node': 'n1'}))
"""
from __future__ import annotations

import base64
import os
import pickle
import threading
from typing import Any, Dict, List, Optional, Tuple

MARK = "@na"
PIECE = 600          # base64 characters per line: a line stays well under slurmstepd's 1024-byte buffer
EVERY_RANK = -1      # a kernel -> ranks message for every rank (srun's stdin goes to every task)


def encode(rank: int, message: Any, message_id: int) -> List[str]:
    """``message`` as frame lines (each ending in a newline), from (or for) ``rank``."""
    data = base64.b64encode(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")
    pieces = [data[start:start + PIECE] for start in range(0, len(data), PIECE)] or [""]
    return [f"{MARK} {rank} {message_id} {index} {len(pieces)} {piece}\n" for index, piece in enumerate(pieces)]


class LineDecoder:
    """Frame lines in, whole messages out (see the module docstring)."""

    def __init__(self) -> None:
        self._pieces: Dict[Tuple[int, int], List[Optional[str]]] = {}

    def feed(self, line: str) -> Optional[Tuple[int, Any]]:
        """``(rank, message)`` when ``line`` completes one, else None (a piece, or not a frame)."""
        fields = line.strip().split(" ")
        if len(fields) not in (5, 6) or fields[0] != MARK:
            return None
        try:
            rank, message_id, index, count = (int(field) for field in fields[1:5])
        except ValueError:
            return None
        piece = fields[5] if len(fields) == 6 else ""
        pieces = self._pieces.setdefault((rank, message_id), [None] * count)
        if not 0 <= index < len(pieces):
            return None
        pieces[index] = piece
        if any(part is None for part in pieces):
            return None
        del self._pieces[(rank, message_id)]
        return rank, pickle.loads(base64.b64decode("".join(pieces)))  # type: ignore[arg-type]


class FrameWriter:
    """Writes messages as frame lines to ``fd``; thread-safe, each message's lines together."""

    def __init__(self, fd: int, rank: int) -> None:
        self.fd = fd
        self.rank = rank
        self._lock = threading.Lock()
        self._next_id = 0

    def send(self, message: Any, rank: Optional[int] = None) -> None:
        with self._lock:
            self._next_id += 1
            data = "".join(encode(self.rank if rank is None else rank, message, self._next_id)).encode("ascii")
            while data:
                written = os.write(self.fd, data)
                data = data[written:]
