"""The launched function and its arguments, as each kind of rank receives them.

- **Inherited** (fork, and the rank in the kernel): the kernel's own objects, never pickled. A forked rank
  runs with the notebook's real globals, copy-on-write, and objects that cannot be pickled (locks, open
  files, a live model) are fine.
- **Pickled** (forkserver, spawn): cloudpickled once in the kernel. Large CPU tensor storages and large
  out-of-band buffers (numpy arrays, pickle protocol 5) do not travel as pickled bytes. A storage moves
  into shared memory in place, as ``torch.multiprocessing`` does (once: later launches reuse it, and the
  kernel holds no second copy); buffers are copied into one shared-memory file. Each rank receives the
  descriptors as it starts and maps them *copy-on-write* (``MAP_PRIVATE``): it reads the kernel's data
  without a private copy and, as under fork, what it writes stays its own.
- **Source lines** travel with the code: cloudpickle names every function's file ``<dynamic-code>``; here each
  code object keeps its own file name, and the lines of those the rank cannot read from disk (a notebook's
  cells, which IPython keeps in ``linecache`` only) travel beside the call, so a rank's traceback shows the
  user's lines as under fork.
- **CUDA tensors** (a model a cell put on ``cuda:0``, then a launch on every GPU) travel as
  ``torch.multiprocessing`` sends them: as CUDA IPC handles. No copy is made: every rank sees the kernel's
  tensor on its GPU, and ``prepare`` / ``.to(device)`` copies it to the rank's own GPU. (Pickled the default
  way, each rank would load a copy of it onto ``cuda:0``: rank 1's copy and its CUDA context on GPU 0, an
  out-of-memory on 2×T4 for a model that fit.) Like ``torch.multiprocessing``'s, the memory is shared, not
  copy-on-write: a rank that writes to it in place on that GPU writes to the kernel's tensor.
"""
from __future__ import annotations

import io
import linecache
import mmap
import os
import pickle
import sys
import threading
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import cloudpickle
from cloudpickle import cloudpickle as _cloudpickle_internals

from ..errors import LaunchConfigError
from .fds import PassedFd  # fds travel as multiprocessing duplicates them

SHARED_MIN_BYTES = 1 << 16     # smaller storages and buffers simply travel inside the pickle
LARGE_PAYLOAD_BYTES = 64 << 20  # a pickle this big is worth a warning that names what makes it big
_ALIGN = 64

FunctionCall = Tuple[Callable, Tuple, Dict[str, Any]]


class Payload:
    """``(function, args, kwargs)`` as the kernel holds them; pickled only when a rank cannot inherit them.

    >>> payload = Payload(lambda x: x + 1, (1,), {})
    >>> function, args, kwargs = payload.load()      # the objects themselves: no copy
    """

    def __init__(self, function: Callable, args: Tuple, kwargs: Dict[str, Any]) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self._pickled: Optional[PickledPayload] = None
        self._portable: Optional[PortablePayload] = None

    def load(self) -> FunctionCall:
        return self.function, self.args, self.kwargs

    def pickled(self) -> "PickledPayload":
        """Pickle once (for every rank of the launch); a clear error names what cannot be pickled."""
        if self._pickled is None:
            self._pickled = PickledPayload.create(self.function, self.args, self.kwargs)
        return self._pickled

    def portable(self) -> "PortablePayload":
        """Pickle once for ranks elsewhere (a cluster's), large data beside the pickle (``PortablePayload``)."""
        if self._portable is None:
            self._portable = PortablePayload.create(self.function, self.args, self.kwargs)
        return self._portable

    def close(self) -> None:
        """The launch is over: release the shared-memory file (ranks keep their own mappings)."""
        if self._pickled is not None:
            self._pickled.close()
            self._pickled = None
        self._portable = None


@dataclass
class Piece:
    """Where one shared storage or buffer lies: in ``file`` (an index into the payload's shared fds)."""

    file: int
    offset: int
    nbytes: int
    dtype: Optional[str] = None   # a torch storage's dtype name; None for a protocol-5 buffer


@dataclass
class PickledPayload:
    """What a forkserver or spawn rank receives: the pickle, and the large data beside it in shared memory.

    Pickling this object (multiprocessing does so as the rank starts) passes the shared file's descriptor,
    duplicated into the child by multiprocessing itself, not the data.
    """

    data: bytes
    storages: List[Piece] = field(default_factory=list)
    buffers: List[Piece] = field(default_factory=list)
    # kernel: ints (torch's own fds of shared storages, and our buffer file); in a rank: what it received
    shared_fds: List[Any] = field(default_factory=list)
    shared_sizes: List[int] = field(default_factory=list)
    _buffer_file: Optional[mmap.mmap] = None   # the kernel's mapping of the buffers' file, while it runs
    # the CUDA tensors sent by IPC handle: the kernel keeps them alive until the launch ends (torch's rule:
    # the producer holds a shared CUDA tensor while consumers use it)
    _cuda_tensors: List[Any] = field(default_factory=list)

    @classmethod
    def create(cls, function: Callable, args: Tuple, kwargs: Dict[str, Any], *,
               into_rank_namespace: bool = False) -> "PickledPayload":
        """Pickle the call; ``into_rank_namespace``: the notebook's functions get the rank's namespace as their
        globals when loaded (a warm session's rank), instead of a fresh dict of their own."""
        pickled = _pickle_call(function, args, kwargs, into_rank_namespace=into_rank_namespace)
        payload = cls(pickled.data, _cuda_tensors=pickled.cuda_tensors)
        payload._share(pickled.storages, pickled.buffers)
        return payload

    # ------------------------------------------------------------------------------------------ kernel

    def _share(self, storages: List[Any], buffers: List[pickle.PickleBuffer]) -> None:
        for storage in storages:
            self.storages.append(self._share_storage(storage))
        if buffers:
            layout, end = [], 0
            for buffer in buffers:
                layout.append((buffer, end, buffer.raw().nbytes))
                end += -(-buffer.raw().nbytes // _ALIGN) * _ALIGN
            fd = shared_memory_file(end)
            self._buffer_file = mmap.mmap(fd, end)  # kept while the launch runs: ranks' pages stay shared
            self._release = weakref.finalize(self, _release, self._buffer_file, fd)  # a plan never run
            for buffer, offset, nbytes in layout:
                self._buffer_file[offset:offset + nbytes] = buffer.raw()
                self.buffers.append(Piece(len(self.shared_fds), offset, nbytes))
            self.shared_fds.append(fd)
            self.shared_sizes.append(end)

    def _share_storage(self, storage: Any) -> Piece:
        """Move the storage into shared memory in place (torch.multiprocessing's file-descriptor way)."""
        fd, size = _untyped(storage)._share_fd_cpu_()  # owned by torch's allocator: never closed by us
        self.shared_fds.append(fd)
        self.shared_sizes.append(size)
        return Piece(len(self.shared_fds) - 1, 0, _untyped(storage).nbytes(), dtype_name(storage))

    def close(self) -> None:
        if self._buffer_file is not None:
            self._release()
            self._buffer_file = None
        self.shared_fds, self.shared_sizes = [], []
        self._cuda_tensors = []

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__, _buffer_file=None, _cuda_tensors=[])
        state.pop("_release", None)
        state["shared_fds"] = [PassedFd(fd) for fd in self.shared_fds]
        return state

    # -------------------------------------------------------------------------------------------- rank

    def load(self) -> FunctionCall:
        """In a rank: the function and its arguments, large data mapped copy-on-write, not copied."""
        mappings = []
        for passed, size in zip(self.shared_fds, self.shared_sizes):
            fd = passed if isinstance(passed, int) else passed.fd
            mappings.append(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
            os.close(fd)
        storages = [storage_view(mappings[piece.file], piece) for piece in self.storages]
        buffers = [memoryview(mappings[piece.file])[piece.offset:piece.offset + piece.nbytes]
                   for piece in self.buffers]
        unpickler = SharedUnpickler(io.BytesIO(self.data), storages, buffers)
        call = unpickler.load()
        _remember_sources(unpickler.load())
        return call


@dataclass
class _PickledCall:
    """``(function, args, kwargs)`` pickled, with the large data set aside (not yet shared anywhere)."""

    data: bytes
    storages: List[Any]                     # torch TypedStorages, each ``("storage", index)`` in the pickle
    buffers: List[pickle.PickleBuffer]      # protocol-5 out-of-band buffers (numpy arrays), in pickle order
    cuda_tensors: List[Any]


def _pickle_call(function: Callable, args: Tuple, kwargs: Dict[str, Any], *, into_rank_namespace: bool,
                 ipc: bool = True) -> _PickledCall:
    """Pickle the call and the source lines its code needs; a clear error names what cannot be pickled.
    ``ipc``: CUDA tensors travel as CUDA IPC handles (ranks on this machine), else by value."""
    storages: List[Any] = []
    buffers: List[pickle.PickleBuffer] = []
    cuda_tensors: List[Any] = []
    out = io.BytesIO()
    pickler = (_SessionPickler if into_rank_namespace else SharingPickler)(out, storages, buffers, cuda_tensors,
                                                                            ipc=ipc)
    try:
        pickler.dump((function, args, kwargs))
    except Exception as err:
        culprit = find_unpicklable(function, args, kwargs)
        where = f": {culprit}" if culprit else ""
        # A session's ranks started before the object existed, and a cluster's ranks share nothing with the
        # kernel: forking cannot hand it over either.
        alternative = ("" if into_rank_namespace or not ipc else
                       ", or use start_method='fork', whose ranks inherit them")
        raise LaunchConfigError(
            f"cannot send the launched function to the ranks, because something it uses cannot be "
            f"pickled{where} ({type(err).__name__}: {err}). Create such objects (open files, locks, "
            f"sockets, CUDA streams, generators) inside the function instead of capturing them{alternative}."
        ) from err
    pickler.dump(pickler.sources())  # a second pickle in the same bytes: what the rank's linecache lacks
    pickler.clear_memo()  # it is in a cycle (its buffer callback): the memo must not keep the arguments alive
    data = out.getvalue()
    if len(data) >= LARGE_PAYLOAD_BYTES:
        warnings.warn(describe_large_payload(len(data), function, args, kwargs), stacklevel=5)
    return _PickledCall(data, storages, buffers, cuda_tensors)


@dataclass
class PortablePayload:
    """What a rank that shares no memory with the kernel receives (another machine: a Ray cluster's actor): the
    pickle, and each large tensor storage and out-of-band buffer beside it as one ``blob``.

    In the kernel a blob is a ``pickle.PickleBuffer`` over the data itself, so a transport that pickles with
    protocol 5 (Ray's object store) stores it once without a copy in the pickle; in the rank it is whatever
    buffer the transport hands over (Ray's: a read-only view of the node's object store, shared by every rank
    of that node). ``load`` gives the rank its own writable copy, as a local rank's copy-on-write mapping does.

    >>> payload = PortablePayload.create(len, ([1, 2],), {})
    >>> function, args, kwargs = payload.load()
    >>> function(*args)
    2
    """

    data: bytes
    storages: List[Piece] = field(default_factory=list)   # ``file``: the index of its blob
    buffers: List[Piece] = field(default_factory=list)
    blobs: List[Any] = field(default_factory=list)
    _keep: List[Any] = field(default_factory=list, repr=False)  # the kernel's storages, alive while blobs view them

    @classmethod
    def create(cls, function: Callable, args: Tuple, kwargs: Dict[str, Any], *,
               into_rank_namespace: bool = False) -> "PortablePayload":
        """Pickle the call for ranks elsewhere (CUDA tensors by value; see ``PickledPayload.create``)."""
        pickled = _pickle_call(function, args, kwargs, into_rank_namespace=into_rank_namespace, ipc=False)
        payload = cls(pickled.data, _keep=list(pickled.storages))
        for storage in pickled.storages:
            untyped = _untyped(storage)
            payload.storages.append(Piece(len(payload.blobs), 0, untyped.nbytes(), dtype_name(storage)))
            payload.blobs.append(pickle.PickleBuffer(_storage_memory(untyped)))
        for buffer in pickled.buffers:
            payload.buffers.append(Piece(len(payload.blobs), 0, buffer.raw().nbytes))
            payload.blobs.append(buffer)
        return payload

    def __getstate__(self) -> Dict[str, Any]:
        return dict(self.__dict__, _keep=[])

    def load(self) -> FunctionCall:
        """In a rank: the function and its arguments, each large tensor and array in memory of its own."""
        private = [bytearray(blob) for blob in self.blobs]  # one copy, from the transport's buffer
        storages = [storage_view(private[piece.file], piece) for piece in self.storages]
        buffers = [memoryview(private[piece.file])[piece.offset:piece.offset + piece.nbytes]
                   for piece in self.buffers]
        unpickler = SharedUnpickler(io.BytesIO(self.data), storages, buffers)
        call = unpickler.load()
        _remember_sources(unpickler.load())
        return call


def _storage_memory(untyped: Any) -> memoryview:
    """The bytes of a CPU storage as a flat byte buffer, without a copy (it views the storage: keep that alive).
    Cast to plain bytes ("B"): a ctypes array's own format ("<B") is one Ray's pickle-5 buffers cannot carry."""
    import ctypes

    return memoryview((ctypes.c_ubyte * untyped.nbytes()).from_address(untyped.data_ptr())).cast("B")


class SharedUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, storages: List[Any], buffers: List[memoryview]) -> None:
        super().__init__(file, buffers=buffers)
        self._storages = storages

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == RANK_NAMESPACE:
            return rank_namespace()
        return self._storages[pid[1]]

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        # cloudpickle writes a function's globals into its namespace with this; in a session's rank namespace
        # the rank's own names must win (``RankNames``).
        return _function_setstate_in_rank if found is _cloudpickle_function_setstate else found


class SharingPickler(cloudpickle.Pickler):
    """cloudpickle, with large CPU tensor storages and protocol-5 buffers set aside for shared memory, and CUDA
    tensors sent as CUDA IPC handles."""

    def __init__(self, file: io.BytesIO, storages: List[Any], buffers: List[pickle.PickleBuffer],
                 cuda_tensors: Optional[List[Any]] = None, *, ipc: bool = True) -> None:
        super().__init__(file, protocol=5, buffer_callback=self._out_of_band)
        self._storages = storages
        self._buffers = buffers
        self._cuda_tensors = cuda_tensors if cuda_tensors is not None else []
        self._storage_index: Dict[int, int] = {}
        self._source_files: Set[str] = set()
        torch = sys.modules.get("torch")
        self._typed_storage = getattr(getattr(torch, "storage", None), "TypedStorage", None)
        # plain tensors and parameters only: a tensor subclass keeps its own pickling. Without ``ipc`` (ranks on
        # other machines) a CUDA tensor is pickled by value, as torch pickles it.
        self._ipc_tensor_types = (torch.Tensor, torch.nn.Parameter) if torch is not None and ipc else ()

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) in self._ipc_tensor_types and obj.is_cuda:
            return self._share_cuda(obj)
        if type(obj) is types.CodeType and obj.co_filename != _DYNAMIC_CODE:
            # cloudpickle's own reduction, which names the file "<dynamic-code>", then the real name put back
            self._source_files.add(obj.co_filename)
            return _code_in_file, (obj.replace(co_filename=_DYNAMIC_CODE), obj.co_filename)
        return super().reducer_override(obj)

    def sources(self) -> Dict[str, List[str]]:
        """The lines of the files the pickled code comes from that a rank cannot read from disk (a notebook's
        cells: IPython keeps them in ``linecache`` only), by file name."""
        sources = {}
        for filename in sorted(self._source_files):
            if not os.path.isfile(filename):
                lines = linecache.getlines(filename)
                if lines:
                    sources[filename] = lines
        return sources

    def _share_cuda(self, tensor: Any) -> Any:
        """``torch.multiprocessing``'s own reduction: an IPC handle of the tensor's CUDA block, its offset and
        a shared reference count, rebuilt in the rank by ``rebuild_cuda_tensor`` without a copy."""
        from torch.multiprocessing.reductions import reduce_tensor

        self._cuda_tensors.append(tensor)
        return reduce_tensor(tensor)

    def persistent_id(self, obj: Any) -> Any:
        if self._typed_storage is None or type(obj) is not self._typed_storage:
            return None
        untyped = _untyped(obj)
        if untyped.device.type != "cpu" or untyped.nbytes() < SHARED_MIN_BYTES:
            return None
        key = untyped.data_ptr()  # views of one storage share it, as in torch.save
        if key not in self._storage_index:
            self._storage_index[key] = len(self._storages)
            self._storages.append(obj)
        return ("storage", self._storage_index[key])

    def _out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: pickle it in-band
            return True
        if raw.nbytes < SHARED_MIN_BYTES:
            return True
        self._buffers.append(buffer)
        return False


RANK_NAMESPACE = "rank namespace"
_DYNAMIC_CODE = "<dynamic-code>"  # cloudpickle's file name for the code it pickles by value
_cloudpickle_function_setstate = _cloudpickle_internals._function_setstate
_thread_names = threading.local()
_MISSING = object()


class RankNames:
    """A warm session rank's namespace, and whose each of its names is: the rank's own or the kernel's.

    The rule, after ipyparallel's engine namespace (a function's globals resolve on the engine): a name the rank
    set itself — ``global x`` in a run, a ``%%ranks`` cell, ``push`` — is the rank's own. What a run carries from
    the kernel never replaces it: the run's functions see the rank's value (``shadowed`` names the kernel
    values ignored). The kernel's globals that a run's functions use fill every other name and stay the
    kernel's: the next run that uses one brings the kernel's value as it is then (a helper edited, a setting
    changed), and objects built from them (a model whose ``forward`` calls a notebook helper) keep working in
    later cells. A forked rank's namespace starts as a copy of the kernel's: those names are the kernel's too.

    A name is the kernel's while it holds the very object the kernel gave it; bound to anything else by the
    rank, it is the rank's.
    """

    def __init__(self, namespace: Dict[str, Any]) -> None:
        self.namespace = namespace
        self._from_kernel: Dict[str, Any] = dict(namespace)  # name -> the object the kernel gave it
        self._shadowed: Set[str] = set()

    def owned_by_rank(self, name: str) -> bool:
        value = self.namespace.get(name, _MISSING)
        return value is not _MISSING and value is not self._from_kernel.get(name, _MISSING)

    def fill(self, sent: Dict[str, Any]) -> Dict[str, Any]:
        """Of the kernel's values a function brings, the ones to write into the namespace: all but the rank's
        own names."""
        kept = {}
        for name, value in sent.items():
            if self.owned_by_rank(name):
                # the same object (a module, anything pickled by reference) shadows nothing worth a note
                if self.namespace[name] is not value and not (name.startswith("__") and name.endswith("__")):
                    self._shadowed.add(name)
                continue
            kept[name] = value
            self._from_kernel[name] = value
        return kept

    def settle(self) -> List[str]:
        """After a task: the names the rank rebound or deleted are no longer the kernel's (their old objects are
        let go). Returns the names whose kernel value a run ignored since the last call."""
        for name in [name for name, value in self._from_kernel.items()
                     if self.namespace.get(name, _MISSING) is not value]:
            del self._from_kernel[name]
        shadowed, self._shadowed = sorted(self._shadowed), set()
        return shadowed


def rank_namespace() -> Dict[str, Any]:
    """A warm session's rank namespace: its ``__main__``, or the one its thread was given (TPU ranks are threads
    of one process, each with a namespace of its own)."""
    names = getattr(_thread_names, "names", None)
    return names.namespace if names is not None else sys.modules["__main__"].__dict__


def set_thread_rank_names(names: Optional[RankNames]) -> None:
    """This thread serves a session rank whose namespace ``names`` keeps (None: it no longer does)."""
    _thread_names.names = names


def _function_setstate_in_rank(function: Any, state: Any) -> None:
    """cloudpickle's ``_function_setstate``, except that a function whose globals are a session rank's namespace
    writes there only the kernel's names the rank does not own (``RankNames.fill``)."""
    names = getattr(_thread_names, "names", None)
    if names is not None and function.__globals__ is names.namespace:
        attributes, slots = state
        state = (attributes, dict(slots, __globals__=names.fill(slots["__globals__"])))
    _cloudpickle_function_setstate(function, state)


def _code_in_file(code: types.CodeType, filename: str) -> types.CodeType:
    return code.replace(co_filename=filename)


def _remember_sources(sources: Dict[str, List[str]]) -> None:
    """Put the kernel's source lines into this process's ``linecache``, as IPython keeps a cell's."""
    for filename, lines in sources.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


class _SessionPickler(SharingPickler):
    """For a warm session: the globals cloudpickle gives the notebook's functions (one fresh dict per pickle,
    holding the names they use) are the rank's namespace instead, so names only the rank has resolve there and
    ``global x`` in a function sets the rank's ``x`` for later runs and cells. Which of the kernel's values are
    written into it: ``RankNames``."""

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is dict and obj.get("__name__") == "__main__" and \
                any(obj is made for made in self.globals_ref.values()):
            return (RANK_NAMESPACE,)
        return super().persistent_id(obj)


def _release(mapping: mmap.mmap, fd: int) -> None:
    mapping.close()
    os.close(fd)


def _untyped(storage: Any) -> Any:
    return storage._untyped_storage  # TypedStorage's own accessors warn that TypedStorage is deprecated


def dtype_name(storage: Any) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return str(storage.dtype).replace("torch.", "")


def storage_view(mapping: mmap.mmap, piece: Piece) -> Any:
    """A torch storage of ``piece.dtype`` over ``piece``'s bytes of ``mapping``, without a copy (the storage keeps
    the mapping alive)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is what torch's own unpickling rebuilds tensors from
        untyped = torch.frombuffer(mapping, dtype=torch.uint8, count=piece.nbytes,
                                   offset=piece.offset).untyped_storage()
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=getattr(torch, piece.dtype),
                                          _internal=True)


def shared_memory_file(size: int, name: str = "notebook_accel-payload") -> int:
    """An anonymous file in memory (Linux memfd; elsewhere an unlinked temp file) of ``size`` bytes: gone with
    the last fd and mapping of it, whoever holds them, so nothing is left behind in /dev/shm or a temp dir."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:  # pragma: no cover - macOS
        import tempfile

        handle, path = tempfile.mkstemp(prefix=f"{name}-")
        os.unlink(path)
        fd = handle
    os.ftruncate(fd, size)
    return fd


# ----------------------------------------------------------------------------------------- error messages

def find_unpicklable(function: Callable, args: Tuple, kwargs: Dict[str, Any]) -> str:
    """A human description of the first object that cloudpickle refuses, e.g. "captured variable 'lock'"."""
    for label, value in _candidates(function, args, kwargs):
        try:
            cloudpickle.dumps(value)
        except Exception as err:
            return f"{label} ({type(value).__name__}: {err})"
    return ""


def describe_large_payload(size: int, function: Callable, args: Tuple, kwargs: Dict[str, Any]) -> str:
    """Say how big the pickled payload is and which captured objects make it so (the three largest)."""
    sizes = []
    for label, value in _candidates(function, args, kwargs):
        if label == "the function itself":
            continue
        try:
            sizes.append((_pickled_size(value), label, type(value).__name__))
        except Exception:
            continue
    largest = ", ".join(f"{label} ({type_name}, {_mib(nbytes)})"
                        for nbytes, label, type_name in sorted(sizes, reverse=True)[:3])
    return (f"notebook_accel: the launched function is {_mib(size)} once pickled, copied to every rank "
            f"through a pipe (largest: {largest}). Tensors and numpy arrays travel through shared memory "
            f"instead; for other large data, build it inside the function or load it there from a file.")


def _pickled_size(value: Any) -> int:
    """Bytes ``value`` adds to the payload's pickle (what goes to shared memory excluded)."""
    out = io.BytesIO()
    SharingPickler(out, [], []).dump(value)
    return out.tell()


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.0f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.0f} KiB"


def _candidates(function: Callable, args: Tuple, kwargs: Dict[str, Any]) -> Iterator[Tuple[str, Any]]:
    for index, value in enumerate(args):
        yield f"args[{index}]", value
    for key, value in kwargs.items():
        yield f"kwargs[{key!r}]", value
    code = getattr(function, "__code__", None)
    closure = getattr(function, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, closure):
            try:
                yield f"captured variable {name!r}", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        function_globals = getattr(function, "__globals__", {})
        for name in _global_names(code):
            if name in function_globals:
                yield f"global {name!r}", function_globals[name]
    yield "the function itself", function


def _global_names(code) -> List[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):  # nested functions / comprehensions
            names.extend(_global_names(const))
    return names
