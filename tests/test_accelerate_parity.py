"""Code written for HF accelerate runs unchanged on our Accelerator: the same snippets, on both, same results.

``hf_style_snippets(impl, ...)`` is HF-style code (its docs, ``examples/by_feature``, the ``no_trainer`` loops) in
which only the import changes (:func:`imports`). It runs twice on 2 CPU ranks started by our ``notebook_launcher``
— once on HF accelerate 1.x (the reference, in the test extra), once on ours — and each test compares one part of
what came back: values, the files written, which ranks ran what. Two launches in all (each costs 1-3 s here);
the things HF does not do on CPU (``join_uneven_inputs``) and the dashboard (``Launch.metrics``) are checked on
ours only, in the same launch.

In pytest's own process: every public member of HF's ``Accelerator`` is ours or in the explicit absent list
(each absent one raises a NotImplementedError that names it), and ``notebook_accel.utils`` has what HF code imports.
"""
from __future__ import annotations

import inspect
import os
import re
from typing import Any, Dict, List

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import notebook_accel
import notebook_accel.utils
from notebook_accel import Accelerator, last_launch, notebook_launcher
from notebook_accel.accelerator.absent import ABSENT_MEMBERS, ABSENT_PARAMETERS
from notebook_accel.errors import LaunchTimeout

accelerate = pytest.importorskip("accelerate")

pytestmark = pytest.mark.timeout(240)

WORLD = 2


def imports(impl: str):
    """The only line that differs: ``from accelerate import ...`` or ``from notebook_accel import ...``."""
    if impl == "hf":
        import accelerate.utils as utils
        from accelerate import Accelerator, PartialState
    else:
        import notebook_accel.utils as utils
        from notebook_accel import Accelerator, PartialState
    return Accelerator, PartialState, utils


class Counter:
    """An object of the user's own, saved in every checkpoint (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> Dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.count = state["count"]


def tiny_data(n: int = 8) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 2, generator=generator))


class TwoHeads(torch.nn.Module):
    """One head is never used: DDP needs find_unused_parameters=True (DistributedDataParallelKwargs)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(4, 2)
        self.unused = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def hf_style_snippets(impl: str, workdir: str) -> Dict[str, Any]:
    """HF-style code; returns what each snippet computed, on this rank."""
    torch.set_num_threads(1)
    Accelerator, PartialState, utils = imports(impl)
    out: Dict[str, Any] = {}
    ran: List[str] = []

    # --- distributed inference: split_between_processes (Accelerator and PartialState), gather_object
    accelerator = Accelerator()
    rank = accelerator.process_index
    state = PartialState()
    with accelerator.split_between_processes(["A", "B", "C", "D", "E"]) as prompts:
        out["split"] = list(prompts)
    with state.split_between_processes(["A", "B", "C"], apply_padding=True) as prompts:
        out["split_padded"] = list(prompts)
    with state.split_between_processes({"a": [1, 2, 3], "b": [4, 5, 6]}) as part:
        out["split_dict"] = {key: list(value) for key, value in part.items()}
    with accelerator.split_between_processes(torch.arange(5)) as part:
        out["split_tensor"] = part.tolist()
    out["gather_object"] = utils.gather_object([f"answer of rank {rank}"])

    # --- which ranks run what
    @accelerator.on_main_process
    def on_main():
        ran.append("main")

    @accelerator.on_local_main_process
    def on_local_main():
        ran.append("local_main")

    @accelerator.on_last_process
    def on_last():
        ran.append("last")

    @accelerator.on_process(process_index=1)
    def on_one():
        ran.append("process_1")

    for function in (on_main, on_local_main, on_last, on_one):
        function()
    out["ran"] = ran
    out["is_last_process"] = accelerator.is_last_process

    # --- one rank tells all: set_trigger / check_trigger
    if rank == 1:
        accelerator.set_trigger()
    out["trigger"] = [accelerator.check_trigger(), accelerator.check_trigger()]

    # --- accelerate.utils
    objects = [f"from {rank}", rank]
    utils.broadcast_object_list(objects, from_process=1)
    out["broadcast_object_list"] = objects
    out["reduce_mean"] = utils.reduce(torch.tensor([float(rank + 1)])).tolist()
    out["accelerator_reduce_sum"] = accelerator.reduce(torch.tensor([float(rank + 1)])).tolist()
    out["gathered"] = utils.gather(torch.tensor([rank])).tolist()
    out["gathered_requires_grad"] = accelerator.gather(torch.ones(2, requires_grad=True) * (rank + 1)).tolist()
    utils.set_seed(7)
    out["seeded"] = torch.rand(2).tolist()

    @utils.find_executable_batch_size(starting_batch_size=64)
    def fits(batch_size):
        if batch_size > 16:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
        return batch_size

    out["executable_batch_size"] = fits()

    # --- data order: HF's default (a generator seeded once at prepare from a draw on the global RNG, each iteration
    # starting from rank 0's state of it) and use_seedable_sampler (data_seed, else the initial seed, + the epoch);
    # the ranks seeded differently where HF's order does not need it; then the global RNG the draw advanced (with
    # rng_types' "torch": rank 0's, on every rank)
    orders = {}
    for name, own_seed, config, rng_types in (
            ("default", True, {}, None), ("seedable", False, {"use_seedable_sampler": True}, None),
            ("seedable_data_seed", True, {"use_seedable_sampler": True, "data_seed": 5}, None),
            ("rng_types_torch", True, {}, ["generator", "torch"])):
        torch.manual_seed(11 + rank if own_seed else 11)
        ordered = Accelerator(dataloader_config=utils.DataLoaderConfiguration(**config), rng_types=rng_types)
        shuffled, users = ordered.prepare(
            DataLoader(list(range(12)), batch_size=2, shuffle=True),
            DataLoader(list(range(12)), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(rank)))
        epochs = []
        for epoch in range(3):
            if epoch == 2:
                shuffled.set_epoch(2)
            epochs.append([[int(i) for batch in loader for i in batch] for loader in (shuffled, users)])
        orders[name] = {"epochs": epochs, "global_rng_after": torch.rand(2).tolist()}
    out["data_order"] = orders

    # --- eval: gather_for_metrics with python objects, exactly len(dataset) items
    eval_loader = accelerator.prepare(DataLoader(list(range(5)), batch_size=2))
    labels = []
    for batch in eval_loader:
        labels += accelerator.gather_for_metrics([f"item {int(i)}" for i in batch], use_gather_object=True)
    out["gather_for_metrics_objects"] = labels

    # --- training: DDP kwargs, an accumulation plugin, no_sync, unscale_gradients, a scheduler stepped every call
    torch.manual_seed(0)
    accelerator = Accelerator(
        kwargs_handlers=[utils.DistributedDataParallelKwargs(find_unused_parameters=True)],
        gradient_accumulation_plugin=utils.GradientAccumulationPlugin(num_steps=2),
        step_scheduler_with_optimizer=False,
    )
    model = TwoHeads()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(tiny_data(8), batch_size=1)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            accelerator.unscale_gradients()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    out["trained_weights"] = accelerator.unwrap_model(model).used.weight.detach().tolist()
    out["lr_after_4_calls"] = scheduler.get_last_lr()
    x, y = tiny_data(2).tensors
    with accelerator.no_sync(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(x[rank:rank + 1]), y[rank:rank + 1]))
    grad = accelerator.unwrap_model(model).used.weight.grad.clone()
    out["no_sync_grads_equal"] = bool(torch.equal(*accelerator.gather(grad[None])))
    accelerator.backward(torch.nn.functional.mse_loss(model(x[rank:rank + 1]), y[rank:rank + 1]))
    grad = accelerator.unwrap_model(model).used.weight.grad.clone()
    out["synced_grads_equal"] = bool(torch.allclose(*accelerator.gather(grad[None])))

    # --- HF's numbers: the default step_scheduler_with_optimizer=True steps the scheduler num_processes times per
    # optimizer step; clip_grad_norm_ on an accumulation step clips the partial gradients
    torch.manual_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(tiny_data(8), batch_size=1)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    lrs, norms = [], []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y) * 50)
            accelerator.clip_grad_value_(model.parameters(), 2.0)
            norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    out["scheduler_lrs"] = lrs
    out["clip_norms"] = [round(norm, 5) for norm in norms]
    out["clipped_weights"] = [round(w, 6) for row in accelerator.unwrap_model(model).weight.tolist() for w in row]
    del accelerator, model, optimizer, scheduler, loader

    # --- checkpoints: automatic naming with total_limit, registered objects, hooks, resuming mid-epoch
    project = os.path.join(workdir, "project")
    config = utils.ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(tiny_data(8), batch_size=1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    hooked: List[Any] = []
    accelerator.register_save_state_pre_hook(
        lambda models, weights, directory: hooked.append(("save", len(models), os.path.basename(directory))))
    accelerator.register_load_state_pre_hook(
        lambda models, directory: hooked.append(("load", len(models), os.path.basename(directory))))
    seen = []
    for step, (x, y) in enumerate(loader):
        seen.append(x.sum().item())
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        counter.count += 1
        accelerator.save_state()
        if step == 1:
            weights_at_step_1 = accelerator.unwrap_model(model).weight.detach().clone()
            break
    accelerator.save_state()
    out["save_iteration"] = accelerator.save_iteration
    accelerator.wait_for_everyone()
    out["checkpoints"] = sorted(os.listdir(os.path.join(project, "checkpoints")))
    out["custom_checkpoint_files"] = sorted(
        name for name in os.listdir(os.path.join(project, "checkpoints", "checkpoint_2")) if name.startswith("custom"))
    counter.count = 99
    with torch.no_grad():
        accelerator.unwrap_model(model).weight.zero_()
    accelerator.load_state()  # the latest: checkpoint_2
    out["counter_restored"] = counter.count
    out["weights_restored"] = bool(torch.equal(accelerator.unwrap_model(model).weight, weights_at_step_1))
    out["hooks"] = hooked
    resumed = [x.sum().item() for x, _ in accelerator.skip_first_batches(loader, 2)]
    out["resumed_batches_are_the_rest_of_the_epoch"] = len(resumed) == len(loader) - 2
    out["first_batches_before_saving"] = seen

    # --- HF's files: save_model's shards and index, save_state(safe_serialization=False), utils.save / load
    import json

    sharded = os.path.join(workdir, "sharded")
    accelerator = Accelerator()  # no automatic checkpoint naming: save_state takes its directory
    two_layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    accelerator.prepare(two_layers, torch.optim.SGD(two_layers.parameters(), lr=0.1))
    accelerator.save_model(two_layers, sharded, max_shard_size=100)  # 128-byte weight: a shard of its own
    accelerator.save_model(two_layers, os.path.join(workdir, "whole"), safe_serialization=False)
    accelerator.save_state(os.path.join(workdir, "unsafe"), safe_serialization=False)
    accelerator.save({"step": torch.tensor([rank])}, os.path.join(workdir, "saved.bin"))
    accelerator.wait_for_everyone()
    out["save_model_files"] = sorted(os.listdir(sharded)) + sorted(os.listdir(os.path.join(workdir, "whole")))
    with open(os.path.join(sharded, "model.safetensors.index.json")) as file:
        out["save_model_index"] = json.load(file)
    out["unsafe_checkpoint_files"] = sorted(os.listdir(os.path.join(workdir, "unsafe")))
    out["utils_load"] = utils.load(os.path.join(workdir, "saved.bin"))["step"].tolist()

    # --- profiling
    with accelerator.profile(utils.ProfileKwargs(output_trace_dir=os.path.join(workdir, "traces"))) as profiler:
        torch.ones(8) @ torch.ones(8)
    out["profiled"] = profiler is not None

    if impl == "ours":
        out.update(ours_only(Accelerator, utils, workdir))

    # --- end_training under FORK_LAUNCHED (HF's notebook_launcher sets it in its ranks): the process group stays
    os.environ["FORK_LAUNCHED"] = "1"
    type(accelerator.state)._reset_state(True)
    Accelerator().end_training()
    out["group_kept_by_end_training_when_fork_launched"] = torch.distributed.is_initialized()
    del os.environ["FORK_LAUNCHED"]
    type(accelerator.state)._reset_state(True)

    # --- trackers (last: end_training destroys the process group)
    accelerator = Accelerator(log_with="tensorboard", project_dir=os.path.join(workdir, "logs"))
    accelerator.init_trackers("parity", config={"lr": 0.1, "batch_size": 8})
    for step, loss in enumerate([1.5, 0.5, 0.25]):
        accelerator.log({"train_loss": loss, "epoch": step // 2}, step=step)
    out["tracker_on_this_rank"] = type(accelerator.get_tracker("tensorboard")).__name__
    out["tracker_unwrapped"] = type(accelerator.get_tracker("tensorboard", unwrap=True)).__name__
    accelerator.end_training()
    out["group_kept_by_end_training"] = torch.distributed.is_initialized()
    return out


def ours_only(Accelerator: Any, utils: Any, workdir: str) -> Dict[str, Any]:
    """What HF does not do here: join_uneven_inputs on CPU (gloo), even_batches=False."""
    out: Dict[str, Any] = {}
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(tiny_data(5), batch_size=1)  # 5 batches on 2 ranks: 3 and 2 when not evened out
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    with accelerator.join_uneven_inputs([model], even_batches=False):
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    out["join_steps"] = steps
    weights = accelerator.unwrap_model(model).weight.detach()
    out["join_weights_equal_on_all_ranks"] = bool(torch.equal(*accelerator.gather(weights[None])))
    out["even_batches_back"] = len(loader)
    return out


LAUNCH_BOUND = 180  # s for one launch of this file (a few seconds quiet): past it, a hang named with every rank's stack


def bounded_launch(function: Any, args: tuple = (), num_processes: int = WORLD) -> List[Any]:
    """``notebook_launcher(function, args)`` on CPU ranks, every rank's value; a launch still running after
    :data:`LAUNCH_BOUND` s fails the test with where each rank was, not at pytest's timeout with nothing named."""
    try:
        return notebook_launcher(function, args=args, num_processes=num_processes, device="cpu", display="none",
                                 return_all=True, timeout=LAUNCH_BOUND)  # fmt: skip
    except LaunchTimeout as error:
        where = "\n".join(f"--- rank {rank}:\n{stack}" for rank, stack in sorted(error.stacks.items()))
        pytest.fail(f"{function.__name__}{args} had not returned after {LAUNCH_BOUND} s; where each rank was:\n{where}")


def run(impl: str, workdir: str) -> List[Dict[str, Any]]:
    return bounded_launch(hf_style_snippets, (impl, workdir))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Dict[str, Any]:
    """Both launches, once for the module: ``{"hf": [rank 0, rank 1], "ours": [...], "dirs": ..., "metrics": ...}``."""
    dirs = {impl: str(tmp_path_factory.mktemp(impl)) for impl in ("hf", "ours")}
    found: Dict[str, Any] = {"dirs": dirs, "hf": run("hf", dirs["hf"])}
    found["ours"] = run("ours", dirs["ours"])
    found["metrics"] = last_launch().metrics
    return found


SAME_ON_BOTH = [
    "split", "split_padded", "split_dict", "split_tensor", "gather_object", "ran", "is_last_process", "trigger",
    "broadcast_object_list", "reduce_mean", "accelerator_reduce_sum", "gathered",
    "gathered_requires_grad", "seeded", "executable_batch_size", "data_order",
    "gather_for_metrics_objects", "lr_after_4_calls", "scheduler_lrs", "clip_norms", "clipped_weights",
    "save_model_files", "save_model_index", "unsafe_checkpoint_files", "utils_load", "no_sync_grads_equal", "synced_grads_equal", "save_iteration",
    "checkpoints", "custom_checkpoint_files", "counter_restored", "weights_restored", "hooks",
    "resumed_batches_are_the_rest_of_the_epoch", "first_batches_before_saving", "profiled", "tracker_on_this_rank",
    "tracker_unwrapped", "group_kept_by_end_training_when_fork_launched", "group_kept_by_end_training",
]


@pytest.mark.parametrize("name", SAME_ON_BOTH)
def test_a_snippet_gives_what_it_gives_on_hf_accelerate(results, name):
    assert [rank[name] for rank in results["ours"]] == [rank[name] for rank in results["hf"]]


def test_the_snippets_computed_what_hf_documents(results):
    """A few absolute values, so that both being wrong the same way fails too."""
    rank0, rank1 = results["ours"]
    assert (rank0["split"], rank1["split"]) == (["A", "B", "C"], ["D", "E"])
    assert rank0["gathered_requires_grad"] == [1.0, 1.0, 2.0, 2.0]  # the values, as HF (no autograd error)
    assert rank0["scheduler_lrs"] == [0.1, 0.025, 0.025, 0.00625]  # 2 scheduler steps per optimizer step on 2 ranks
    assert rank0["clip_norms"][0] > 0.5  # an accumulation step: the partial gradients were clipped, not skipped
    assert (rank0["split_padded"], rank1["split_padded"]) == (["A", "B"], ["C", "C"])
    assert (rank0["ran"], rank1["ran"]) == (["main", "local_main"], ["last", "process_1"])
    assert rank0["trigger"] == rank1["trigger"] == [True, False]
    assert rank0["gather_for_metrics_objects"] == [f"item {i}" for i in range(5)]
    assert rank0["checkpoints"] == ["checkpoint_1", "checkpoint_2"]  # 3 saves, total_limit=2
    assert rank0["hooks"][0] == ("save", 1, "checkpoint_0") and rank0["hooks"][-1] == ("load", 1, "checkpoint_2")
    assert rank0["executable_batch_size"] == 15  # 64, 57, 51, ... and rank0["reduce_mean"] == [1.5]
    for rank in (rank0, rank1):  # end_training ends the group, unless HF's notebook_launcher forked the rank
        assert (rank["group_kept_by_end_training_when_fork_launched"], rank["group_kept_by_end_training"]) == (True, False)


def test_a_model_trained_with_ddp_kwargs_and_an_accumulation_plugin_has_hf_accelerates_weights(results):
    for ours, theirs in zip(results["ours"], results["hf"]):
        assert torch.allclose(torch.tensor(ours["trained_weights"]), torch.tensor(theirs["trained_weights"]),
                              atol=1e-6)  # fmt: skip


def test_profiles_and_checkpoints_are_written_under_the_same_names(results):
    for impl in ("hf", "ours"):
        traces = sorted(os.listdir(os.path.join(results["dirs"][impl], "traces")))
        assert traces == ["profile_0.json", "profile_1.json"], impl


def test_tensorboard_files_read_back_with_tensorboards_reader_hold_the_logged_values(results):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    read = {}
    for impl in ("hf", "ours"):
        run_dir = os.path.join(results["dirs"][impl], "logs", "parity")
        events = EventAccumulator(run_dir)
        events.Reload()
        read[impl] = {tag: [(event.step, event.value) for event in events.Scalars(tag)]
                      for tag in events.Tags()["scalars"]}  # fmt: skip
        assert any(re.match(r"\d+\.\d+$", name) for name in os.listdir(run_dir)), "the hparams run of init_trackers"
        event_files = [name for name in os.listdir(run_dir) if name.startswith("events.out.tfevents")]
        assert len(event_files) == 1, (impl, "only the main process writes")
    assert read["ours"] == read["hf"]
    assert read["ours"]["train_loss"] == [(0, 1.5), (1, 0.5), (2, 0.25)]
    assert results["ours"][0]["tracker_on_this_rank"] == "TensorBoardTracker"
    assert results["ours"][1]["tracker_on_this_rank"] == "GeneralTracker"  # a blank one on the other ranks


def test_accelerator_log_feeds_launch_metrics_as_report_does(results):
    metrics = results["metrics"]
    losses = metrics[metrics["name"] == "train_loss"]
    for rank in range(WORLD):
        mine = losses[losses["rank"] == rank].sort_values("step")
        assert list(zip(mine["step"], mine["value"])) == [(0, 1.5), (1, 0.5), (2, 0.25)]
    assert set(metrics["name"]) >= {"train_loss", "epoch"}


def test_join_uneven_inputs_works_on_cpu_ranks(results):
    rank0, rank1 = results["ours"]
    assert (rank0["join_steps"], rank1["join_steps"]) == (3, 2)
    assert rank0["join_weights_equal_on_all_ranks"] and rank1["join_weights_equal_on_all_ranks"]
    assert rank0["even_batches_back"] == rank1["even_batches_back"] == 3  # padded again after the block


# ------------------------------------------------------------------------------------ members, in pytest's process
def hf_public_members() -> List[str]:
    return sorted(name for name in dir(accelerate.Accelerator) if not name.startswith("_"))


def test_every_public_member_of_hf_accelerator_is_ours_or_listed_as_absent():
    ours = set(dir(Accelerator)) | set(vars(Accelerator(cpu=True)))  # a few are attributes of the instance
    missing = [name for name in hf_public_members() if name not in ours and name not in ABSENT_MEMBERS]
    assert not missing, f"HF members neither implemented nor in absent.ABSENT_MEMBERS: {missing}"
    assert not [name for name in ABSENT_MEMBERS if name not in hf_public_members()], "absent list names a non-HF member"


def test_every_constructor_parameter_of_hf_accelerator_is_ours():
    theirs = set(inspect.signature(accelerate.Accelerator.__init__).parameters) - {"self"}
    ours = set(inspect.signature(Accelerator.__init__).parameters)
    assert theirs <= ours, sorted(theirs - ours)


@pytest.mark.parametrize("name", sorted(ABSENT_MEMBERS))
def test_an_absent_member_says_so_and_what_to_use_instead(name):
    accelerator = Accelerator(cpu=True)
    with pytest.raises(NotImplementedError, match=rf"Accelerator\.{name} is not offered.*: "):
        member = getattr(accelerator, name)
        member()


@pytest.mark.parametrize("given", [dict(megatron_lm_plugin=object()), dict(parallelism_config=object()),
                                   dict(torch_tp_plugin=object()), dict(mixed_precision="fp8"),
                                   dict(deepspeed_plugins={"a": object(), "b": object()})])  # fmt: skip
def test_an_absent_constructor_parameter_is_refused_before_anything_starts(given):
    with pytest.raises(NotImplementedError, match=re.escape(next(iter(given)))):
        Accelerator(cpu=True, **given)


UTILS_NAMES = [
    "set_seed", "gather_object", "broadcast_object_list", "find_executable_batch_size", "send_to_device", "gather",
    "reduce", "pad_across_processes", "wait_for_everyone", "broadcast", "release_memory", "patch_environment",
    "extract_model_from_parallel", "recursively_apply", "DistributedDataParallelKwargs", "GradScalerKwargs",
    "InitProcessGroupKwargs", "AutocastKwargs", "ProfileKwargs", "KwargsHandler", "GradientAccumulationPlugin",
    "DataLoaderConfiguration", "ProjectConfiguration", "TorchDynamoPlugin", "DeepSpeedPlugin",
    "FullyShardedDataParallelPlugin", "DistributedType", "PrecisionType", "LoggerType", "RNGType", "DynamoBackend",
    "write_basic_config", "is_tensorboard_available", "is_wandb_available", "is_mlflow_available",
]


@pytest.mark.parametrize("name", UTILS_NAMES)
def test_notebook_accel_utils_has_what_hf_code_imports_from_accelerate_utils(name):
    import accelerate.utils

    assert hasattr(accelerate.utils, name), f"{name} is not HF's: remove it from this list"
    assert hasattr(notebook_accel.utils, name)


@pytest.mark.parametrize("cls", ["DistributedDataParallelKwargs", "GradScalerKwargs", "AutocastKwargs",
                                 "ProfileKwargs", "GradientAccumulationPlugin", "DataLoaderConfiguration",
                                 "ProjectConfiguration"])  # fmt: skip
def test_a_configuration_class_has_hf_accelerates_fields_and_defaults(cls):
    import dataclasses

    import accelerate.utils

    def fields(of):
        return {field.name: field.default for field in dataclasses.fields(of)}

    theirs, ours = fields(getattr(accelerate.utils, cls)), fields(getattr(notebook_accel.utils, cls))
    assert {name: str(value) for name, value in theirs.items()} == {name: str(value) for name, value in ours.items()}


def test_partial_state_and_accelerator_state_are_importable_as_in_hf():
    assert notebook_accel.PartialState().num_processes == 1
    assert notebook_accel.AcceleratorState(cpu=True).mixed_precision == "no"


# ------------------------------------------------------------------- W&B (offline) and MLflow (a file store)
TRACKERS_SCRIPT = r"""
import json, sys
from notebook_accel import Accelerator
accelerator = Accelerator(cpu=True, log_with=["wandb", "mlflow"])
accelerator.init_trackers("parity", config={"lr": 0.1})
for step, loss in enumerate([1.5, 0.5]):
    accelerator.log({"loss": loss}, step=step)
run = accelerator.get_tracker("wandb", unwrap=True)
seen = {"wandb_config": dict(run.config), "wandb_dir": run.dir,
        "mlflow_run": accelerator.get_tracker("mlflow", unwrap=True).info.run_id}
accelerator.end_training()
import mlflow
client = mlflow.tracking.MlflowClient()
seen["mlflow_loss"] = [(m.step, m.value) for m in client.get_metric_history(seen["mlflow_run"], "loss")]
seen["mlflow_params"] = client.get_run(seen["mlflow_run"]).data.params
print(json.dumps(seen))
"""


def test_wandb_offline_and_mlflow_on_a_file_store_get_what_log_sends(tmp_path):
    """In a script of its own: wandb starts a service process, which ends with it."""
    import json
    import subprocess
    import sys

    import importlib.util

    if not all(importlib.util.find_spec(name) for name in ("wandb", "mlflow")):  # not imported here: wandb's import
        pytest.skip("wandb and mlflow (the test extra) are not installed")      # makes temp dirs it leaves behind
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", TMPDIR=str(tmp_path),
               MLFLOW_TRACKING_URI=f"file:{tmp_path}/mlruns", MLFLOW_ALLOW_FILE_STORE="true")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", TRACKERS_SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=200)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["wandb_config"] == {"lr": 0.1}
    assert seen["wandb_dir"].startswith(str(tmp_path)) and any(
        name.endswith(".wandb") for name in os.listdir(os.path.dirname(seen["wandb_dir"])))  # fmt: skip
    assert seen["mlflow_loss"] == [[0, 1.5], [1, 0.5]]
    assert seen["mlflow_params"] == {"lr": "0.1"}


def test_the_parity_page_has_one_row_per_hf_member_and_says_absent_where_it_is():
    page = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "accelerate-parity.md")
    with open(page) as handle:
        rows = dict(re.findall(r"^\| `(\w+)` \| (same|differs|absent) \|", handle.read(), re.M))
    assert sorted(rows) == hf_public_members()
    assert sorted(name for name, verdict in rows.items() if verdict == "absent") == sorted(ABSENT_MEMBERS)


# ------------------------------------------------------------------------------- in pytest's process, ours only
class ListTracker(notebook_accel.accelerator.GeneralTracker):
    """A tracker of one's own (HF's GeneralTracker contract): keeps what it is given."""

    name = "list"
    requires_logging_directory = False

    def __init__(self):
        super().__init__()
        self.calls: List[Any] = []

    @property
    def tracker(self):
        return self.calls

    def start(self):
        self.calls.append("start")

    def store_init_configuration(self, values):
        self.calls.append(("config", values))

    def log(self, values, step=None, **kwargs):
        self.calls.append(("log", values, step, kwargs))

    def finish(self):
        self.calls.append("finish")


def test_a_tracker_of_ones_own_gets_init_log_and_finish():
    tracker = ListTracker()
    accelerator = Accelerator(cpu=True, log_with=[tracker])
    accelerator.init_trackers("p", config={"lr": 1}, init_kwargs={"list": {"ignored": True}})
    accelerator.log({"loss": 0.5}, step=3, log_kwargs={"list": {"commit": False}})
    assert accelerator.get_tracker("list", unwrap=True) is tracker.calls
    with pytest.raises(ValueError, match="tensorboard is not an available tracker"):
        accelerator.get_tracker("tensorboard")
    accelerator.end_training()
    assert tracker.calls == ["start", ("config", {"lr": 1}), ("log", {"loss": 0.5}, 3, {"commit": False}), "finish"]


def test_trackers_and_options_are_checked_when_the_accelerator_is_made():
    class Incomplete(notebook_accel.accelerator.GeneralTracker):
        pass

    with pytest.raises(NotImplementedError, match="`name`, `requires_logging_directory`, `tracker`"):
        Incomplete()
    with pytest.raises(ValueError, match="requires a `logging_dir`"):
        Accelerator(cpu=True, log_with="tensorboard")
    with pytest.raises(ValueError, match="Unsupported logging capability: comet_ml"):
        Accelerator(cpu=True, log_with="comet_ml")
    with pytest.raises(ValueError, match="rng_types"):
        Accelerator(cpu=True, rng_types=["numpy"])
    with pytest.raises(NotImplementedError, match="use_stateful_dataloader"):
        Accelerator(cpu=True, dataloader_config=notebook_accel.utils.DataLoaderConfiguration(
            use_stateful_dataloader=True))
    with pytest.raises(ValueError, match="only pass one of `gradient_accumulation_steps`"):
        Accelerator(cpu=True, gradient_accumulation_steps=2,
                    gradient_accumulation_plugin=notebook_accel.utils.GradientAccumulationPlugin(num_steps=2))
    assert Accelerator(cpu=True, log_with=None).get_tracker("x").__class__.__name__ == "GeneralTracker"


def test_dynamo_backend_compiles_prepared_models_and_unwrap_model_gives_the_users_module():
    accelerator = Accelerator(cpu=True, dynamo_backend="eager")  # torch.compile's eager backend: no C++ compiler
    model = torch.nn.Linear(3, 2)
    prepared = accelerator.prepare(model)
    assert prepared is not model and isinstance(prepared._orig_mod, torch.nn.Linear)
    assert torch.equal(prepared(torch.ones(1, 3)), model(torch.ones(1, 3)))
    assert accelerator.unwrap_model(prepared) is model
    assert accelerator.unwrap_model(prepared, keep_torch_compile=True) is prepared


def test_data_loader_configuration_and_the_accumulation_plugin_are_read():
    config = notebook_accel.utils.DataLoaderConfiguration(split_batches=True, even_batches=False, data_seed=5)
    plugin = notebook_accel.utils.GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, dataloader_config=config, gradient_accumulation_plugin=plugin)
    assert accelerator.split_batches and not accelerator.even_batches and accelerator.gradient_accumulation_steps == 3
    loader = accelerator.prepare(DataLoader(list(range(4)), batch_size=2))
    assert loader.randomness.base_seed == 5
    syncs = []
    for _ in loader:  # 2 batches: without sync_with_dataloader the last batch does not force a step
        with accelerator.accumulate():
            syncs.append(accelerator.sync_gradients)
    assert syncs == [False, False]


def partial_state_world() -> int:
    return notebook_accel.PartialState().num_processes


def test_a_rank_forked_from_a_kernel_that_made_an_accelerator_has_its_own_partial_state():
    Accelerator(cpu=True)  # as a notebook that tried one process in the kernel first
    assert bounded_launch(partial_state_world) == [WORLD, WORLD]


def test_prepare_takes_a_device_placement_flag_per_object():
    accelerator = Accelerator(cpu=True)
    loader = DataLoader(tiny_data(4), batch_size=2)
    kept, moved = accelerator.prepare(loader, loader, device_placement=[False, True])
    assert kept.device is None and moved.device == torch.device("cpu") and accelerator.device_placement


# ------------------------------------------------------------------ checkpoints move between the two libraries
def dropout_model() -> torch.nn.Module:
    """Dropout: a resumed run must have the saved RNG state too to take the same step."""
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))


def resume_round(impl: str, load_dir: str, save_dir: str) -> Dict[str, Any]:
    """On ``impl``: resume from ``load_dir`` (another library's checkpoint) and take 3 steps; then, from scratch,
    train 3 steps, ``save_state(save_dir)`` and take the same 3 steps ("continued": what a resume must give)."""
    torch.set_num_threads(1)
    Accelerator, _, _ = imports(impl)
    rank = int(os.environ.get("RANK", "0"))
    x, y = tiny_data(8).tensors

    def objects(accelerator):
        torch.manual_seed(0)
        model = dropout_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return accelerator.prepare(model, optimizer, scheduler)

    def steps(accelerator, model, optimizer, scheduler, count):
        for step in range(count):
            batch = slice(2 * step + rank, 2 * step + rank + 1)
            accelerator.backward(torch.nn.functional.mse_loss(model(x[batch]), y[batch]))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        weights = accelerator.unwrap_model(model).state_dict()
        return {"weights": {name: value.tolist() for name, value in weights.items()},
                "lr": scheduler.get_last_lr(), "rand": torch.rand(2).tolist()}  # fmt: skip

    out: Dict[str, Any] = {}
    if load_dir:
        accelerator = Accelerator()
        model, optimizer, scheduler = objects(accelerator)
        accelerator.load_state(load_dir)
        out["resumed"] = steps(accelerator, model, optimizer, scheduler, 3)
    accelerator = Accelerator()
    model, optimizer, scheduler = objects(accelerator)
    steps(accelerator, model, optimizer, scheduler, 1)
    out["saved_to"] = type(accelerator.save_state(save_dir)).__name__
    out["continued"] = steps(accelerator, model, optimizer, scheduler, 3)
    accelerator.wait_for_everyone()
    out["files"] = sorted(os.listdir(save_dir))
    # a 1-process launch runs in this very process (pytest's): leave no process group or HF state behind
    accelerator.end_training()
    if impl == "hf":
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_a_checkpoint_of_hf_resumes_on_ours_and_one_of_ours_on_hf(tmp_path, world):
    """ours saves -> HF resumes it (and saves) -> ours resumes HF's: each resume takes the steps the saving run took
    after saving (same weights, learning rate, RNG). The files are HF's names on both."""
    def launch(impl, load_dir, save_dir):
        return bounded_launch(resume_round, (impl, load_dir, save_dir), num_processes=world)

    ours_dir, hf_dir = str(tmp_path / "ours"), str(tmp_path / "hf")
    first = launch("ours", "", ours_dir)
    on_hf = launch("hf", ours_dir, hf_dir)
    on_ours = launch("ours", hf_dir, str(tmp_path / "again"))
    for rank in range(world):
        assert on_hf[rank]["resumed"] == first[rank]["continued"], f"HF resuming ours, rank {rank}"
        assert on_ours[rank]["resumed"] == on_hf[rank]["continued"], f"ours resuming HF's, rank {rank}"
        assert first[rank]["continued"] == on_hf[rank]["continued"]  # and both libraries train the same
        assert first[rank]["files"] == on_hf[rank]["files"]
        assert first[rank]["saved_to"] == on_hf[rank]["saved_to"] == "PosixPath"
    rngs = [f"random_states_{rank}.pkl" for rank in range(world)]
    assert first[0]["files"] == sorted(["model.safetensors", "optimizer.bin", "scheduler.bin", *rngs])
