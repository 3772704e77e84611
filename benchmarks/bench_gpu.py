"""On one GPU: our rows beside their references, in one run (issue 37). Runs on any CUDA machine; exits with a message
where there is none.

    python benchmarks/bench_gpu.py [--gib 1] [--steps 30]

This script is the "kernel": CUDA is initialised in it before ``notebook_accel`` is imported, as on Colab after any
cell touched the GPU. Rows, each with what it is compared with:

1. in-kernel 1-GPU launch, bf16 and fp16 (GradScaler): the autocast dtypes a step sees
2. Accelerator step, a 6-layer Transformer, bf16: ours / a hand-written loop, HF accelerate's / the same loop
3. a tiny model (overhead-bound): the same three
4. a CUDA argument of ``--gib`` GiB into a process rank: ours (CUDA IPC, shared in place) vs torch.mp spawn
5. a CUDA tensor of ``--gib`` GiB returned by a launch (lands in host memory): ours in all, and the rank's copy into
   the result's shared memory vs a copy into a reused pinned buffer and ``x.cpu()``
6. ``Session.pull`` of ``--gib`` GiB: to host (twice: the second into the pages the first made) and on the GPU
   (``device="cuda"``, CUDA IPC and a device copy), vs ``x.cpu()`` into new pageable memory, into pageable memory
   already touched, and into a reused pinned buffer
7. ``Session(num_processes=1, device="cuda")`` start
8. the first launch of 2 CPU ranks with CUDA live (the fork server started at import: ``warm_start``) vs a warm one
9. out of memory in the kernel (3x the card asked): the line we print
10. ``DeepSpeedPlugin(zero_stage=3)`` with CPU offload on one GPU: the engine built (DeepSpeed installed or not)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

GIB = 1 << 30
ROWS: List[Tuple[str, str, str]] = []


def row(name: str, ours: str, reference: str = "—") -> None:
    ROWS.append((name, ours, reference))
    print(f"| {name} | {ours} | {reference} |", flush=True)


def timed(function: Callable[[], Any]) -> Tuple[float, Any]:
    import torch

    torch.cuda.synchronize()
    began = time.perf_counter()
    value = function()
    torch.cuda.synchronize()
    return time.perf_counter() - began, value


# ----------------------------------------------------------------------------- functions the ranks run

def autocast_dtypes() -> Dict[str, str]:
    import torch

    from notebook_accel import Accelerator

    seen = {}
    for precision in ("bf16", "fp16"):
        accelerator = Accelerator(mixed_precision=precision)
        model = accelerator.prepare(torch.nn.Linear(16, 16))
        out = model(torch.randn(4, 16, device=accelerator.device))
        seen[precision] = f"{str(out.dtype).replace('torch.', '')}, scaler {accelerator.scaler is not None}"
    return seen


def reads_its_argument(tensor: Any) -> float:
    return float(tensor[-1])


def spawn_reads_its_argument(index: int, tensor: Any) -> None:
    float(tensor[-1])


def returns_on_the_gpu(nbytes: int) -> Any:
    import torch

    return torch.ones(nbytes // 4, device="cuda")


def rank_side_copies(nbytes: int) -> Dict[str, float]:
    """In a rank: the result route's copy of a GPU tensor into shared memory (twice: the second into pages the first
    made), a copy into a reused pinned buffer, and ``.cpu()``."""
    import torch

    from notebook_accel.wire import results
    from notebook_accel.wire.payload import shared_memory_file

    block = torch.ones(nbytes // 4, device="cuda")
    times = {}
    fd = shared_memory_file(nbytes, "bench")
    try:
        for attempt in ("first", "again"):
            times[f"into shared memory ({attempt})"], _ = timed(
                lambda: results._write(fd, results._DeviceSource(block.untyped_storage()), 0))
    finally:
        os.close(fd)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    times["into a reused pinned buffer"], _ = timed(lambda: pinned.copy_(block.view(torch.uint8)))
    times["x.cpu() (new pageable)"], _ = timed(lambda: block.cpu())
    return times


def cpu_rank() -> int:
    return os.getpid()


# ------------------------------------------------------------------------------------------------ rows

def step_rows(steps: int) -> None:
    import torch
    import torch.nn.functional as F

    def transformer() -> torch.nn.Module:
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 6)

    def tiny() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))

    cases = {"Accelerator step, 6-layer Transformer, bf16": (transformer, (32, 256, 512), "bf16"),
             "tiny model (overhead-bound)": (tiny, (64, 32), "no")}
    for name, (build, shape, precision) in cases.items():
        timings = {}
        for who in ("plain", "ours", "hf"):
            torch.manual_seed(0)
            model = build().cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randn(*shape, device="cuda")
            if who == "ours":
                from notebook_accel import Accelerator

                accelerator = Accelerator(mixed_precision=precision)
                model, optimizer = accelerator.prepare(model, optimizer)
                backward = accelerator.backward
            elif who == "hf":
                try:
                    from accelerate import Accelerator as HFAccelerator
                except ImportError:
                    timings[who] = None
                    continue
                from accelerate.state import AcceleratorState

                AcceleratorState._reset_state(True)  # the previous case's precision is not this one's
                accelerator = HFAccelerator(mixed_precision=precision)
                model, optimizer = accelerator.prepare(model, optimizer)
                backward = accelerator.backward
            else:
                backward = torch.Tensor.backward
            autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if who == "plain" and precision == "bf16"
                        else None)

            def step() -> None:
                if autocast is not None:
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = F.mse_loss(model(x), x)
                else:
                    loss = F.mse_loss(model(x), x)
                backward(loss)
                optimizer.step()
                optimizer.zero_grad()

            for _ in range(5):
                step()
            timings[who], _ = timed(lambda: [step() for _ in range(steps)])
        plain = timings["plain"]
        hf = timings.get("hf")
        row(name, f"{timings['ours'] / plain:.2f}× a hand-written loop",
            f"HF accelerate {hf / plain:.2f}×" if hf else "HF accelerate not installed")


def argument_row(nbytes: int) -> None:
    import torch
    import torch.multiprocessing as tmp

    from notebook_accel import notebook_launcher

    tensor = torch.ones(nbytes // 4, device="cuda")
    began = time.perf_counter()
    notebook_launcher(reads_its_argument, args=(tensor,), num_processes=1, device="cuda", display="none",
                      start_method="forkserver")
    ours = time.perf_counter() - began
    began = time.perf_counter()
    tmp.start_processes(spawn_reads_its_argument, args=(tensor,), nprocs=1, start_method="spawn")
    row(f"{nbytes / GIB:g} GiB CUDA argument into a process rank", f"{ours:.2f} s (CUDA IPC)",
        f"torch.mp spawn {time.perf_counter() - began:.2f} s")


def returned_rows(nbytes: int) -> None:
    from notebook_accel import notebook_launcher

    began = time.perf_counter()
    value = notebook_launcher(returns_on_the_gpu, args=(nbytes,), num_processes=1, device="cuda", display="none",
                              start_method="forkserver")
    took = time.perf_counter() - began
    assert value.device.type == "cpu" and float(value[-1]) == 1.0
    times = notebook_launcher(rank_side_copies, args=(nbytes,), num_processes=1, device="cuda", display="none",
                              start_method="forkserver")
    copies = ", ".join(f"{name} {seconds:.3f} s" for name, seconds in times.items())
    row(f"{nbytes / GIB:g} GiB CUDA tensor returned by a launch", f"{took:.2f} s in all, lands in host memory",
        f"in the rank: {copies}")


def session_rows(nbytes: int) -> None:
    import torch

    from notebook_accel import Session

    began = time.perf_counter()
    session = Session(num_processes=1, device="cuda", display="none")
    row('Session(num_processes=1, device="cuda") start', f"{time.perf_counter() - began:.2f} s")
    try:
        session.execute(f"import torch\nx = torch.ones({nbytes // 4}, device='cuda')")
        pulls = []
        for device in ("cpu", "cpu", "cuda", "cuda"):
            began = time.perf_counter()
            (value,) = session.pull("x", device=device)
            pulls.append(f"{device} {time.perf_counter() - began:.3f} s")
            del value
    finally:
        session.close()
    local = torch.ones(nbytes // 4, device="cuda")
    fresh, _ = timed(lambda: local.cpu())
    touched = torch.empty(nbytes // 4)
    touched.copy_(local)
    again, _ = timed(lambda: touched.copy_(local))
    pinned = torch.empty(nbytes // 4, pin_memory=True)
    pinned_time, _ = timed(lambda: pinned.copy_(local))
    row(f"Session.pull of a {nbytes / GIB:g} GiB CUDA tensor", "; ".join(pulls),
        f"x.cpu() (new pageable) {fresh:.3f} s, into touched pageable {again:.3f} s, into reused pinned "
        f"{pinned_time:.3f} s")


def oom_row() -> None:
    import torch

    from notebook_accel import notebook_launcher
    from notebook_accel.launcher import last_launch

    total = torch.cuda.get_device_properties(0).total_memory

    def asks_too_much() -> None:
        torch.empty(3 * total, dtype=torch.uint8, device="cuda")

    try:
        notebook_launcher(asks_too_much, display="none")
    except torch.OutOfMemoryError:
        row("OOM (3× the card asked), in the kernel", (last_launch().out_of_memory or "").split("; try")[0])


def deepspeed_row() -> None:
    import torch

    try:
        import deepspeed  # noqa: F401
    except ImportError:
        row("DeepSpeedPlugin(zero_stage=3) with CPU offload, one GPU", "DeepSpeed not installed here")
        return
    from notebook_accel import notebook_launcher

    name = notebook_launcher(one_gpu_zero3_offload, num_processes=1, device="cuda", display="none",
                             start_method="forkserver")
    row("DeepSpeedPlugin(zero_stage=3) with CPU offload, one GPU", name, "HF accelerate builds the engine too")
    del torch


def one_gpu_zero3_offload() -> str:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator, DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu", offload_param_device="cpu")
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
    data = DataLoader(TensorDataset(torch.randn(8, 1024), torch.randn(8, 1024)), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, torch.optim.Adam(model.parameters()), data)
    for x, y in data:
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
    return f"{type(model).__name__}, ZeRO-{model.zero_optimization_stage()}, trained 2 steps"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the tensors moved (GiB)")
    parser.add_argument("--steps", type=int, default=30, help="training steps timed per Accelerator row")
    options = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False here): nothing to measure")
    torch.ones(1, device="cuda")  # CUDA live in this "kernel", before notebook_accel is imported
    nbytes = int(options.gib * GIB) // 4 * 4
    began = time.perf_counter()
    import notebook_accel  # noqa: F401  - starts the fork server in the background (CUDA is live)
    imported = time.perf_counter() - began
    from notebook_accel import notebook_launcher
    from notebook_accel.backends.processes import warm_start

    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} cores\n")
    print("| | ours | reference |\n|---|---|---|")
    began = time.perf_counter()
    notebook_launcher(cpu_rank, num_processes=2, device="cpu", display="none")
    first = time.perf_counter() - began
    began = time.perf_counter()
    notebook_launcher(cpu_rank, num_processes=2, device="cpu", display="none")
    row("first launch of 2 CPU ranks with CUDA live", f"{first:.2f} s (import {imported * 1000:.0f} ms; "
        f"{warm_start.describe() or 'no warm start'})", f"a warm fork server {time.perf_counter() - began:.3f} s")
    dtypes = notebook_launcher(autocast_dtypes, display="none")
    row("in-kernel 1-GPU launch, bf16 / fp16 (GradScaler)", f"bf16: {dtypes['bf16']}; fp16: {dtypes['fp16']}")
    step_rows(options.steps)
    argument_row(nbytes)
    returned_rows(nbytes)
    session_rows(nbytes)
    oom_row()
    deepspeed_row()


if __name__ == "__main__":
    main()
