"""The TPU backend on the real torch_xla 2.9, on its CPU client (``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2``: one
worker process, a thread per device, exactly the shape of a TPU v2/v3 chip). Marked ``xla``: kept out of the
default run; ``scripts/test_xla_cpu.sh`` runs it in the torch_xla venv (README, "TPU").

XLA:CPU collectives between device threads only meet when both threads run the *same* executable: XLA names
the in-process rendezvous of a collective after its channel id, or when it has none (torch_xla's cross-replica
ones have none) after the HloModule's unique id. torch_xla compiles a graph on a cache miss in whichever thread
gets there, so two threads reaching a new collective graph at the same moment compile it twice, get two module
ids, wait in two different rendezvous, and XLA aborts the worker after 10 s ("Termination timeout"). So the
functions below cut their graphs one thread at a time (``serialized_sync``), and keep rank-dependent Python
scalars out of collective graphs (they are baked in as constants and make the threads' graphs differ).
"""
from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

torch_xla = pytest.importorskip("torch_xla")

from notebook_accel.wire.events import OutputLine, ProgressUpdate, RankExited, RankStarted  # noqa: E402
from notebook_accel.errors import LaunchError  # noqa: E402
from notebook_accel.launcher import start_launch  # noqa: E402
from scripts import Recorder  # noqa: E402

pytestmark = [pytest.mark.xla, pytest.mark.timeout(300)]

_SYNC_LOCK = threading.Lock()


@pytest.fixture(autouse=True)
def cpu_client(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")


def launch(function, *args, **options):
    recorder = Recorder()
    job = start_launch(function, args, view=recorder, device="xla", **options)
    try:
        return job.wait(240), recorder
    except BaseException as error:
        error.recorder = recorder
        raise


def serialized_sync():
    """Cut the lazy graph one device thread at a time, so the second thread finds the first one's executable
    in torch_xla's cache instead of compiling its own (see the module docstring)."""
    import torch_xla

    with _SYNC_LOCK:
        torch_xla.sync()


# ------------------------------------------------------------------------------------ launched functions

def device_result():
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    from tqdm import tqdm

    device = torch_xla.device()
    model = torch.nn.Linear(4, 2).to(device)
    for _ in tqdm(range(3), desc=f"xla {xr.global_ordinal()}"):
        out = model(torch.ones(3, 4).to(device)).sum()
        torch_xla.sync()
    print(f"device {xr.global_ordinal()} of {xr.world_size()} says hello")
    return xr.global_ordinal(), xr.world_size(), str(device), os.getpid(), float(out.cpu())


def all_reduce_agrees():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    values = []
    for step in range(3):
        mine = torch.full((4,), float(xr.global_ordinal() + step)).to(torch_xla.device())  # data, not constant
        total = xm.all_reduce(xm.REDUCE_SUM, mine)
        serialized_sync()
        values.append(total.cpu().tolist())
    return values


def collective_graphs_differ():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    # ``* (ordinal + 1)`` puts a different constant in each thread's graph: two executables, two module ids.
    total = xm.all_reduce(xm.REDUCE_SUM, torch.ones(4, device=torch_xla.device()) * (xr.global_ordinal() + 1))
    return total.cpu().tolist()


def device_one_fails():
    import torch
    import torch_xla
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 1:
        raise RuntimeError("device one gave up")
    torch.ones(2).to(torch_xla.device()).sum().item()
    time.sleep(60)  # a peer still running: the launcher must stop it


# ----------------------------------------------------------------------------------------------- tests

def test_each_device_returns_its_result_and_reports_progress():
    results, recorder = launch(device_result, return_all=True)
    assert [(ordinal, world) for ordinal, world, *_ in results] == [(0, 2), (1, 2)]
    assert {device for _, _, device, _, _ in results} == {"xla:0", "xla:1"}
    assert results[0][3] == results[1][3] != os.getpid()  # two threads of one worker, not the kernel
    for rank in (0, 1):
        bars = [update for update in recorder.of(ProgressUpdate) if update.rank == rank]
        assert bars and bars[-1].closed and bars[-1].n == 3 and bars[-1].desc == f"xla {rank}"
        assert f"device {rank} of 2 says hello" in [line.text for line in recorder.of(OutputLine)
                                                     if line.rank == rank]
    assert not psutil.Process().children(recursive=True) or _only_kept_helpers()


def test_an_xla_all_reduce_agrees():
    results, _ = launch(all_reduce_agrees, return_all=True)
    expected = [[float(1 + 2 * step)] * 4 for step in range(3)]  # (0 + step) + (1 + step)
    assert results == [expected, expected]


def test_a_failing_device_is_named_and_its_peer_stopped():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="device one gave up") as raised:
        launch(device_one_fails)
    assert raised.value.rank == 1
    assert time.monotonic() - started < 50
    exits = {event.rank: event for event in raised.value.recorder.of(RankExited)}
    assert exits[1].exitcode == 1 and exits[0].stopped
    pids = {event.pid for event in raised.value.recorder.of(RankStarted)}
    assert pids and not any(_running(pid) for pid in pids)


def test_collectives_that_cannot_meet_end_with_the_worker_named():
    """What the earlier "deadlock on the first compile" was: the threads wait in different rendezvous, XLA
    aborts the worker after its 10 s termination timeout; the launch names it instead of hanging."""
    with pytest.raises(LaunchError, match="was killed by SIGABRT") as raised:
        launch(collective_graphs_differ)
    output = "\n".join(line.text for line in raised.value.recorder.of(OutputLine))
    assert "Termination timeout for `all reduce RendezvousKey" in output
    assert "op_id=" in output


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _only_kept_helpers() -> bool:
    kept = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
    return all(any(k in " ".join(child.cmdline()) for k in kept) for child in psutil.Process().children(True))


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_the_seeds_transformer_trains_with_the_accelerator(monkeypatch, precision):
    """One device: the Accelerator's XLA path (device, MpDeviceLoader, bf16 autocast on XLA, optimizer step,
    reduce/gather) on real torch_xla. Two device threads would need collectives between threads, which on the
    CPU client abort unless every graph cut is serialized (module docstring), which prepare()'s own
    collectives (broadcast of rank 0's weights, mesh_reduce) are not."""
    from xla_examples import transformer_example

    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    (result,), _ = launch(transformer_example, 8, return_all=True, mixed_precision=precision)
    assert (result["kind"], result["device"], result["world"], result["precision"]) == ("XLA", "xla", 1, precision)
    assert result["loader"] == "XlaDeviceLoader" and result["ranks"] == [0] and result["objects"] == ["rank 0"]
    assert len(result["losses"]) == 8 * 64 // 8
    assert sum(result["losses"][-8:]) < 0.8 * sum(result["losses"][:8]), result["losses"]  # it learns
