"""Sharded training: step time and what each rank holds, DDP vs FSDP2 vs ZeRO-2 vs ZeRO-3, ours vs HF accelerate.

    python benchmarks/bench_sharded.py [--width 1024] [--layers 8] [--steps 6]

Every configuration trains the same Transformer (≈100M parameters, 400 MB in fp32, with AdamW: 1.6 GB of
parameters + gradients + optimizer state per DDP rank) for ``--steps`` steps on 2 CPU ranks (gloo), launched
by our ``notebook_launcher`` in every row so only the training library differs: our ``Accelerator`` with the
plugin, or HF accelerate's ``Accelerator`` with its plugin of the same name (when accelerate is installed). A
row gives the median step time after the first step, the ratio to our DDP row, the parameter and
optimizer-state bytes rank 0 holds after training (its shards, under FSDP2 and ZeRO-3; ZeRO-2 partitions only
optimizer state and gradients), and rank 0's peak RSS. On CPU HF accelerate trains plain DDP whatever the
plugin (it drops FSDP and DeepSpeed when there is no GPU): its rows show what it actually did.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from notebook_accel import notebook_launcher  # noqa: E402
from notebook_accel.formatting import format_bytes  # noqa: E402

CONFIGS = ["DDP", "FSDP2", "ZeRO-2", "ZeRO-3"]


def make_model(width: int, layers: int) -> torch.nn.Module:
    block = torch.nn.TransformerEncoderLayer(d_model=width, nhead=16, dim_feedforward=4 * width, batch_first=True)
    return torch.nn.Sequential(torch.nn.TransformerEncoder(block, num_layers=layers), torch.nn.Linear(width, 1))


def ours(config: str) -> Any:
    from notebook_accel import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin

    if config == "FSDP2":
        return Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(
            transformer_cls_names_to_wrap=["TransformerEncoderLayer"]))
    if config.startswith("ZeRO"):
        return Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=int(config[-1])))
    return Accelerator()


def hf_accelerate(config: str) -> Any:
    import accelerate

    if config == "FSDP2":
        plugin = accelerate.FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                           transformer_cls_names_to_wrap=["TransformerEncoderLayer"])
        return accelerate.Accelerator(fsdp_plugin=plugin)
    if config.startswith("ZeRO"):
        plugin = accelerate.DeepSpeedPlugin(zero_stage=int(config[-1]), gradient_clipping=0.0)
        return accelerate.Accelerator(deepspeed_plugin=plugin)
    return accelerate.Accelerator()


def train(library: str, config: str, width: int, layers: int, steps: int) -> Dict[str, Any]:
    import warnings

    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel.accelerator.memory import held_bytes

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    accelerator = ours(config) if library == "ours" else hf_accelerate(config)
    torch.manual_seed(0)
    model = make_model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randn(8 * steps, 32, width)
    loader = DataLoader(TensorDataset(inputs, inputs.mean(dim=(1, 2)).unsqueeze(-1)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    times = []
    for x, y in loader:
        start = time.perf_counter()
        accelerator.backward(F.mse_loss(model(x).mean(dim=1).float(), y))
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    module = getattr(model, "module", model)
    held = held_bytes(module, getattr(optimizer, "optimizer", optimizer), gradients=False)
    return {"step": statistics.median(times[1:]), "parameters": held["parameters"], "optimizer": held["optimizer"],
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "kind": type(model).__name__}


def run(library: str, config: str, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    try:
        return notebook_launcher(train, args=(library, config, args.width, args.layers, args.steps),
                                 num_processes=2, device="cpu", display="none")
    except Exception as error:  # a configuration the library refuses here: say so in the table
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:70]}"}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    total = sum(p.numel() for p in make_model(args.width, args.layers).parameters())
    print(f"{total / 1e6:.0f}M parameters ({format_bytes(total * 4)} fp32), AdamW, 2 CPU ranks, "
          f"batch 4 x 32 x {args.width} per rank, median of {args.steps - 1} steps\n")
    libraries = ["ours"] + (["accelerate"] if importlib.util.find_spec("accelerate") else [])
    if "accelerate" not in libraries:
        print("(HF accelerate is not installed: pip install '.[bench]' for its rows)\n")
    rows = [(library, config, run(library, config, args)) for config in CONFIGS for library in libraries]
    baseline = next(result["step"] for library, config, result in rows if (library, config) == ("ours", "DDP"))
    header = f"{'library':<11}{'config':<8}{'step s':>8}{'vs DDP':>8}{'params/rank':>13}{'optim/rank':>12}"
    print(header + f"{'peak RSS':>10}  model")
    for library, config, result in rows:
        if "error" in result:
            print(f"{library:<11}{config:<8}  {result['error']}")
            continue
        print(f"{library:<11}{config:<8}{result['step']:>8.3f}{result['step'] / baseline:>7.2f}x"
              f"{format_bytes(result['parameters']):>13}{format_bytes(result['optimizer']):>12}"
              f"{format_bytes(result['peak_rss']):>10}  {result['kind']}")


if __name__ == "__main__":
    main()
