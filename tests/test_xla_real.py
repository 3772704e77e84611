"""The TPU backend on the real torch_xla 2.9, on its CPU client (``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2``: one
worker process, a thread per device, exactly the shape of a TPU v2/v3 chip). Marked ``xla``: kept out of the
default run; ``scripts/test_xla_cpu.sh`` runs it in the torch_xla venv (docs/tpu.md), and ``.ci/run`` runs it
when that venv is there.

The launched functions are TPU code as users write it, unmodified: on the CPU client the launcher serializes
the graph cuts and gives each collective its own graph (``notebook_accel/rank/xla/cpu_client.py`` says why),
without which 4 of 5 such launches aborted (SIGABRT, "Termination timeout").
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

torch_xla = pytest.importorskip("torch_xla")

from notebook_accel.wire.events import OutputLine, ProgressUpdate, RankExited, RankStarted  # noqa: E402
from notebook_accel.errors import LaunchError  # noqa: E402
from notebook_accel.launcher import start_launch  # noqa: E402
from scripts import Recorder  # noqa: E402

pytestmark = [pytest.mark.xla, pytest.mark.timeout(300)]

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
        mine = torch.full((4,), float(xr.global_ordinal() + step)).to(torch_xla.device())
        values.append(xm.all_reduce(xm.REDUCE_SUM, mine).cpu().tolist())
    return values


def rank_dependent_constants():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    # ``* (ordinal + 1)`` puts a different constant in each thread's graph; fine on a TPU. On the CPU client
    # it would make two executables with two rendezvous unless the collective has a graph of its own.
    total = xm.all_reduce(xm.REDUCE_SUM, torch.ones(4, device=torch_xla.device()) * (xr.global_ordinal() + 1))
    gathered = xm.all_gather(torch.full((1,), float(xr.global_ordinal()), device=torch_xla.device()))
    return total.cpu().tolist(), gathered.cpu().tolist()


def only_device_zero_joins():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 0:  # its peer never joins: XLA aborts the worker after its termination timeout
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(4, device=torch_xla.device())).cpu()
    time.sleep(60)


def optimizer_step_loop(barrier: bool):
    """A raw torch_xla training loop: MpDeviceLoader, xm.optimizer_step, and either its barrier or a sync."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    from torch.utils.data import DataLoader, TensorDataset

    device = torch_xla.device()
    model = torch.nn.Linear(8, 1).to(device)
    xm.broadcast_master_param(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=8)
    losses = []
    for _ in range(3):
        for x, y in pl.MpDeviceLoader(data, device):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            xm.optimizer_step(optimizer, barrier=barrier)
            if not barrier:
                torch_xla.sync()
            losses.append(loss.detach())
    return [float(loss.cpu()) for loss in losses]


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


def test_an_xla_all_reduce_agrees_launch_after_launch():
    expected = [[float(1 + 2 * step)] * 4 for step in range(3)]  # (0 + step) + (1 + step)
    for _ in range(3):  # "two launches in a row" was one of the aborts
        results, _ = launch(all_reduce_agrees, return_all=True)
        assert results == [expected, expected]


def test_collectives_over_rank_dependent_graphs_meet():
    results, _ = launch(rank_dependent_constants, return_all=True)
    assert results == [([3.0] * 4, [0.0, 1.0])] * 2


@pytest.mark.parametrize("barrier", [True, False])
def test_a_raw_torch_xla_loop_trains_on_two_devices(barrier):
    first, second = launch(optimizer_step_loop, barrier, return_all=True)[0]
    assert first == second  # the gradients were all-reduced: the replicas stayed identical
    assert len(first) == 24 and sum(first[-4:]) < 0.5 * sum(first[:4]), first


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


def test_a_collective_only_one_device_joins_ends_with_the_worker_named():
    """XLA aborts the worker after its 10 s termination timeout; the launch names it instead of hanging."""
    with pytest.raises(LaunchError, match="was killed by SIGABRT") as raised:
        launch(only_device_zero_joins)
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
def test_the_seeds_transformer_trains_with_the_accelerator(precision):
    """Two device threads: the Accelerator's XLA path (device, MpDeviceLoader, bf16 autocast on XLA, the
    broadcast of rank 0's weights, gradient all-reduce, reduce/gather) on real torch_xla, code unmodified."""
    import torch
    from xla_examples import transformer_example

    results, _ = launch(transformer_example, 8, return_all=True, mixed_precision=precision)
    first, second = results
    assert (first["kind"], first["device"], first["world"], first["precision"]) == ("XLA", "xla", 2, precision)
    assert first["loader"] == "XlaDeviceLoader" and first["ranks"] == [0, 1]
    assert first["objects"] == ["rank 0", "rank 1"]
    assert first["losses"] == second["losses"] and len(first["losses"]) == 8 * 64 // 16
    assert sum(first["losses"][-4:]) < 0.8 * sum(first["losses"][:4]), first["losses"]  # it learns
    for name, value in first["weights"].items():  # XLA's gradient all-reduce kept the replicas identical
        assert torch.equal(value, second["weights"][name]), name


def test_uneven_data_syncs_at_the_epochs_end_and_gathers_every_sample():
    """torch_xla's MpDeviceLoader prefetches in a thread: what counts is the batch the user holds."""
    from xla_examples import uneven_epoch_example

    results, _ = launch(uneven_epoch_example, 21, 2, 4, return_all=True)
    for result in results:
        assert result["world"] == 2 and result["batches"] == 6
        assert result["gathered"] == [float(value) for value in range(21)], result
        assert result["syncs"] == [4, 6], result


def test_xla_tensors_come_back_to_a_kernel_without_torch_xla(tmp_path):
    """The kernel never imports torch_xla (it must not start the runtime there): a tensor and a state dict on
    the XLA device come back as CPU tensors."""
    code = textwrap.dedent("""
        import sys, torch
        from notebook_accel import notebook_launcher

        def on_device():
            import torch, torch_xla
            model = torch.nn.Linear(3, 2).to(torch_xla.device())
            return torch.arange(4.0, device=torch_xla.device()) * 2, model.state_dict()

        results = notebook_launcher(on_device, device="xla", return_all=True, display="none", timeout=200)
        (tensor, state), _ = results
        print("TENSOR", tensor.device, tensor.tolist())
        print("STATE", sorted((name, str(value.device)) for name, value in state.items()))
        print("IMPORTED", "torch_xla" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TENSOR cpu [0.0, 2.0, 4.0, 6.0]" in out.stdout, out.stdout
    assert "STATE [('bias', 'cpu'), ('weight', 'cpu')]" in out.stdout, out.stdout
    assert "IMPORTED False" in out.stdout, out.stdout


# ------------------------------------------------------------------------------------------ a warm session

SESSION_CELL = {"__name__": "__main__", "os": os}
exec(textwrap.dedent("""
    def load_model():
        global model, device
        import torch
        import torch_xla
        device = torch_xla.device()
        model = torch.nn.Linear(4, 2)
        with torch.no_grad():  # the same start on every device (device threads share torch's CPU generator)
            model.weight.fill_(0.1), model.bias.fill_(0.0)
        model = model.to(device)
        return str(device)

    def train_step(lr):
        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        loss = model(torch.ones(3, 4, device=device)).pow(2).sum()
        loss.backward()
        xm.optimizer_step(optimizer)
        torch_xla.sync()
        return xr.global_ordinal(), float(loss.cpu()), os.getpid()
"""), SESSION_CELL)


def test_a_session_keeps_its_device_threads_and_model_across_runs():
    """TPU code in a warm session on the real CPU client: the model loaded by one run is trained by the next
    ones, on the same worker process, and gradients are all-reduced (both devices see the same loss)."""
    from notebook_accel import Session

    with Session(device="xla", display="none") as session:
        assert session.num_processes == 2
        devices = session.run(SESSION_CELL["load_model"], return_all=True)
        assert len(devices) == 2 and all(device.startswith("xla") for device in devices), devices
        first = session.run(SESSION_CELL["train_step"], args=(0.01,), return_all=True)
        second = session.run(SESSION_CELL["train_step"], args=(0.01,), return_all=True)
        assert [ordinal for ordinal, _, _ in first] == [0, 1]
        assert first[0][1] == pytest.approx(first[1][1]) and second[0][1] == pytest.approx(second[1][1])
        assert second[0][1] < first[0][1]  # the same model, trained further
        assert {pid for *_, pid in first} == {pid for *_, pid in second}  # the same worker took both runs
        session.execute("import torch_xla.runtime as xr\nxr.global_ordinal() + 100")
