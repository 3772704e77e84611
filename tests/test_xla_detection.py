"""TPU detection from a fake sysfs (no TPU here), num_processes rules, and that the kernel never initializes
XLA. The fake hosts (tests/fake_tpu.py) are the PCI devices and variables of v2-8, v4-8, v5e-1, v5e-8 VMs."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fake_tpu import FAKE_TORCH_XLA, HOSTS, tpu_env, tpu_host_env
from notebook_accel.plan import devices as environment, tpu
from notebook_accel.errors import LaunchConfigError
from notebook_accel.plan.plan import plan_launch


def cuda_here() -> bool:
    """On a GPU machine CUDA comes first ("CUDA, then TPU, then MPS, then CPU"): the expectations say so. Asked when
    the test runs: the suite hides a machine's GPUs from tests not marked ``cuda`` (conftest.py)."""
    return environment.cuda_device_count() > 0

TPU_VARIABLES = ("PJRT_DEVICE", "TPU_ACCELERATOR_TYPE", "CPU_NUM_DEVICES", "NOTEBOOK_ACCEL_SYSFS_ROOT",
                 "COLAB_TPU_ADDR", "COLAB_RELEASE_TAG", "COLAB_GPU")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Make this process look like a TPU host; the fake torch_xla importable."""
    for name in TPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in [name for name in os.environ if name.startswith("KAGGLE_")]:
        monkeypatch.delenv(name)
    monkeypatch.syspath_prepend(FAKE_TORCH_XLA)

    def become(name: str) -> None:
        for key, value in tpu_env(str(tmp_path / name), name, fake_torch_xla=False).items():
            monkeypatch.setenv(key, value)

    return become


@pytest.mark.parametrize("name", ["v2-8", "v4-8", "v5e-1", "v5e-8"])
def test_each_tpu_host_is_detected_from_pci(host, name):
    chips, _, accelerator_type, devices, shown = HOSTS[name]
    host(name)
    info = tpu.detect_tpu()
    assert info is not None and info.chips == chips and info.devices == devices
    assert info.devices_per_chip == (2 if name == "v2-8" else 1)
    assert info.accelerator_type == accelerator_type
    assert environment.describe("xla").description == shown
    assert environment.describe("xla").count == devices
    assert environment.best_device() == ("cuda" if cuda_here() else "xla")  # a TPU runtime's default is xla
    assert [d.kind for d in environment.available_devices()] == (["cuda"] if cuda_here() else []) + ["xla", "cpu"]


def test_no_tpu_on_a_cpu_box(host):
    host("none")
    assert tpu.detect_tpu() is None
    assert environment.best_device() == ("cuda" if cuda_here() else "cpu")
    assert environment.describe("xla").count == 0
    with pytest.raises(LaunchConfigError, match="no TPU is attached here"):
        plan_launch(print, device="xla")


def test_generation_comes_from_pci_when_no_accelerator_type(host, monkeypatch):
    host("v5e-8")
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE")
    assert environment.describe("xla").description == "TPU v5e × 8"
    host_v2 = tpu.TpuInfo(4, tpu.devices_per_chip(None), None, None)
    assert host_v2.describe() == "TPU (unknown generation) × 4"  # v2 and v3 share a PCI id: not guessed


def test_platform_is_named(host, monkeypatch):
    host("v5e-8")
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert environment.describe("xla").description == "TPU v5e × 8 (Kaggle)"
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20250101")
    assert environment.describe("xla").description == "TPU v5e × 8 (Colab)"


def test_pjrt_device_cpu_selects_the_xla_cpu_client(host, monkeypatch):
    host("v5e-8")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    assert tpu.detect_tpu() is None
    assert environment.describe("xla").description == "XLA CPU client × 2"
    assert plan_launch(print, device="xla", display="none").world_size == 2


@pytest.mark.parametrize("name, asked, expected", [
    ("v5e-8", None, 8), ("v5e-8", 1, 1), ("v5e-8", 8, 8), ("v2-8", None, 8), ("v4-8", None, 4),
    ("v5e-1", None, 1), ("v5e-1", 1, 1)])
def test_num_processes_as_pjrt_allows(host, name, asked, expected):
    host(name)
    plan = plan_launch(print, num_processes=asked, device="xla", display="none")
    assert plan.world_size == expected and plan.device == "xla"


@pytest.mark.parametrize("name, asked", [("v5e-8", 4), ("v5e-8", 9), ("v2-8", 2), ("v4-8", 8), ("v5e-1", 2)])
def test_other_num_processes_are_refused_before_anything_starts(host, name, asked):
    host(name)
    with pytest.raises(LaunchConfigError, match=r"on XLA a launch runs on 1 device or on all|more than"):
        plan_launch(print, num_processes=asked, device="xla", display="none")


def test_fp16_is_refused_on_xla(host):
    host("v5e-8")
    with pytest.raises(LaunchConfigError, match="bf16"):
        plan_launch(print, device="xla", mixed_precision="fp16", display="none")


def test_missing_torch_xla_is_named(tmp_path, monkeypatch):
    for key, value in tpu_env(str(tmp_path), "v5e-8", fake_torch_xla=False).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(environment, "torch_xla_importable", lambda: False)
    with pytest.raises(LaunchConfigError, match="needs torch_xla"):
        plan_launch(print, device="xla")
    assert environment.best_device() == ("cuda" if cuda_here() else "cpu")  # a TPU without torch_xla: not xla


@pytest.mark.parametrize("use", ["torch_xla.device()", "torch_xla.runtime.global_device_count()",
                                 "torch_xla.runtime.addressable_device_count()", "torch_xla.device_count()"])
def test_fork_safety_is_about_the_runtime_not_the_import(tmp_path, use):
    """In a fresh process: importing torch_xla keeps fork safe; using an XLA device, or asking the runtime how
    many devices there are (that starts the PJRT client in torch_xla 2.9 too), does not, and a launch then
    says why before starting anything."""
    code = f"""
import torch_xla
import torch_xla.runtime
from notebook_accel.plan import devices as environment
from notebook_accel.plan.plan import plan_launch
print("IMPORTED", environment.fork_safety()[0])
{use}
print("USED", environment.fork_safety())
try:
    plan_launch(print, device="xla")
except Exception as error:
    print("REFUSED", type(error).__name__, error)
"""
    env = tpu_host_env(str(tmp_path), "v5e-8")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED True" in out.stdout
    assert "USED (False, 'the XLA runtime is already initialized" in out.stdout
    assert "REFUSED LaunchConfigError the XLA runtime is already initialized in this notebook" in out.stdout


def test_detection_never_imports_torch_xla(tmp_path):
    code = """
import sys
from notebook_accel.plan import devices as environment
from notebook_accel.plan.plan import plan_launch
from notebook_accel.cli import describe_environment
print(describe_environment())
plan_launch(print, display="none")
print("IMPORTED", "torch_xla" in sys.modules)
"""
    env = tpu_host_env(str(tmp_path), "v5e-8")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED False" in out.stdout
    if cuda_here():
        assert re.search(r"^best device:\s+cuda ", out.stdout, re.MULTILINE), out.stdout
    else:
        assert "best device:    xla (TPU v5e × 8)" in out.stdout


@pytest.mark.parametrize("name", ["v5e-8", "none"])
def test_cli_env_shows_the_tpu(tmp_path, name):
    env = tpu_host_env(str(tmp_path), name)
    out = subprocess.run([sys.executable, "-m", "notebook_accel.cli", "env"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if name == "none":
        missing = "xla, mps" if cuda_here() else "cuda, xla, mps"
        assert re.search(rf"^not here:\s+{missing}$", out.stdout, re.MULTILINE), out.stdout
        assert "TPU" not in out.stdout
    else:
        assert re.search(r"^xla:\s+up to 8 ranks - TPU v5e × 8$", out.stdout, re.MULTILINE), out.stdout


def test_panel_lists_the_tpu(host):
    host("v5e-8")
    from notebook_accel.panel import launch_panel

    panel = launch_panel(print)
    assert "<b>xla</b>: TPU v5e × 8" in panel.devices_html.value
    assert panel.device == ("cuda" if cuda_here() else "xla")
    panel.device = "xla"
    assert panel.processes_picker.max == 8
