"""Fake ``torch_xla.core.xla_model``: the functions notebook_accel calls (see the package docstring)."""
import torch

from .. import _XLAC as torch_xla_c
from .. import _fake_runtime, runtime
from .._internal import collectives

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"


def xla_device(n=None, devkind=None) -> torch.device:
    return _fake_runtime.current_device()


def get_xla_supported_devices(max_devices=None):
    _fake_runtime.initialize()  # _XLAC._xla_get_devices() starts the client
    devices = [f"xla:{index}" for index in range(_fake_runtime.devices_per_process())]
    return devices[:max_devices] if max_devices else devices


def set_replication(device, devices) -> None:
    _fake_runtime.replicated = bool(devices)


def get_local_ordinal() -> int:
    return runtime.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    return (runtime.local_ordinal() if local else runtime.global_ordinal()) == 0


def master_print(*args, **kwargs) -> None:
    if is_master_ordinal(local=False):
        print(*args, **kwargs)


def is_xla_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor)


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    import torch_xla

    torch_xla.sync(wait, reset_scope)  # as torch_xla 2.9, where mark_step is the deprecated name of sync


def wait_device_ops(devices=()) -> None:
    torch_xla_c._xla_wait_device_ops(devices=list(devices))


def unlazy(tensors) -> None:
    torch_xla_c._xla_sync_multi(tensors, devices=[], wait=True)


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """In place on a list of tensors (returns it); a new tensor for a single one, as torch_xla does."""
    if groups:
        raise NotImplementedError("the fake torch_xla reduces over all replicas only")
    _fake_runtime.record("all_reduce")
    tensors = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    results = []
    for tensor in tensors:
        target = tensor.clone() if isinstance(inputs, torch.Tensor) else tensor
        collectives.all_reduce_(target.data if target.requires_grad else target, reduce_type)
        if scale != 1.0:
            target.data.mul_(scale)
        results.append(target)
    return results[0] if isinstance(inputs, torch.Tensor) else inputs


def all_gather(value, dim=0, groups=None, output=None, pin_layout=True, channel_id=None,
               use_global_device_ids=None):
    if groups:
        raise NotImplementedError("the fake torch_xla gathers over all replicas only")
    _fake_runtime.record("all_gather")
    gathered = torch.cat(collectives.all_gather(value), dim=dim)
    if output is not None:
        output.copy_(gathered)
        return output
    return gathered


def _fetch_gradients(optimizer):
    return [param.grad for group in optimizer.param_groups for param in group["params"]
            if param.grad is not None]


def reduce_gradients(optimizer, groups=None, pin_layout=True) -> None:
    count = runtime.world_size()
    if count > 1:
        all_reduce(REDUCE_SUM, _fetch_gradients(optimizer), scale=1.0 / count, groups=groups)


def optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
        import torch_xla

        torch_xla.sync()
    return loss


def rendezvous(tag, payload=b"", replicas=[]):
    return collectives.exchange(f"rendezvous/{tag}", payload)


def mesh_reduce(tag, data, reduce_fn):
    return reduce_fn(collectives.exchange(f"mesh_reduce/{tag}", data))


def save(data, file_or_path, master_only=True, global_master=False) -> None:
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(data, file_or_path)
    rendezvous("torch_xla.core.xla_model.save")


def broadcast_master_param(model) -> None:
    """As torch_xla: every replica gets the master replica's parameters and buffers (a sum where the
    others contribute zeros)."""
    import itertools

    tensors = [tensor for tensor in itertools.chain(model.parameters(), model.buffers())
               if tensor.dtype.is_floating_point]
    with torch.no_grad():
        if not is_master_ordinal(local=False):
            for tensor in tensors:
                tensor.zero_()
        all_reduce(REDUCE_SUM, tensors)
