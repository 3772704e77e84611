"""Fake TPU hosts for tests (this machine has no TPU): a sysfs tree with the PCI devices a TPU VM shows, the
variables its platform sets, and the fake ``torch_xla`` package (``tests/fake_torch_xla``) on the path.

``NOTEBOOK_ACCEL_SYSFS_ROOT`` points notebook_accel's PCI scan (and the fake torch_xla's) at the tree.
"""
from __future__ import annotations

import os
from typing import Dict

from scripts import script_env

FAKE_TORCH_XLA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_torch_xla")

# name -> (chips, PCI device id, TPU_ACCELERATOR_TYPE, devices a launch gets, what people are shown)
HOSTS = {
    "v2-8": (4, "0x0027", "v2-8", 8, "TPU v2 × 8"),             # Colab's former TPU runtime
    "v4-8": (4, "0x005e", "v4-8", 4, "TPU v4 × 4"),             # GCP TPU VM (megacore: 1 device per chip)
    "v5e-1": (1, "0x0063", "v5litepod-1", 1, "TPU v5e × 1"),    # Colab's TPU runtime today
    "v5e-8": (8, "0x0063", "v5litepod-8", 8, "TPU v5e × 8"),    # Kaggle's
    "none": (0, None, None, 0, None),                           # a CPU box
    "v5e-2": (2, "0x0063", "v5litepod-2", 2, "TPU v5e × 2"),    # not sold: a small host for launch tests
}


def make_sysfs(root: str, host: str) -> str:
    """Write the PCI devices of ``host`` (plus a NIC and a GPU-less bridge that are not TPUs) under ``root``."""
    chips, device_id, _, _, _ = HOSTS[host]
    devices = os.path.join(root, "sys", "bus", "pci", "devices")
    entries = [("0x8086", "0x1237"), ("0x1af4", "0x1000")] + [("0x1ae0", device_id)] * chips
    for slot, (vendor, device) in enumerate(entries):
        path = os.path.join(devices, f"0000:00:{slot + 1:02x}.0")
        os.makedirs(path)
        with open(os.path.join(path, "vendor"), "w") as handle:
            handle.write(vendor + "\n")
        with open(os.path.join(path, "device"), "w") as handle:
            handle.write(device + "\n")
    return root


def tpu_env(root: str, host: str, *, fake_torch_xla: bool = True) -> Dict[str, str]:
    """Variables that make this process look like ``host``: fake sysfs, accelerator type, PJRT_DEVICE."""
    _, _, accelerator_type, _, _ = HOSTS[host]
    env = {"NOTEBOOK_ACCEL_SYSFS_ROOT": make_sysfs(root, host)}
    if accelerator_type:
        env.update(TPU_ACCELERATOR_TYPE=accelerator_type, PJRT_DEVICE="TPU")
    if fake_torch_xla:
        # In front of the path scripts get anyway (the notebook_accel under test: installed, or the checkout)
        env["PYTHONPATH"] = FAKE_TORCH_XLA + os.pathsep + script_env()["PYTHONPATH"]
    return env


def tpu_host_env(root: str, host: str) -> Dict[str, str]:
    """The whole environment of a script or kernel started on ``host`` (``tpu_env`` over ``script_env``)."""
    return {**script_env(), **tpu_env(root, host)}


def become_tpu_host(monkeypatch, root: str, host: str) -> None:
    """Make this process (and every process it starts) look like ``host``, the fake torch_xla importable."""
    for name in ("PJRT_DEVICE", "TPU_ACCELERATOR_TYPE", "CPU_NUM_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for key, value in tpu_env(root, host).items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(FAKE_TORCH_XLA)
