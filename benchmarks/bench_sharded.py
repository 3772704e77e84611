"""Sharded training: step time, what each rank holds and its peak memory, DDP vs FSDP2 vs ZeRO-2 vs ZeRO-3, ours
(with and without ``init_module``) vs HF accelerate.

    python benchmarks/bench_sharded.py [--width 1024] [--layers 8] [--steps 6] [--ours-only]

Every configuration trains the same Transformer (≈100M parameters, 400 MB in fp32, with AdamW: 1.6 GB of
parameters + gradients + optimizer state per DDP rank) for ``--steps`` steps on 2 CPU ranks (gloo), launched
by our ``notebook_launcher`` in every row so only the training library differs: our ``Accelerator`` with the
plugin, or HF accelerate's ``Accelerator`` with its plugin of the same name (when accelerate is installed). A
row gives the median step time after the first step, the ratio to our DDP row, the parameter and
optimizer-state bytes rank 0 holds after training (its shards, under FSDP2 and ZeRO-3; ZeRO-2 partitions only
optimizer state and gradients), and memory: each rank's peak RSS over its whole life, and its *peak growth* —
the highest RSS while building, preparing and training the model, less the RSS just before building it (torch,
the process group and DeepSpeed already loaded; Linux: the peak is reset through /proc/self/clear_refs) — for the
larger of the two ranks, with its ratio to our DDP row's. The "+init_module" rows build the model inside
``accelerator.init_module()``: under FSDP2 and ZeRO-3 no rank then holds the whole model. On CPU HF accelerate
trains plain DDP whatever the plugin (it drops FSDP and DeepSpeed when there is no GPU): its rows show what it
actually did.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import resource
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from notebook_accel import notebook_launcher  # noqa: E402
from notebook_accel.formatting import format_bytes  # noqa: E402

CONFIGS = ["DDP", "FSDP2", "ZeRO-2", "ZeRO-3"]
WITH_INIT_MODULE = ["FSDP2", "ZeRO-3"]  # elsewhere init_module is a plain block


def _status_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as status:
            found = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def start_peak() -> Optional[int]:
    """This process's RSS now, in bytes, with its peak (VmHWM) reset to it; None where Linux's files are missing."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # 5: reset the peak resident set size to the current one
    except OSError:
        return None
    rss = _status_kib("VmRSS")
    return None if rss is None else rss * 1024


def peak_since() -> Optional[int]:
    peak = _status_kib("VmHWM")
    return None if peak is None else peak * 1024


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


def train(library: str, config: str, width: int, layers: int, steps: int, init_module: bool = False) -> Dict[str, Any]:
    import warnings

    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel.accelerator.memory import held_bytes

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    accelerator = ours(config) if library == "ours" else hf_accelerate(config)
    torch.manual_seed(0)
    inputs = torch.randn(8 * steps, 32, width)  # the data is not the model's memory
    before = start_peak()
    if init_module:
        with accelerator.init_module():
            model = make_model(width, layers)
    else:
        model = make_model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
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
    peak = peak_since()
    growth = None if before is None or peak is None else peak - before
    return {"step": statistics.median(times[1:]), "parameters": held["parameters"], "optimizer": held["optimizer"],
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "growth": growth,
            "kind": type(model).__name__}


def run(library: str, config: str, init_module: bool, args: argparse.Namespace) -> Dict[str, Any]:
    try:
        ranks = notebook_launcher(train, args=(library, config, args.width, args.layers, args.steps, init_module),
                                  num_processes=2, device="cpu", display="none", return_all=True)  # fmt: skip
    except Exception as error:  # a configuration the library refuses here: say so in the table
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:70]}"}
    result = dict(ranks[0])
    for key in ("peak_rss", "growth"):  # memory: the larger rank (rank 0 holds more under some layouts)
        values = [rank[key] for rank in ranks if rank[key] is not None]
        result[key] = max(values) if values else None
    return result


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--ours-only", action="store_true", help="leave out HF accelerate's rows")
    parser.add_argument("--configs", default=None,
                        help="only these of our rows, comma-separated (DDP, the ratios' base, always runs first): "
                             "FSDP2, FSDP2+init_module, ZeRO-2, ZeRO-3, ZeRO-3+init_module")
    args = parser.parse_args(argv)
    total = sum(p.numel() for p in make_model(args.width, args.layers).parameters())
    print(f"{total / 1e6:.0f}M parameters ({format_bytes(total * 4)} fp32), AdamW, 2 CPU ranks, "
          f"batch 4 x 32 x {args.width} per rank, median of {args.steps - 1} steps, "
          f"{os.cpu_count()} CPU cores, torch {torch.__version__}\n", flush=True)
    with_accelerate = not args.ours_only and importlib.util.find_spec("accelerate") is not None
    if not args.ours_only and not with_accelerate:
        print("(HF accelerate is not installed: pip install '.[bench]' for its rows)\n")
    plan: List[Tuple[str, str, bool]] = []
    for config in CONFIGS:
        plan.append(("ours", config, False))
        if config in WITH_INIT_MODULE:
            plan.append(("ours", config, True))
        if with_accelerate:
            plan.append(("accelerate", config, False))
    if args.configs:
        wanted = {"DDP"} | {name.strip() for name in args.configs.split(",")}
        plan = [row for row in plan if row[0] == "ours" and row[1] + ("+init_module" if row[2] else "") in wanted]
    header = f"{'library':<11}{'config':<20}{'step s':>8}{'vs DDP':>8}{'params/rank':>13}{'optim/rank':>12}"
    print(header + f"{'peak RSS':>10}{'peak growth':>13}{'vs DDP':>8}  model", flush=True)
    ddp: Dict[str, Any] = {}
    for library, config, init_module in plan:  # each row as it is measured: a loaded machine takes minutes a row
        result = run(library, config, init_module, args)
        if (library, config) == ("ours", "DDP"):
            ddp = result  # the first row: the ratios' base
        name = config + (" +init_module" if init_module else "")
        if "error" in result:
            print(f"{library:<11}{name:<20}  {result['error']}", flush=True)
            continue
        growth = result["growth"]
        ratio = f"{growth / ddp['growth']:>7.2f}x" if growth and ddp.get("growth") else f"{'-':>8}"
        step_ratio = f"{result['step'] / ddp['step']:>7.2f}x" if "step" in ddp else f"{'-':>8}"
        print(f"{library:<11}{name:<20}{result['step']:>8.3f}{step_ratio}"
              f"{format_bytes(result['parameters']):>13}{format_bytes(result['optimizer']):>12}"
              f"{format_bytes(result['peak_rss']):>10}{format_bytes(growth) if growth else '-':>13}{ratio}"
              f"  {result['kind']}", flush=True)


if __name__ == "__main__":
    main()
