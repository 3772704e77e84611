"""A rank's return value on its way to the kernel: large tensors and arrays through shared memory, copied once.

The value is pickled in the rank as a launch's payload is pickled in the kernel (``payload.SharingPickler``): CPU
tensor storages and protocol-5 buffers (numpy arrays) of at least ``SHARED_MIN_BYTES`` are set aside. Each is then
copied once into a shared-memory file (``os.pwrite``: one copy, without the page faults and zeroing that writing
through a fresh mapping costs), and the files travel with the ``RankResult`` over the rank's event socket
(``SCM_RIGHTS``, as ``torch.multiprocessing`` passes a storage's fd). The rank closes its ends once they are sent;
the kernel maps each piece and closes the fd at once (``map_shared``). So:

- the kernel alone owns the memory: a launch's ranks end, and a session's rank may change or free its tensor after
  ``pull``, without the kernel's value changing (the rank's bytes were copied, not shared);
- a tensor (or array) in the kernel is a view of its own mapping, no copy on the kernel's side, and that memory goes
  back to the system once the tensor is freed, as a tensor's own memory does (pieces share a file only past
  ``FILES_PER_RESULT`` of them);
- nothing has a name: no /dev/shm entry, no temp file. A rank killed while sending takes its files with it; files
  already sent are closed with the kernel's end of the socket, or by the decoder that received them.

Example (rank side, then kernel side)::

    ResultPickler(out, storages, buffers).dump(value)        # large storages and buffers set aside
    pieces, fds = share_pieces(storages, buffers)
    sender.send(RankResult(rank=0, payload=out.getvalue(), shared=pieces), fds)
    ...
    value = event.shared.load(event.payload)                 # the decoder mapped the files it received
"""
from __future__ import annotations

import ctypes
import io
import mmap
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from .payload import (SHARED_MIN_BYTES, Piece, SharedUnpickler, SharingPickler, dtype_name, shared_memory_file,
                      storage_view)

FILES_PER_RESULT = 250          # SCM_RIGHTS carries at most 253 fds in one message on Linux
_PAGE = mmap.ALLOCATIONGRANULARITY   # each piece is mapped on its own: its offset in the file is page-aligned
_WRITE_BYTES = 1 << 30          # os.pwrite writes at most ~2 GiB at once on Linux
FILE_NAME = "notebook_accel-result"

__all__ = ["FILES_PER_RESULT", "ResultPickler", "SharedPieces", "map_shared", "share_pieces"]


class ResultPickler(SharingPickler):
    """cloudpickle, with large CPU storages and out-of-band buffers set aside (in ``storages`` and ``buffers``)
    for ``share_pieces``. Unlike a payload's, a storage is not moved into shared memory in place (the rank keeps
    its own, the kernel gets a copy), and a CUDA tensor still inside the value (in an object ``to_cpu`` does not
    walk) is pickled as before, not sent as an IPC handle the rank may not outlive."""

    def __init__(self, file: io.BytesIO, storages: List[Any], buffers: List[Any]) -> None:
        super().__init__(file, storages, buffers)
        self._ipc_tensor_types = ()


@dataclass
class SharedPieces:
    """Where the set-aside parts of a pickled value lie: each storage and buffer in one of ``files`` shared-memory
    files (sent beside the pickle, in this order). Kernel side, ``receive`` maps them and ``load`` unpickles."""

    storages: List[Piece] = field(default_factory=list)
    buffers: List[Piece] = field(default_factory=list)
    files: int = 0

    def __post_init__(self) -> None:
        self._mapped: Optional[List[memoryview]] = None
        self._missing = ""

    def __getstate__(self) -> dict:
        return {"storages": self.storages, "buffers": self.buffers, "files": self.files}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    # -------------------------------------------------------------------------------------------- kernel

    def receive(self, fds: Sequence[int]) -> None:
        """Map every piece from the files that came with the result (shared, not copied), then close the fds:
        the mappings alone keep the memory."""
        try:
            if len(fds) != self.files:
                self._missing = f"{len(fds)} of its {self.files} shared-memory files arrived"
                return
            self._mapped = [map_shared(fds[piece.file], piece.offset, piece.nbytes)
                            for piece in self.storages + self.buffers]
        finally:
            for fd in fds:
                os.close(fd)

    def load(self, data: bytes) -> Any:
        """Unpickle ``data`` with the received pieces: each tensor's storage and each array a view of its own
        mapping. Raises ``ValueError`` when the files did not arrive (never expected)."""
        if self._mapped is None:
            raise ValueError(self._missing or "its shared-memory files never arrived")
        mapped, self._mapped = self._mapped, None   # from now on the values alone keep their mappings
        count = len(self.storages)
        storages = [storage_view(mapping, Piece(0, 0, piece.nbytes, piece.dtype))
                    for mapping, piece in zip(mapped[:count], self.storages)]
        buffers = mapped[count:]
        return SharedUnpickler(io.BytesIO(data), storages, buffers).load()


def map_shared(fd: int, offset: int, nbytes: int) -> memoryview:
    """``nbytes`` of the file ``fd`` from ``offset`` (page-aligned), mapped shared and writable, as a memoryview
    that owns the mapping: unmapped when the last object using it is freed, and its pages of the file given back
    then (``MADV_REMOVE``), whoever else still maps other parts of that file. Unlike Python's ``mmap`` (before
    3.13), no duplicate of ``fd`` is kept: the kernel holds no fd per tensor it received."""
    address = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, offset)
    if address in (None, _MAP_FAILED):
        error = ctypes.get_errno()
        raise OSError(error, f"mmap of a result's shared memory failed: {os.strerror(error)}")
    region = (ctypes.c_char * nbytes).from_address(address)
    weakref.finalize(region, _unmap, address, nbytes)
    return memoryview(region).cast("B")


def _unmap(address: int, nbytes: int) -> None:
    if _MADV_REMOVE is not None:
        _libc.madvise(address, nbytes, _MADV_REMOVE)
    _libc.munmap(address, nbytes)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", None)   # Linux: free a shared mapping's pages in the file


# ------------------------------------------------------------------------------------------------ rank

def share_pieces(storages: List[Any], buffers: List[Any]) -> Tuple[Optional[SharedPieces], List[int]]:
    """Copy what a ``ResultPickler`` set aside into new shared-memory files; returns where each piece lies and
    the files' fds (the caller sends, then closes them). ``(None, [])`` when nothing was set aside."""
    sources = [_storage_bytes(storage) for storage in storages] + [buffer.raw() for buffer in buffers]
    if not sources:
        return None, []
    groups = _groups(len(sources), FILES_PER_RESULT)
    pieces: List[Piece] = []
    fds: List[int] = []
    try:
        for file, (start, stop) in enumerate(groups):
            offsets, end = [], 0
            for source in sources[start:stop]:
                offsets.append(end)
                end += -(-source.nbytes // _PAGE) * _PAGE
            fd = shared_memory_file(end, FILE_NAME)
            fds.append(fd)
            for source, offset in zip(sources[start:stop], offsets):
                _write(fd, source, offset)
                pieces.append(Piece(file, offset, source.nbytes))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for piece, storage in zip(pieces, storages):
        piece.dtype = dtype_name(storage)
    return SharedPieces(storages=pieces[:len(storages)], buffers=pieces[len(storages):], files=len(fds)), fds


def _groups(count: int, most: int) -> List[Tuple[int, int]]:
    """``count`` pieces in at most ``most`` runs of consecutive pieces, as even as can be: one file per piece
    while they are few (each piece's memory is freed on its own)."""
    files = min(count, most)
    bounds = [round(index * count / files) for index in range(files + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _write(fd: int, source: memoryview, offset: int) -> None:
    written = 0
    while written < source.nbytes:
        written += os.pwrite(fd, source[written:written + _WRITE_BYTES], offset + written)


def _storage_bytes(storage: Any) -> memoryview:
    """The bytes of a CPU storage, as a memoryview over its memory (no copy)."""
    untyped = storage._untyped_storage
    nbytes = untyped.nbytes()
    return memoryview((ctypes.c_char * nbytes).from_address(untyped.data_ptr())).cast("B")
