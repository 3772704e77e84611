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
  ``FILES_PER_RESULT`` of them) — or, for a warm session's rank, back to that rank's ``ResultPool``, which writes
  its next result into those pages (already there: a plain memory copy) and keeps at most its limit of them;
- nothing has a name: no /dev/shm entry, no temp file. A rank killed while sending takes its files with it; files
  already sent are closed with the kernel's end of the socket, or by the decoder that received them.

A CUDA tensor a rank returns (one of at least ``SHARED_MIN_BYTES``) is not moved to CPU first: its storage is set
aside as a CPU one is, and copied from the device straight into the shared-memory file, in chunks of
``CHUNK_BYTES`` (``copy_from_device``), into pages that exist before the copy (mapped with ``MAP_POPULATE``, or a
pooled file's) and, from ``REGISTER_MIN_BYTES`` on, registered as pinned (``cudaHostRegister``: the copy is then the
GPU's own DMA at the link's speed, instead of the driver's staging through a bounce buffer). Never into fresh pageable
memory, never twice. The kernel maps the file as for any result: it receives a CPU tensor and initialises no CUDA.

A warm session's ``pull(name, device="cuda")`` takes another road (``CudaHandover``): the rank is alive, so the
tensor goes by CUDA IPC and the kernel copies it on the device.

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
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from .payload import (SHARED_MIN_BYTES, Piece, SharedUnpickler, SharingPickler, dtype_name, shared_memory_file,
                      storage_view)

FILES_PER_RESULT = 250          # SCM_RIGHTS carries at most 253 fds in one message on Linux
_PAGE = mmap.ALLOCATIONGRANULARITY   # each piece is mapped on its own: its offset in the file is page-aligned
_WRITE_BYTES = 1 << 30          # os.pwrite writes at most ~2 GiB at once on Linux
CHUNK_BYTES = 64 << 20          # a device tensor's bytes are copied to the host this much at a time
REGISTER_MIN_BYTES = 32 << 20   # from this size on the host pages are registered (pinned) for the copy
FILE_NAME = "notebook_accel-result"
POOL_LIMIT_VARIABLE = "NOTEBOOK_ACCEL_RESULT_POOL_MIB"   # MiB of free result files a warm session rank keeps
DEFAULT_POOL_MIB = 1024

__all__ = ["FILES_PER_RESULT", "CudaHandover", "ResultPickler", "ResultPool", "SharedPieces", "chunk_bounds",
           "copy_from_device", "goes_from_device", "map_shared", "share_pieces"]


class ResultPickler(SharingPickler):
    """cloudpickle, with large CPU storages and out-of-band buffers set aside (in ``storages`` and ``buffers``)
    for ``share_pieces``. Unlike a payload's, a storage is not moved into shared memory in place (the rank keeps
    its own, the kernel gets a copy), and a CUDA tensor still inside the value (in an object ``to_cpu`` does not
    walk) is pickled as before, not sent as an IPC handle the rank may not outlive."""

    def __init__(self, file: io.BytesIO, storages: List[Any], buffers: List[Any]) -> None:
        super().__init__(file, storages, buffers)
        self._ipc_tensor_types = ()

    def persistent_id(self, obj: Any) -> Any:
        """CPU storages as the payload's pickler sets them aside; a large CUDA one too (``goes_from_device``): it is
        copied from the device straight into shared memory, and the kernel rebuilds a CPU tensor over it."""
        if self._typed_storage is not None and type(obj) is self._typed_storage:
            untyped = obj._untyped_storage
            if untyped.device.type == "cuda" and untyped.nbytes() >= SHARED_MIN_BYTES:
                key = ("cuda", untyped.device.index, untyped.data_ptr())
                if key not in self._storage_index:
                    self._storage_index[key] = len(self._storages)  # type: ignore[index]
                    self._storages.append(obj)
                return ("storage", self._storage_index[key])  # type: ignore[index]
        return super().persistent_id(obj)


def goes_from_device(tensor: Any) -> bool:
    """Whether a returned tensor stays on its GPU until it is copied into the result's shared memory (a CUDA tensor
    of at least ``SHARED_MIN_BYTES`` of storage), rather than being moved to the host first (a small one, which
    then travels in the pickle: torch would rebuild a pickled CUDA storage on the kernel's GPU)."""
    return bool(getattr(tensor, "is_cuda", False)) and tensor.untyped_storage().nbytes() >= SHARED_MIN_BYTES


def chunk_bounds(nbytes: int, chunk: int = CHUNK_BYTES) -> List[Tuple[int, int]]:
    """``[start, stop)`` of each chunk of a copy of ``nbytes``: ``chunk`` bytes each, the last one what is left.

    >>> chunk_bounds(10, 4)
    [(0, 4), (4, 8), (8, 10)]
    """
    return [(start, min(start + chunk, nbytes)) for start in range(0, nbytes, chunk)]


def copy_from_device(address: int, storage: Any, chunk: Optional[int] = None, register: Optional[bool] = None,
                     pinned: bool = False) -> bool:
    """Copy the bytes of ``storage`` (an untyped storage: a CUDA one, or any torch copies from) to ``address`` in
    this process's memory, ``chunk`` bytes at a time (default ``CHUNK_BYTES``); the pages there must exist already.
    ``register``: pin them for the copy (``cudaHostRegister``; default: a CUDA storage of at least
    ``REGISTER_MIN_BYTES``), unless ``pinned`` says they are registered already (a pooled file's, kept so).
    Returns whether they were registered for this copy (and are unregistered again)."""
    import torch

    nbytes = storage.nbytes()
    host = torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8, count=nbytes)
    source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    on_gpu = storage.device.type == "cuda"
    if register is None:
        register = on_gpu and nbytes >= REGISTER_MIN_BYTES and not pinned
    registered = bool(register) and on_gpu and _register(address, nbytes)
    try:
        for start, stop in chunk_bounds(nbytes, chunk or CHUNK_BYTES):
            host[start:stop].copy_(source[start:stop], non_blocking=registered or (pinned and on_gpu))
        if on_gpu:
            torch.cuda.current_stream(storage.device).synchronize()
    finally:
        if registered:
            torch.cuda.cudart().cudaHostUnregister(address)
    return registered


def _register(address: int, nbytes: int) -> bool:
    """Pin ``nbytes`` at ``address`` for the GPU's DMA; False where the driver refuses (the copy is then staged)."""
    import torch

    try:
        return int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)) == 0
    except Exception:
        return False


class _DeviceSource:
    """A CUDA storage among a result's pieces: copied by ``copy_from_device``, not written from host memory."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.nbytes = storage.nbytes()


class CudaHandover:
    """A warm session rank's CUDA tensor for ``Session.pull(name, device="cuda")``: pickled as a CUDA IPC handle
    (``torch.multiprocessing``'s reduction; the rank is alive and keeps the tensor), rebuilt in the kernel and
    copied there on the device (``clone``), so the kernel's value stays its own whatever the rank does next."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __reduce__(self) -> Any:
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(self.tensor.detach())
        return _rebuilt_and_copied, (rebuild, args)


def _rebuilt_and_copied(rebuild: Any, args: Any) -> Any:
    return rebuild(*args).clone()


@dataclass
class SharedPieces:
    """Where the set-aside parts of a pickled value lie: each storage and buffer in one of ``files`` shared-memory
    files (sent beside the pickle, in this order). Kernel side, ``receive`` maps them and ``load`` unpickles."""

    storages: List[Piece] = field(default_factory=list)
    buffers: List[Piece] = field(default_factory=list)
    files: int = 0
    # Per file, where its lent flag lies when it is a warm session rank's pooled file (``ResultPool``): the kernel
    # clears the flag once its mapping is gone, and the rank may then write its next result there. None: a file of
    # its own, freed with the mapping.
    flags: List[Optional[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._mapped: Optional[List[memoryview]] = None
        self._missing = ""

    def __getstate__(self) -> dict:
        return {"storages": self.storages, "buffers": self.buffers, "files": self.files, "flags": self.flags}

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
            flags = self.flags or [None] * self.files
            self._mapped = [map_shared(fds[piece.file], piece.offset, piece.nbytes, flags[piece.file])
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


def map_shared(fd: int, offset: int, nbytes: int, flag: Optional[int] = None) -> memoryview:
    """``nbytes`` of the file ``fd`` from ``offset`` (page-aligned), mapped shared and writable, as a memoryview
    that owns the mapping: unmapped when the last object using it is freed, and its pages of the file given back
    then (``MADV_REMOVE``), whoever else still maps other parts of that file. Unlike Python's ``mmap`` (before
    3.13), no duplicate of ``fd`` is kept: the kernel holds no fd per tensor it received.

    ``flag``: the file is a rank's pooled file (``ResultPool``), its lent flag at that offset: its pages are kept
    (the rank writes its next result into them) and the flag is cleared once the mapping is gone."""
    address = _map(fd, offset, nbytes)
    flag_page = _map(fd, flag, _PAGE) if flag is not None else None
    region = (ctypes.c_char * nbytes).from_address(address)
    weakref.finalize(region, _unmap, address, nbytes, flag_page)
    return memoryview(region).cast("B")


def _map(fd: int, offset: int, nbytes: int, populate: bool = False) -> int:
    """Map ``nbytes`` of ``fd`` at ``offset``; ``populate``: with its pages made now, in one go (``MAP_POPULATE``),
    rather than one fault per 4 KiB during the copy that follows."""
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    address = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, offset)
    if address in (None, _MAP_FAILED):
        error = ctypes.get_errno()
        raise OSError(error, f"mmap of a result's shared memory failed: {os.strerror(error)}")
    return address


def _unmap(address: int, nbytes: int, flag_page: Optional[int] = None) -> None:
    if flag_page is None and _MADV_REMOVE is not None:
        _libc.madvise(address, nbytes, _MADV_REMOVE)
    _libc.munmap(address, nbytes)
    if flag_page is not None:  # only now, with no way left to reach those bytes: the rank may reuse them
        ctypes.c_uint8.from_address(flag_page).value = 0
        _libc.munmap(flag_page, _PAGE)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", None)   # Linux: free a shared mapping's pages in the file


# ------------------------------------------------------------------------------------------------ rank

def share_pieces(storages: List[Any], buffers: List[Any],
                 pool: Optional["ResultPool"] = None) -> Tuple[Optional[SharedPieces], List[int]]:
    """Copy what a ``ResultPickler`` set aside into shared-memory files; returns where each piece lies and the
    files' fds (the caller sends, then closes them). ``(None, [])`` when nothing was set aside. With a warm
    session rank's ``pool``, each piece goes into one of its files the kernel gave back, when one fits."""
    sources = [_storage_source(storage) for storage in storages] + [buffer.raw() for buffer in buffers]
    if not sources:
        return None, []
    if pool is not None and len(sources) <= FILES_PER_RESULT:
        pieces, fds, flags = pool.share(sources)
        for piece, storage in zip(pieces, storages):
            piece.dtype = dtype_name(storage)
        return SharedPieces(storages=pieces[:len(storages)], buffers=pieces[len(storages):], files=len(fds),
                            flags=flags), fds
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


@dataclass
class _PooledFile:
    """One of a ``ResultPool``'s files: ``capacity`` bytes of data, then a page whose first byte says it is lent
    (the kernel maps it), all mapped in the rank at ``address``. ``warm``: its pages exist (written once)."""

    fd: int
    capacity: int
    address: int
    warm: bool = False
    pinned: bool = False   # its data registered with CUDA (``cudaHostRegister``) for the copies from a GPU

    def pin_for(self, source: "_DeviceSource") -> bool:
        """Register the file's data with CUDA once, for every copy from a GPU into it, where that pays."""
        if not self.pinned and source.storage.device.type == "cuda" and self.capacity >= REGISTER_MIN_BYTES:
            self.pinned = _register(self.address, self.capacity)
        return self.pinned

    def lent(self) -> bool:
        return ctypes.c_uint8.from_address(self.address + self.capacity).value != 0

    def lend(self) -> None:
        ctypes.c_uint8.from_address(self.address + self.capacity).value = 1

    def close(self) -> None:
        if self.pinned:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.address)
        _libc.munmap(self.address, self.capacity + _PAGE)
        os.close(self.fd)


class ResultPool:
    """A warm session rank's result files, kept for its next results (issue 29: ``pull`` at the memory's pace).

    A new file costs the system a page allocation and zeroing per 4 KiB, the copy included; writing into pages a
    file already has, through a mapping that already reaches them, is a plain memory copy (100 MiB: about 16 ms
    here against 35 ms into a new file). So a rank keeps the files it sent: each is lent while the kernel maps it
    (a flag byte past its data, which the kernel clears once its tensor is freed: ``map_shared``) and written
    again once free. The kernel's tensors are never written while it holds them; what the pool keeps free is at
    most ``limit`` bytes (``NOTEBOOK_ACCEL_RESULT_POOL_MIB``, 1024 by default; the rest goes back to the system),
    in at most ``MAX_FILES`` files. Pieces below ``MIN_BYTES`` get files of their own, as a launch's rank's do.
    """

    MAX_FILES = 64
    MIN_BYTES = 1 << 20

    def __init__(self, limit: Optional[int] = None) -> None:
        if limit is None:
            limit = int(float(os.environ.get(POOL_LIMIT_VARIABLE, DEFAULT_POOL_MIB)) * (1 << 20))
        self.limit = limit
        self.files: List[_PooledFile] = []
        self.reused = 0          # writes into a file the kernel gave back (for tests and benchmarks)
        self._lock = threading.Lock()

    def share(self, sources: List[memoryview]) -> Tuple[List[Piece], List[int], List[Optional[int]]]:
        """Each source into a file of its own (a pooled one when it is large enough): its piece, a duplicate
        of its fd for the kernel, and where its lent flag lies (None: not pooled)."""
        pieces: List[Piece] = []
        fds: List[int] = []
        flags: List[Optional[int]] = []
        try:
            with self._lock:
                for index, source in enumerate(sources):
                    pooled = self._file_for(source.nbytes) if source.nbytes >= self.MIN_BYTES else None
                    if pooled is None:
                        fd = shared_memory_file(-(-source.nbytes // _PAGE) * _PAGE, FILE_NAME)
                        fds.append(fd)
                        _write(fd, source, 0)
                        flags.append(None)
                    else:
                        fds.append(os.dup(pooled.fd))
                        if isinstance(source, _DeviceSource):  # registering makes the pages, then DMA into them
                            copy_from_device(pooled.address, source.storage, pinned=pooled.pin_for(source))
                            self.reused += 1 if pooled.warm else 0
                            pooled.warm = True
                        elif pooled.warm:
                            _copy_into(pooled.address, source)
                            self.reused += 1
                        else:
                            _write(pooled.fd, source, 0)
                            pooled.warm = True
                        pooled.lend()
                        flags.append(pooled.capacity)
                    pieces.append(Piece(index, 0, source.nbytes))
                self._trim()
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return pieces, fds, flags

    def _file_for(self, nbytes: int) -> Optional[_PooledFile]:
        """The smallest free file that holds ``nbytes``, else a new one (None once ``MAX_FILES`` are lent)."""
        free = [pooled for pooled in self.files if not pooled.lent() and pooled.capacity >= nbytes]
        if free:
            return min(free, key=lambda pooled: pooled.capacity)
        if len(self.files) >= self.MAX_FILES:
            self._trim(keep=0)  # make room: free files too small for this piece go
            if len(self.files) >= self.MAX_FILES:
                return None
        capacity = -(-nbytes // _PAGE) * _PAGE
        fd = shared_memory_file(capacity + _PAGE, FILE_NAME)
        try:
            address = _map(fd, 0, capacity + _PAGE)
        except OSError:
            os.close(fd)
            raise
        pooled = _PooledFile(fd, capacity, address)
        self.files.append(pooled)
        return pooled

    def _trim(self, keep: Optional[int] = None) -> None:
        """Close free files beyond ``keep`` bytes of them (the pool's ``limit``), largest first."""
        keep = self.limit if keep is None else keep
        free = sorted((pooled for pooled in self.files if not pooled.lent()), key=lambda pooled: -pooled.capacity)
        kept = sum(pooled.capacity for pooled in free)
        for pooled in free:
            if kept <= keep:
                break
            self.files.remove(pooled)
            pooled.close()
            kept -= pooled.capacity

    def close(self) -> None:
        """Let every file go (those the kernel still maps stay alive through its mappings)."""
        with self._lock:
            for pooled in self.files:
                pooled.close()
            self.files = []


def _copy_into(address: int, source: memoryview) -> None:
    """One memory copy of ``source`` to ``address`` (a read-only source too)."""
    memoryview((ctypes.c_char * source.nbytes).from_address(address)).cast("B")[:] = source.cast("B")


def _groups(count: int, most: int) -> List[Tuple[int, int]]:
    """``count`` pieces in at most ``most`` runs of consecutive pieces, as even as can be: one file per piece
    while they are few (each piece's memory is freed on its own)."""
    files = min(count, most)
    bounds = [round(index * count / files) for index in range(files + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _write(fd: int, source: Any, offset: int) -> None:
    if isinstance(source, _DeviceSource):  # straight from the GPU, into pages mapped (and made) first
        nbytes = -(-source.nbytes // _PAGE) * _PAGE
        address = _map(fd, offset, nbytes, populate=True)
        try:
            copy_from_device(address, source.storage)
        finally:
            _libc.munmap(address, nbytes)
        return
    written = 0
    while written < source.nbytes:
        written += os.pwrite(fd, source[written:written + _WRITE_BYTES], offset + written)


def _storage_source(storage: Any) -> Any:
    """What ``share_pieces`` copies from: a CPU storage's bytes, or a CUDA storage itself."""
    untyped = storage._untyped_storage
    return _DeviceSource(untyped) if untyped.device.type == "cuda" else _storage_bytes(storage)


def _storage_bytes(storage: Any) -> memoryview:
    """The bytes of a CPU storage, as a memoryview over its memory (no copy)."""
    untyped = storage._untyped_storage
    nbytes = untyped.nbytes()
    return memoryview((ctypes.c_char * nbytes).from_address(untyped.data_ptr())).cast("B")
