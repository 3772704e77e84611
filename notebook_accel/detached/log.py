"""An append-only log of cloudpickled frames, one writer and any number of readers, over a shared file system.

A frame is ``length`` (4 bytes) ``crc32`` (4 bytes) then the pickle. The writer writes each frame with one
``write`` of an ``O_APPEND`` file and flushes it to the file system (``fsync``: another node reads it). A reader
that meets a frame still being written — fewer bytes than its length says, or bytes whose checksum does not match
yet (a network file system may show a write's size before its data) — stops before it and reads it whole on its next
call: no event is lost, none read twice. A writer killed in the middle of a frame leaves a torn tail; the next writer
(the requeued job's driver) cuts it before appending.
"""
from __future__ import annotations

import os
import pickle
import struct
import zlib
from typing import Any, Iterator, List, Tuple

import cloudpickle

HEADER = struct.Struct("<II")  # length, crc32 of the payload


def frame(item: Any) -> bytes:
    payload = cloudpickle.dumps(item)
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def frames(data: bytes, offset: int = 0) -> Iterator[Tuple[int, bytes]]:
    """``(end offset, payload)`` of each whole frame of ``data`` from ``offset``; stops at the first incomplete one."""
    while offset + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, offset)
        end = offset + HEADER.size + length
        if end > len(data):
            return
        payload = data[offset + HEADER.size:end]
        if zlib.crc32(payload) != crc:
            return
        yield end, payload
        offset = end


class LogWriter:
    """Appends frames to ``path`` (created if absent), after cutting a torn tail left by a writer that was killed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._cut_torn_tail()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _cut_torn_tail(self) -> None:
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        whole = 0
        for whole, _ in frames(data):
            pass
        if whole < len(data):
            os.truncate(self.path, whole)

    def append(self, item: Any) -> None:
        os.write(self._fd, frame(item))
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LogReader:
    """Reads ``path`` incrementally: ``read(since)`` is every whole item from index ``since`` on. Remembers where it
    stopped, so that following a log reads each byte once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0  # the byte after the last whole frame read
        self._count = 0   # how many items lie before it

    def read(self, since: int = 0) -> List[Any]:
        if since < self._count:  # asked for earlier items again: start over
            self._offset, self._count = 0, 0
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        items: List[Any] = []
        consumed = 0
        for consumed, payload in frames(data):
            if self._count >= since:
                items.append(pickle.loads(payload))
            self._count += 1
        self._offset += consumed
        return items
