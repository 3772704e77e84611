"""The fake runtime's state: topology from the environment, the current thread's device, initialization."""
import glob
import os
import re
import threading
import time

import torch

initialized = False
compiled = False  # the computation cache exists once something ran (a collective, here)
replicated = False
_thread = threading.local()


def initialize() -> None:
    """Using a device initializes the runtime, as creating the PJRT client does in torch_xla."""
    global initialized
    initialized = True


# Graph cuts, recorded per thread: what the thread did since it started ("step_marker", "sync_multi", and
# the collectives xla_model ran), and how often two threads were compiling at once. Compiling takes time on
# XLA; the fake spends CUT_SECONDS, so cuts of two threads that are not serialized overlap here as they do there.
CUT_SECONDS = 0.005
overlapping_cuts = 0
_cutting = 0
_cuts_lock = threading.Lock()


def record(event: str) -> None:
    if not hasattr(_thread, "events"):
        _thread.events = []
    _thread.events.append(event)


def thread_events() -> list:
    return list(getattr(_thread, "events", []))


def cut_graph(kind: str) -> None:
    global _cutting, overlapping_cuts
    record(kind)
    with _cuts_lock:
        _cutting += 1
        overlapping_cuts += _cutting > 1
    time.sleep(CUT_SECONDS)
    with _cuts_lock:
        _cutting -= 1


def device_type() -> str:
    chosen = os.environ.get("PJRT_DEVICE")
    if chosen:
        return chosen.upper()
    return "TPU" if tpu_chips() else "CPU"  # torch_xla's _maybe_select_default_device


def tpu_chips() -> int:
    """torch_xla._internal.tpu.num_available_chips, on the tests' fake sysfs."""
    root = os.environ.get("NOTEBOOK_ACCEL_SYSFS_ROOT", "/")
    count = 0
    for vendor in glob.glob(os.path.join(root, "sys", "bus", "pci", "devices", "*", "vendor")):
        device = os.path.join(os.path.dirname(vendor), "device")
        if _read(vendor) == "0x1ae0" and _read(device) in ("0x0027", "0x005e", "0x0063", "0x006f", "0x0056",
                                                           "0x0062", "0x0076"):
            count += 1
    return count


def tpu_version() -> int:
    match = re.match(r"^(?:v|tpu)(\d)([A-Za-z]?){7}-(\d+)$", os.environ.get("TPU_ACCELERATOR_TYPE", ""))
    if not match:
        raise EnvironmentError("Failed to parse TPU version from metadata")
    return int(match.group(1))


def num_local_processes() -> int:
    return tpu_chips() if device_type() == "TPU" else 1


def devices_per_process() -> int:
    """Addressable devices of one worker: one chip's cores on TPU, CPU_NUM_DEVICES on the CPU client."""
    if device_type() == "TPU":
        return 2 if tpu_version() <= 3 else 1
    return int(os.environ.get("CPU_NUM_DEVICES", "1"))


def local_process_rank() -> int:
    return int(os.environ.get("PJRT_LOCAL_PROCESS_RANK", "0"))


def set_thread_device(index: int) -> None:
    _thread.index = index


def thread_device_index() -> int:
    return getattr(_thread, "index", 0)


def ordinal_of(index: int) -> int:
    return local_process_rank() * devices_per_process() + index


def global_ordinal() -> int:
    return ordinal_of(thread_device_index()) if replicated else 0


def world_size() -> int:
    return num_local_processes() * devices_per_process() if replicated else 1


def current_device() -> torch.device:
    initialize()
    return torch.device("cpu")


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip().lower()
    except OSError:
        return ""
