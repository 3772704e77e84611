"""FSDP2 through the Accelerator, on real ranks (2 CPU processes, gloo) and in this process.

- equivalence: 2 sharded ranks train to the same weights as one plain-PyTorch process with the whole batch
  (ordered, shuffled, and with gradient accumulation + clipping + an LR scheduler);
- each rank holds about half the parameters; accumulation steps leave the gradients unreduced;
- ``get_state_dict`` gathers the full weights on rank 0; ``save_state`` on 1, 2 or 3 ranks (or under DDP) resumes
  on another number of ranks: the same weights, momentum and next step;
- the seeds' Transformer loop with blocks wrapped by class name, bf16 and activation checkpointing;
- the plugin's refusals and HF accelerate's environment spelling;
- ``init_module``: every rank records only its rows of each parameter as the model is built — exactly what a plain
  construction writes — and prepare makes them its shards: the same model, training, checkpoints and ``load_model``
  (rank 0 reads, the others receive their shards), at a third of the peak memory of building the whole model.
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Any, Dict

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, FullyShardedDataParallelPlugin, last_launch
from notebook_accel.accelerator.fsdp import _blocks
from notebook_accel.accelerator.memory import held_bytes
from checkpoint_worlds import assert_resumed, load_and_continue, on_ranks, train_and_save
from test_accelerator_distributed import (
    EPOCHS,
    EQUIVALENCE_CASES,
    WORLD,
    assert_same_weights,
    fresh_training_objects,
    launch,
    regression_data,
    train_plain_pytorch,
    weights_of,
)

pytestmark = pytest.mark.timeout(240)


def train_sharded(batch_size: int, shuffle: bool, accumulation: int = 1, clip=None) -> Dict[str, Any]:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation,
                              fsdp_plugin=FullyShardedDataParallelPlugin(min_num_params=16))  # fmt: skip
    model, optimizer, scheduler = fresh_training_objects()
    total_parameters = sum(param.numel() for param in model.parameters())
    loader = DataLoader(regression_data(), batch_size=batch_size, shuffle=shuffle)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    grads_on_accumulation_steps = []
    norms = []
    for _ in range(EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(F.mse_loss(model(x), y))
                if not accelerator.sync_gradients:
                    grads_on_accumulation_steps.append(sum(p.grad is not None for p in model.parameters()))
                if clip is not None:
                    norm = accelerator.clip_grad_norm_(model.parameters(), clip)
                    if norm is not None:
                        norms.append(type(norm).__name__)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return {
        "weights": accelerator.get_state_dict(model),
        "local_parameters": sum(p.to_local().numel() for p in model.parameters()),
        "total_parameters": total_parameters,
        "grads_on_accumulation_steps": grads_on_accumulation_steps,
        "norm_types": set(norms),
        "blocks": sorted(name for name, module in model.named_modules() if type(module).__name__.startswith("FSDP")),
    }


def equivalence_rank():
    return {name: train_sharded(batch, shuffle, steps, clip)
            for name, (batch, shuffle, steps, clip) in EQUIVALENCE_CASES.items()}  # fmt: skip


def test_fsdp2_on_two_ranks_trains_like_one_process_with_the_whole_batch():
    ranks = launch(equivalence_rank)
    for name, (batch, shuffle, steps, clip) in EQUIVALENCE_CASES.items():
        expected = train_plain_pytorch(batch * WORLD * steps, shuffle, clip, scheduler_steps=WORLD, processes=WORLD)
        main, other = ranks[0][name], ranks[1][name]
        assert_same_weights(main["weights"], expected, f"FSDP2, {name}")  # full weights, gathered on rank 0
        assert other["weights"] == {}  # as HF accelerate: the full copy is rank 0's only
        # min_num_params=16 wraps both Linear layers and the root: three FSDP modules
        assert main["blocks"] == ["", "0", "2"]
        for result in (main, other):
            # each rank holds half of every parameter (dim 0 split in two; odd sizes round up on rank 0)
            assert result["total_parameters"] * 0.4 < result["local_parameters"] < result["total_parameters"] * 0.6
        assert ranks[0][name]["local_parameters"] + ranks[1][name]["local_parameters"] == main["total_parameters"]
        if steps > 1:
            # accumulation steps reduce nothing: FSDP2 keeps the unsharded gradient, no sharded .grad yet
            assert main["grads_on_accumulation_steps"] and set(main["grads_on_accumulation_steps"]) == {0}
            assert main["norm_types"] == {"Tensor"}  # a plain tensor, not a DTensor, comes back from clipping


# stateless and unstepped optimizers (issue 36): torch's full-state setter asserted "Expected device to be set"
@pytest.mark.parametrize("saved_on, loaded_on, optimizer_state", [
    (1, 2, "momentum"), (2, 1, "momentum"), (2, 3, "momentum"),
    (1, 2, "stateless"), (2, 1, "stateless"), (1, 2, "unstepped"), (2, 1, "unstepped")])
def test_an_fsdp2_checkpoint_resumes_on_another_number_of_ranks(tmp_path, saved_on, loaded_on, optimizer_state):
    # one process has nothing to shard: it writes the plain files (model.pt, optimizer.pt), which sharded ranks
    # load as full state; sharded ranks write torch.distributed.checkpoint shards, resharded on load
    saved = on_ranks(saved_on, train_and_save, str(tmp_path), "fsdp2", optimizer_state)[0]
    assert ("model.dcp" in os.listdir(tmp_path)) is (saved_on > 1)
    loaded = on_ranks(loaded_on, load_and_continue, str(tmp_path), "fsdp2", optimizer_state)[0]
    assert_resumed(saved, loaded, f"an FSDP2 checkpoint ({optimizer_state}) from {saved_on} to {loaded_on} ranks",
                   optimizer_state)


def test_a_ddp_checkpoint_resumes_under_fsdp2_and_back(tmp_path):
    saved = on_ranks(2, train_and_save, str(tmp_path / "ddp"), "plain")[0]
    loaded = on_ranks(2, load_and_continue, str(tmp_path / "ddp"), "fsdp2")[0]
    assert_resumed(saved, loaded, "a DDP checkpoint under FSDP2")
    saved = on_ranks(2, train_and_save, str(tmp_path / "fsdp2"), "fsdp2")[0]
    loaded = on_ranks(2, load_and_continue, str(tmp_path / "fsdp2"), "plain")[0]
    assert_resumed(saved, loaded, "an FSDP2 checkpoint under DDP")


def transformer_rank() -> Dict[str, Any]:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(
        transformer_layer_cls_to_wrap=["TransformerEncoderLayer"], activation_checkpointing=True))
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=2), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(64, 8, 32, generator=generator)
    data = TensorDataset(x, x.mean(dim=(1, 2)).unsqueeze(-1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
    losses = []
    for _ in range(3):
        for inputs, targets in loader:
            loss = F.mse_loss(model(inputs).mean(dim=1).float(), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return {
        "losses": losses,
        "sharded": sorted(name for name, module in model.named_modules() if type(module).__name__.startswith("FSDP")),
        "checkpointed": sum(type(module).__name__ == "CheckpointWrapper" for module in model.modules()),
        "bytes": held_bytes(model, optimizer.optimizer),
        "weights": {name: tuple(value.shape) for name, value in accelerator.get_state_dict(model).items()},
    }


def test_the_seeds_transformer_loop_under_fsdp2_with_bf16_and_activation_checkpointing():
    ranks = launch(transformer_rank)
    main = ranks[0]
    assert all(torch.isfinite(torch.tensor(main["losses"])))
    assert main["losses"][-1] < main["losses"][0]  # it learns
    assert ranks[1]["losses"] == main["losses"]  # reduced: the same numbers on both ranks
    # the two encoder layers (by class name) and the root; their forward recomputed in backward
    assert main["sharded"] == ["", "0.layers.0._checkpoint_wrapped_module", "0.layers.1._checkpoint_wrapped_module"]
    assert main["checkpointed"] == 2
    assert main["bytes"]["optimizer"] > 0 and main["bytes"]["parameters"] > 0
    assert "0.layers.1.linear1.weight" in main["weights"] and main["weights"]["0.layers.1.linear1.weight"] == (64, 32)
    assert ranks[1]["weights"] == {}


def forward_rank(reshard_after_forward: bool) -> Dict[str, Any]:
    from torch.distributed.tensor import DTensor

    accelerator = Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(
        min_num_params=16, reshard_after_forward=reshard_after_forward))
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
    seen: Dict[str, Any] = {}
    model[0].register_forward_pre_hook(lambda module, args: seen.update(
        dtype=module.weight.dtype, gathered=not isinstance(module.weight, DTensor)))
    output = model(torch.randn(4, 8))
    seen["sharded_after_forward"] = isinstance(model[0].weight, DTensor)
    accelerator.backward(output.float().sum())
    seen["unwrapped"] = accelerator.unwrap_model(model) is model
    return seen


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_reshard_after_forward_mixed_precision_policy_and_unwrap_model(reshard_after_forward):
    seen = launch(forward_rank, reshard_after_forward)[0]
    # the block computes with its whole weight, gathered in bf16 (MixedPrecisionPolicy from mixed_precision)
    assert seen["gathered"] and seen["dtype"] == torch.bfloat16
    # freed again right after its forward, or kept gathered until backward
    assert seen["sharded_after_forward"] is reshard_after_forward
    # fully_shard shards the user's module in place: unwrap_model gives it back as it is
    assert seen["unwrapped"]


def meta_model_rank() -> None:
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    accelerator.prepare(model)


def test_a_model_that_cannot_be_sharded_from_where_it_is_is_refused_at_prepare():
    with pytest.raises(ValueError, match="FSDP2: the model has tensors on the meta device"):
        launch(meta_model_rank)
    # the places a model must not be in, decided without the hardware (no GPU here)
    from notebook_accel.accelerator.placement import placement_problem

    cuda = torch.device
    assert "is on cuda:0, but this rank trains on cuda:1" in placement_problem([cuda("cuda:0")], cuda("cuda:1"))
    assert "spread over cpu, cuda:1" in placement_problem([cuda("cuda:1"), cuda("cpu")], cuda("cuda:1"))
    assert placement_problem([cuda("cuda:1")], cuda("cuda:1")) is None
    assert placement_problem([cuda("cpu")], cuda("cuda:1")) is None  # prepare moves it


def test_tpu_cores_are_refused_before_any_model_is_built(monkeypatch):
    # no TPU here: only the process state says XLA (2 cores), which is what the refusal reads
    from notebook_accel import DeepSpeedPlugin
    from notebook_accel.accelerator import accelerator as accelerator_module
    from notebook_accel.accelerator.state import DistributedType, ProcessState

    xla = ProcessState(0, 0, 2, 2, torch.device("cpu"), DistributedType.XLA, None)
    monkeypatch.setattr(accelerator_module, "resolve_process_state", lambda cpu: xla)
    with pytest.raises(ValueError, match="FSDP2 shards over a torch.distributed process group, which TPU cores"):
        Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    with pytest.raises(ValueError, match="DeepSpeed does not run on TPU cores"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin())


def tutorial_rank() -> Dict[str, Any]:
    from word_language_model import run_tutorial

    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["TransformerEncoderLayer"])
    result = run_tutorial(fsdp_plugin=plugin)
    model = result.pop("model")
    result.pop("accelerator")
    result["sharded"] = sorted(name for name, module in model.named_modules() if type(module).__name__.startswith("FSDP"))
    result["local_parameters"] = sum(param.to_local().numel() for param in model.parameters())
    return result


def test_the_seeds_transformer_language_model_tutorial_trains_under_fsdp2():
    from word_language_model import NTOKENS

    ranks = launch(tutorial_rank)
    main = ranks[0]
    assert main["losses"][-1] < main["losses"][0] * 0.8, main["losses"]  # it learns the made-up language
    assert ranks[1]["losses"] == main["losses"]
    assert main["sharded"] == ["", "transformer_encoder.layers.0", "transformer_encoder.layers.1"]
    total = sum(math.prod(shape) for name, shape in main["weights"].items() if name != "pos_encoder.pe")  # a buffer
    assert main["local_parameters"] + ranks[1]["local_parameters"] == total  # half each: together the whole
    assert main["weights"]["linear.weight"] == (NTOKENS, 32) and ranks[1]["weights"] == {}


def differently_initialised_rank() -> Dict[str, Any]:
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    torch.manual_seed(accelerator.process_index)  # each rank's own init differs, as with a rank-seeded setup
    model = accelerator.prepare(torch.nn.Linear(6, 4))
    return accelerator.get_state_dict(model)


def test_every_rank_starts_from_rank_0s_weights_as_ddp_does():
    gathered = launch(differently_initialised_rank)[0]
    torch.manual_seed(0)
    assert_same_weights(gathered, torch.nn.Linear(6, 4).state_dict(), "rank 0's init, on both shards")


# notebooks/big_models.ipynb's FSDP2 showcase (the ranks' lines reach the cell, no warning) is checked on nbval's run
# of the notebook, the only one (notebooks/conftest.py, fsdp2_showcase_problem).


# ------------------------------------------------------------------------------- the plugin, in this process
def test_the_plugin_refuses_what_it_cannot_do_with_a_clear_message():
    with pytest.raises(ValueError, match="FSDP2 .* only"):
        FullyShardedDataParallelPlugin(fsdp_version=1)
    with pytest.raises(ValueError, match="needs transformer_cls_names_to_wrap"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    with pytest.raises(ValueError, match="use one of"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="everything")
    with pytest.raises(ValueError, match="SHARDED_STATE_DICT"):
        FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap="DecoderLayer")
    with pytest.raises(ValueError, match="no module of that class; its classes are Linear, Sequential"):
        _blocks(model, plugin)


def test_the_wrap_policies_pick_blocks_inner_first():
    inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    model = torch.nn.Sequential(inner, torch.nn.Linear(8, 1))
    by_size = _blocks(model, FullyShardedDataParallelPlugin(min_num_params=70))
    assert by_size == [model[0][0], model[0][1]]  # 72 parameters each; the outer Sequential then holds none
    by_name = _blocks(model, FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=[torch.nn.Linear]))
    assert by_name == [model[1], model[0][1], model[0][0]]  # reversed module order: children before parents
    assert _blocks(model, FullyShardedDataParallelPlugin()) == []  # the root only
    # HF accelerate's policy spellings, and a function of the module
    spelled = FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=70)
    assert spelled.auto_wrap_policy == "size_based_wrap" and _blocks(model, spelled) == by_size
    by_trainer_name = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                                     transformer_layer_cls_to_wrap="Linear")
    assert _blocks(model, by_trainer_name) == by_name
    assert _blocks(model, FullyShardedDataParallelPlugin(
        auto_wrap_policy=lambda module: getattr(module, "out_features", None) == 1)) == [model[1]]


def test_hf_accelerates_environment_builds_the_same_plugin():
    environ = {"ACCELERATE_USE_FSDP": "true", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
               "FSDP_TRANSFORMER_CLS_TO_WRAP": "BertLayer,GPT2Block", "FSDP_RESHARD_AFTER_FORWARD": "false",
               "FSDP_ACTIVATION_CHECKPOINTING": "true"}  # fmt: skip
    plugin = FullyShardedDataParallelPlugin.from_environment(environ)
    assert plugin.auto_wrap_policy == "transformer_based_wrap"
    assert plugin.transformer_cls_names_to_wrap == ["BertLayer", "GPT2Block"]
    assert plugin.reshard_after_forward is False and plugin.activation_checkpointing is True
    assert FullyShardedDataParallelPlugin.from_environment({"FSDP_MIN_NUM_PARAMS": "10"}) is None


def test_one_process_warns_and_trains_unsharded():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    assert any("nothing to shard" in str(warning.message) for warning in caught)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert type(model) is torch.nn.Linear and accelerator.fsdp_plugin is None


def one_adam_step(plugin_kind: str) -> None:
    from notebook_accel import DeepSpeedPlugin

    plugin = {"fsdp_plugin": FullyShardedDataParallelPlugin()} if plugin_kind == "fsdp" else {
        "deepspeed_plugin": DeepSpeedPlugin(zero_stage=3)}
    accelerator = Accelerator(cpu=True, **plugin)
    model = torch.nn.Linear(256, 256)  # 65,792 fp32 parameters: 257 KiB, Adam's two moments 514 KiB
    optimizer = torch.optim.Adam(model.parameters())
    data = TensorDataset(torch.randn(8, 256), torch.randn(8, 256))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    for _ in range(2):  # the line comes once, after the first step
        for x, y in loader:
            accelerator.backward(F.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()


@pytest.mark.parametrize("plugin_kind", ["fsdp", "deepspeed"])
def test_each_rank_says_once_what_it_holds_of_the_sharded_model(plugin_kind):
    if plugin_kind == "deepspeed":
        pytest.importorskip("deepspeed")
    launch(one_adam_step, plugin_kind)
    outputs = last_launch().outputs  # what the dashboard shows, by rank
    how = "FSDP2" if plugin_kind == "fsdp" else "DeepSpeed ZeRO-3"
    for rank in range(WORLD):
        lines = [line for line in outputs[rank] if "this rank holds" in line]
        assert len(lines) == 1, outputs[rank]
        line = lines[0]
        # half of 257 KiB of parameters, and of Adam's 514 KiB of moments (plus its step counters)
        assert f"{how} over 2 ranks: this rank holds parameters 128 KiB of 257 KiB" in line, line
        assert "optimizer state 257 KiB" in line, line
        assert ("gradients 128 KiB" in line) == (plugin_kind == "fsdp"), line


def save_model_rank(directory: str) -> Dict[str, Any]:
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    model, optimizer, _ = fresh_training_objects()
    model, optimizer = accelerator.prepare(model, optimizer)
    path = accelerator.save_model(model, directory)
    return {"path": path, "weights": accelerator.get_state_dict(model), "exists": os.path.exists(path)}


def test_save_model_writes_one_safetensors_file_of_the_full_weights(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    ranks = launch(save_model_rank, str(tmp_path))
    assert all(rank["exists"] for rank in ranks)  # written before any rank returns
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    assert_same_weights(safetensors.load_file(ranks[0]["path"]), ranks[0]["weights"], "model.safetensors")
    assert_same_weights(ranks[0]["weights"], weights_of(fresh_training_objects()[0]), "the full model")


# ----------------------------------------------------------------------------- init_module: no rank holds it whole
class TinyLM(torch.nn.Module):
    """What init_module must build exactly: layers nn.TransformerEncoder deep-copies, MultiheadAttention (whose
    init writes to its child's bias), an Embedding with padding_idx (a row zeroed through a view), tied weights,
    a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(20, 16, padding_idx=0)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(16, 20, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)) * self.scale)


def tiny_lm_plugin() -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["TransformerEncoderLayer"])


def init_module_rank(directory: str, use_init_module: bool) -> Dict[str, Any]:
    import contextlib

    accelerator = Accelerator(cpu=True, fsdp_plugin=tiny_lm_plugin())
    torch.manual_seed(0)
    with accelerator.init_module() if use_init_module else contextlib.nullcontext():
        model = TinyLM()
    built_on = sorted({str(param.device) for param in model.parameters()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before prepare: pointed at the shards
    model, optimizer = accelerator.prepare(model, optimizer)
    initial = accelerator.get_state_dict(model)
    tokens = torch.randint(1, 20, (4, 6), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        accelerator.backward(F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()))
        optimizer.step()
        optimizer.zero_grad()
    trained = accelerator.get_state_dict(model)
    accelerator.save_state(os.path.join(directory, "state"))
    accelerator.save_model(model, os.path.join(directory, "final"), safe_serialization=False)
    loaded = {}
    for how in ("load_state", "load_model"):  # into fresh models whose shards were never initialised
        again = Accelerator(cpu=True, fsdp_plugin=tiny_lm_plugin())
        with again.init_module(empty_init=True):
            fresh = TinyLM()
        fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        fresh, fresh_optimizer = again.prepare(fresh, fresh_optimizer)
        if how == "load_state":
            again.load_state(os.path.join(directory, "state"))
        else:
            again.load_model(fresh, os.path.join(directory, "final"))
        loaded[how] = again.get_state_dict(fresh)
    return {"built_on": built_on, "initial": initial, "trained": trained, "loaded": loaded}


def test_init_module_builds_trains_saves_and_loads_the_same_model_without_any_rank_holding_it_whole(tmp_path):
    plain = launch(init_module_rank, str(tmp_path / "plain"), False)
    recorded = launch(init_module_rank, str(tmp_path / "recorded"), True)
    assert plain[0]["built_on"] == ["cpu"] and recorded[0]["built_on"] == ["meta"]  # nothing allocated yet
    torch.manual_seed(0)
    expected = {name: value.detach() for name, value in TinyLM().state_dict().items()}  # one process, same seed
    for what in ("initial", "trained"):  # bit for bit: the same model, then the same training
        for name in expected:
            assert torch.equal(recorded[0][what][name], plain[0][what][name]), f"{what}: {name}"
    for name in expected:
        assert torch.equal(recorded[0]["initial"][name], expected[name]), name
    assert torch.equal(expected["encoder.layers.0.linear1.weight"], expected["encoder.layers.1.linear1.weight"])
    assert recorded[1]["initial"] == {} and recorded[1]["trained"] == {}  # the full weights are rank 0's only
    for how in ("load_state", "load_model"):
        assert_same_weights(recorded[0]["loaded"][how], recorded[0]["trained"], f"init_module(empty_init), {how}")


def peak_growth_rank(use_init_module: bool) -> int:
    """Peak RSS growth while building and preparing a 25M-parameter model (100 MB in fp32), in bytes."""
    import contextlib

    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(min_num_params=1))
    accelerator.prepare(torch.nn.Linear(4, 4))  # FSDP2's imports and first allocations: not the model's memory
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak RSS starts again from the RSS now
    start = _status_bytes("VmRSS")
    with accelerator.init_module() if use_init_module else contextlib.nullcontext():
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(24)])
    accelerator.prepare(model)
    return _status_bytes("VmHWM") - start


def _status_bytes(field: str) -> int:
    import re

    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1)) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures the peak RSS through Linux's /proc")
def test_init_module_keeps_a_ranks_peak_memory_well_below_building_the_whole_model():
    # without it: the whole model (100 MB) and then the shards; with it: the shards (50 MB) and one layer at a time
    whole = max(launch(peak_growth_rank, False))
    sharded = max(launch(peak_growth_rank, True))
    assert whole > 100 * 2**20, whole  # the measure sees the model
    assert sharded < 0.6 * whole, (sharded, whole)


def test_init_module_records_each_ranks_rows_exactly_as_a_real_construction_writes_them():
    """In this process: every rank's recorded rows are its dim-0 chunk of what the construction really gives,
    through every way a constructor writes a parameter; the random state ends where it would."""
    from notebook_accel.accelerator.sharded_init import ShardedInit, rows_of

    class Writes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = TinyLM()
            self.drawn = torch.nn.Parameter(torch.randn(5, 3))  # a value made before it is a parameter
            self.gru = torch.nn.GRU(3, 4)
            for start in range(0, 12, 4):  # torch.nn.init on views (orthogonal_ reads what it draws)
                torch.nn.init.orthogonal_(self.gru.weight_hh_l0[start:start + 4])
            self.linear = torch.nn.Linear(3, 7)
            torch.nn.init.trunc_normal_(self.linear.weight, std=0.02)  # resamples what falls outside
            self.linear.bias.data.normal_(0, 0.1).mul_(0.5)  # through .data, then an elementwise update
            with torch.no_grad():
                self.linear.weight[:, 1] = 1.5  # a column: every rank's rows
            self.conv = torch.nn.Conv2d(3, 4, 3)
            torch.nn.init.dirac_(self.conv.weight)
            self.ones = torch.nn.Parameter(torch.ones_like(self.linear.bias) * 2)
            self.width = self.conv(torch.zeros(1, 3, 8, 8)).numel()  # a trial forward, on the meta device

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return Writes()

    expected = {name: param.detach() for name, param in build().named_parameters()}
    after = torch.rand(3)
    for world in (2, 3):
        for rank in range(world):
            recording = ShardedInit(world, rank)
            with recording:
                model = build()
            assert torch.equal(torch.rand(3), after)  # the random state moved exactly as for the real model
            assert all(param.is_meta for param in model.parameters()) and model.width == 4 * 6 * 6
            rows = recording.take(model)
            assert rows.keys() == expected.keys()
            for name, value in expected.items():
                start, stop = rows_of(value.shape, world, rank)
                assert torch.equal(rows[name], value[start:stop]), (name, world, rank)
            assert not recording._records  # nothing kept once taken (the layer TransformerEncoder copied either)


def test_init_module_refuses_what_it_cannot_replay_on_shards_naming_the_parameter():
    from notebook_accel.accelerator.sharded_init import ShardedInit

    class Unreplayable(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fine = torch.nn.Linear(2, 2)
            self.logit = torch.nn.Parameter(torch.rand(3))
            self.logit.data.logit_()  # not an operation init_module replays on rows
            self.ghost = torch.nn.Parameter(torch.empty(3, device="meta"))

    recording = ShardedInit(2, 0)
    with recording:
        model = Unreplayable()
    with pytest.raises(ValueError, match="init_module cannot build this rank's shards: logit: changed in place by "
                                         "Tensor.logit_.*; ghost: it was made on the meta device"):  # fmt: skip
        recording.take(model)


def pretrained_rank(directory: str, sharding: str) -> Dict[str, Any]:
    """transformers' from_pretrained inside init_module: under FSDP2 each rank keeps its rows of every weight as
    it is loaded; under ZeRO-3 transformers is told (as HF accelerate's zero3_init_flag does) and loads into the
    partitions."""
    import transformers
    from notebook_accel import DeepSpeedPlugin

    if sharding == "fsdp2":
        accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
            transformer_cls_names_to_wrap=["GPT2Block"]))
    else:
        accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    with accelerator.init_module():
        model = transformers.GPT2LMHeadModel.from_pretrained(directory)
    built_on = sorted({str(param.device) for param in model.parameters()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if sharding == "fsdp2":
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model, optimizer, _ = accelerator.prepare(model, optimizer, DataLoader(TensorDataset(torch.zeros(4, 1)),
                                                                               batch_size=2))  # fmt: skip
    return {"built_on": built_on, "weights": accelerator.get_state_dict(model)}


def saved_tiny_gpt2(directory: str) -> Dict[str, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(directory)
    return {name: value.clone() for name, value in model.state_dict().items()}


def test_transformers_from_pretrained_inside_init_module_loads_each_ranks_shards(tmp_path):
    saved = saved_tiny_gpt2(str(tmp_path))
    ranks = launch(pretrained_rank, str(tmp_path), "fsdp2")
    assert ranks[0]["built_on"] == ["meta"]  # each rank kept its rows of the weights as they were loaded
    assert_same_weights(ranks[0]["weights"], saved, "GPT-2 from_pretrained under FSDP2 init_module")
