"""Which TPU is attached here, found without importing torch_xla's runtime or initializing XLA.

A runtime initialized in the kernel makes every later ``xmp.spawn`` fail (pytorch/xla#7765), so the kernel
only reads what torch_xla's own pre-spawn helpers read (``torch_xla._internal.tpu``): TPU chips on the PCI
bus (Google's vendor id 0x1ae0 and a TPU device id), the generation from ``TPU_ACCELERATOR_TYPE`` (Cloud TPU
VMs, Colab and Kaggle set it), 2 XLA devices per chip on v2/v3 and 1 on later generations, and
``PJRT_DEVICE``.

``NOTEBOOK_ACCEL_SYSFS_ROOT`` points the PCI scan at another tree (the tests' fake sysfs); it defaults to "/".
"""
from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass
from typing import Optional

SYSFS_ROOT_VARIABLE = "NOTEBOOK_ACCEL_SYSFS_ROOT"
GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device id -> TPU generation, as torch_xla 2.9 lists them (it also counts two test-only ids as TPUs).
TPU_PCI_DEVICES = {"0x0027": "v2/v3", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e",
                   "0x0076": "v7", "0x0056": "test"}
# Cloud TPU API names that differ from the marketing ones people know.
_GENERATION_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}


@dataclass(frozen=True)
class TpuInfo:
    """The TPU attached to this host: ``chips`` on the PCI bus, ``devices_per_chip`` XLA devices each.

    >>> TpuInfo(chips=4, devices_per_chip=2, generation="v2", accelerator_type="v2-8").describe()
    'TPU v2 × 8'
    """

    chips: int
    devices_per_chip: int
    generation: Optional[str]          # "v2", "v4", "v5e", ... None when no accelerator type is known
    accelerator_type: Optional[str]    # as the platform reports it: "v2-8", "v5litepod-8", ...
    platform: Optional[str] = None     # "Colab" | "Kaggle" | None

    @property
    def devices(self) -> int:
        """XLA devices (TPU cores) on this host: what ``xmp.spawn(nprocs=None)`` runs on."""
        return self.chips * self.devices_per_chip

    def describe(self) -> str:
        where = f" ({self.platform})" if self.platform else ""
        return f"TPU {self.generation or '(unknown generation)'} × {self.devices}{where}"


def sysfs_root() -> str:
    return os.environ.get(SYSFS_ROOT_VARIABLE, "/")


def pci_tpu_chips(root: Optional[str] = None) -> list:
    """Generations of the TPU chips on the PCI bus, one entry per chip (empty: no TPU here)."""
    base = os.path.join(root or sysfs_root(), "sys", "bus", "pci", "devices")
    chips = []
    for vendor_path in sorted(glob.glob(os.path.join(base, "*", "vendor"))):
        vendor = _read(vendor_path)
        device = _read(os.path.join(os.path.dirname(vendor_path), "device"))
        if vendor == GOOGLE_PCI_VENDOR and device in TPU_PCI_DEVICES:
            chips.append(TPU_PCI_DEVICES[device])
    return chips


def generation_of(accelerator_type: Optional[str]) -> Optional[str]:
    """``"v5litepod-8"`` -> ``"v5e"``, ``"v3-8"`` -> ``"v3"``; None when it cannot be read."""
    if not accelerator_type:
        return None
    match = re.match(r"^(?:v|tpu)(\d)([a-z]*)-\d+$", accelerator_type.strip().lower())
    if not match:
        return None
    name = f"v{match.group(1)}{match.group(2)}"
    return _GENERATION_ALIASES.get(name, name)


def devices_per_chip(generation: Optional[str]) -> int:
    """2 XLA devices per chip on v2 and v3 (two TensorCores driven separately), 1 on v4 and later."""
    return 2 if generation in ("v2", "v3") else 1


def platform() -> Optional[str]:
    """The notebook service we run on, for people: "Colab", "Kaggle" or None."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ:
        return "Colab"
    if any(name.startswith("KAGGLE_") for name in os.environ):
        return "Kaggle"
    return None


def detect_tpu(root: Optional[str] = None) -> Optional[TpuInfo]:
    """The TPU attached here, or None. Never imports torch_xla.

    ``PJRT_DEVICE`` set to anything but "TPU" means the user chose another PJRT client: no TPU then.

    >>> info = detect_tpu()          # on a Kaggle v5e-8: TpuInfo(chips=8, devices_per_chip=1, ...)
    >>> info is None or info.devices > 0
    True
    """
    pjrt = os.environ.get("PJRT_DEVICE", "").upper()
    if pjrt and pjrt != "TPU":
        return None
    chips = pci_tpu_chips(root)
    if not chips:
        return None
    accelerator_type = os.environ.get("TPU_ACCELERATOR_TYPE") or None
    generation = generation_of(accelerator_type)
    if generation is None and chips[0] not in ("v2/v3", "test"):
        generation = chips[0]  # the PCI id names every generation but v2 and v3 (which share one id)
    return TpuInfo(chips=len(chips), devices_per_chip=devices_per_chip(generation), generation=generation,
                   accelerator_type=accelerator_type, platform=platform())


def xla_cpu_devices() -> Optional[int]:
    """``PJRT_DEVICE=CPU``: torch_xla's CPU client with ``CPU_NUM_DEVICES`` devices (default 1)."""
    if os.environ.get("PJRT_DEVICE", "").upper() != "CPU":
        return None
    value = os.environ.get("CPU_NUM_DEVICES", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def runtime_initialized() -> bool:
    """True once the XLA runtime (the PJRT client) is up in this process: a fork of it cannot use the TPU,
    and ``xmp.spawn`` refuses to start. Importing torch_xla alone does not initialize it."""
    torch_xla = sys.modules.get("torch_xla")
    xlac = getattr(torch_xla, "_XLAC", None) if torch_xla is not None else None
    probe = getattr(xlac, "_xla_runtime_is_initialized", None)
    if probe is None:
        return False
    try:
        return bool(probe())
    except Exception:
        return False


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip().lower()
    except OSError:
        return ""
