"""The Accelerator on real ranks: ``notebook_launcher(..., display="none")``, gloo on CPU.

Four launches, each grouping several checks (a launch costs ~0.1-2 s):

1. equivalence: 2 ranks x batch 8 trains to the same weights as 1 process x batch 16 (plain PyTorch,
   no Accelerator), also shuffled, and with gradient accumulation + clipping + an LR scheduler (which a prepared
   scheduler steps num_processes times per optimizer step, as HF accelerate does: the reference does too);
   accumulation all-reduces once per cycle (a DDP comm hook counts them: equal weights cannot show it);
2. sharding with a global-RNG sampler, a WeightedRandomSampler, a batch_sampler and an IterableDataset,
   gather_for_metrics on an odd-sized eval set, and the collectives;
3. the seeds' example: torch.nn.Transformer, Adam, DataLoader, prepare, backward;
4. bf16 autocast on CPU (chosen by the launcher) + save_state / load_state resuming to the same weights;
5. ``init_module`` with DDP and in one process: a plain block (the same model, losses, checkpoints), and
   ``empty_init`` + ``load_model`` restores saved weights.
"""
from __future__ import annotations

import contextlib
import io
import os
from typing import Any, Dict, List, Optional

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset, WeightedRandomSampler

from notebook_accel import Accelerator, DataLoaderConfiguration, notebook_launcher
from notebook_accel.plan.devices import cuda_device_count
from test_accelerator_units import GlobalRNGSampler, RangeStream, UnevenBatchSampler, index_dataset

pytestmark = pytest.mark.timeout(180)

WORLD = 2


def launch(function, *args: Any, **options: Any) -> List[Any]:
    """Every rank's return value, by rank (each rank runs single-threaded, see `one_thread_then`)."""
    # device="cpu": these are the gloo tests, also on a machine with GPUs
    return notebook_launcher(one_thread_then, args=(function, *args), num_processes=WORLD, device="cpu",
                             display="none", return_all=True, **options)  # fmt: skip


def one_thread_then(function, *args: Any) -> Any:
    """2 ranks on 2 cores: one intra-op thread each (what torchrun's OMP_NUM_THREADS=1 gives).

    Also a workaround, reported to the launcher's owner: a rank *forked* from a process whose OpenMP
    pool already ran (this pytest process, after the in-process tests) hangs in its first parallel op
    unless it first drops to one thread.
    """
    torch.set_num_threads(1)
    return function(*args)


# ---------------------------------------------------------------------------------------- 1. equivalence
N_SAMPLES, EPOCHS = 64, 2


def regression_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N_SAMPLES, 6, generator=generator), torch.randn(N_SAMPLES, 3, generator=generator))


def teacher_data() -> TensorDataset:
    """A target the model can learn (y = a fixed linear map of x), to see the loss fall."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_SAMPLES, 6, generator=generator)
    return TensorDataset(x, x @ torch.randn(6, 3, generator=generator))


def fresh_training_objects():
    torch.manual_seed(0)  # same init everywhere; prepare() then draws the data-order generator's seed
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return model, optimizer, scheduler


def weights_of(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}


def train_with_accelerator(batch_size: int, shuffle: bool, accumulation: int = 1, clip: Optional[float] = None):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model, optimizer, scheduler = fresh_training_objects()
    loader = DataLoader(regression_data(), batch_size=batch_size, shuffle=shuffle)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for _ in range(EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(F.mse_loss(model(x), y))
                if clip is not None and accelerator.sync_gradients:  # HF's form: clip the whole step's gradients
                    accelerator.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    # what a user returns from a launch: the DDP-wrapped model's weights under the plain module's names
    weights = {name: value.detach().cpu().clone() for name, value in accelerator.get_state_dict(model).items()}
    assert weights.keys() == accelerator.unwrap_model(model).state_dict().keys()
    return weights


def train_plain_pytorch(batch_size: int, shuffle: bool, clip: Optional[float] = None, scheduler_steps: int = 1,
                        processes: int = 1):  # fmt: skip
    """The single-process reference: no Accelerator at all, shuffled in HF accelerate's order for a run on
    ``processes``: on several, ``prepare()`` seeds the sampler a generator of its own once, from a draw on the global
    RNG (here: right after the model's initialisation), and the epochs go on from it; on one, it leaves the sampler
    alone (a plain ``shuffle=True``: a new draw each epoch). ``scheduler_steps`` per optimizer step: a prepared
    scheduler steps ``num_processes`` times per step, as in HF accelerate."""
    model, optimizer, scheduler = fresh_training_objects()
    dataset = regression_data()
    sampler = None
    if shuffle and processes > 1:
        drawn = int(torch.empty((), dtype=torch.int64).random_().item())
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(drawn))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=shuffle and sampler is None)
    for _ in range(EPOCHS):
        for x, y in loader:
            F.mse_loss(model(x), y).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            for _ in range(scheduler_steps):
                scheduler.step()
            optimizer.zero_grad()
    return weights_of(model)


EQUIVALENCE_CASES = {
    # name: (per-rank batch, shuffle, accumulation steps, clip) -- all make 16 samples per optimizer step
    "ordered": (8, False, 1, None),
    "shuffled": (8, True, 1, None),
    "accumulated+clipped": (4, True, 2, 0.05),
}


def equivalence_rank():
    return {name: train_with_accelerator(batch, shuffle, steps, clip)
            for name, (batch, shuffle, steps, clip) in EQUIVALENCE_CASES.items()}  # fmt: skip


def assert_same_weights(actual: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor], what: str) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert torch.allclose(actual[name], expected[name], rtol=1e-4, atol=1e-5), f"{what}: {name} differs"


@pytest.mark.timeout(180)
def test_two_ranks_train_like_one_process_with_a_doubled_batch():
    ranks = launch(equivalence_rank)
    for name, (batch, shuffle, steps, clip) in EQUIVALENCE_CASES.items():
        expected = train_plain_pytorch(batch * WORLD * steps, shuffle, clip, scheduler_steps=WORLD, processes=WORLD)
        initial = weights_of(fresh_training_objects()[0])
        assert not torch.allclose(expected["0.weight"], initial["0.weight"])  # it did train
        for rank, result in enumerate(ranks):
            assert_same_weights(result[name], expected, f"{name}, rank {rank}")
    # the clip really bit (otherwise the case would not test where clipping happens)
    clipped, unclipped = train_plain_pytorch(16, True, 0.05), train_plain_pytorch(16, True)
    assert not torch.allclose(clipped["0.weight"], unclipped["0.weight"])


@pytest.mark.timeout(60)
def test_one_process_gradient_accumulation_equals_a_doubled_batch():
    # in this process, no launcher: batch 8 x 2 accumulation steps == batch 16, with clipping and a scheduler
    accumulated = train_with_accelerator(8, shuffle=True, accumulation=2, clip=0.05)
    assert_same_weights(accumulated, train_plain_pytorch(16, True, clip=0.05), "1 process, accumulation 2")


def all_reduces_per_micro_step(accumulation: int) -> List[int]:
    """How many gradient all-reduces DDP ran in each micro-step of two epochs, counted by a DDP comm hook."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model, optimizer, scheduler = fresh_training_objects()
    # 64 samples / (2 ranks x 4) = 8 micro-batches an epoch: a cycle of 3, 3, then 2 cut short by the epoch's end
    loader = DataLoader(regression_data(), batch_size=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    per_step = []
    for _ in range(EPOCHS):
        for x, y in loader:
            before = len(calls)
            with accelerator.accumulate(model):
                accelerator.backward(F.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            per_step.append(len(calls) - before)
    return per_step


def test_accumulation_all_reduces_once_per_cycle_not_on_every_micro_step():
    # Issue 36: with DDP's no_sync dropped, the weights still come out the same (averaging is linear), so the
    # equivalence tests pass; only counting the all-reduces shows the wasted communication.
    ranks = launch(all_reduces_per_micro_step, 3)
    one_epoch = [0, 0, 1, 0, 0, 1, 0, 1]  # (the model is one DDP bucket: one all-reduce a sync step)
    assert ranks == [one_epoch * EPOCHS] * WORLD


# ------------------------------------------------------------------------------------------ 2. sharding
ODD = 23  # samples: never a multiple of WORLD * batch, so the last step is padded


def sharding_loaders():
    """Fresh loaders, identical on every rank and in the single-process reference."""
    return {
        "global-rng-sampler": DataLoader(index_dataset(ODD), batch_size=4, sampler=GlobalRNGSampler(ODD)),
        "weighted": DataLoader(index_dataset(ODD), batch_size=4,
                               sampler=WeightedRandomSampler(torch.linspace(0.1, 1, ODD), 30)),  # fmt: skip
        "batch-sampler": DataLoader(index_dataset(ODD), batch_sampler=UnevenBatchSampler(ODD)),
        "iterable": DataLoader(RangeStream(ODD), batch_size=4),
        "eval-ordered": DataLoader(index_dataset(ODD), batch_size=4),
    }


def read_passes(accelerator: Accelerator, epochs: int = 2):
    """Per loader and epoch: this rank's batches (lists of indices) and gather_for_metrics' result."""
    out = {}
    for name, loader in sharding_loaders().items():
        loader = accelerator.prepare(loader)
        passes = []
        for _ in range(epochs):
            mine, gathered = [], []
            for batch in loader:
                values = batch[0] if isinstance(batch, (list, tuple)) else batch
                mine.append(values.tolist())
                gathered += accelerator.gather_for_metrics(values).tolist()
            passes.append({"mine": mine, "gathered": gathered})
        out[name] = passes
    return out


def collectives(accelerator: Accelerator, shared_dir: str) -> Dict[str, Any]:
    rank = accelerator.process_index
    results: Dict[str, Any] = {}
    results["uneven"] = accelerator.gather(torch.arange(rank + 1)).tolist()
    tree = accelerator.gather({"a": torch.tensor(float(rank)), "b": (torch.ones(2, 2) * rank,)})
    results["tree"] = (tree["a"].tolist(), tree["b"][0].shape, type(tree["b"]).__name__)
    results["reduce"] = [accelerator.reduce(torch.tensor(rank + 1.0), op).item() for op in ("sum", "mean", "max")]
    padded = accelerator.pad_across_processes(torch.ones(1, rank + 2), dim=1, pad_index=-1)
    results["padded"] = accelerator.gather(padded).tolist()
    results["objects"] = accelerator.gather_for_metrics([f"rank{rank}"])
    try:
        accelerator.gather(torch.zeros(2, rank + 1))
    except ValueError as error:  # raised on every rank (no hang): shapes are exchanged first
        results["mismatch"] = str(error)
    marker = os.path.join(shared_dir, "written-by-main-first")
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            with open(marker, "w") as handle:
                handle.write("x")
        results["marker_seen"] = os.path.exists(marker)
    accelerator.save({"rank": rank}, os.path.join(shared_dir, "saved.pt"))  # the main process writes, as in HF
    accelerator.wait_for_everyone()
    results["saved"] = torch.load(os.path.join(shared_dir, "saved.pt"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        accelerator.print("hello from main")
    results["printed"] = printed.getvalue()
    results["identity"] = (accelerator.process_index, accelerator.local_process_index, accelerator.num_processes,
                           accelerator.is_main_process, accelerator.is_local_main_process,
                           accelerator.distributed_type.value, str(accelerator.device))  # fmt: skip
    return results


def seedable_accelerator(**options: Any) -> Accelerator:
    """HF's use_seedable_sampler: the data order depends on the seed and the epoch only, the same for 1 or N processes
    (HF's default order is not: one process leaves the sampler to the global RNG), so one pass on 2 ranks can be held
    against one pass in this process."""
    return Accelerator(seed=1234, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True), **options)


def sharding_rank(shared_dir: str):
    accelerator = seedable_accelerator()
    passes, results = read_passes(accelerator), collectives(accelerator, shared_dir)
    was_initialized = torch.distributed.is_initialized()
    accelerator.end_training()
    results["group"] = (was_initialized, torch.distributed.is_initialized())
    return passes, results


@pytest.mark.timeout(180)
def test_shards_cover_one_pass_and_gather_for_metrics_drops_padding(tmp_path):
    ranks = launch(sharding_rank, str(tmp_path))
    reference = read_passes(seedable_accelerator(cpu=True))  # this process alone: the 1-process order
    for name, one_process in reference.items():
        for epoch, expected in enumerate(one_process):
            order = [i for batch in expected["mine"] for i in batch]
            assert expected["gathered"] == order
            if name in ("eval-ordered", "iterable", "batch-sampler"):
                assert order == list(range(ODD))
            per_rank = [ranks[r][0][name][epoch] for r in range(WORLD)]
            steps = len(per_rank[0]["mine"])
            assert all(len(p["mine"]) == steps for p in per_rank), f"{name}: uneven batch counts"
            seen = [i for s in range(steps) for p in per_rank for i in p["mine"][s]]  # rank by rank
            padding = seen[len(order):]
            assert seen[: len(order)] == order, f"{name}: the ranks' union is not one pass"
            assert padding == [order[i % len(order)] for i in range(len(padding))], f"{name}: padding"
            if name in ("eval-ordered", "iterable"):
                assert len(padding) == 3 * WORLD * 4 - ODD  # 3 steps of 2 ranks x 4, one sample short
            for p in per_rank:  # exactly one copy of the data, in order, on every rank
                assert p["gathered"] == order, f"{name}: gather_for_metrics"
        assert one_process[0]["gathered"] != one_process[1]["gathered"] or name in ("eval-ordered", "iterable",
                                                                                   "batch-sampler")  # fmt: skip

    main, other = ranks[0][1], ranks[1][1]
    for results in (main, other):
        assert results["uneven"] == [0, 0, 1]
        assert results["tree"] == ([0.0, 1.0], torch.Size([4, 2]), "tuple")
        assert results["reduce"] == [3.0, 1.5, 2.0]
        assert results["padded"] == [[1.0, 1.0, -1.0], [1.0, 1.0, 1.0]]
        assert results["objects"] == ["rank0", "rank1"]
        assert "ranks disagree" in results["mismatch"] and "(2, 1)" in results["mismatch"]
        assert results["marker_seen"] and results["saved"] == {"rank": 0}
        assert results["group"] == (True, False)  # end_training destroyed the process group
    assert main["printed"] == "hello from main\n" and other["printed"] == ""
    assert main["identity"] == (0, 0, 2, True, True, "MULTI_CPU", "cpu")
    assert other["identity"] == (1, 1, 2, False, False, "MULTI_CPU", "cpu")


# ------------------------------------------------------------------------------------ 3. seeds' example
def seeds_example():
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=32, batch_first=True)  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    source = torch.randn(64, 5, 16)
    dataset = TensorDataset(source, source.flip(1))  # learn to reverse a sequence
    data = DataLoader(dataset, batch_size=8, shuffle=True)

    model, optimizer, data = accelerator.prepare(model, optimizer, data)

    model.train()
    losses = []
    for _ in range(4):
        for source, targets in data:
            optimizer.zero_grad()
            output = model(source, targets)
            loss = F.mse_loss(output, targets)
            accelerator.backward(loss)
            optimizer.step()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return losses, weights_of(accelerator.unwrap_model(model))


@pytest.mark.timeout(180)
def test_the_seeds_transformer_example_trains_on_two_ranks():
    (losses, weights), (other_losses, other_weights) = launch(seeds_example)
    assert losses == other_losses and len(losses) == 4 * 64 // (8 * WORLD)
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4]), losses  # it learns
    for name in weights:  # DDP kept the replicas identical
        assert torch.equal(weights[name], other_weights[name]), name


# -------------------------------------------------------------------------------- 4. bf16 + checkpoints
def bf16_and_resume(checkpoint_dir: str):
    def build(accelerator: Accelerator):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                    torch.nn.Linear(32, 3))  # fmt: skip
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.8)
        loader = DataLoader(teacher_data(), batch_size=8, shuffle=True)
        return accelerator.prepare(model, optimizer, loader, scheduler)

    def run_epoch(accelerator, model, optimizer, loader, scheduler) -> List[float]:
        losses = []
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    accelerator = Accelerator()  # bf16 comes from notebook_launcher(mixed_precision="bf16")
    objects = build(accelerator)
    inner_dtypes = []
    accelerator.unwrap_model(objects[0])[0].register_forward_hook(lambda m, a, out: inner_dtypes.append(out.dtype))
    output_dtype = objects[0](torch.randn(2, 6)).dtype
    losses = run_epoch(accelerator, *objects)
    accelerator.save_state(checkpoint_dir)
    at_save = weights_of(accelerator.unwrap_model(objects[0]))
    for _ in range(3):
        losses += run_epoch(accelerator, *objects)
    finished = weights_of(accelerator.unwrap_model(objects[0]))

    # a "new session": fresh objects, RNG moved on, then load_state and the same remaining epochs
    resumed_accelerator = Accelerator()
    resumed = build(resumed_accelerator)
    torch.rand(100)
    resumed_accelerator.load_state(checkpoint_dir)
    loaded = weights_of(resumed_accelerator.unwrap_model(resumed[0]))
    for _ in range(3):
        run_epoch(resumed_accelerator, *resumed)
    return {
        "precision": accelerator.mixed_precision,
        "dtypes": (inner_dtypes[0], output_dtype),
        "losses": losses,
        "at_save": at_save,
        "loaded": loaded,
        "finished": finished,
        "resumed": weights_of(resumed_accelerator.unwrap_model(resumed[0])),
        "files": sorted(os.listdir(checkpoint_dir)),
    }


@pytest.mark.timeout(180)
def test_bf16_on_cpu_trains_and_save_load_state_resumes_to_the_same_weights(tmp_path):
    ranks = launch(bf16_and_resume, str(tmp_path / "checkpoint"), mixed_precision="bf16")
    for rank, result in enumerate(ranks):
        assert result["precision"] == "bf16"
        assert result["dtypes"] == (torch.bfloat16, torch.float32)  # autocast inside, fp32 out
        steps = len(result["losses"]) // 4
        assert sum(result["losses"][-steps:]) < 0.6 * sum(result["losses"][:steps])  # it learns in bf16
        assert_same_weights(result["loaded"], result["at_save"], f"rank {rank}: load_state")
        assert not torch.allclose(result["finished"]["0.weight"], result["at_save"]["0.weight"])
        for name in result["finished"]:  # dropout RNG, data order, Adam and scheduler state all restored
            assert torch.equal(result["resumed"][name], result["finished"][name]), f"rank {rank}: {name}"
    assert ranks[0]["files"] == ["model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl",
                                 "scheduler.bin"]  # HF accelerate's names  # fmt: skip


# ---------------------------------------------------------------------------------------------- 5. CUDA
# Asked through NVML (torch.cuda.is_available() would initialize the driver in pytest's process, and every later
# fork would be refused); the CUDA work itself runs in a rank started by spawn, never in pytest's process.
def cuda(test):
    """Runs on a real GPU (tests marked ``cuda`` see it: conftest.py); skipped without one."""
    return pytest.mark.cuda(pytest.mark.skipif(cuda_device_count() == 0,
                                               reason="needs a CUDA device (none on this machine)")(test))


def on_one_cuda_rank(function) -> Any:
    return notebook_launcher(function, num_processes=1, device="cuda", start_method="spawn", display="none")


@cuda
@pytest.mark.timeout(180)
def test_fp16_grad_scaler_on_one_cuda_device():
    assert on_one_cuda_rank(fp16_grad_scaler_rank) == "ok"


@cuda
@pytest.mark.timeout(180)
def test_bf16_on_one_cuda_device():
    outcome = on_one_cuda_rank(bf16_rank)
    if outcome == "no bf16":
        pytest.skip("this CUDA device has no bf16")
    assert outcome == "ok"


def fp16_grad_scaler_rank() -> str:
    accelerator = Accelerator(mixed_precision="fp16")
    assert accelerator.device.type == "cuda" and accelerator.scaler is not None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    inputs = torch.randn(64, 8)
    # a target the model can learn (random targets gave a last batch's loss above the first's: a different batch)
    loader = DataLoader(TensorDataset(inputs, inputs @ torch.linspace(-1, 1, 8).unsqueeze(1)), batch_size=16)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    inner = []
    model[0].register_forward_hook(lambda m, a, out: inner.append(out.dtype))
    losses, skipped = [], []
    for _ in range(5):
        for x, y in loader:
            assert x.device.type == "cuda"
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)  # unscaled before clipping
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            skipped.append(optimizer.step_was_skipped)
            if not skipped[-1]:  # the first steps may overflow while the scaler finds its scale
                assert torch.isfinite(norm) and norm < 1e3  # a real, unscaled gradient norm
    assert inner[0] == torch.float16, inner[0]
    assert skipped.count(False) >= 15, skipped
    first_epoch, last_epoch = sum(losses[:4]) / 4, sum(losses[-4:]) / 4  # 4 batches an epoch (fp32: 3.8 -> 2.6)
    assert last_epoch < 0.9 * first_epoch, losses
    # an overflowing step is skipped: weights, and the scheduler, stay where they were
    before = weights_of(model)
    lr_before = scheduler.get_last_lr()
    accelerator.backward(model(x).sum() * float("inf"))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    assert optimizer.step_was_skipped and accelerator.optimizer_step_was_skipped
    assert scheduler.get_last_lr() == lr_before
    after = weights_of(model)
    assert all(torch.equal(before[name], after[name]) for name in before)
    return "ok"


def bf16_rank() -> str:
    if not torch.cuda.is_bf16_supported():
        return "no bf16"
    accelerator = Accelerator(mixed_precision="bf16")
    assert accelerator.scaler is None
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    inner = []
    model[0].register_forward_hook(lambda m, a, out: inner.append(out.dtype))
    out = model(torch.randn(4, 8, device=accelerator.device))
    assert inner == [torch.bfloat16] and out.dtype == torch.float32
    return "ok"


# ------------------------------------------------------------------- 5. init_module where no rank shards
def init_module_plain_rank(directory: str) -> Dict[str, Any]:
    """The same training with the model built inside ``init_module`` and outside it: under DDP and in one
    process the block changes nothing (the model is real, on the CPU, with the same weights and losses)."""
    results: Dict[str, Any] = {}
    for inside in (False, True):
        accelerator = Accelerator(cpu=True)
        torch.manual_seed(0)
        with accelerator.init_module() if inside else contextlib.nullcontext():
            model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        built_on = sorted({str(param.device) for param in model.parameters()})
        initial = weights_of(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loader = DataLoader(teacher_data(), batch_size=8)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        losses = []
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        results[f"inside={inside}"] = {"built_on": built_on, "initial": initial, "losses": losses,
                                       "trained": weights_of(accelerator.unwrap_model(model))}  # fmt: skip
        if inside:  # save, then load into a model whose initialisation was skipped
            accelerator.save_model(model, os.path.join(directory, "final"))
            again = Accelerator(cpu=True)
            with again.init_module(empty_init=True):
                fresh = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
            fresh = again.prepare(fresh)
            again.load_model(fresh, os.path.join(directory, "final"))
            results["loaded"] = weights_of(again.unwrap_model(fresh))
    return results


def assert_init_module_is_a_plain_block(result: Dict[str, Any], what: str) -> None:
    plain, inside = result["inside=False"], result["inside=True"]
    assert inside["built_on"] == plain["built_on"] == ["cpu"], what  # a real model, not meta or partitioned
    for key in ("initial", "trained"):
        assert inside[key].keys() == plain[key].keys()
        for name, value in plain[key].items():
            assert torch.equal(inside[key][name], value), f"{what}: {key} {name}"
    assert inside["losses"] == plain["losses"] and plain["losses"][-1] < plain["losses"][0], what
    assert_same_weights(result["loaded"], inside["trained"], f"{what}: load_model after init_module(empty_init)")


def test_init_module_is_a_plain_block_under_ddp_and_in_one_process(tmp_path):
    ranks = launch(init_module_plain_rank, str(tmp_path / "ddp"))
    for rank, result in enumerate(ranks):
        assert_init_module_is_a_plain_block(result, f"DDP, rank {rank}")
    assert_same_weights(ranks[1]["inside=True"]["trained"], ranks[0]["inside=True"]["trained"], "DDP ranks agree")
    assert_init_module_is_a_plain_block(init_module_plain_rank(str(tmp_path / "one")), "one process")


# ------------------------------------------------------------------- 6. HF's names behind them, on 2 ranks
def hf_names_on_ranks() -> Dict[str, Any]:
    """LocalSGD, the debug-mode op checker, PowerSGD's DDP hook on gloo, get_logger's main_process_only /
    in_order, trigger_sync_in_backward — as HF code calls them (``notebook_accel.*`` for ``accelerate.*``)."""
    import logging

    from notebook_accel.local_sgd import LocalSGD
    from notebook_accel.logging import get_logger
    from notebook_accel.state import PartialState
    from notebook_accel.utils import DDPCommunicationHookType, DistributedDataParallelKwargs, gather, reduce
    from notebook_accel.utils.operations import DistributedOperationException

    out: Dict[str, Any] = {}
    # LocalSGD: no gradient sync between averages; every 2nd step the ranks' weights become their mean
    accelerator = Accelerator()
    rank = accelerator.process_index
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    weights = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
        for step in range(3):
            x = torch.full((1, 2), float(rank + 1))  # each rank its own data: the weights drift apart
            accelerator.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            weights.append(accelerator.unwrap_model(model).weight.detach().clone())
    out["local_sgd_weights"] = [w.tolist() for w in weights]
    out["after_block"] = accelerator.unwrap_model(model).weight.detach().tolist()
    # debug mode: ranks gathering tensors of different shapes raise DistributedOperationException on every rank
    state = PartialState()
    state.debug = True
    try:
        gather(torch.zeros(1, 2 + rank))
        out["op_checker"] = "ran on"
    except DistributedOperationException as error:
        out["op_checker"] = str(error)
    try:
        accelerator.reduce(torch.zeros(2 + rank))
        out["op_checker_reduce"] = "ran on"
    except DistributedOperationException:
        out["op_checker_reduce"] = "raised"
    state.debug = False
    out["gather_by_keyword"] = gather(tensor=torch.tensor([rank])).tolist()
    out["reduce_mean"] = reduce(tensor=torch.tensor([float(rank)])).tolist()
    # PowerSGD (torch's hook) on gloo
    hooked = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(
        comm_hook=DDPCommunicationHookType.POWER_SGD, comm_state_option={"matrix_approximation_rank": 1})])
    model = hooked.prepare(torch.nn.Linear(4, 4))
    hooked.backward(model(torch.full((2, 4), float(rank))).sum())
    grad = hooked.unwrap_model(model).weight.grad
    out["power_sgd_grads_equal"] = bool(torch.allclose(*hooked.gather(grad[None])))
    # get_logger: main_process_only (default) and in_order
    records: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = get_logger("hf_names_test", log_level="INFO")
    logger.logger.addHandler(handler)
    logger.info("main only")
    logger.info(f"rank {rank}", main_process_only=False)
    logger.info(f"in order {rank}", main_process_only=False, in_order=True)
    logger.logger.removeHandler(handler)
    out["logged"] = records
    return out


def test_hf_names_behave_as_hf_documents_on_two_ranks():
    first, second = launch(hf_names_on_ranks)
    # LocalSGD: step 1 differs between ranks (no sync), step 2 averaged (equal), the block's end averages again
    assert first["local_sgd_weights"][0] != second["local_sgd_weights"][0]
    assert first["local_sgd_weights"][1] == second["local_sgd_weights"][1]
    assert first["after_block"] == second["after_block"]
    assert "Cannot apply desired operation due to shape mismatches" in first["op_checker"]
    assert "Process 0: [('', [1, 2])]" in second["op_checker"] and "Process 1: [('', [1, 3])]" in second["op_checker"]
    assert first["op_checker_reduce"] == second["op_checker_reduce"] == "raised"
    assert first["gather_by_keyword"] == [0, 1] and first["reduce_mean"] == [0.5]
    assert first["power_sgd_grads_equal"] and second["power_sgd_grads_equal"]
    assert first["logged"] == ["main only", "rank 0", "in order 0"]
    assert second["logged"] == ["rank 1", "in order 1"]
