"""A warm start where CUDA is live: ``import notebook_accel`` in a kernel whose CUDA driver is initialised starts the
fork server in the background, so the first launch of CPU ranks finds it warm (issue 37).

No GPU here: the kernel is a fresh interpreter on the suite's stand-in CUDA driver (tests/cuda_stand_in.py), which
``cudaGetDeviceCount`` initialises as a real one is — after that, fork is unsafe and ranks come from the fork server.
tests/test_cuda_machine.py does the same on a real GPU.
"""
from __future__ import annotations

import os
import time

import psutil
import pytest

import cuda_stand_in
from scripts import run_script

pytestmark = pytest.mark.timeout(300)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> str:
    return cuda_stand_in.built_or_skip(tmp_path_factory)


KERNEL = """
import os, sys, time
sys.path.insert(0, {here!r})
if {cuda_live!r}:
    import cuda_stand_in
    cuda_stand_in.install({folder!r})
import torch
if {cuda_live!r}:
    torch.cuda.is_available()   # cudaGetDeviceCount: the driver is initialised, CUDA is live in this "kernel"
import multiprocessing.forkserver as forkserver
from scripts import Recorder

began = time.monotonic()
import notebook_accel
print("IMPORT=" + str(round(time.monotonic() - began, 4)))
time.sleep(0.5)   # the background thread: imports the backend, asks whether CUDA is live
from notebook_accel.backends.processes import warm_start
warm = warm_start.wait(120)
print("WARM=" + str(None if warm is None else (warm.ready is not None, warm.error, warm.skipped)))
print("SERVER BEFORE=" + str(forkserver._forkserver._forkserver_pid))

def pid_of_rank():
    return os.getpid()

from notebook_accel.launcher import start_launch
from notebook_accel.wire.events import LaunchStarted
view = Recorder()
began = time.monotonic()
pids = start_launch(pid_of_rank, num_processes=2, device="cpu", view=view, return_all=True).wait(120)
print("FIRST LAUNCH=" + str(round(time.monotonic() - began, 3)))
print("SERVER AFTER=" + str(forkserver._forkserver._forkserver_pid))
started = view.of(LaunchStarted)[0]
print("START METHOD=" + str(started.start_method))
print("HEADER=" + str(started.start_up))
"""


def run_kernel(stand_in: str, cuda_live: bool, **env: str):
    env = {"NOTEBOOK_ACCEL_WARM_START": "1", **env}  # conftest.py turns it off for the rest of the suite
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        done = run_script(KERNEL.format(here=HERE, folder=stand_in, cuda_live=cuda_live), timeout=240)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def server_gone(pid: int) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def test_where_cuda_is_live_the_import_starts_the_fork_server_and_the_first_launch_reuses_it(stand_in):
    # The stand-in initialises only when torch's availability check is not NVML's (conftest.py's setting)
    out = run_kernel(stand_in, cuda_live=True, PYTORCH_NVML_BASED_CUDA_CHECK="")
    assert out["WARM"] == "(True, None, None)", out
    server = int(out["SERVER BEFORE"])  # the server ran before any launch asked for it...
    assert out["SERVER AFTER"] == str(server), out  # ...and the launch used it: no second server
    assert out["START METHOD"] == "forkserver", out
    assert out["HEADER"].startswith("fork server warm (started at import, ready in "), out
    assert float(out["IMPORT"]) < 5, out  # the import itself does not wait for the server (a hang bound)
    assert server_gone(server), "the fork server outlived its kernel"
    print("first launch, warm:", out["FIRST LAUNCH"], "s")


def test_with_the_warm_start_off_the_first_launch_starts_the_server(stand_in):
    out = run_kernel(stand_in, cuda_live=True, PYTORCH_NVML_BASED_CUDA_CHECK="", NOTEBOOK_ACCEL_WARM_START="0")
    assert out["WARM"] == "None" and out["SERVER BEFORE"] == "None", out
    assert out["START METHOD"] == "forkserver" and out["HEADER"] == "", out
    assert server_gone(int(out["SERVER AFTER"]))
    print("first launch, cold:", out["FIRST LAUNCH"], "s")


def test_without_cuda_the_import_starts_nothing(stand_in):
    out = run_kernel(stand_in, cuda_live=False)
    assert out["WARM"] == "None" and out["SERVER BEFORE"] == "None", out  # torch's CPU build: not even a thread
    assert out["START METHOD"] == "fork", out


def test_a_child_of_a_kernel_that_has_a_fork_server_still_warms_its_own(stand_in):
    """A kernel that started a fork server leaves its mark in its environment (the server's owner), which every
    child of it inherits: a script run from a cell, a test's subprocess. Such a child is not that fork server — it
    is a kernel in its own right, and where CUDA is live its import starts its own warm fork server."""
    out = run_kernel(stand_in, cuda_live=True, PYTORCH_NVML_BASED_CUDA_CHECK="",
                     NOTEBOOK_ACCEL_FORKSERVER_OWNER=f"{os.getpid()}:/tmp/pymp-of-another-kernel")
    assert out["WARM"] == "(True, None, None)", out
    assert server_gone(int(out["SERVER BEFORE"]))
