"""The stand-in CUDA driver (tests/cuda_stand_in.py) behaves as a machine with CUDA does, and there fork stays
safe after ``import torch`` and an NVML-based availability check, and not after ``cudaGetDeviceCount``.

Checked against a real CUDA build of torch when one is at hand: ``CUDA_TORCH_PYTHON`` names its python (CI uses
the torch 2.9+cu128 of the XLA venv).
"""
from __future__ import annotations

import os
import subprocess

import pytest

import cuda_stand_in
from notebook_accel.plan.devices import cuda_device_count
from scripts import run_script, script_env

pytestmark = pytest.mark.timeout(120)

# Asked at import, before the suite hides the GPUs from this file's tests (conftest.py).
REAL_GPUS = cuda_device_count()

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> str:
    return cuda_stand_in.built_or_skip(tmp_path_factory)


PROBE = """
import os, sys
sys.path.insert(0, {here!r})
import cuda_stand_in
cuda_stand_in.install({folder!r})
import torch
from notebook_accel.plan.devices import cuda_device_count, fork_safety

def state(when):
    print(when, cuda_stand_in.driver_loaded(), cuda_stand_in.init_calls(), fork_safety())

state("IMPORTED")
print("AVAILABLE", torch.cuda.is_available(), cuda_device_count())
state("ASKED")
"""


@pytest.mark.skipif(REAL_GPUS > 0, reason="a real CUDA driver is here, and torch's CUDA build maps it beside the "
                                          "stand-in: tests/test_cuda_machine.py checks the real thing")
@pytest.mark.parametrize("nvml_check", ["1", ""])
def test_fork_is_safe_until_something_initializes_the_driver(stand_in, nvml_check, monkeypatch):
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", nvml_check)
    done = run_script(PROBE.format(here=HERE, folder=stand_in))
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "IMPORTED True 0 (True, None)" in out, out  # mapped as `import torch` maps it: fork is safe
    assert "AVAILABLE False 0" in out, out
    if nvml_check:  # NVML answered: nothing initialized
        assert "ASKED True 0 (True, None)" in out, out
    else:  # cudaGetDeviceCount initialized the driver: fork is refused, and says why
        assert "ASKED True 1 (False, 'a CUDA driver is initialized in this process" in out, out


CUDA_TORCH = """
import ctypes, os
import torch
driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
print("IMPORTED", torch.version.cuda is not None, driver.stand_in_init_calls())
print("AVAILABLE", torch.cuda.is_available(), driver.stand_in_init_calls())
"""


@pytest.mark.skipif(not os.environ.get("CUDA_TORCH_PYTHON"), reason="no CUDA build of torch named (CUDA_TORCH_PYTHON)")
@pytest.mark.parametrize("nvml_check", ["1", ""])
def test_a_cuda_build_of_torch_does_with_the_stand_in_what_the_emulation_does(stand_in, nvml_check):
    env = {**script_env(), "LD_LIBRARY_PATH": stand_in, "PYTORCH_NVML_BASED_CUDA_CHECK": nvml_check,
           "PYTHONPATH": ""}
    done = subprocess.run([os.environ["CUDA_TORCH_PYTHON"], "-c", CUDA_TORCH], env=env, capture_output=True,
                          text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "IMPORTED True 0" in done.stdout, done.stdout + done.stderr[-2000:]  # mapped at import, not initialized
    assert f"AVAILABLE False {0 if nvml_check else 1}" in done.stdout, done.stdout + done.stderr[-2000:]


def test_the_suite_asks_nvml():
    # conftest.py's setting, inherited by everything the tests start
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
