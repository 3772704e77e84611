"""What is here: accelerators and their counts, whether fork is safe, the IPython shell we run in. Never initializes
CUDA in the kernel."""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..formatting import count as count_of
from ..wire.choices import Device
from . import tpu

DEVICES = Device.values()


@dataclass(frozen=True)
class DeviceInfo:
    """One kind of device and how many ranks it can host."""

    kind: str
    count: int
    description: str


def ipython_shell() -> Optional[object]:
    """The IPython shell this code runs in (a Jupyter kernel's, a terminal IPython's), or None; never imports it."""
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def cuda_device_count() -> int:
    """Number of CUDA devices. ``torch.cuda.device_count`` asks NVML first, so CUDA stays uninitialized."""
    if "torch" not in sys.modules and not _torch_importable():
        return 0
    import torch

    if not torch.backends.cuda.is_built():
        return 0
    return torch.cuda.device_count()


def cuda_initialized() -> bool:
    """True once CUDA was initialized in this process; forking after that gives broken children."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def mps_available() -> bool:
    if sys.platform != "darwin" or not _torch_importable():
        return False
    import torch

    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def tpu_detected() -> bool:
    """TPU chips are on this host's PCI bus (Colab, Kaggle, Cloud TPU VM), read without touching torch_xla."""
    return tpu.detect_tpu() is not None


def torch_xla_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def cpu_count() -> int:
    """Cores this process may run on (respects CPU affinity / container limits where the OS reports them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def best_device() -> str:
    """The device a launch uses when none is named: CUDA, then TPU, then MPS, then CPU."""
    return available_devices()[0].kind


def available_devices() -> List[DeviceInfo]:
    """The device kinds a launch can use here, best first (CPU always last and always present)."""
    found = []
    for kind in ("cuda", "xla", "mps", "cpu"):
        if kind == "xla" and not ((tpu_detected() or tpu.xla_cpu_devices()) and torch_xla_importable()):
            continue
        info = describe(kind)
        if info.count > 0:
            found.append(info)
    return found


def describe(kind: str) -> DeviceInfo:
    """How many ranks ``kind`` can host here, with words for people ("2 CUDA devices", "16 CPU cores"), read after
    the kind as "cpu (16 CPU cores)"."""
    if kind == "cuda":
        count = cuda_device_count()
        return DeviceInfo("cuda", count, count_of(count, "CUDA device"))
    if kind == "xla":
        return describe_xla()
    if kind == "mps":
        return DeviceInfo("mps", 1 if mps_available() else 0, "Apple MPS (one device)")
    cores = cpu_count()
    return DeviceInfo("cpu", cores, count_of(cores, "CPU core"))


def why_absent(kind: str) -> str:
    """Why this machine has no ``kind`` device (CUDA, MPS), for the error that refuses it.

    >>> why_absent("mps")  # doctest: +SKIP
    'MPS is Apple silicon's GPU, on macOS only'
    """
    if kind == "mps":
        return "MPS is Apple silicon's GPU, on macOS only" if sys.platform != "darwin" else \
            "torch says MPS is not available here (torch.backends.mps.is_available())"
    if kind != "cuda":
        return f"there is no {kind} device here"
    if "torch" not in sys.modules and not _torch_importable():
        return "torch is not installed"
    import torch

    if not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) is built without CUDA (a CPU-only wheel)"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and not hidden.strip(","):
        return f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
    return "the CUDA driver sees no GPU here (nvidia-smi lists what the machine has)"


def fork_safety() -> Tuple[bool, Optional[str]]:
    """Whether forking the kernel gives working ranks; when not, the reason for people."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return False, f"fork does not exist on {sys.platform}"
    if sys.platform == "darwin":
        return False, "on macOS, system libraries are not fork-safe (CPython's own default there is spawn)"
    if cuda_initialized():
        return False, "CUDA is already initialized in this process, and a forked child cannot use it"
    if cuda_driver_initialized():
        return False, ("a CUDA driver is initialized in this process (by a library such as cupy, numba, jax or a C "
                       "extension), and a forked child cannot use it")
    if tpu.runtime_initialized():
        return False, ("the XLA runtime is already initialized in this process (an XLA device was used), and "
                       "a forked child cannot use the TPU")
    if ray_threads_running():
        return False, ("Ray's threads run in this process (ray.init() starts them; they stay after ray.shutdown()): "
                       "they do not survive fork, and a forked rank may crash (SIGSEGV)")
    group = kernel_process_group()
    if group:
        return False, (f"a torch.distributed process group ({group}) is initialized in this process; forked "
                       f"ranks would inherit it and hang in their first collective or train alone. End it "
                       f"with torch.distributed.destroy_process_group() (accelerator.end_training() for an "
                       f"Accelerator)")
    return True, None


RAY_THREAD_PREFIXES = ("grpc", "gcs_client", "event_engine")  # named by Ray's core worker (Linux thread names)


def ray_threads_running() -> bool:
    """``ray.init()`` ran in this process: Ray is imported and says it is initialized, or its gRPC threads are still
    here (``ray.shutdown()`` leaves them). Importing Ray alone starts no thread, and Ray is never imported here."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        if ray.is_initialized():
            return True
    except Exception:  # a partly imported or foreign module named ray
        pass
    try:
        names = os.listdir("/proc/self/task")
    except OSError:  # not Linux
        return False
    for task in names:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith(RAY_THREAD_PREFIXES):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_driver_initialized() -> bool:
    """A CUDA driver library is mapped into this process *and* initialized (``cuInit`` ran: cupy, numba, jax, a C
    extension, torch's own ``cudaGetDeviceCount``): a forked child cannot use it. Mapped alone is harmless, and
    common: torch's CUDA wheels map it at ``import torch`` (cuBLASLt opens it) without initializing it.

    Nothing is initialized to find out: /proc/self/maps says whether it is mapped; the mapped library itself
    (opened with ``RTLD_NOLOAD``: never loaded here) answers ``cuCtxGetCurrent`` with CUDA_ERROR_NOT_INITIALIZED
    until ``cuInit`` ran. A driver that cannot be asked counts as initialized. Every mapped copy is asked: a library
    that loads its own by path (a bundled or compat driver) beside the system's one torch mapped may be the one
    initialized.
    """
    try:
        with open("/proc/self/maps") as maps:
            mapped = {line.split(None, 5)[-1].strip() for line in maps if "/libcuda.so" in line}
    except OSError:  # not Linux
        return False
    return any(_driver_initialized(path) for path in sorted(mapped))


def _driver_initialized(path: str) -> bool:
    try:
        driver = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        context = ctypes.c_void_p()
        return driver.cuCtxGetCurrent(ctypes.byref(context)) != CUDA_ERROR_NOT_INITIALIZED
    except (OSError, AttributeError):
        return True


def kernel_process_group() -> Optional[str]:
    """A description of the default torch.distributed process group of this process, if one exists."""
    torch = sys.modules.get("torch")
    distributed = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if distributed is None or not distributed.is_available() or not distributed.is_initialized():
            return None
        return f"backend {distributed.get_backend()}, world size {distributed.get_world_size()}"
    except Exception:
        return None


def describe_xla() -> DeviceInfo:
    """XLA devices here: the TPU's cores ("TPU v5e × 8"), or torch_xla's CPU client under
    ``PJRT_DEVICE=CPU`` ("XLA CPU client × 2"); a count of 0 when neither."""
    cpu_devices = tpu.xla_cpu_devices()
    if cpu_devices:
        return DeviceInfo("xla", cpu_devices, f"XLA CPU client × {cpu_devices}")
    info = tpu.detect_tpu()
    if info is None:
        return DeviceInfo("xla", 0, "no TPU")
    return DeviceInfo("xla", info.devices, info.describe())


def _torch_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None
