"""CUDA tensors captured from the kernel travel to the ranks as CUDA IPC handles (``wire/payload.py``).

The Kaggle pattern: a cell puts the model on ``cuda:0``, a later cell launches on both GPUs. CUDA is live in
the kernel, so ranks come from the fork server and receive a pickled payload; pickled the default way, each
rank would load its own copy of the model onto ``cuda:0``. These tests need CUDA (skipped without it) and run
in a fresh interpreter each, since CUDA must be live in the "kernel" and must not be in pytest's process
(a later fork would be refused).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from notebook_accel.plan.devices import cuda_device_count

# Asked through NVML: torch.cuda.is_available() here would initialize the driver in pytest's process.
GPUS = cuda_device_count()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(GPUS == 0, reason="needs CUDA (none on this machine)"),
              pytest.mark.timeout(300)]


def run_as_kernel(code: str, tmp_path) -> str:
    """``code`` as a script file: multiprocessing's spawn re-imports a script's ``__main__`` (for its functions by
    name), which ``python -c`` has not (seen on the first GPU run: "Can't get attribute 'rank_side'")."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = tmp_path / "kernel.py"
    script.write_text(textwrap.dedent(code))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=280, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_two_ranks_on_one_gpu_open_the_kernels_tensor_without_a_copy(tmp_path):
    """Two processes started as ranks are (spawn) load the payload: each sees the kernel's 1 GiB tensor on
    cuda:0 without allocating it (IPC memory is not its caching allocator's), and the pickle is small."""
    out = run_as_kernel("""
        import multiprocessing, torch
        from notebook_accel.wire.payload import PickledPayload

        def rank_side(pickled, queue, rank):
            import torch
            function, (tensor,), _ = pickled.load()
            if rank == 1:
                tensor[0, 0, 0] = 7.0   # shared, as torch.multiprocessing shares CUDA tensors
                torch.cuda.synchronize()
            queue.put((rank, str(tensor.device), torch.cuda.memory_allocated(0), float(tensor[1].sum())))

        if __name__ == "__main__":
            big = torch.ones(256, 1024, 1024, device="cuda:0")            # 1 GiB on cuda:0: CUDA is live
            pickled = PickledPayload.create(len, (big,), {})
            print("PICKLE BYTES", len(pickled.data))
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            ranks = [context.Process(target=rank_side, args=(pickled, queue, rank)) for rank in range(2)]
            for rank in ranks:
                rank.start()
            seen = sorted(queue.get(timeout=120) for _ in ranks)
            for rank in ranks:
                rank.join(60)
            pickled.close()
            for rank, device, allocated, total in seen:
                print("RANK", rank, device, allocated, total)
            print("KERNEL SEES", float(big[0, 0, 0]))
    """, tmp_path)
    assert int(out.split("PICKLE BYTES ")[1].split()[0]) < (1 << 20), out  # handles, not the GiB
    for rank in (0, 1):
        assert f"RANK {rank} cuda:0 0 {float(1024 * 1024)}" in out, out  # nothing allocated: no copy
    assert "KERNEL SEES 7.0" in out, out


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_a_model_on_cuda_0_in_the_kernel_trains_on_every_gpu_with_one_copy_on_gpu_0(tmp_path):
    """The whole launch: forkserver ranks (CUDA is live), ``prepare`` moves the kernel's model to each rank's own
    GPU; rank 1 never allocates on GPU 0."""
    out = run_as_kernel("""
        import torch
        from notebook_accel import notebook_launcher

        model = torch.nn.Linear(4096, 4096).to("cuda:0")   # 64 MiB, loaded by an earlier cell

        def train():
            import torch
            from notebook_accel import Accelerator

            accelerator = Accelerator()
            on_gpu0_before = torch.cuda.memory_allocated(0)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            prepared, optimizer = accelerator.prepare(model, optimizer)
            loss = prepared(torch.randn(8, 4096, device=accelerator.device)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            weight = accelerator.unwrap_model(prepared).weight
            return (accelerator.process_index, str(weight.device), on_gpu0_before,
                    torch.cuda.memory_allocated(0) if accelerator.process_index else -1)

        for rank, device, before, after in notebook_launcher(train, num_processes=2, return_all=True,
                                                              display="none", timeout=240):
            print("RANK", rank, device, before, after)
    """, tmp_path)
    assert "RANK 0 cuda:0 0 -1" in out, out
    assert "RANK 1 cuda:1 0 0" in out, out  # rank 1 put nothing on GPU 0
