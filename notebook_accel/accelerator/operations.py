"""Nested batches and the collectives over them: move, gather, reduce, pad, broadcast.

A *tree* is a tensor or any nesting of dicts (any Mapping), lists, tuples and namedtuples around tensors;
every function here keeps the container types it was given. With one process (no process group) every
collective is an identity, so the same training loop runs unchanged on 1 or N ranks.

Gathers tolerate tensors whose first dimension differs between ranks (a custom batch sampler's uneven
batches): the ranks first exchange one small tensor of shapes, which also lets every rank raise the same
clear error on a real mismatch instead of hanging inside a collective.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, List, Sequence, Tuple

import torch
import torch.distributed as dist

__all__ = [
    "is_tensor",
    "tree_map",
    "tree_leaves",
    "send_to_device",
    "world_size",
    "gather",
    "gather_per_rank",
    "fill_leaves",
    "gather_object",
    "reduce",
    "pad_across_processes",
    "broadcast",
    "broadcast_object",
    "barrier",
]

Tree = Any


# ----------------------------------------------------------------------------------------------------- trees
def is_tensor(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _rebuild_mapping(original: Mapping, items: dict) -> Mapping:
    try:
        return type(original)(items)
    except TypeError:  # e.g. defaultdict: its constructor wants the factory first
        if isinstance(original, MutableMapping):
            rebuilt = copy.copy(original)
            rebuilt.update(items)
            return rebuilt
        return items


def tree_map(fn: Callable[[Any], Any], tree: Tree, is_leaf: Callable[[Any], bool] = is_tensor) -> Tree:
    """Apply ``fn`` to every leaf of ``tree`` (tensors by default), keeping the containers' types.

    Example::

        tree_map(lambda t: t * 2, {"x": torch.ones(2), "ids": [torch.zeros(1)], "name": "a"})
        # -> {"x": tensor([2., 2.]), "ids": [tensor([0.])], "name": "a"}   (non-leaves pass through)
    """
    if is_leaf(tree):
        return fn(tree)
    if isinstance(tree, Mapping):
        return _rebuild_mapping(tree, {key: tree_map(fn, value, is_leaf) for key, value in tree.items()})
    if _is_namedtuple(tree):
        return type(tree)(*(tree_map(fn, value, is_leaf) for value in tree))
    if isinstance(tree, (list, tuple)):
        values = [tree_map(fn, value, is_leaf) for value in tree]
        try:
            return type(tree)(values)
        except TypeError:  # a list/tuple subclass with its own constructor
            return tuple(values) if isinstance(tree, tuple) else values
    return tree


def tree_leaves(tree: Tree, is_leaf: Callable[[Any], bool] = is_tensor) -> List[Tuple[str, Any]]:
    """``(path, leaf)`` pairs in a deterministic order; a path reads like ``batch['x'][0]``.

    Anything that is neither a container nor a leaf is reported as a leaf too, so callers can reject it
    with a message that says where it was.
    """
    found: List[Tuple[str, Any]] = []

    def visit(node: Any, path: str) -> None:
        if is_leaf(node):
            found.append((path, node))
        elif isinstance(node, Mapping):
            for key, value in node.items():
                visit(value, f"{path}[{key!r}]")
        elif isinstance(node, (list, tuple)):
            for index, value in enumerate(node):
                visit(value, f"{path}[{index}]")
        else:
            found.append((path, node))

    visit(tree, "")
    return found


def _has_to_method(obj: Any) -> bool:
    return is_tensor(obj) or (callable(getattr(obj, "to", None)) and not isinstance(obj, torch.nn.Module))


def send_to_device(tree: Tree, device: torch.device, non_blocking: bool = False) -> Tree:
    """Move every tensor (and every object with a ``.to``, e.g. a tokenizer's BatchEncoding) to ``device``."""

    def move(obj: Any) -> Any:
        if is_tensor(obj):
            return obj.to(device, non_blocking=non_blocking)
        try:
            return obj.to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() that does not know non_blocking
            return obj.to(device)

    # fast path for the most common batch, a plain list/tuple of tensors (runs once per step)
    if type(tree) in (list, tuple) and all(type(item) is torch.Tensor for item in tree):
        return type(tree)(item.to(device, non_blocking=non_blocking) for item in tree)
    return tree_map(move, tree, is_leaf=_has_to_method)


# ------------------------------------------------------------------------------------------- process group
# On XLA a rank is a device, and on TPU v2/v3 (and torch_xla's CPU client) devices are threads of one process:
# a torch.distributed group (one per process) cannot serve them, so collectives use torch_xla's own
# (xm.all_gather / all_reduce / mesh_reduce / rendezvous), which every device thread joins.
_xla_collectives = False


def use_xla_collectives(enabled: bool = True) -> None:
    """Route this process's collectives through torch_xla (set once by the Accelerator on XLA)."""
    global _xla_collectives
    _xla_collectives = enabled


def xla_device() -> torch.device:
    """This process's TPU core (``torch_xla.device()`` in recent torch_xla, ``xm.xla_device()`` before)."""
    import torch_xla

    if hasattr(torch_xla, "device"):
        return torch_xla.device()
    import torch_xla.core.xla_model as xm

    return xm.xla_device()


def world_size() -> int:
    """Ranks in the launch: the default process group's, torch_xla's on XLA, 1 when there is neither."""
    if _xla_collectives:
        import torch_xla.runtime as xr

        return xr.world_size()
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    """Wait until every rank gets here (no-op for one process)."""
    if world_size() > 1:
        if _xla_collectives:
            import torch_xla.core.xla_model as xm

            xm.rendezvous("notebook_accel.barrier")
        else:
            dist.barrier()


def _comm_device(tensor: torch.Tensor) -> torch.device:
    """Where a tensor must live for the current backend's collectives."""
    if _xla_collectives:
        return xla_device()
    backend = dist.get_backend()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "xla":
        return xla_device()
    return tensor.device


def _all_gather_flat(output: torch.Tensor, tensor: torch.Tensor) -> None:
    """All-gather equal-shaped tensors into ``output`` (world * dim0 rows)."""
    if _xla_collectives:
        import torch_xla.core.xla_model as xm

        output.copy_(xm.all_gather(tensor, dim=0))
    elif dist.get_backend() in ("gloo", "nccl"):
        gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather_single(output, tensor)
    else:  # the list form is the one every backend implements
        dist.all_gather(list(output.chunk(world_size())), tensor)


# dtype <-> small int, so a shape record is one int64 tensor
_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
]  # fmt: skip
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
_MAX_DIMS = 8


def _shape_record(tensor: torch.Tensor) -> List[int]:
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"collectives here support tensors of at most {_MAX_DIMS} dimensions, got {tensor.dim()}")
    dims = list(tensor.shape) + [-1] * (_MAX_DIMS - tensor.dim())
    return [_DTYPE_CODE.get(tensor.dtype, -1), tensor.dim()] + dims


def _exchange_shapes(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every rank's shape records: an int64 tensor [world, len(tensors), 2 + _MAX_DIMS] on the CPU."""
    records = torch.tensor([_shape_record(t) for t in tensors], dtype=torch.int64).reshape(len(tensors), -1)
    device = _comm_device(tensors[0]) if tensors else torch.device("cpu")
    local = records.to(device)
    everyone = torch.empty((world_size() * local.shape[0], local.shape[1]), dtype=torch.int64, device=device)
    _all_gather_flat(everyone, local)
    return everyone.reshape(world_size(), len(tensors), -1).cpu()


def _describe(record: torch.Tensor) -> str:
    ndim = int(record[1])
    dtype = _DTYPES[int(record[0])] if int(record[0]) >= 0 else "unknown dtype"
    return f"{tuple(int(d) for d in record[2 : 2 + ndim])} {dtype}"


def _check_leaves(tree: Tree, what: str) -> Tuple[List[str], List[torch.Tensor]]:
    paths, tensors = [], []
    for path, leaf in tree_leaves(tree):
        if not is_tensor(leaf):
            raise TypeError(
                f"{what}() works on tensors (or dicts/lists/tuples of tensors), but found a "
                f"{type(leaf).__name__} at {'the top level' if not path else 'batch' + path}. "
                + ("Use gather_for_metrics() to gather python objects." if what == "gather" else "")
            )
        paths.append(path)
        tensors.append(leaf)
    return paths, tensors


def gather_per_rank(tree: Tree) -> Tuple[List[str], List[List[torch.Tensor]]]:
    """For every tensor leaf, the list of every rank's tensor in rank order (0-dim tensors become 1-dim).

    Shapes may differ between ranks in the first dimension only. Returns ``(paths, per_leaf_per_rank)``.
    """
    paths, tensors = _check_leaves(tree, "gather")
    tensors = [t.unsqueeze(0) if t.dim() == 0 else t for t in tensors]
    world = world_size()
    if world == 1 or not tensors:
        return paths, [[t] for t in tensors]
    shapes = _exchange_shapes(tensors)
    gathered = []
    for index, (path, tensor) in enumerate(zip(paths, tensors)):
        records = shapes[:, index]
        same_layout = (records[:, 0] == records[0, 0]).all() and (records[:, 1] == records[0, 1]).all()
        same_trailing = (records[:, 3:] == records[0, 3:]).all()
        if not (same_layout and same_trailing):
            described = ", ".join(f"rank {r}: {_describe(rec)}" for r, rec in enumerate(records))
            raise ValueError(
                f"cannot gather {'the tensor' if not path else 'batch' + path}: ranks disagree on dtype or on "
                f"dimensions other than the first ({described}). pad_across_processes() can even them out."
            )
        sizes = [int(s) for s in records[:, 2]]
        gathered.append(_all_gather_padded(tensor, sizes))
    return paths, gathered


def _all_gather_padded(tensor: torch.Tensor, sizes: List[int]) -> List[torch.Tensor]:
    """All-gather tensors whose first dimensions are ``sizes`` (one per rank); returns them unpadded."""
    largest = max(sizes)
    # the values only, as HF's gather returns them: a collective has no gradient, and gloo writing into views of
    # the output while ``tensor`` requires grad fails ("a view was created in no_grad mode ...")
    comm = tensor.detach().to(_comm_device(tensor))
    if comm.shape[0] < largest:
        padding = comm.new_zeros((largest - comm.shape[0],) + tuple(comm.shape[1:]))
        comm = torch.cat([comm, padding])
    output = comm.new_empty((len(sizes) * largest,) + tuple(comm.shape[1:]))
    _all_gather_flat(output, comm.contiguous())
    return [chunk[:size].to(tensor.device) for chunk, size in zip(output.split(largest), sizes)]


def fill_leaves(tree: Tree, values: List[Any]) -> Tree:
    """Put ``values`` back into ``tree``'s tensor leaves, in tree_leaves order."""
    remaining = iter(values)
    return tree_map(lambda _: next(remaining), tree)


def gather(tree: Tree) -> Tree:
    """Concatenate every rank's tensors along the first dimension (rank order); same containers back.

    Example::

        accelerator.gather(torch.tensor([rank]))   # on 2 ranks -> tensor([0, 1]) on both
    """
    _, per_rank = gather_per_rank(tree)
    return fill_leaves(tree, [torch.cat(chunks) for chunks in per_rank])


def gather_object(obj: Any) -> List[Any]:
    """Every rank's (picklable) python object, in rank order."""
    world = world_size()
    if world == 1:
        return [obj]
    if _xla_collectives:
        import torch_xla.core.xla_model as xm

        return list(xm.mesh_reduce("notebook_accel.gather_object", obj, list))
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, obj)
    return everyone


_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


def reduce(tree: Tree, reduction: str = "sum") -> Tree:
    """Reduce every tensor across ranks: "sum", "mean", "max" or "min"; inputs are not modified."""
    if reduction not in _REDUCE_OPS:
        raise ValueError(f"reduction must be one of {sorted(_REDUCE_OPS)}, got {reduction!r}")
    _check_leaves(tree, "reduce")
    world = world_size()

    def reduce_one(tensor: torch.Tensor) -> torch.Tensor:
        if world == 1:
            result = tensor.clone()
        elif _xla_collectives:
            import torch_xla.core.xla_model as xm

            result = xm.all_reduce(_REDUCE_OPS[reduction].lower(), tensor.to(_comm_device(tensor), copy=True))
            result = result.to(tensor.device)
        else:
            result = tensor.to(_comm_device(tensor), copy=True)
            dist.all_reduce(result, op=getattr(dist.ReduceOp, _REDUCE_OPS[reduction]))
            result = result.to(tensor.device)
        return result / world if reduction == "mean" else result

    return tree_map(reduce_one, tree)


def pad_across_processes(tree: Tree, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Tree:
    """Pad every tensor along ``dim`` to the largest size any rank has, so they can be gathered.

    Example::

        preds = accelerator.pad_across_processes(preds, dim=1, pad_index=tokenizer.pad_token_id)
    """
    _, tensors = _check_leaves(tree, "pad_across_processes")
    if world_size() == 1 or not tensors:
        return tree
    shapes = _exchange_shapes(tensors)
    padded = []
    for index, tensor in enumerate(tensors):
        axis = dim % max(tensor.dim(), 1)
        if tensor.dim() == 0:
            padded.append(tensor)
            continue
        largest = int(shapes[:, index, 2 + axis].max())
        missing = largest - tensor.shape[axis]
        if missing == 0:
            padded.append(tensor)
            continue
        pad_shape = list(tensor.shape)
        pad_shape[axis] = missing
        filler = tensor.new_full(pad_shape, pad_index)
        padded.append(torch.cat([filler, tensor] if pad_first else [tensor, filler], dim=axis))
    return fill_leaves(tree, padded)


def broadcast(tree: Tree, src: int = 0) -> Tree:
    """Every rank gets rank ``src``'s tensors (same shapes required); returns new tensors."""
    _check_leaves(tree, "broadcast")
    if world_size() == 1:
        return tree

    def broadcast_one(tensor: torch.Tensor) -> torch.Tensor:
        comm = tensor.to(_comm_device(tensor), copy=True)
        if _xla_collectives:
            import torch_xla.core.xla_model as xm

            everyone = xm.all_gather(comm.unsqueeze(0), dim=0)
            return everyone[src].to(tensor.device)
        dist.broadcast(comm, src=src)
        return comm.to(tensor.device)

    return tree_map(broadcast_one, tree)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s (picklable) python object, on every rank."""
    if world_size() == 1:
        return obj
    if _xla_collectives:
        import torch_xla.core.xla_model as xm

        return xm.mesh_reduce("notebook_accel.broadcast_object", obj, lambda everyone: everyone[src])
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]
