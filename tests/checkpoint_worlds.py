"""``save_state`` on one number of ranks, ``load_state`` on another: what tests/test_fsdp.py and
tests/test_deepspeed.py share.

A run trains the small regression model (SGD with momentum, so the optimizer has state worth keeping) under a
sharding ("fsdp2", "zero3", or "plain": DDP, or nothing on one process), saves, and then takes one more step on
*the whole data set on every rank*: the ranks' gradients average to the one-process gradient, so that step is
the same on any number of ranks. A resumed run loads and takes the same step: equal weights after it mean the
weights *and* the optimizer state came back (momentum moves the step), and that training goes on.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, List

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from notebook_accel import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, notebook_launcher
from test_accelerator_distributed import fresh_training_objects, one_thread_then, regression_data


def sharded_accelerator(sharding: str) -> Accelerator:
    with warnings.catch_warnings():  # on one process: "nothing to shard / partition", trained as it is
        warnings.filterwarnings("ignore", message="(fsdp|deepspeed)_plugin with one process", category=UserWarning)
        if sharding == "fsdp2":
            return Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
        if sharding == "zero3":
            return Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
        assert sharding == "plain", sharding
        return Accelerator(cpu=True)


def _momentum(accelerator: Accelerator, model: Any, optimizer: Any) -> Dict[str, torch.Tensor]:
    """Every parameter's whole momentum buffer by name, on rank 0 (a collective: call it on every rank)."""
    from notebook_accel.accelerator.fsdp import is_sharded
    from notebook_accel.accelerator.zero import is_engine

    if is_engine(model):
        from deepspeed.utils import safe_get_full_optimizer_state

        return {name: safe_get_full_optimizer_state(param, "momentum_buffer").cpu().clone()
                for name, param in model.module.named_parameters()}  # fmt: skip
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(model, optimizer.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # fmt: skip
        return {name: value["momentum_buffer"] for name, value in state.get("state", {}).items()}
    module = accelerator.unwrap_model(model)
    return {name: optimizer.optimizer.state[param]["momentum_buffer"].clone()
            for name, param in module.named_parameters() if param in optimizer.optimizer.state}  # fmt: skip


def _weights(accelerator: Accelerator, model: Any) -> Dict[str, torch.Tensor]:
    # a copy: one process's state_dict holds the live parameters, which the next step moves
    return {name: value.detach().clone() for name, value in accelerator.get_state_dict(model).items()}


def _prepared(accelerator: Accelerator):
    model, optimizer, _ = fresh_training_objects()
    return accelerator.prepare(model, optimizer, DataLoader(regression_data(), batch_size=8))


def _step_on_everything(accelerator: Accelerator, model: Any, optimizer: Any) -> None:
    x, y = regression_data().tensors
    accelerator.backward(F.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()


def train_and_save(directory: str, sharding: str) -> Dict[str, Any]:
    """Train an epoch, save; what was saved, and the weights after one more step."""
    accelerator = sharded_accelerator(sharding)
    model, optimizer, loader = _prepared(accelerator)
    for x, y in loader:
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(directory)
    saved = {"weights": _weights(accelerator, model), "momentum": _momentum(accelerator, model, optimizer)}
    _step_on_everything(accelerator, model, optimizer)
    return {**saved, "next": _weights(accelerator, model)}


def load_and_continue(directory: str, sharding: str) -> Dict[str, Any]:
    """A fresh run that loads ``directory``: what it loaded, and the weights after the same one more step."""
    accelerator = sharded_accelerator(sharding)
    model, optimizer, _ = _prepared(accelerator)
    fresh = _weights(accelerator, model)
    accelerator.load_state(directory)
    loaded = {"fresh": fresh, "weights": _weights(accelerator, model),
              "momentum": _momentum(accelerator, model, optimizer)}  # fmt: skip
    _step_on_everything(accelerator, model, optimizer)
    return {**loaded, "next": _weights(accelerator, model)}


def on_ranks(world: int, function: Callable[..., Any], *args: Any) -> List[Any]:
    """Every rank's return value: ``world`` CPU ranks, or this process for one."""
    if world == 1:
        from notebook_accel.accelerator.state import end_one_rank_group

        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")  # DeepSpeed's engine sets them if unset
        before = {name: os.environ.get(name) for name in names}
        try:
            return [function(*args)]
        finally:
            end_one_rank_group()  # DeepSpeed's one-rank group: later tests fork ranks from this process
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return notebook_launcher(one_thread_then, args=(function, *args), num_processes=world, device="cpu",
                             display="none", return_all=True)  # fmt: skip


def assert_resumed(saved: Dict[str, Any], loaded: Dict[str, Any], what: str) -> None:
    """Rank 0's views of a save and a load: the same weights and momentum, and the same next step."""
    from test_accelerator_distributed import assert_same_weights

    assert saved["weights"] and saved["momentum"], f"{what}: nothing was saved"
    assert not torch.allclose(loaded["fresh"]["0.weight"], saved["weights"]["0.weight"]), f"{what}: trained?"
    assert_same_weights(loaded["weights"], saved["weights"], f"{what}, weights")
    assert_same_weights(loaded["momentum"], saved["momentum"], f"{what}, momentum")
    assert_same_weights(loaded["next"], saved["next"], f"{what}, the step after")
