"""Accelerator pieces that need no second process: sharding maths, trees, precision, errors, one-process runs.

Sharding is tested by running the shard of *every* rank in this one process (the shards never talk to
each other: each rank runs the same sampler in lockstep), so the padding rules are checked for 3 ranks
and many sampler kinds in milliseconds. The real multi-process runs are in test_accelerator_distributed.py.
"""
from __future__ import annotations

import collections
import random
from typing import Any, List

import pytest
import torch
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    TensorDataset,
    WeightedRandomSampler,
)

from notebook_accel import Accelerator
from notebook_accel.accelerator import operations
from notebook_accel.accelerator.data_loader import prepare_data_loader
from notebook_accel.accelerator.gradient_state import GradientState
from notebook_accel.accelerator.precision import resolve_mixed_precision
from notebook_accel.accelerator.rng import SharedRNG

pytestmark = pytest.mark.timeout(60)

# torch makes its inductor cache dir (TMPDIR/torchinductor_<user>) on a process's first optimizer step;
# make it now, at import, so the suite's "no new temp entries" check does not blame the first test.
torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0).step()


# ------------------------------------------------------------------------------------------- datasets
class GlobalRNGSampler(Sampler):
    """A user sampler that shuffles with torch's *global* RNG (no generator): the hard case."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


class PythonRandomSampler(GlobalRNGSampler):
    """Same, with python's ``random``."""

    def __iter__(self):
        order = list(range(self.n))
        random.shuffle(order)
        return iter(order)


class UnevenBatchSampler(Sampler):
    """Batches of varying size (like a bucketing sampler): 3, 1, 4, 1, 5, ... indices."""

    def __init__(self, n: int) -> None:
        self.batches, start = [], 0
        sizes = [3, 1, 4, 1, 5, 2, 6]
        while start < n:
            size = sizes[len(self.batches) % len(sizes)]
            self.batches.append(list(range(start, min(start + size, n))))
            start += size

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter([list(b) for b in self.batches])


class RangeStream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.arange(self.n).unbind())


def index_dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


# -------------------------------------------------------------------------------------- simulated ranks
def shard_all_ranks(make_loader, world: int, split: bool = False, seed: int = 1234, epochs: int = 1,
                    seedable: bool = True):  # fmt: skip
    """Every rank's ``[(indices, layout)]`` per epoch, each rank's shard built from a fresh loader. ``seedable``
    (HF's use_seedable_sampler): the order depends on ``seed`` and the epoch only, so ranks simulated one after the
    other in this process agree; HF's default order (a draw on the global RNG at prepare, synchronized by a
    broadcast, a no-op here) needs the global RNG reseeded before each rank's prepare, as set_seed does."""
    per_rank = []
    for rank in range(world):
        torch.manual_seed(seed)
        loader = prepare_data_loader(
            make_loader(), process_index=rank, num_processes=world, device=None,
            gradient_state=GradientState(), base_seed=seed, split_batches=split, use_seedable_sampler=seedable,
        )  # fmt: skip
        epochs_seen = []
        for _ in range(epochs):
            seen = []
            for batch in loader:
                values = batch[0] if isinstance(batch, (list, tuple)) else batch
                seen.append((values.reshape(-1).tolist(), loader.current_layout))
            epochs_seen.append(seen)
        per_rank.append(epochs_seen)
    return per_rank


def interleave(per_rank, epoch: int = 0, drop_padding: bool = False) -> List[int]:
    """The global order the ranks saw together: step by step, rank by rank (what gather returns)."""
    steps = len(per_rank[0][epoch])
    assert all(len(rank[epoch]) == steps for rank in per_rank), "ranks got different numbers of batches"
    order = []
    for step in range(steps):
        for rank, seen in enumerate(per_rank):
            values, layout = seen[epoch][step]
            order += values[: layout.real[rank]] if drop_padding else values
    return order


def check_shards(make_loader, world: int, split: bool = False, epochs: int = 1,
                 seedable: bool = True) -> List[List[int]]:  # fmt: skip
    """One pass over the ranks == one pass of the 1-process loader (+ padding that repeats the start)."""
    reference = shard_all_ranks(make_loader, 1, epochs=epochs, seedable=seedable)
    sharded = shard_all_ranks(make_loader, world, split=split, epochs=epochs, seedable=seedable)
    orders = []
    for epoch in range(epochs):
        one_process = interleave(reference, epoch)
        assert interleave(sharded, epoch, drop_padding=True) == one_process
        with_padding = interleave(sharded, epoch)
        padding = with_padding[len(one_process):]
        assert with_padding[: len(one_process)] == one_process
        if padding:  # padding repeats the start of the epoch, cyclically
            assert padding == [one_process[i % len(one_process)] for i in range(len(padding))]
        orders.append(one_process)
    return orders


# ------------------------------------------------------------------------------------------------ sharding
@pytest.mark.parametrize("n,batch,world", [(24, 4, 3), (23, 4, 3), (5, 4, 3), (9, 2, 2), (1, 3, 2)])
def test_sequential_batches_shard_and_pad(n, batch, world):
    (order,) = check_shards(lambda: DataLoader(index_dataset(n), batch_size=batch), world)
    assert order == list(range(n))


def test_padding_follows_accelerate_layout():
    # 10 samples, batch 4, 2 ranks: accelerate gives rank 1 the short batch [8, 9] completed by [0, 1]
    (rank0,), (rank1,) = shard_all_ranks(lambda: DataLoader(index_dataset(10), batch_size=4), 2)
    assert [v for v, _ in rank0] == [[0, 1, 2, 3], [8, 9, 0, 1]]
    assert [v for v, _ in rank1] == [[4, 5, 6, 7], [2, 3, 4, 5]]
    assert rank0[1][1].real == (2, 0)


def test_drop_last_gives_every_rank_the_same_full_batches():
    per_rank = shard_all_ranks(lambda: DataLoader(index_dataset(23), batch_size=4, drop_last=True), 3)
    assert interleave(per_rank) == list(range(12))  # 5 full batches -> 3 steps would need 6: keep 1 step
    assert all(len(values) == 4 for rank in per_rank for values, _ in rank[0])


@pytest.mark.parametrize("n", [24, 22])
def test_split_batches_cut_each_batch(n):
    (order,) = check_shards(lambda: DataLoader(index_dataset(n), batch_size=6), 3, split=True)
    assert order == list(range(n))


def test_layouts_stay_matched_to_batches_with_worker_processes():
    # workers prefetch batches ahead of the consumer; each batch's layout must still be its own
    make = lambda: DataLoader(index_dataset(23), batch_size=4, shuffle=True, num_workers=2)  # noqa: E731
    first, second = check_shards(make, 2, epochs=2)
    assert sorted(first) == sorted(second) == list(range(23)) and first != second


def test_split_batches_needs_divisible_batch():
    with pytest.raises(ValueError, match="not divisible"):
        shard_all_ranks(lambda: DataLoader(index_dataset(8), batch_size=4), 3, split=True)


@pytest.mark.parametrize(
    "make_loader",
    [
        lambda: DataLoader(index_dataset(23), batch_size=4, shuffle=True),
        lambda: DataLoader(index_dataset(23), batch_size=4, sampler=GlobalRNGSampler(23)),
        lambda: DataLoader(index_dataset(23), batch_size=4, sampler=PythonRandomSampler(23)),
        lambda: DataLoader(
            index_dataset(23), batch_size=4, sampler=WeightedRandomSampler(torch.linspace(0.1, 1, 23), 30)
        ),
        lambda: DataLoader(index_dataset(23), batch_sampler=UnevenBatchSampler(23)),
        lambda: DataLoader(index_dataset(23), batch_size=None, sampler=RandomSampler(index_dataset(23))),
    ],
    ids=["shuffle", "global-rng-sampler", "python-random-sampler", "weighted", "batch-sampler", "unbatched"],
)
def test_random_samplers_shard_identically_and_reshuffle_each_epoch(make_loader):
    first, second = check_shards(make_loader, world=3, epochs=2)
    if not isinstance(make_loader().batch_sampler, UnevenBatchSampler):  # the only sequential one
        assert first != second  # a new epoch, a new order
    if not isinstance(make_loader().sampler, WeightedRandomSampler):
        assert sorted(first) == list(range(23))  # a permutation: each sample exactly once


def test_shared_rng_leaves_the_users_streams_alone():
    torch.manual_seed(0)
    random.seed(0)
    expected_torch, expected_python = torch.rand(3), random.random()
    torch.manual_seed(0)
    random.seed(0)
    drawn = list(SharedRNG(5).iterate(GlobalRNGSampler(10)))
    assert sorted(drawn) == list(range(10))
    assert torch.equal(torch.rand(3), expected_torch) and random.random() == expected_python
    assert list(SharedRNG(5).iterate(GlobalRNGSampler(10))) == drawn  # same seed, same order


def test_user_generator_is_kept():
    make = lambda: DataLoader(index_dataset(16), batch_size=4, shuffle=True,  # noqa: E731
                              generator=torch.Generator().manual_seed(7))  # fmt: skip
    (order,) = check_shards(make, 2, seedable=False)
    plain = [i for batch in make() for i in batch[0].tolist()]
    assert order == plain  # HF's default: the user's generator decides the order, as without prepare()


def test_hf_default_order_draws_a_generator_once_and_never_reseeds_it():
    """HF's prepare_data_loader without use_seedable_sampler: one draw on the global RNG seeds the sampler's new
    generator; the epochs go on from it (set_epoch changes nothing); the draw advances the global RNG."""
    torch.manual_seed(21)
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    after_the_draw = torch.get_rng_state()
    generator = torch.Generator().manual_seed(seed)
    expected = [list(RandomSampler(range(12), generator=generator)) for _ in range(3)]  # each epoch goes on
    for world in (2, 3):
        per_rank = shard_all_ranks(lambda: DataLoader(index_dataset(12), batch_size=2, shuffle=True), world,
                                   seed=21, epochs=3, seedable=False)  # fmt: skip
        assert [interleave(per_rank, epoch) for epoch in range(3)] == expected
    torch.manual_seed(21)
    loader = prepare_data_loader(DataLoader(index_dataset(12), batch_size=2, shuffle=True), process_index=0,
                                 num_processes=2, device=None, gradient_state=GradientState(), base_seed=0)
    assert torch.equal(torch.get_rng_state(), after_the_draw)
    rank_zero = []
    for _ in range(2):
        loader.set_epoch(0)  # HF's set_epoch: no reseeding, the second pass is the second epoch's order
        rank_zero.append([i for (batch,) in loader for i in batch.tolist()])
    assert rank_zero == [[i for start in (0, 4, 8) for i in order[start:start + 2]] for order in expected[:2]]


def test_set_epoch_selects_the_order():
    loader = prepare_data_loader(
        DataLoader(index_dataset(12), batch_size=4, shuffle=True), process_index=0, num_processes=1,
        device=None, gradient_state=GradientState(), base_seed=3, use_seedable_sampler=True,
    )  # fmt: skip
    epochs = []
    for epoch in (0, 1, 0):
        loader.set_epoch(epoch)
        epochs.append([i for (batch,) in loader for i in batch.tolist()])
    assert epochs[0] == epochs[2] != epochs[1]


@pytest.mark.parametrize(
    "n,batch,world,split", [(24, 4, 3, False), (23, 4, 3, False), (22, 6, 3, True), (2, 4, 3, False)]
)
def test_iterable_dataset_shards_and_pads(n, batch, world, split):
    (order,) = check_shards(lambda: DataLoader(RangeStream(n), batch_size=batch), world, split=split)
    assert order == list(range(n))


def test_iterable_dataset_unbatched():
    (order,) = check_shards(lambda: DataLoader(RangeStream(7), batch_size=None), 3)
    assert order == list(range(7))


class EpochAwareStream(IterableDataset):
    """An IterableDataset that shuffles per epoch (set_epoch), the way streaming datasets do."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch))
        return iter(order.unbind())


class GeneratorStream(RangeStream):
    """An IterableDataset that shuffles with its own torch.Generator (reseeded per epoch by prepare)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.generator = torch.Generator()

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).unbind())


def test_iterable_datasets_get_the_epoch():
    first, second = check_shards(lambda: DataLoader(EpochAwareStream(13), batch_size=2), 2, epochs=2)
    assert sorted(first) == sorted(second) == list(range(13)) and first != second


def test_an_iterable_datasets_generator_is_reseeded_with_the_epoch_on_several_processes():
    """HF's IterableDatasetShard: ``dataset.generator.manual_seed(epoch)`` at each epoch (one process: untouched)."""
    per_rank = shard_all_ranks(lambda: DataLoader(GeneratorStream(13), batch_size=2), 2, epochs=2)
    for epoch in range(2):
        expected = torch.randperm(13, generator=torch.Generator().manual_seed(epoch)).tolist()
        assert interleave(per_rank, epoch, drop_padding=True) == expected


def test_a_distributed_sampler_is_left_alone():
    from torch.utils.data.distributed import DistributedSampler

    dataset = index_dataset(10)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
    with pytest.warns(UserWarning, match="already uses a DistributedSampler"):
        loader = prepare_data_loader(DataLoader(dataset, batch_size=2, sampler=sampler), process_index=1,
                                     num_processes=2, device=None, gradient_state=GradientState(), base_seed=0)
    assert [i for (batch,) in loader for i in batch.tolist()] == [1, 3, 5, 7, 9]


def test_prepared_loader_lengths():
    for n, batch, world, drop_last in [(23, 4, 3, False), (23, 4, 3, True), (24, 4, 2, False)]:
        for rank in range(world):
            loader = prepare_data_loader(
                DataLoader(index_dataset(n), batch_size=batch, drop_last=drop_last), process_index=rank,
                num_processes=world, device=None, gradient_state=GradientState(), base_seed=0,
            )  # fmt: skip
            assert len(loader) == len(list(loader))
            stream = prepare_data_loader(
                DataLoader(RangeStream(n), batch_size=batch, drop_last=drop_last), process_index=rank,
                num_processes=world, device=None, gradient_state=GradientState(), base_seed=0,
            )  # fmt: skip
            assert len(stream) == len(list(stream))


def test_end_of_dataloader_is_known_on_the_last_batch():
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(index_dataset(10), batch_size=4))
    flags = [loader.end_of_dataloader for _ in loader]
    assert flags == [False, False, True]
    assert accelerator.gradient_state.active_loader is None


# ------------------------------------------------------------------------------------------------- trees
Pair = collections.namedtuple("Pair", "x y")


def test_send_to_device_keeps_containers():
    class Movable:
        def __init__(self) -> None:
            self.moved_to = None

        def to(self, device):
            self.moved_to = device
            return self

    batch = {"pair": Pair(torch.ones(1), [torch.zeros(2), "text"]), "obj": Movable(), "n": 3}
    moved = operations.send_to_device(batch, torch.device("cpu"))
    assert isinstance(moved["pair"], Pair) and moved["pair"].y[1] == "text" and moved["n"] == 3
    assert moved["obj"].moved_to == torch.device("cpu")


def test_one_process_collectives_are_identities():
    tree = {"a": torch.tensor(2.0), "b": [torch.arange(3)]}
    gathered = operations.gather(tree)
    assert gathered["a"].tolist() == [2.0] and gathered["b"][0].tolist() == [0, 1, 2]
    assert operations.reduce(tree, "mean")["a"].item() == 2.0
    assert operations.pad_across_processes(tree) is tree


# ------------------------------------------------------------------------------------------------ errors
def test_prepare_rejects_unsupported_objects_with_what_it_accepts():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError, match=r"accepts torch.nn.Module.*DataLoader.*LRScheduler"):
        accelerator.prepare(torch.nn.Linear(1, 1), index_dataset(3))


def test_gather_rejects_non_tensors():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError, match=r"found a str at batch\['label'\].*gather_for_metrics"):
        accelerator.gather({"x": torch.ones(1), "label": "cat"})


def test_fp16_on_cpu_points_to_bf16():
    with pytest.raises(ValueError, match="bf16"):
        Accelerator(cpu=True, mixed_precision="fp16")


def test_mixed_precision_comes_from_the_launcher_env(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert resolve_mixed_precision(None) == "bf16"
    assert Accelerator(cpu=True).mixed_precision == "bf16"
    assert Accelerator(cpu=True, mixed_precision="no").mixed_precision == "no"
    with pytest.raises(ValueError, match="must be one of"):
        resolve_mixed_precision("fp8")


# ------------------------------------------------------------------------------------- one-process training
def test_one_process_without_launcher():
    accelerator = Accelerator(cpu=True)
    assert (accelerator.num_processes, accelerator.process_index, accelerator.is_main_process) == (1, 0, True)
    assert accelerator.distributed_type == "NO" and accelerator.device.type == "cpu"
    assert not torch.distributed.is_initialized()
    accelerator.wait_for_everyone()
    with accelerator.main_process_first():
        pass
    accelerator.end_training()


def test_accumulation_steps_optimizer_and_scheduler_once_per_cycle():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.ones(7, 2)), batch_size=1)  # 7 batches: cycles of 3, 3, 1
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    weights, syncs = [], []
    for (x,) in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            syncs.append(accelerator.sync_gradients)
            assert accelerator.clip_grad_norm_(model.parameters(), 1e9) is not None  # partial gradients too, as HF
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            weights.append(model.weight.detach().clone())
    assert syncs == [False, False, True, False, False, True, True]  # the last batch closes the cycle
    assert scheduler.get_last_lr() == [0.125]  # 3 optimizer steps, not 7
    changed = [not torch.equal(a, b) for a, b in zip(weights, weights[1:])]
    assert changed == [False, True, False, False, True, True]


def test_bf16_forward_runs_under_autocast_and_returns_fp32():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    inner = []
    model[0].register_forward_hook(lambda module, args, out: inner.append(out.dtype))
    out = model(torch.randn(2, 4))
    assert inner == [torch.bfloat16] and out.dtype == torch.float32
    with accelerator.autocast():
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.bfloat16
    plain = accelerator.unwrap_model(model, keep_autocast=False)
    assert plain(torch.randn(2, 4)).dtype == torch.float32 and inner[-1] == torch.float32


def test_gather_for_metrics_objects_one_process():
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(index_dataset(5), batch_size=2))
    seen: List[Any] = []
    for (batch,) in loader:
        seen += accelerator.gather_for_metrics([f"item{i}" for i in batch.tolist()])
    assert seen == [f"item{i}" for i in range(5)]


def test_loss_scaling_path_with_a_cpu_grad_scaler():
    """The fp16 bookkeeping (scale, unscale before clipping, skip on overflow, scheduler hold) runs on
    CUDA only; torch's GradScaler also works on CPU, so the same code path is exercised here."""
    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    reference = torch.autograd.grad(torch.nn.functional.mse_loss(model(x), y), [model.weight, model.bias])
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    assert torch.allclose(model.weight.grad, reference[0] * 2.0**10)  # the loss was scaled
    norm = accelerator.clip_grad_norm_(model.parameters(), 1e9)
    assert torch.allclose(norm, torch.cat([g.flatten() for g in reference]).norm())  # unscaled first
    optimizer.step()  # must not unscale a second time
    scheduler.step()
    assert not optimizer.step_was_skipped and scheduler.get_last_lr() == [0.05]
    assert torch.allclose(model.weight, before - 0.1 * reference[0])
    optimizer.zero_grad()

    accelerator.backward(model(x).sum() * float("inf"))
    weights = model.weight.detach().clone()
    optimizer.step()
    scheduler.step()
    assert optimizer.step_was_skipped and accelerator.optimizer_step_was_skipped
    assert torch.equal(model.weight, weights) and scheduler.get_last_lr() == [0.05]
    assert accelerator.scaler.get_scale() == 2.0**9  # backed off


# ------------------------------------------------------------------- split_between_processes, padded tensors

def test_split_between_processes_pads_a_tensors_short_shares_with_its_last_row():
    """HF accelerate's cut of 5 rows over 2 ranks: 3 and 2; ``apply_padding`` gives rank 1 the last row again (and a
    dict's tensors alike), with the rows' shape kept."""
    from notebook_accel.accelerator.partial_state import split_between_processes
    from notebook_accel.accelerator.state import DistributedType, ProcessState

    rows = torch.arange(10.0).reshape(5, 2)

    def share(rank: int, inputs: Any, apply_padding: bool) -> Any:
        state = ProcessState(process_index=rank, local_process_index=rank, num_processes=2, local_num_processes=2,
                             device=torch.device("cpu"), distributed_type=DistributedType.MULTI_CPU, backend="gloo")
        return split_between_processes(state, inputs, apply_padding=apply_padding)

    assert share(0, rows, True).tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert share(1, rows, False).tolist() == [[6.0, 7.0], [8.0, 9.0]]
    assert share(1, rows, True).tolist() == [[6.0, 7.0], [8.0, 9.0], [8.0, 9.0]]
    padded = share(1, {"x": rows, "y": rows[:, 0]}, True)
    assert padded["x"].shape == (3, 2) and padded["y"].tolist() == [6.0, 8.0, 8.0]
