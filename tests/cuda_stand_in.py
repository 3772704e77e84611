"""A stand-in CUDA driver: this machine as one with CUDA installed (a GPU-less driver), for want of a GPU.

What changes on such a machine is the driver library in pytest's own process, not the GPU:

- ``import torch`` (torch's CUDA wheels; torch 2.9+cu128 checked) maps ``libcuda.so.1``: cuBLASLt opens it when it
  loads, without initializing it (no ``cuInit``). Forking after that is safe.
- ``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``, which initializes the driver (``cuInit``): from then on
  a forked child cannot use it, and the launcher rightly refuses ``start_method="fork"``. Called by a test module
  at import, every later test that forks would fail. Under ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (tests/conftest.py
  sets it) torch asks NVML instead and initializes nothing.

The stand-in, compiled at test time (gcc): ``libcuda.so.1``, a driver with no device (``cuInit`` says
``CUDA_ERROR_NO_DEVICE``; ``cuCtxGetCurrent`` says ``CUDA_ERROR_NOT_INITIALIZED`` until ``cuInit`` ran, as CUDA's
does; the CUDA runtime finds its functions through ``cuGetProcAddress``), and ``libnvidia-ml.so.1``, NVML answering
0 devices (the driver package ships both). With them on ``LD_LIBRARY_PATH``, torch 2.9+cu128 behaves as listed above
(tests/test_cuda_stand_in.py checks it when such a torch is at hand: ``CUDA_TORCH_PYTHON``).

``install`` gives pytest's process (torch here is a CPU build) the same: the driver mapped from the start, and
``torch.cuda.is_available`` / ``device_count`` as the CUDA build runs them (torch's own ``_device_count_nvml``, its
``CDLL`` finding the stand-in NVML; else ``cudaGetDeviceCount``, which initializes the stand-in driver). Scripts,
kernels and spawned ranks the tests start run the plain CPU build. Run the suite, or some files, with it::

    NOTEBOOK_ACCEL_CUDA_STAND_IN=1 pytest -q tests/test_launcher.py tests/test_session.py ...
"""
from __future__ import annotations

import ctypes
import os
import subprocess
from typing import Dict

VARIABLE = "NOTEBOOK_ACCEL_CUDA_STAND_IN"

LIBCUDA = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_NOT_FOUND = 500 };
static int init_calls = 0;
int stand_in_init_calls(void) { return init_calls; }      /* not CUDA's: how often cuInit ran */
CUresult cuInit(unsigned int flags) { init_calls++; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return CUDA_SUCCESS; }  /* 580: CUDA 12.x and 13.x builds */
CUresult cuDeviceGetCount(int *count) { *count = 0; return init_calls ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_NOT_INITIALIZED; }
CUresult cuCtxGetCurrent(void **context) { *context = 0; return init_calls ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_NOT_INITIALIZED; }
/* The CUDA runtime finds every driver function through cuGetProcAddress: the stand-in's own, by name. */
CUresult cuGetProcAddress_v2(const char *symbol, void **function, int version, unsigned long long flags,
                             int *status) {
    *function = dlsym(RTLD_DEFAULT, symbol);
    if (status) *status = *function ? 0 : 1;
    return *function ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
CUresult cuGetProcAddress(const char *symbol, void **function, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, function, version, flags, 0);
}
CUresult cuGetExportTable(const void **table, const void *id) { *table = 0; return CUDA_ERROR_NOT_FOUND; }
"""

LIBNVML = r"""
#include <string.h>
int nvmlInit(void) { return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned int flags) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount(unsigned int *count) { *count = 0; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 0; return 0; }
int nvmlSystemGetDriverVersion(char *version, unsigned int length) { strncpy(version, "580.0", length); return 0; }
const char *nvmlErrorString(int result) { return "NVML stand-in"; }
"""


def built_or_skip(tmp_path_factory) -> str:
    """A module fixture's stand-in driver, built in a fresh temp folder; the test skips where no C compiler is."""
    import pytest

    folder = str(tmp_path_factory.mktemp("cuda_stand_in"))
    try:
        build(folder)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"no C compiler to build the stand-in driver: {error}")
    return folder


def build(folder: str) -> Dict[str, str]:
    """Compile the two libraries into ``folder``; their paths by soname."""
    os.makedirs(folder, exist_ok=True)
    built = {}
    for soname, source in (("libcuda.so.1", LIBCUDA), ("libnvidia-ml.so.1", LIBNVML)):
        path = os.path.join(folder, soname)
        if not os.path.exists(path):
            subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", path, "-x", "c", "-"],
                           input=source, text=True, check=True, capture_output=True)
        built[soname] = path
    return built


def install(folder: str) -> Dict[str, str]:
    """Make this process's torch behave as a CUDA build of torch (torch 2.9+cu128, checked) on a machine whose
    driver is the stand-in: the driver is mapped as ``import torch`` maps it (cuBLASLt opens it, without
    ``cuInit``), NVML is found by its soname, and ``cudaGetDeviceCount`` initializes the driver."""
    import torch
    import torch.cuda

    libraries = build(folder)
    ctypes.CDLL(libraries["libnvidia-ml.so.1"])   # loaded by path once, torch's CDLL("libnvidia-ml.so.1") finds it
    driver = ctypes.CDLL(libraries["libcuda.so.1"])

    def cuda_get_device_count() -> int:
        """The CUDA runtime's cudaGetDeviceCount: initializes the driver (cuInit), then counts (0: no device)."""
        if driver.cuInit(0) != 0:
            return 0
        count = ctypes.c_int(0)
        driver.cuDeviceGetCount(ctypes.byref(count))
        return count.value

    def device_count() -> int:
        """torch.cuda.device_count of a CUDA build: NVML first, cudaGetDeviceCount if NVML cannot answer."""
        counted = torch.cuda._device_count_nvml()
        return cuda_get_device_count() if counted < 0 else counted

    def is_available() -> bool:
        """torch.cuda.is_available of a CUDA build: through NVML under PYTORCH_NVML_BASED_CUDA_CHECK=1, else
        cudaGetDeviceCount (which initializes the driver)."""
        if torch.cuda._nvml_based_avail():
            return device_count() > 0
        return cuda_get_device_count() > 0

    # Only these two: the rest of torch stays the CPU build it is (torch._dynamo, for one, imports CUDA-only
    # symbols once torch.cuda says it was compiled with CUDA).
    torch.cuda.device_count, torch.cuda.is_available = device_count, is_available
    return libraries


def init_calls() -> int:
    """How often the stand-in driver's ``cuInit`` ran in this process."""
    return ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD).stand_in_init_calls()


def driver_loaded() -> bool:
    """The (stand-in or real) CUDA driver library is mapped into this process."""
    with open("/proc/self/maps") as maps:
        return any("/libcuda.so" in line for line in maps)
