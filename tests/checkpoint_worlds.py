"""``save_state`` on one number of ranks, ``load_state`` on another: what tests/test_fsdp.py and
tests/test_deepspeed.py share.

A run trains the small regression model (SGD with momentum, so the optimizer has state worth keeping) under a
sharding ("fsdp2", "zero3", or "plain": DDP, or nothing on one process), saves, and then takes one more step on
*the whole data set on every rank*: the ranks' gradients average to the one-process gradient, so that step is
the same on any number of ranks. A resumed run loads and takes the same step: equal weights after it mean the
weights *and* the optimizer state came back (momentum moves the step), and that training goes on.

``optimizer`` varies what the optimizer holds when it is saved: ``"momentum"`` (a buffer per parameter),
``"stateless"`` (plain SGD: no state at all, only its hyperparameters) or ``"unstepped"`` (SGD with momentum saved
right after ``prepare``, before its first step: no state yet).
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


OPTIMIZER_STATES = ("momentum", "stateless", "unstepped")


def _momentum(accelerator: Accelerator, model: Any, optimizer: Any) -> Dict[str, torch.Tensor]:
    """Every parameter's whole momentum buffer by name, on rank 0 (a collective: call it on every rank)."""
    from notebook_accel.accelerator.fsdp import is_sharded
    from notebook_accel.accelerator.zero import is_engine

    if is_engine(model):
        from deepspeed.utils import safe_get_full_optimizer_state

        buffers = {}
        for name, param in model.module.named_parameters():
            try:  # (a KeyError on every rank alike, before any gather: no buffer yet, or plain SGD)
                buffers[name] = safe_get_full_optimizer_state(param, "momentum_buffer").cpu().clone()
            except KeyError:
                pass
        return buffers
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(model, optimizer.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # fmt: skip
        return {name: value["momentum_buffer"] for name, value in state.get("state", {}).items()
                if value.get("momentum_buffer") is not None}  # fmt: skip
    module = accelerator.unwrap_model(model)
    state = optimizer.optimizer.state
    return {name: state[param]["momentum_buffer"].clone() for name, param in module.named_parameters()
            if state.get(param, {}).get("momentum_buffer") is not None}  # fmt: skip


def _weights(accelerator: Accelerator, model: Any) -> Dict[str, torch.Tensor]:
    # a copy: one process's state_dict holds the live parameters, which the next step moves
    return {name: value.detach().clone() for name, value in accelerator.get_state_dict(model).items()}


def _prepared(accelerator: Accelerator, optimizer_state: str = "momentum"):
    model, optimizer, _ = fresh_training_objects()
    if optimizer_state == "stateless":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return accelerator.prepare(model, optimizer, DataLoader(regression_data(), batch_size=8))


def _step_on_everything(accelerator: Accelerator, model: Any, optimizer: Any) -> None:
    x, y = regression_data().tensors
    accelerator.backward(F.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()


def train_and_save(directory: str, sharding: str, optimizer_state: str = "momentum") -> Dict[str, Any]:
    """Train an epoch (none when ``"unstepped"``), save; what was saved, and the weights after one more step."""
    accelerator = sharded_accelerator(sharding)
    model, optimizer, loader = _prepared(accelerator, optimizer_state)
    for x, y in loader if optimizer_state != "unstepped" else ():
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(directory)
    saved = {"weights": _weights(accelerator, model), "momentum": _momentum(accelerator, model, optimizer)}
    _step_on_everything(accelerator, model, optimizer)
    return {**saved, "next": _weights(accelerator, model)}


def load_and_continue(directory: str, sharding: str, optimizer_state: str = "momentum") -> Dict[str, Any]:
    """A fresh run that loads ``directory``: what it loaded, and the weights after the same one more step."""
    accelerator = sharded_accelerator(sharding)
    model, optimizer, _ = _prepared(accelerator, optimizer_state)
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


def assert_resumed(saved: Dict[str, Any], loaded: Dict[str, Any], what: str, optimizer_state: str = "momentum") -> None:
    """Rank 0's views of a save and a load: the same weights and momentum, and the same next step."""
    from test_accelerator_distributed import assert_same_weights

    assert saved["weights"], f"{what}: nothing was saved"
    if optimizer_state == "momentum":
        assert saved["momentum"], f"{what}: no momentum was saved"
    if optimizer_state == "stateless":
        assert not saved["momentum"] and not loaded["momentum"], f"{what}: plain SGD has no momentum"
    if optimizer_state != "unstepped":  # (saved before any step: the fresh weights are the saved ones)
        assert not torch.allclose(loaded["fresh"]["0.weight"], saved["weights"]["0.weight"]), f"{what}: trained?"
    assert_same_weights(loaded["weights"], saved["weights"], f"{what}, weights")
    if optimizer_state == "unstepped":  # no buffer yet, or (torch's loaders make room so) a zero one: the same step
        for momentum in (saved["momentum"], loaded["momentum"]):
            assert all(not value.any() for value in momentum.values()), f"{what}: momentum before any step"
    else:
        assert_same_weights(loaded["momentum"], saved["momentum"], f"{what}, momentum")
    assert_same_weights(loaded["next"], saved["next"], f"{what}, the step after")
