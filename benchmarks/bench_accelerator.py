"""Steps/s of the same training loop: hand-written DDP vs notebook_accel's Accelerator vs HF accelerate.

Two ranks on CPU (gloo) started by ``notebook_launcher``; a small MLP and a small CNN. Inside each rank
the three variants are built once, then timed epoch by epoch in rotating order (round r starts with a
different variant), so drift and noise from the machine hit all three alike; the table reports the
median over rounds of steps/s and of the per-round ratios.

    python benchmarks/bench_accelerator.py            # ~30 s on 2 cores
    python benchmarks/bench_accelerator.py --rounds 3 --quick
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("ddp", "ours", "hf")


def make_model(kind: str):
    import torch

    torch.manual_seed(0)
    if kind == "mlp":
        return torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 10),
        )  # fmt: skip
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10),
    )  # fmt: skip


def make_dataset(kind: str, steps: int, batch: int, world: int):
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(0)
    n = steps * batch * world
    shape = (n, 1, 28, 28) if kind == "mlp" else (n, 3, 32, 32)
    return TensorDataset(torch.randn(shape, generator=generator), torch.randint(0, 10, (n,), generator=generator))


def build_variants(kind: str, steps: int, batch: int) -> Dict[str, Tuple[Callable[[], int], Any]]:
    """variant -> (run one epoch and return its step count, the objects kept alive)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    world = dist.get_world_size()
    dataset = make_dataset(kind, steps, batch, world)
    variants: Dict[str, Tuple[Callable[[], int], Any]] = {}

    # 1. hand-written DDP: DistributedSampler + set_epoch + loss.backward()
    model = DistributedDataParallel(make_model(kind))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    epoch_counter = [0]

    def ddp_epoch() -> int:
        sampler.set_epoch(epoch_counter[0])
        epoch_counter[0] += 1
        count = 0
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            count += 1
        return count

    variants["ddp"] = (ddp_epoch, (model, optimizer, loader))

    # 2. ours
    from notebook_accel import Accelerator

    accelerator = Accelerator()
    model2 = make_model(kind)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.01, momentum=0.9)
    model2, optimizer2, loader2 = accelerator.prepare(
        model2, optimizer2, DataLoader(dataset, batch_size=batch, shuffle=True)
    )

    def ours_epoch() -> int:
        count = 0
        for x, y in loader2:
            loss = F.cross_entropy(model2(x), y)
            accelerator.backward(loss)
            optimizer2.step()
            optimizer2.zero_grad()
            count += 1
        return count

    variants["ours"] = (ours_epoch, (model2, optimizer2, loader2))

    # 3. HF accelerate, if installed
    try:
        import accelerate
    except ImportError:
        return variants
    hf = accelerate.Accelerator(cpu=True)
    model3 = make_model(kind)
    optimizer3 = torch.optim.SGD(model3.parameters(), lr=0.01, momentum=0.9)
    model3, optimizer3, loader3 = hf.prepare(model3, optimizer3, DataLoader(dataset, batch_size=batch, shuffle=True))

    def hf_epoch() -> int:
        count = 0
        for x, y in loader3:
            loss = F.cross_entropy(model3(x), y)
            hf.backward(loss)
            optimizer3.step()
            optimizer3.zero_grad()
            count += 1
        return count

    variants["hf"] = (hf_epoch, (model3, optimizer3, loader3))
    return variants


def rank_benchmark(rounds: int, quick: bool) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 ranks on 2 cores: one thread each, as torchrun's OMP_NUM_THREADS=1
    from notebook_accel import Accelerator

    Accelerator()  # creates the process group (gloo) the hand-written variant also uses
    results: Dict[str, Any] = {}
    settings = {"mlp": (20 if quick else 60, 64), "cnn": (8 if quick else 24, 32)}
    for kind, (steps, batch) in settings.items():
        variants = build_variants(kind, steps, batch)
        names = [name for name in VARIANTS if name in variants]
        for name in names:  # warm-up epoch (allocator, autograd graph caches, first-call imports)
            variants[name][0]()
        rates: Dict[str, List[float]] = {name: [] for name in names}
        for round_index in range(rounds):
            order = names[round_index % len(names):] + names[: round_index % len(names)]
            for name in order:
                dist.barrier()
                start = time.perf_counter()
                count = variants[name][0]()
                elapsed = time.perf_counter() - start
                # the slowest rank decides the step rate (they are coupled by all-reduce anyway)
                elapsed_t = torch.tensor([elapsed])
                dist.all_reduce(elapsed_t, op=dist.ReduceOp.MAX)
                rates[name].append(count / elapsed_t.item())
        results[kind] = {"rates": rates, "steps_per_epoch": steps, "batch": batch}
    return results


def ratio_summary(numerator: List[float], denominator: List[float]) -> str:
    """Median of the per-round ratios, with the middle half of them (rounds are paired in time)."""
    ratios = sorted(n / d for n, d in zip(numerator, denominator))
    low, high = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    return f"{statistics.median(ratios):.3f} ({low:.2f}-{high:.2f})"


def summarize(results: Dict[str, Any]) -> str:
    lines = [
        "| model | batch/rank | DDP steps/s | ours steps/s | ours/DDP | accelerate steps/s | ours/accelerate |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, data in results.items():
        rates = data["rates"]
        median = {name: statistics.median(values) for name, values in rates.items()}
        vs_ddp = ratio_summary(rates["ours"], rates["ddp"])
        if "hf" in rates:
            vs_hf, hf = ratio_summary(rates["ours"], rates["hf"]), f"{median['hf']:.1f}"
        else:
            vs_hf = hf = "n/a (accelerate not installed)"
        lines.append(
            f"| {kind} | {data['batch']} | {median['ddp']:.1f} | {median['ours']:.1f} | {vs_ddp} | {hf} | {vs_hf} |"
        )
    lines.append("ratios: median over rounds (interquartile range in brackets); > 1 means ours is faster")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15, help="timed epochs per variant (default 15)")
    parser.add_argument("--quick", action="store_true", help="shorter epochs (smoke run)")
    args = parser.parse_args()

    import torch

    from notebook_accel import notebook_launcher

    results = notebook_launcher(rank_benchmark, args=(args.rounds, args.quick), num_processes=2, device="cpu",
                                display="none")  # fmt: skip
    print(f"torch {torch.__version__}, 2 ranks x 1 thread, gloo, {args.rounds} rounds (median)")
    print(summarize(results))


if __name__ == "__main__":
    main()
