"""A machine with a real GPU: what the rest of the suite can only fake (NVML, a live CUDA driver in the kernel).

Skipped without CUDA (none on the CI machine); run on a GPU machine as ``pytest tests/test_cuda_machine.py``.
CUDA is never initialized in pytest's process (a later fork would be refused): the "kernel" with CUDA live is a
fresh interpreter, and CUDA work runs in ranks.
"""
from __future__ import annotations

import os

import pytest

from notebook_accel.errors import LaunchConfigError
from notebook_accel.launcher import start_launch
from notebook_accel.plan.devices import cuda_device_count
from notebook_accel.plan.plan import plan_launch
from notebook_accel.wire.events import ResourceSample
from scripts import Recorder, run_script

GPUS = cuda_device_count()  # asked through NVML: nothing is initialized here
GIB = 2 ** 30
pytestmark = [pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device (none on this machine)"),
              pytest.mark.timeout(240)]


def holds_two_gib_on_its_gpu() -> int:
    import time

    import torch
    from tqdm.auto import tqdm

    block = torch.ones(2 * GIB // 4, device="cuda")  # 2 GiB through torch's caching allocator
    for _ in tqdm(range(40)):  # 4 s of progress: the kernel samples about once a second
        time.sleep(0.1)
    return int(block.numel() * 4)


@pytest.mark.cuda
def test_nvml_and_torch_figures_of_a_ranks_gpu_reach_the_kernel():
    """The dashboard's GPU column: NVML's memory in use on the rank's GPU (asked by the kernel) and torch's own
    peak (reported by the rank) both show the rank's 2 GiB."""
    view = Recorder()
    job = start_launch(holds_two_gib_on_its_gpu, num_processes=1, device="cuda", start_method="spawn", view=view)
    assert job.wait(180) == 2 * GIB
    samples = [event for event in view.events if isinstance(event, ResourceSample) and event.rank == 0]
    assert samples, "no resource sample of rank 0"
    used = max(sample.device_used or 0 for sample in samples)
    total = max(sample.device_total or 0 for sample in samples)
    peak_allocated = max(sample.device_peak_allocated or 0 for sample in samples)
    assert used >= 2 * GIB and total > used, (used, total)  # NVML: the whole device, the rank's 2 GiB within it
    assert peak_allocated >= 2 * GIB, peak_allocated       # torch.cuda.max_memory_allocated, from the rank


KERNEL_WITH_CUDA_LIVE = """
import os
import torch
import torch.distributed as dist
from notebook_accel import notebook_launcher
from notebook_accel.errors import LaunchConfigError
from notebook_accel.plan.plan import plan_launch

model = torch.nn.Linear(64, 1).to("cuda")   # an earlier cell put the model on the GPU: CUDA is live
weights = torch.arange(4.0)

def total_on_cpu_ranks():
    dist.init_process_group("gloo")
    total = weights.sum() * (dist.get_rank() + 1)
    dist.all_reduce(total)
    return dist.get_rank(), total.item()

def one_step_on_the_gpu():
    from notebook_accel import Accelerator
    accelerator = Accelerator()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    loss = prepared(torch.ones(8, 64, device=accelerator.device)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    return str(accelerator.device), os.getpid()

if __name__ == "__main__":
    print("PLAN", plan_launch(total_on_cpu_ranks, num_processes=2, device="cpu").start_method)
    print("CPU", notebook_launcher(total_on_cpu_ranks, num_processes=2, device="cpu", display="none",
                                   return_all=True))
    try:
        notebook_launcher(total_on_cpu_ranks, num_processes=2, device="cpu", start_method="fork", display="none")
    except LaunchConfigError as refused:
        print("FORK REFUSED", str(refused).replace("\\n", " "))
    device, pid = notebook_launcher(one_step_on_the_gpu, display="none")  # the defaults: every GPU here
    print("DEFAULT", device, "IN THE KERNEL" if pid == os.getpid() else "IN A RANK", torch.cuda.device_count())
    device, pid = notebook_launcher(one_step_on_the_gpu, num_processes=1, start_method="spawn", display="none")
    print("SPAWNED", device, "IN THE KERNEL" if pid == os.getpid() else "IN A RANK")
"""


@pytest.mark.cuda
def test_a_kernel_with_cuda_live_launches_cpu_ranks_and_gpu_ranks():
    """The Colab/Kaggle pattern on a real driver: CUDA live in the kernel. CPU ranks come from the fork server (a
    forked child of an initialized driver cannot use CUDA), ``start_method='fork'`` is refused before any process
    starts and says why, and the kernel's CUDA model trains in a launched rank."""
    done = run_script(KERNEL_WITH_CUDA_LIVE, timeout=220)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "PLAN forkserver" in out, out
    assert "CPU [(0, 18.0), (1, 18.0)]" in out, out
    assert "FORK REFUSED" in out and "CUDA" in out.split("FORK REFUSED")[1].splitlines()[0], out
    assert f"DEFAULT cuda:0 {'IN THE KERNEL' if GPUS == 1 else 'IN A RANK'} {GPUS}" in out, out
    assert "SPAWNED cuda:0 IN A RANK" in out, out


@pytest.mark.cuda
def test_more_ranks_than_gpus_is_refused_with_the_way_to_cpu_ranks():
    """Colab's one GPU and ``num_processes=2`` (the quick start's call before it named device='cpu')."""
    with pytest.raises(LaunchConfigError, match=rf"num_processes={GPUS + 1} is more than the {GPUS} cuda devices "
                                                r"here \(for CPU ranks, pass device='cpu'\)"):
        plan_launch(print, num_processes=GPUS + 1)


@pytest.mark.cuda
def test_a_test_marked_cuda_sees_the_gpus():
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "" and cuda_device_count() == GPUS


def test_a_test_not_marked_cuda_sees_none():
    """conftest.py hides the GPUs from the tests about CPU ranks, which name no device (see there)."""
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and cuda_device_count() == 0


IN_KERNEL_OUT_OF_MEMORY = """
import torch
from notebook_accel import notebook_launcher
from notebook_accel.launcher import last_launch

torch.ones(1, device="cuda")   # an earlier cell used the GPU: CUDA is live, the launch runs in the kernel
total = torch.cuda.get_device_properties(0).total_memory

def asks_for_more_than_the_card():
    torch.empty(3 * total, dtype=torch.uint8, device="cuda")

try:
    notebook_launcher(asks_for_more_than_the_card, display="none")
except torch.OutOfMemoryError:
    job = last_launch()
    print("BACKEND", job.backend.name)
    print("TOTAL", total)
    print("LINE", job.out_of_memory)
"""


@pytest.mark.cuda
def test_a_real_cuda_out_of_memory_in_the_kernel_says_what_was_asked_the_cards_memory_and_a_real_peak():
    """The issue's case on a real card: in the kernel, the line said only "peak GPU memory per rank: rank 0: 512 B".
    Now it says how much was asked, the card's total and free memory, and what the process held (CUDA's context
    included) as the rank's peak."""
    from notebook_accel.formatting import format_bytes

    done = run_script(IN_KERNEL_OUT_OF_MEMORY, timeout=120)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "BACKEND inline" in out, out
    total = int(out.split("TOTAL ")[1].split()[0])
    line = out.split("LINE ")[1].splitlines()[0]
    assert line.startswith(f"rank 0 ran out of GPU memory (CUDA out of memory): asked for {format_bytes(3 * total)} "
                           f"on GPU 0 ({format_bytes(total)} in all, "), line
    peak = line.split("peak GPU memory per rank: rank 0: ")[1].split(";")[0]
    assert peak.endswith("MiB") or peak.endswith("GiB"), line  # the process's CUDA context at least, not 512 B


# ----------------------------------------------------------------------- one GPU, a model bigger than its memory

CAP = 4 * GIB  # the card is made this small for the rank (set_per_process_memory_fraction), whatever its size


def layers_whose_weights_exceed(cap: int):
    """Linear(8192, 8192) layers enough that their fp32 weights alone (4 bytes a parameter) exceed ``cap``: fp32
    Adam's two moments are twice that (about 1.2 G parameters for a 4 GiB cap: 24 GB of host memory in all)."""
    import torch

    per_layer = 8192 * 8192 + 8192
    count = cap // (4 * per_layer) + 2
    return torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(count)]), count * per_layer


def trains_with_zero3_offload_under_a_cap():
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator, DeepSpeedPlugin

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP / total)  # allocations past CAP raise OutOfMemoryError
    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu", offload_param_device="cpu")
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model, parameters = layers_whose_weights_exceed(CAP)
    data = TensorDataset(torch.randn(8, 8192), torch.randn(8, 8192))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    losses = []
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return {"parameters": parameters, "losses": losses, "peak": torch.cuda.max_memory_allocated(),
            "engine": type(model).__name__, "offload": model.zero_offload_optimizer().device}


@pytest.mark.cuda
def test_one_gpu_trains_a_model_whose_adam_state_does_not_fit_it_with_zero3_offload():
    """ZeRO-Offload on one process, as a Colab GPU would use it: fp32 Adam state larger than the (capped) card, in
    host memory; the card holds a layer or two at a time."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra")
    result = start_launch(trains_with_zero3_offload_under_a_cap, num_processes=1, device="cuda",
                          start_method="spawn").wait(400)
    assert result["engine"] == "DeepSpeedEngine" and result["offload"] == "cpu", result
    assert 4 * result["parameters"] > CAP  # the weights alone would not fit, their Adam state twice over
    assert result["peak"] < CAP and len(result["losses"]) == 2, result


def trains_with_fsdp2_cpu_offload_on_one_gpu():
    import torch
    import torch.nn.functional as F

    from notebook_accel import Accelerator, FullyShardedDataParallelPlugin

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(cpu_offload=True))
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    before = [param.full_tensor().clone() for param in model.parameters()]
    loss = F.mse_loss(model(torch.randn(8, 256, device="cuda")), torch.zeros(8, 1, device="cuda"))
    accelerator.backward(loss)
    optimizer.step()
    moved = any(not torch.equal(a, b.full_tensor()) for a, b in zip(before, model.parameters()))
    devices = {param.to_local().device.type for param in model.parameters()}
    return {"devices": sorted(devices), "moved": moved, "world": torch.distributed.get_world_size()}


@pytest.mark.cuda
def test_fsdp2_cpu_offload_on_one_gpu_keeps_the_parameters_in_host_memory_and_trains():
    result = start_launch(trains_with_fsdp2_cpu_offload_on_one_gpu, num_processes=1, device="cuda",
                          start_method="spawn").wait(180)
    assert result == {"devices": ["cpu"], "moved": True, "world": 1}, result


WARM_START_KERNEL = """
import os, time
import torch
torch.ones(1, device="cuda")       # an earlier cell used the GPU: CUDA is live
import multiprocessing.forkserver as forkserver
began = time.monotonic()
import notebook_accel
print("IMPORT", round(time.monotonic() - began, 4))
time.sleep(float(os.environ.get("USER_PAUSE", "0")))   # the user reads the cell's output, or launches at once
from notebook_accel import notebook_launcher, Session
from notebook_accel.launcher import last_launch

def pid():
    return os.getpid()

began = time.monotonic()
notebook_launcher(pid, num_processes=2, device="cpu", display="none")
print("FIRST LAUNCH", round(time.monotonic() - began, 3), forkserver._forkserver._forkserver_pid)
began = time.monotonic()
with Session(num_processes=1, device="cuda", display="none") as session:
    print("SESSION", round(time.monotonic() - began, 3), session.run(lambda: torch.cuda.is_available()))
print("SERVER", forkserver._forkserver._forkserver_pid)
"""


@pytest.mark.cuda
@pytest.mark.parametrize("pause", ["5", "0"])
def test_a_kernel_with_cuda_live_starts_its_fork_server_at_import(pause, monkeypatch):
    """The issue's 4.8 s first launch of 2 CPU ranks with CUDA live (the fork server importing torch) is paid at
    import, in the background: after a pause the launch finds the server warm; launched at once, it waits for the
    start under way and reuses it (one server either way). Times printed for the note, bounds only for a hang."""
    monkeypatch.setenv("USER_PAUSE", pause)
    monkeypatch.setenv("NOTEBOOK_ACCEL_WARM_START", "1")  # conftest.py turns it off for the rest of the suite
    done = run_script(WARM_START_KERNEL, timeout=220)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    first = out.split("FIRST LAUNCH ")[1].split()
    assert out.split("SERVER ")[1].split()[0] == first[1], out  # the session's ranks came from the same server
    assert "SESSION" in out and out.split("SESSION ")[1].split()[1] == "True", out
    print(f"pause {pause} s: import {out.split('IMPORT ')[1].split()[0]} s, first launch {first[0]} s, "
          f"one-GPU session start {out.split('SESSION ')[1].split()[0]} s")


# --------------------------------------------------------------------- results from GPU ranks at link speed

def returns_a_gib_on_the_gpu():
    import torch

    block = torch.arange(GIB // 4, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    return {"block": block, "small": torch.ones(3, device="cuda"), "sum": float(block.double().sum())}


@pytest.mark.cuda
def test_a_gib_cuda_tensor_a_rank_returns_lands_in_host_memory_and_the_kernel_initialises_no_cuda():
    """Copied from the GPU straight into the result's shared memory (registered as pinned): the kernel gets CPU
    tensors, and this (pytest's) process never initialises CUDA. Time printed for the note (issue 37: 1.68 s before,
    goal 0.3 s per GiB on an H200), bounded only against a hang."""
    import time

    import torch

    started = time.monotonic()
    job = start_launch(returns_a_gib_on_the_gpu, num_processes=1, device="cuda", start_method="spawn")
    value = job.wait(180)
    print(f"launch returning 1 GiB from the GPU: {time.monotonic() - started:.2f} s in all")
    assert value["block"].device.type == "cpu" and value["small"].device.type == "cpu"
    assert float(value["block"].double().sum()) == value["sum"] and value["small"].tolist() == [1.0, 1.0, 1.0]
    assert not torch.cuda.is_initialized()


def rank_copies_a_gib_from_the_gpu():
    """In a rank (CUDA live there): the result route's copy itself, timed, against a pinned buffer's and .cpu()."""
    import os
    import time

    import torch

    from notebook_accel.wire import results
    from notebook_accel.wire.payload import shared_memory_file

    block = torch.randn(GIB // 4, device="cuda")
    torch.cuda.synchronize()
    times = {}
    fd = shared_memory_file(GIB, "bench")
    try:
        for attempt in range(2):
            began = time.perf_counter()
            results._write(fd, results._DeviceSource(block.untyped_storage()), 0)
            times[f"shared memory {attempt}"] = time.perf_counter() - began
        back = torch.frombuffer(results.map_shared(fd, 0, GIB), dtype=torch.float32)
        same = torch.equal(back, block.cpu())
    finally:
        os.close(fd)
    pinned = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    began = time.perf_counter()
    pinned.copy_(block.view(torch.uint8))
    times["pinned"] = time.perf_counter() - began
    began = time.perf_counter()
    block.cpu()
    times["cpu()"] = time.perf_counter() - began
    return same, times


@pytest.mark.cuda
def test_the_result_routes_copy_of_a_gib_is_right_and_near_a_pinned_copy():
    same, times = start_launch(rank_copies_a_gib_from_the_gpu, num_processes=1, device="cuda",
                               start_method="spawn").wait(180)
    print("1 GiB device -> host:", {name: f"{seconds:.3f} s" for name, seconds in times.items()})
    assert same
    assert times["shared memory 1"] < max(10 * times["pinned"], 1.0), times  # a hang bound, not the goal


PULL_ON_THE_GPU = """
import time
import torch
from notebook_accel import Session

torch.ones(1, device="cuda")     # CUDA is live in this kernel
with Session(num_processes=1, device="cuda", display="none") as session:
    session.execute("import torch\nx = torch.arange(1 << 28, dtype=torch.float32, device='cuda')")
    for device in ("cpu", "cuda", "cuda"):
        began = time.monotonic()
        (x,) = session.pull("x", device=device)
        took = time.monotonic() - began
        print("PULL", device, x.device.type, bool(torch.equal(x.cpu(), torch.arange(1 << 28, dtype=torch.float32))),
              round(took, 3))
    session.execute("_ = x.zero_()")
    print("OWN", float(x[-1]))     # the kernel's copy is its own: the rank zeroing its tensor changes nothing
"""


@pytest.mark.cuda
def test_session_pull_of_a_gib_to_the_host_and_on_the_gpu():
    done = run_script(PULL_ON_THE_GPU, timeout=220)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    lines = [line.split() for line in out.splitlines() if line.startswith("PULL")]
    assert [line[1:4] for line in lines] == [["cpu", "cpu", "True"], ["cuda", "cuda", "True"],
                                             ["cuda", "cuda", "True"]], out
    assert f"OWN {float((1 << 28) - 1)}" in out, out
    print("Session.pull of 1 GiB:", {f"{line[1]} #{index}": f"{line[4]} s" for index, line in enumerate(lines)})
