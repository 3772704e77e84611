"""Messages as short text lines, for a channel that carries lines and nothing else: ``srun``'s stdio.

A Slurm job step's tasks talk to the kernel through the stdin and stdout ``srun`` forwards (munge-authenticated,
no port of ours; ``backends.slurm``, ``rank.slurm_task``). That channel is line-oriented: slurmstepd forwards a
task's output a line at a time (lines longer than its 1 KiB buffer in pieces), and ``srun`` writes the pieces of
all tasks to its one stdout as they come, so a long line of one task may be cut by another's. So a message is
pickled, base64-encoded and cut into lines well under that size, each naming its sender, its message and its
place::

    @na <rank> <message id> <index> <count> <base64 piece>

A message is sent in one write, and kept small: its pickle is zlib-compressed (the mark ``@nz``) where that makes it
shorter (``compressed``). Slurm carries stdio between ``srun`` and each node in messages of at most 1 KiB
(``SRUN_MESSAGE``) over TCP with Nagle's algorithm on: a second message sent while the first is unacknowledged waits
for the receiver's delayed ACK, 40 ms on Linux. A small function's run command in one message, and a rank's result
with its task's end in one write (``rank.slurm_task``), is what keeps a warm run on Slurm at a few milliseconds
(docs/benchmarks.md).

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
import zlib
from typing import Any, Dict, Iterable, List, Optional, Tuple

MARK = "@na"
ZLIB_MARK = "@nz"    # the same, the pickle zlib-compressed
PIECE = 600          # base64 characters per line: a line stays well under slurmstepd's 1024-byte buffer
EVERY_RANK = -1      # a kernel -> ranks message for every rank (srun's stdin goes to every task)
SRUN_MESSAGE = 1024  # bytes of stdio Slurm carries in one message between srun and a node (SLURM_IO_MAX_MSG_LEN)
# Pickles compressed: above a few hundred bytes (a small function's run command is ~1 KiB, ~0.6 compressed); not
# beyond what zlib does in a moment (a large result's tensors hardly compress, and take longer to send than to save).
COMPRESS_SIZES = range(256, 1 << 16)


def compressed(data: bytes) -> Optional[bytes]:
    """``data`` zlib-compressed where its size is in ``COMPRESS_SIZES`` and that makes it shorter, else None.

    >>> len(compressed(b"ab" * 500)) < 100, compressed(b"short"), compressed(os.urandom(1000))
    (True, None, None)
    """
    if len(data) not in COMPRESS_SIZES:
        return None
    packed = zlib.compress(data)
    return packed if len(packed) < len(data) else None


def encode(rank: int, message: Any, message_id: int) -> List[str]:
    """``message`` as frame lines (each ending in a newline), from (or for) ``rank``."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    packed = compressed(data)
    mark, data = (MARK, data) if packed is None else (ZLIB_MARK, packed)
    text = base64.b64encode(data).decode("ascii")
    pieces = [text[start:start + PIECE] for start in range(0, len(text), PIECE)] or [""]
    return [f"{mark} {rank} {message_id} {index} {len(pieces)} {piece}\n" for index, piece in enumerate(pieces)]


class LineDecoder:
    """Frame lines in, whole messages out (see the module docstring)."""

    def __init__(self) -> None:
        self._pieces: Dict[Tuple[int, int], List[Optional[str]]] = {}

    def feed(self, line: str) -> Optional[Tuple[int, Any]]:
        """``(rank, message)`` when ``line`` completes one, else None (a piece, or not a frame)."""
        fields = line.strip().split(" ")
        if len(fields) not in (5, 6) or fields[0] not in (MARK, ZLIB_MARK):
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
        data = base64.b64decode("".join(pieces))  # type: ignore[arg-type]
        return rank, pickle.loads(zlib.decompress(data) if fields[0] == ZLIB_MARK else data)


class FrameWriter:
    """Writes messages as frame lines to ``fd``; thread-safe, each message's lines together, in one write."""

    def __init__(self, fd: int, rank: int) -> None:
        self.fd = fd
        self.rank = rank
        self._lock = threading.Lock()
        self._next_id = 0

    def send(self, message: Any, rank: Optional[int] = None) -> None:
        self.send_many([message], rank)

    def send_many(self, messages: Iterable[Any], rank: Optional[int] = None) -> None:
        """``messages`` in one write: what follows a message at once goes with it (see the module docstring)."""
        with self._lock:
            lines: List[str] = []
            for message in messages:
                self._next_id += 1
                lines += encode(self.rank if rank is None else rank, message, self._next_id)
            data = "".join(lines).encode("ascii")
            while data:
                written = os.write(self.fd, data)
                data = data[written:]
