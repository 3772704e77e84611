"""DeepSpeed ZeRO through the Accelerator, on real ranks (2 CPU processes, gloo; DeepSpeed without built ops,
so the user's torch optimizer runs) and in this process.

- equivalence: ZeRO-1, -2 and -3 on 2 ranks train to the same weights as one plain-PyTorch process with the
  whole batch (ordered, shuffled, and with gradient accumulation + DeepSpeed's clipping + an LR scheduler); the
  engine runs the stage asked for, and each rank holds half of the optimizer state;
- ZeRO-3 keeps half the parameters per rank; ``get_state_dict`` gathers the full weights on rank 0;
- a ZeRO-3 checkpoint from 2 ranks loads in one process without DeepSpeed; ``save_state`` on 1, 2 or 3 ranks (or
  under DDP) resumes under ZeRO-3 on another number of ranks: the same weights, momentum and next step;
- the seeds' Transformer loop under ZeRO-3 with bf16;
- the config is filled from the launch (no "auto" left), and bad input is refused with one message;
- a ZeRO ``prepare`` on CPU ranks compiles nothing (DeepSpeed's shared-memory collective op is not built), and
  DeepSpeed is told the ranks train on the CPU (no rank warns that it guessed);
- ``init_module`` (``deepspeed.zero.Init``) builds, trains, saves and loads the same model as a plain construction;
  ``load_model`` (rank 0 reads, the others receive their partitions) into an engine built with ``empty_init``.
  While the model is built inside it, no rank's peak memory reaches the whole model's size.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import warnings
from typing import Any, Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, DeepSpeedPlugin, notebook_launcher
from notebook_accel.accelerator.zero import filled_config
from checkpoint_worlds import assert_resumed, load_and_continue, on_ranks, train_and_save
from test_accelerator_distributed import (
    EPOCHS,
    EQUIVALENCE_CASES,
    WORLD,
    assert_same_weights,
    fresh_training_objects,
    launch,
    one_thread_then,
    regression_data,
    train_plain_pytorch,
)

pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra: pip install '.[deepspeed]'")
pytestmark = pytest.mark.timeout(300)


def local_parameters(model: torch.nn.Module) -> int:
    # ZeRO-3 replaces each parameter's data by an empty tensor and keeps this rank's partition in ds_tensor
    return sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in model.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of this rank's optimizer state (SGD's momentum): ZeRO-1 and up keep only this rank's partition."""
    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor))


def master_copies(engine: Any) -> Dict[str, int]:
    """ZeRO-3's fp32 "master" partitions the optimizer steps: how many share the parameters' own partition's
    memory, and how many are a copy beside it."""
    pairs = list(zip(engine.optimizer.fp16_partitioned_groups_flat, engine.optimizer.fp32_partitioned_groups_flat))
    shared = sum(flat.data_ptr() == master.data_ptr() for flat, master in pairs)
    return {"shared": shared, "copies": len(pairs) - shared}


def train_zero(stage: int, batch_size: int, shuffle: bool, accumulation: int = 1, clip=None,
               **plugin_options: Any) -> Dict[str, Any]:
    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_clipping=clip, **plugin_options)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation, deepspeed_plugin=plugin)
    model, optimizer, scheduler = fresh_training_objects()
    loader = DataLoader(regression_data(), batch_size=batch_size, shuffle=shuffle)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for _ in range(EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(F.mse_loss(model(x), y))
                if clip is not None:
                    accelerator.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return {
        "weights": accelerator.get_state_dict(model),
        "local_parameters": local_parameters(model),
        "stage": model.zero_optimization_stage(),  # the engine's own word on what it runs
        "optimizer_bytes": optimizer_state_bytes(optimizer.optimizer),  # the user's torch optimizer, as stepped
        "lr": optimizer.param_groups[0]["lr"],
        "masters": master_copies(model) if stage == 3 else None,
        "config": {key: model.config[key] for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                                      "train_batch_size")},  # fmt: skip
    }


def equivalence_rank():
    return {(stage, name): train_zero(stage, batch, shuffle, steps, clip)
            for stage in (1, 2, 3) for name, (batch, shuffle, steps, clip) in EQUIVALENCE_CASES.items()}  # fmt: skip


def test_zero_1_2_3_on_two_ranks_train_like_one_process_with_the_whole_batch():
    ranks = launch(equivalence_rank)
    total = sum(p.numel() for p in fresh_training_objects()[0].parameters())
    for (stage, name), main in ranks[0].items():
        batch, shuffle, steps, clip = EQUIVALENCE_CASES[name]
        other = ranks[1][(stage, name)]
        assert main["stage"] == other["stage"] == stage  # not silently another stage (stage 0 trains the same)
        # every stage partitions the optimizer state (fp32 momentum: 4 bytes a parameter): half of it per rank
        assert main["optimizer_bytes"] + other["optimizer_bytes"] in range(4 * total, 4 * total + 4 * WORLD + 1)
        assert main["optimizer_bytes"] < 4 * total * 0.6, f"ZeRO-{stage}: rank 0 holds {main['optimizer_bytes']} B"
        expected = train_plain_pytorch(batch * WORLD * steps, shuffle, clip, scheduler_steps=WORLD, processes=WORLD)
        assert_same_weights(main["weights"], expected, f"ZeRO-{stage}, {name}")
        assert main["config"] == {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": steps,
                                  "train_batch_size": batch * steps * WORLD}  # fmt: skip
        if stage == 3:
            assert other["weights"] == {}  # gathered on rank 0 only
            # each rank keeps half of every parameter (odd sizes are padded to an even split)
            assert main["local_parameters"] + other["local_parameters"] in (total, total + 1, total + 2)
            assert main["local_parameters"] < total * 0.6
            # fp32 parameters: the optimizer steps their partition itself, no second copy of it (DeepSpeed meant
            # to, but compares a torch.device with a string)
            assert main["masters"]["copies"] == 0 and main["masters"]["shared"] > 0, main["masters"]
        else:
            assert_same_weights(other["weights"], expected, f"ZeRO-{stage}, {name}, rank 1")  # whole on every rank
            assert main["local_parameters"] == total
        # the StepLR schedule stepped WORLD times per real optimizer step (as HF accelerate), halving every 3
        assert main["lr"] == pytest.approx(0.05 * 0.5 ** (EPOCHS * 64 // (batch * WORLD * steps) * WORLD // 3))


def offload_rank() -> Dict[str, Any]:
    return train_zero(3, 8, False, offload_optimizer_device="cpu", offload_param_device="cpu")


def test_zero3_with_optimizer_and_parameter_offload_trains_like_one_process():
    # the user's torch optimizer, stepped on the CPU partitions (DeepSpeed would refuse it without being told)
    ranks = launch(offload_rank)
    assert_same_weights(ranks[0]["weights"], train_plain_pytorch(8 * WORLD, False, scheduler_steps=WORLD), "ZeRO-3 with CPU offload")
    assert ranks[0]["masters"]["shared"] == 0  # offloaded: DeepSpeed's own masters, left as they are


def zero3_training(accelerator: Accelerator):
    model, optimizer, _ = fresh_training_objects()
    loader = DataLoader(regression_data(), batch_size=16)
    return accelerator.prepare(model, optimizer, loader)


def save_zero3(directory: str) -> Dict[str, Any]:
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    model, optimizer, loader = zero3_training(accelerator)
    for x, y in loader:
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(directory)
    saved = accelerator.get_state_dict(model)
    final = accelerator.save_model(model, os.path.join(directory, "final"))  # one file of the gathered weights
    # and resumed by a fresh engine on the same 2 ranks (each loads its own partitions and optimizer state)
    again = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    model_again, optimizer_again, _ = zero3_training(again)
    fresh = again.get_state_dict(model_again)
    again.load_state(directory)
    return {"saved": saved, "final": final, "fresh": fresh, "resumed": again.get_state_dict(model_again),
            "unwrapped": type(accelerator.unwrap_model(model)).__name__,
            "optimizer_state": sum(len(state) for state in optimizer_again.optimizer.state.values())}


def test_a_zero3_checkpoint_resumes_on_the_ranks_that_saved_it(tmp_path):
    result = launch(save_zero3, str(tmp_path))[0]
    saved = result["saved"]
    assert os.path.isdir(tmp_path / "model.deepspeed")
    assert result["unwrapped"] == "Sequential"  # unwrap_model: the user's module inside the engine
    assert not torch.allclose(result["fresh"]["0.weight"], saved["0.weight"])
    assert_same_weights(result["resumed"], saved, "ZeRO-3 checkpoint resumed on 2 ranks")
    assert result["optimizer_state"] > 0  # SGD's momentum came back with the engine's checkpoint
    safetensors = pytest.importorskip("safetensors.torch")
    assert_same_weights(safetensors.load_file(result["final"]), saved, "save_model under ZeRO-3")
    # on one process without DeepSpeed, and on another number of ranks: the next test


# stateless and unstepped optimizers (issue 36): torch's full-state setter asserted "Expected device to be set"
@pytest.mark.parametrize("saved_on, loaded_on, optimizer_state", [
    (1, 2, "momentum"), (2, 1, "momentum"), (2, 3, "momentum"),
    (1, 2, "stateless"), (2, 1, "stateless"), (1, 2, "unstepped"), (2, 1, "unstepped")])
def test_a_zero3_checkpoint_resumes_on_another_number_of_ranks(tmp_path, saved_on, loaded_on, optimizer_state):
    # one process trains with DeepSpeed's engine too (as HF accelerate's does) and writes its checkpoint;
    # DeepSpeed's own checkpoint (each rank's partitions) is merged into full state for another number of ranks
    saved = on_ranks(saved_on, train_and_save, str(tmp_path), "zero3", optimizer_state)[0]
    assert os.path.isdir(tmp_path / "model.deepspeed")
    loaded = on_ranks(loaded_on, load_and_continue, str(tmp_path), "zero3", optimizer_state)[0]
    assert_resumed(saved, loaded, f"a ZeRO-3 checkpoint ({optimizer_state}) from {saved_on} to {loaded_on} ranks",
                   optimizer_state)


def test_a_ddp_checkpoint_resumes_under_zero3(tmp_path):
    saved = on_ranks(2, train_and_save, str(tmp_path), "plain")[0]
    loaded = on_ranks(2, load_and_continue, str(tmp_path), "zero3")[0]
    assert_resumed(saved, loaded, "a DDP checkpoint under ZeRO-3")


def transformer_rank() -> Dict[str, Any]:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
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
            losses.append(accelerator.reduce(loss.detach().float(), "mean").item())
    weights = accelerator.get_state_dict(model)
    return {"losses": losses, "bf16": model.config["bf16"]["enabled"], "masters": master_copies(model),
            "dtypes": sorted({str(value.dtype) for value in weights.values()})}  # fmt: skip


def test_the_seeds_transformer_loop_under_zero3_with_bf16():
    ranks = launch(transformer_rank)
    main = ranks[0]
    assert main["bf16"] is True
    assert all(torch.isfinite(torch.tensor(main["losses"])))
    assert main["losses"][-1] < main["losses"][0]
    assert ranks[1]["losses"] == main["losses"]
    assert main["dtypes"] == ["torch.bfloat16"]  # DeepSpeed's 16-bit weights, gathered on rank 0
    assert main["masters"]["shared"] == 0 and main["masters"]["copies"] > 0  # bf16 weights: fp32 masters apart


def differently_initialised_rank() -> Dict[str, torch.Tensor]:
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    torch.manual_seed(accelerator.process_index)  # each rank's own init differs, as with a rank-seeded setup
    model = torch.nn.Linear(6, 4)
    model, _, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                      DataLoader(regression_data(), batch_size=4))  # fmt: skip
    return accelerator.get_state_dict(model)


def test_every_rank_starts_from_rank_0s_weights_as_ddp_does():
    # DeepSpeed broadcasts rank 0's module when it builds the engine (ZeRO-3 partitions rank 0's copy): checked
    gathered = launch(differently_initialised_rank)[0]
    torch.manual_seed(0)
    assert_same_weights(gathered, torch.nn.Linear(6, 4).state_dict(), "rank 0's init, on both partitions")


def prepare_alone_rank() -> str:
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin())
    try:
        accelerator.prepare(torch.nn.Linear(2, 2))
    except ValueError as error:
        return str(error)
    return "no error"


def meta_model_rank() -> None:
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(regression_data(), batch_size=4))


def test_a_model_on_a_device_it_must_not_be_on_is_refused_at_prepare():
    with pytest.raises(ValueError, match="DeepSpeed ZeRO-3: the model has tensors on the meta device"):
        launch(meta_model_rank)
    # the other places (another rank's GPU, a device_map): tests/test_fsdp.py, decided without a GPU


def tutorial_rank() -> Dict[str, Any]:
    from word_language_model import run_tutorial

    result = run_tutorial(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_clipping=0.5))
    engine = result.pop("model")
    result.pop("accelerator")
    result["local_parameters"] = local_parameters(engine)
    return result


def test_the_seeds_transformer_language_model_tutorial_trains_under_zero3():
    from word_language_model import NTOKENS

    ranks = launch(tutorial_rank)
    main = ranks[0]
    assert main["losses"][-1] < main["losses"][0] * 0.8, main["losses"]
    assert ranks[1]["losses"] == main["losses"]
    total = sum(math.prod(shape) for name, shape in main["weights"].items() if name != "pos_encoder.pe")
    assert main["local_parameters"] < total * 0.55 and ranks[1]["local_parameters"] < total * 0.55  # ~half each
    assert main["weights"]["linear.weight"] == (NTOKENS, 32) and ranks[1]["weights"] == {}


def prepare_zero_rank() -> Dict[str, Any]:
    import deepspeed.comm.comm as deepspeed_comm

    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    started = time.monotonic()
    zero3_training(accelerator)
    return {"seconds": time.monotonic() - started, "shm_op": deepspeed_comm.cdb.shm_comm_op is not None}


class CompilerWatch:
    """The names of C++ build tools (ninja, g++, cc1plus) that ever ran below this process, polled in a thread:
    a JIT build of a torch extension runs them for tens of seconds, so polling at 20 Hz cannot miss one."""

    TOOLS = ("ninja", "g++", "c++", "cc1plus")

    def __init__(self) -> None:
        self.seen: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import psutil

        while not self._stop.wait(0.05):
            for child in psutil.Process().children(recursive=True):
                try:
                    name = child.name()
                except psutil.Error:
                    continue
                if any(name == tool or name.endswith("-" + tool) for tool in self.TOOLS):
                    self.seen.add(name)

    def __enter__(self) -> "CompilerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def test_a_zero_prepare_on_cpu_ranks_builds_no_cpp_op(tmp_path, monkeypatch):
    # DeepSpeed's torch backend would JIT-compile its shared-memory collective op (deepspeed_shm_comm: ninja and
    # g++, 30-120 s, in TORCH_EXTENSIONS_DIR) at the first engine of every rank; training's collectives are
    # torch.distributed's (gloo) either way. An empty extensions dir is what a fresh environment has.
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    with CompilerWatch() as compilers:
        ranks = launch(prepare_zero_rank)
    seconds = [rank["seconds"] for rank in ranks]
    assert compilers.seen == set(), f"a C++ build ran during prepare ({seconds} s): {compilers.seen}"
    assert list(extensions.iterdir()) == [], f"written in TORCH_EXTENSIONS_DIR: {list(extensions.rglob('*'))[:5]}"
    assert [rank["shm_op"] for rank in ranks] == [False, False]


def init_module_rank(directory: str, use_init_module: bool) -> Dict[str, Any]:
    import contextlib

    from test_fsdp import TinyLM

    tokens = torch.randint(1, 20, (8, 6), generator=torch.Generator().manual_seed(1))
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    torch.manual_seed(0)
    with accelerator.init_module() if use_init_module else contextlib.nullcontext():
        model = TinyLM()
    partitioned = sorted({hasattr(param, "ds_id") for param in model.parameters()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(TensorDataset(tokens), batch_size=4))
    initial = accelerator.get_state_dict(model)
    for _ in range(2):
        for (batch,) in loader:
            accelerator.backward(F.cross_entropy(model(batch).flatten(0, 1), batch.flatten()))
            optimizer.step()
            optimizer.zero_grad()
    trained = accelerator.get_state_dict(model)
    accelerator.save_state(os.path.join(directory, "state"))
    accelerator.save_model(model, os.path.join(directory, "final"), safe_serialization=False)
    loaded = {}
    for how in ("load_state", "load_model"):  # into fresh engines whose partitions were never initialised
        again = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
        with again.init_module(empty_init=True):
            fresh = TinyLM()
        fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        fresh, fresh_optimizer, _ = again.prepare(fresh, fresh_optimizer, DataLoader(TensorDataset(tokens), batch_size=4))
        if how == "load_state":
            again.load_state(os.path.join(directory, "state"))
        else:
            again.load_model(fresh, os.path.join(directory, "final"))
        loaded[how] = again.get_state_dict(fresh)
    return {"partitioned": partitioned, "initial": initial, "trained": trained, "loaded": loaded}


@pytest.mark.timeout(600)  # six engines on two ranks
def test_init_module_builds_trains_saves_and_loads_the_same_model_partitioned_from_the_start(tmp_path, monkeypatch):
    extensions = tmp_path / "torch_extensions"  # zero.Init starts DeepSpeed's comm backend before any engine:
    extensions.mkdir()  # it must not build the shared-memory op either
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    plain = launch(init_module_rank, str(tmp_path / "plain"), False)
    partitioned = launch(init_module_rank, str(tmp_path / "partitioned"), True)
    assert list(extensions.iterdir()) == [], f"written in TORCH_EXTENSIONS_DIR: {list(extensions.rglob('*'))[:5]}"
    assert plain[0]["partitioned"] == [False] and partitioned[0]["partitioned"] == [True]  # zero.Init at work
    for what in ("initial", "trained"):  # bit for bit: deep-copied layers, MultiheadAttention's zeroed bias...
        assert partitioned[0][what].keys() == plain[0][what].keys()
        for name, value in plain[0][what].items():
            assert torch.equal(partitioned[0][what][name], value), f"{what}: {name}"
    assert partitioned[1]["trained"] == {}  # gathered on rank 0 only
    for how in ("load_state", "load_model"):
        assert_same_weights(partitioned[0]["loaded"][how], partitioned[0]["trained"], f"init_module(empty_init), {how}")


def build_peaks_rank() -> Dict[str, int]:
    """Peak RSS growth of this rank while a 25M-parameter model (100 MB in fp32) is built inside ZeRO-3's
    ``init_module``, then outside it; and the model's bytes."""
    from test_fsdp import _status_bytes

    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    with accelerator.init_module():
        torch.nn.Linear(4, 4)  # zero.Init's first use (its comm backend, imports): not the model's memory
    peaks = {}
    for how in ("init_module", "plain"):
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # the peak RSS starts again from the RSS now
        start = _status_bytes("VmRSS")
        with accelerator.init_module() if how == "init_module" else contextlib.nullcontext():
            model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(24)])
        peaks[how] = _status_bytes("VmHWM") - start
        peaks["model"] = sum(param.ds_numel if hasattr(param, "ds_numel") else param.numel()
                             for param in model.parameters()) * 4
        del model
    return peaks


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures the peak RSS through Linux's /proc")
def test_zero3_init_module_never_holds_the_whole_model_on_any_rank():
    # Beyond "the parameters are partitioned" (which DeepSpeed's prepare makes true of any model): while the
    # model is built, a rank holds its half and one layer at a time, never the whole 100 MB.
    ranks = launch(build_peaks_rank)
    for rank, peaks in enumerate(ranks):
        assert peaks["model"] > 95 * 2**20 and peaks["plain"] >= 0.95 * peaks["model"], peaks  # the measure sees it
        assert peaks["init_module"] < 0.65 * peaks["model"], (rank, peaks)  # half, and a layer or two


def test_transformers_from_pretrained_inside_init_module_loads_into_the_partitions(tmp_path):
    from test_fsdp import pretrained_rank, saved_tiny_gpt2

    saved = saved_tiny_gpt2(str(tmp_path))
    ranks = launch(pretrained_rank, str(tmp_path), "zero3")
    assert_same_weights(ranks[0]["weights"], saved, "GPT-2 from_pretrained under ZeRO-3 init_module")


def finished_script(code: str, cwd: Any) -> Tuple[int, str, str]:
    """A fresh script's exit code, stdout, and stdout + stderr (this process imported DeepSpeed already), run in
    ``cwd``, away from the checkout, so that it imports the notebook_accel under test."""
    from scripts import start_script

    script = start_script(code, cwd=str(cwd))
    try:
        stdout, stderr = script.communicate(timeout=280)
    finally:
        script.kill()
    return script.returncode, stdout, stdout + stderr


def test_deepspeed_is_told_its_ranks_train_on_the_cpu_so_no_rank_warns_that_it_guessed(tmp_path):
    returncode, stdout, printed = finished_script("""
        import torch
        from notebook_accel import notebook_launcher

        def rank():
            import os
            from notebook_accel import Accelerator, DeepSpeedPlugin, notebook_launcher
            torch.set_num_threads(1)
            Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))  # imports DeepSpeed
            from deepspeed.accelerator import get_accelerator
            return os.environ.get("DS_ACCELERATOR"), get_accelerator().device_name()

        print("ranks:", notebook_launcher(rank, num_processes=2, device="cpu", display="text", return_all=True))
    """, tmp_path)
    assert returncode == 0, printed
    assert "ranks: [('cpu', 'cpu'), ('cpu', 'cpu')]" in stdout, printed
    assert "Setting accelerator to CPU" not in printed, printed  # DeepSpeed's "we were unable to detect it"


def test_a_model_prepared_without_its_optimizer_is_refused_with_one_message():
    messages = launch(prepare_alone_rank)
    assert all("prepare exactly one model and its optimizer" in message for message in messages)


# ------------------------------------------------------------------------------- the plugin, in this process
def test_the_config_is_filled_from_the_launch_and_leftover_autos_are_refused():
    plugin = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
                                           "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})  # fmt: skip
    config = filled_config(plugin, micro_batch=4, accumulation=2, world=2, mixed_precision="bf16")
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["train_batch_size"] == 16
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert config["gradient_clipping"] == 0.0 and config["zero_optimization"] == {"stage": 3}  # DeepSpeed's is 1.0
    with pytest.raises(ValueError, match="per-rank batch size"):
        filled_config(DeepSpeedPlugin(), micro_batch=None, accumulation=1, world=2, mixed_precision="no")
    with pytest.raises(ValueError, match="'auto' at wall_clock_breakdown"):
        filled_config(DeepSpeedPlugin(hf_ds_config={"wall_clock_breakdown": "auto"}), micro_batch=2, accumulation=1,
                      world=2, mixed_precision="no")  # fmt: skip
    with pytest.raises(ValueError, match="differs from the Accelerator's 1"):
        filled_config(DeepSpeedPlugin(gradient_accumulation_steps=4), micro_batch=2, accumulation=1, world=2,
                      mixed_precision="no")  # fmt: skip


def test_zero3s_bucket_and_step_sizes_come_from_the_models_width_as_hf_accelerate_fills_auto():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))  # width 64
    config = filled_config(DeepSpeedPlugin(zero_stage=3), micro_batch=2, accumulation=1, world=2,
                           mixed_precision="no", model=model)  # fmt: skip
    assert config["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 64 * 64,
                                           "stage3_prefetch_bucket_size": int(0.9 * 64 * 64),
                                           "sub_group_size": 4 * 64 * 64,
                                           "stage3_max_live_parameters": 4 * 64 * 64,
                                           "stage3_max_reuse_distance": 4 * 64 * 64}  # fmt: skip
    given = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3, "reduce_bucket_size": 1000,
                                                                "stage3_param_persistence_threshold": "auto"}})
    config = filled_config(given, micro_batch=2, accumulation=1, world=2, mixed_precision="no", model=model)
    assert config["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 1000,
                                           "stage3_param_persistence_threshold": 640}  # fmt: skip
    # with no model (zero.Init, before it is built) an "auto" is DeepSpeed's own default
    assert filled_config(DeepSpeedPlugin(zero_stage=3), micro_batch=2, accumulation=1, world=2,
                         mixed_precision="no")["zero_optimization"] == {"stage": 3}  # fmt: skip
    assert DeepSpeedPlugin(zero_stage=2).config["zero_optimization"] == {"stage": 2}  # ZeRO-3's sizes only


def test_the_plugin_refuses_bad_input_before_any_model_is_built(tmp_path):
    with pytest.raises(ValueError, match="'optimizer' section"):
        DeepSpeedPlugin(hf_ds_config={"optimizer": {"type": "AdamW"}})
    with pytest.raises(ValueError, match="needs zero_stage=3"):
        DeepSpeedPlugin(zero_stage=2, offload_param_device="cpu")
    with pytest.raises(ValueError, match="stages 0, 1, 2 and 3"):
        DeepSpeedPlugin(zero_stage=4)
    from notebook_accel import FullyShardedDataParallelPlugin

    with pytest.raises(ValueError, match="give one of them"):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(), deepspeed_plugin=DeepSpeedPlugin())
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": 2}')
    plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    assert plugin.zero_stage == 1 and plugin.gradient_accumulation_steps == 2


def test_hf_accelerates_environment_builds_the_same_plugin(tmp_path):
    environ = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
               "ACCELERATE_GRADIENT_CLIPPING": "1.0", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu"}  # fmt: skip
    plugin = DeepSpeedPlugin.from_environment(environ)
    assert plugin.zero_stage == 3 and plugin.config["gradient_clipping"] == 1.0
    assert plugin.config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert DeepSpeedPlugin.from_environment({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}) is None


def one_process_offload_rank() -> Dict[str, Any]:
    result = train_zero(3, 8, False, offload_optimizer_device="cpu", offload_param_device="cpu")
    result["group"] = (torch.distributed.get_backend(), torch.distributed.get_world_size())
    return result


def test_one_process_builds_deepspeeds_engine_with_zero3_offload_and_trains_like_plain_pytorch():
    """As HF accelerate does: one process still gets DeepSpeed's engine (ZeRO-Offload is how one GPU trains a model
    bigger than its memory; test_cuda_machine.py trains one there), over a one-rank gloo group of its own."""
    result = notebook_launcher(one_thread_then, args=(one_process_offload_rank,), num_processes=1, device="cpu",
                               start_method="fork", display="none")
    assert result["stage"] == 3 and result["group"] == ("gloo", 1)
    assert result["config"]["train_batch_size"] == 8
    assert_same_weights(result["weights"], train_plain_pytorch(8, False), "one process, ZeRO-3 with CPU offload")
    assert result["masters"]["shared"] == 0  # offloaded: DeepSpeed's own fp32 masters in host memory


IN_KERNEL_ZERO = """
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from notebook_accel import Accelerator, DeepSpeedPlugin, notebook_launcher
from notebook_accel.plan.devices import kernel_process_group

def train():
    plugin = DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu")
    accelerator = Accelerator(cpu=True, deepspeed_plugin=plugin)
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    for x, y in loader:
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
    return type(model).__name__, model.zero_optimization_stage(), model.zero_offload_optimizer().device, \
        torch.distributed.get_world_size()

def rank():
    return torch.distributed.is_initialized()

if __name__ == "__main__":
    print("IN THE KERNEL", notebook_launcher(train, num_processes=1, display="none"))
    print("GROUP AFTER", kernel_process_group())
    print("FORKED", notebook_launcher(rank, num_processes=2, device="cpu", start_method="fork", display="none",
                                      return_all=True))
"""


def test_a_zero_engine_in_the_kernel_ends_its_one_rank_group_with_the_run():
    """In the kernel (one rank, inline) the engine's one-rank group ends with the run: left there, it would refuse
    every later forked launch."""
    from scripts import run_script

    done = run_script(IN_KERNEL_ZERO, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "IN THE KERNEL ('DeepSpeedEngine', 2, 'cpu', 1)" in done.stdout, done.stdout
    assert "GROUP AFTER None" in done.stdout and "FORKED [False, False]" in done.stdout, done.stdout

def test_zero3_from_init_module_to_the_gathered_state_prints_no_torch_deprecation(tmp_path):
    # issue 46: big_models.ipynb's ZeRO-3 cell printed torch's FutureWarning "`torch.distributed.all_gather_into_tensor`
    # is deprecated" once per rank: DeepSpeed's call, which the user can do nothing about
    returncode, stdout, printed = finished_script("""
        import torch
        from notebook_accel import notebook_launcher

        def rank():
            from notebook_accel import Accelerator, DeepSpeedPlugin
            torch.set_num_threads(1)
            accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
            with accelerator.init_module():   # the encoder deep-copies its partitioned layer: a gather
                layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
                model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=2), torch.nn.Linear(8, 1))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            loader = torch.utils.data.DataLoader(torch.randn(16, 3, 8), batch_size=4)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for inputs in loader:
                accelerator.backward(model(inputs).pow(2).mean())
                optimizer.step(); optimizer.zero_grad()
            return sorted(accelerator.get_state_dict(model))

        print("ranks:", notebook_launcher(rank, num_processes=2, device="cpu", display="text"))
    """, tmp_path)
    assert returncode == 0, printed
    assert "ranks: ['0.layers.0.linear1.bias'," in stdout and "'1.weight']" in stdout, printed
    assert "is deprecated" not in printed and "FutureWarning" not in printed, printed
