"""Build a model for FSDP2 without any rank holding it whole: what ``Accelerator.init_module()`` does under FSDP2.

Every rank runs the model's constructor as usual, with two changes while it runs:

- each parameter, as it is registered on its module, continues as a parameter on the meta device (a shape and a
  dtype, no memory); the rank keeps only *its rows* of the value: the dim-0 chunk FSDP2 will give it
  (``torch.chunk(value, world)[rank]``, as ``fully_shard`` cuts it);
- whatever then writes the parameter — a ``torch.nn.init`` function, a random fill (``.data.normal_()``),
  ``fill_`` / ``zero_`` / ``copy_``, an assignment to a slice, an elementwise update (``mul_(0.5)``) — runs on a
  scratch tensor with the shape and strides of the parameter (or of the slice) on the CPU, so the random generator
  fills it in the same order and advances exactly as it would for the real parameter; the rank copies out its rows.
  ``copy.deepcopy`` of a module (``nn.TransformerEncoder`` clones its layer so) copies the rows; ``.to(device)``
  keeps them; other operations on a parameter (shapes, a trial forward) run on the meta device.

``prepare`` then shards the meta model with ``fully_shard`` and makes each parameter's rows its local shard: the
weights are exactly those the same construction without ``init_module`` gives from the same random state, while a
rank holds its rows and, for a moment, the one parameter being initialised. Buffers stay real (FSDP2 keeps buffers
whole on every rank anyway).

What cannot be replayed on rows — another in-place operation on a parameter, a parameter with no value (made on
the meta device by hand, or computed from another parameter) — is recorded, and ``prepare`` refuses the model
naming the parameter and the operation. With ``empty=True`` (``init_module(empty_init=True)``) no value is computed
or kept: the shards are allocated uninitialised, for weights loaded right after ``prepare``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from .memory import release_freed_memory

__all__ = ["ShardedInit", "SkippedInit", "rows_of", "init_functions"]

# writes that replace the values (the new ones do not depend on the old)
_RANDOM_FILLS = {"normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_",
                 "random_"}  # fmt: skip
_OVERWRITES = _RANDOM_FILLS | {"fill_", "zero_", "copy_"}
# elementwise updates of the current values (by scalars, or tensors that broadcast to the written tensor)
_UPDATES = {"mul_", "div_", "add_", "sub_", "clamp_", "clamp_min_", "clamp_max_", "neg_", "abs_", "pow_", "sqrt_",
            "erfinv_", "exp_", "log_", "tanh_", "sigmoid_", "sign_", "reciprocal_", "floor_", "ceil_", "round_",
            "fmod_", "remainder_"}  # fmt: skip
_OPERATORS = {"__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_", "__itruediv__": "div_"}
_HARMLESS = {"requires_grad_", "retain_grad", "share_memory_"}  # in place, but no value changes
_MOVES = {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "clone", "contiguous"}
_NEW = {"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided"}
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like"}
_LARGE = 1 << 20  # bytes: a scratch tensor this big is given back to the system once its rows are copied out


def init_functions() -> Dict[str, Callable[..., Any]]:
    """torch.nn.init's initialisers by name (``kaiming_uniform_``, ``trunc_normal_``...)."""
    return {name: function for name, function in vars(torch.nn.init).items()
            if name.endswith("_") and not name.startswith("_") and callable(function)}  # fmt: skip


def rows_of(shape: torch.Size, world: int, rank: int) -> Tuple[int, int]:
    """The rows ``[start, stop)`` of dim 0 that FSDP2 gives ``rank`` of a parameter of ``shape`` (``torch.chunk``:
    chunks of ceil(rows / world), so the last ranks may get fewer rows, or none).

    >>> rows_of(torch.Size([5, 2]), world=2, rank=1)
    (3, 5)
    """
    size = shape[0] if len(shape) else 1
    per_rank = -(-size // world)
    start = min(rank * per_rank, size)
    return start, min(start + per_rank, size)


def _key(tensor: torch.Tensor) -> int:
    """Aliases of a tensor (``.data``, ``detach()``, a Parameter made from it, views) share its storage."""
    return tensor.untyped_storage()._cdata


def _is_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


def _to_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) and not value.is_meta else value


def _flat_positions(view: torch.Tensor, base_offset: int) -> torch.Tensor:
    """Where each element of ``view`` sits in its contiguous base, flattened (in ``view``'s shape)."""
    positions = torch.tensor(view.storage_offset() - base_offset, dtype=torch.long)
    for size, stride in zip(view.shape, view.stride()):
        positions = positions.unsqueeze(-1) + torch.arange(size, dtype=torch.long) * stride
    return positions


@dataclasses.dataclass
class _Record:
    """One parameter built under init_module: this rank's rows of its value."""

    # an alias of its own (not the parameter object) of a meta tensor with this storage: it keeps the storage,
    # the key, alive, and lets _forget_unreachable see when nothing else holds it
    meta: torch.Tensor
    start: int
    stop: int
    rows: Optional[torch.Tensor]  # contiguous, on the CPU; None: unknown (or not computed, under empty_init)
    problem: Optional[str] = None

    def is_whole(self, view: torch.Tensor) -> bool:
        return (view.shape == self.meta.shape and view.storage_offset() == self.meta.storage_offset()
                and view.is_contiguous())  # fmt: skip

    def _mine(self, view: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Which elements of ``view`` (of this parameter) are this rank's: a mask in ``view``'s shape, and their
        positions in ``rows`` flattened."""
        row_numel = self.meta[0].numel() if self.meta.dim() else 1
        low, high = self.start * row_numel, self.stop * row_numel
        positions = _flat_positions(view, self.meta.storage_offset())
        mask = (positions >= low) & (positions < high)
        return mask, positions[mask] - low

    def overwrite(self, view: torch.Tensor, values: torch.Tensor) -> None:
        """``view`` (the whole parameter or a view of it) now holds ``values`` (a tensor of ``view``'s shape)."""
        if self.is_whole(view):
            mine = values.narrow(0, self.start, self.stop - self.start) if values.dim() else values
            if self.rows is not None and self.rows.shape == mine.shape and self.rows.dtype == mine.dtype:
                self.rows.copy_(mine)  # in place: a new block for every write would fragment the heap, and grow it
            else:
                self.rows = mine.contiguous().clone()
            self.problem = None  # known again, whatever happened before
        elif self.rows is not None:  # a part of an unknown value stays unknown
            mask, where = self._mine(view)
            self.rows.view(-1)[where] = values[mask].to(self.rows.dtype)

    def update(self, view: torch.Tensor, operation: Callable[..., Any], others: List[Any], kwargs: Dict[str, Any]) -> None:
        """``operation(view, *others, **kwargs)``, an elementwise in-place update, on this rank's elements."""
        if self.rows is None:
            return
        if self.is_whole(view):
            if self.rows.dim():
                others = [other.expand(view.shape).narrow(0, self.start, self.stop - self.start)
                          if isinstance(other, torch.Tensor) and other.dim() else other for other in others]  # fmt: skip
            operation(self.rows, *others, **kwargs)
            return
        mask, where = self._mine(view)
        values = self.rows.view(-1)[where]
        others = [other.expand(view.shape)[mask] if isinstance(other, torch.Tensor) and other.dim() else other
                  for other in others]  # fmt: skip
        operation(values, *others, **kwargs)
        self.rows.view(-1)[where] = values


class _Recording(TorchFunctionMode):
    """Sees every torch call while the model is built. A recorded parameter passes for the real CPU tensor it
    stands for (``is_meta`` is False, ``device`` is the CPU: torch.nn.init's ``trunc_normal_`` or ``orthogonal_``
    skip meta tensors), writes to it go to its rows, and tensors made from it (``new_empty``, ``zeros_like``) are
    real, as they would be."""

    def __init__(self, owner: "ShardedInit") -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        owner = self.owner
        name = getattr(func, "__name__", "")
        out = owner.record_of(kwargs.get("out"))
        if out is not None:  # torch.eye(n, m, out=param), ...
            owner.overwrite(out, kwargs["out"], lambda scratch: func(*args, **{**kwargs, "out": scratch}))
            return kwargs["out"]
        is_init = getattr(func, "__module__", None) == "torch.nn.init" and name.endswith("_")
        target = kwargs["tensor"] if is_init and "tensor" in kwargs else (args[0] if args else None)
        record = owner.record_of(target)
        if record is None:
            return self._anything_else(func, args, kwargs)
        if name == "__get__":
            attribute = getattr(getattr(func, "__self__", None), "__name__", "")
            if attribute == "is_meta":
                return False
            if attribute == "device":
                return torch.device("cpu")
            return func(*args, **kwargs)
        name = _OPERATORS.get(name, name)
        if is_init:  # torch.nn.init.kaiming_uniform_(param), ...: the same call, on the scratch tensor
            def fill(scratch: torch.Tensor) -> None:
                func(*[scratch if value is target else value for value in args],
                     **{key: scratch if value is target else value for key, value in kwargs.items()})

            owner.overwrite(record, target, fill)
            return target
        if name in _OVERWRITES or name in _UPDATES:
            if any(_is_meta(value) for value in tree_flatten((args[1:], kwargs))[0]):
                record.problem = record.problem or f"Tensor.{name} from another tensor on the meta device"
            elif name in _OVERWRITES:
                owner.overwrite(record, target, lambda scratch: getattr(scratch, name)(*args[1:], **kwargs))
            elif not owner.empty:
                record.update(target, getattr(torch.Tensor, name), list(args[1:]), kwargs)
            return target
        if name == "__setitem__":
            owner.assign(record, target, args[1], args[2])
            return None
        if name in _MOVES:
            return owner.moved(record, target, name, args, kwargs)
        if name in _NEW or name in _LIKE:  # a new tensor that takes only the parameter's dtype (and shape)
            stand_in = (torch.empty_strided(target.shape, target.stride(), dtype=target.dtype) if name in _LIKE
                        else torch.empty(0, dtype=target.dtype))  # never touched: no memory is really used
            return func(stand_in, *args[1:], **kwargs)
        if (name.endswith("_") and not name.startswith("__") and name not in _HARMLESS) or name in ("set_", "resize_"):
            record.problem = record.problem or f"changed in place by Tensor.{name}, which cannot be replayed on shards"
        return self._anything_else(func, args, kwargs)

    @staticmethod
    def _anything_else(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """A view, a shape, an out-of-place op (a trial forward in a constructor): where a meta tensor takes part,
        it all runs on the meta device."""
        if any(_is_meta(value) for value in tree_flatten((args, kwargs))[0]):
            return func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
        return func(*args, **kwargs)


class ShardedInit:
    """The context ``Accelerator.init_module()`` enters under FSDP2 (see the module docstring).

    Example (what the Accelerator does)::

        recording = ShardedInit(world=2, rank=accelerator.process_index)
        with recording:
            model = MyModel()                   # parameters on the meta device; this rank's rows recorded
        rows = recording.take(model)            # {parameter name: rows}, or a ValueError naming what is missing
    """

    def __init__(self, world: int, rank: int, empty: bool = False) -> None:
        self.world, self.rank, self.empty = world, rank, empty
        self._records: Dict[int, _Record] = {}
        self._mode = _Recording(self)
        self._hook: Any = None
        # how many holders a storage has when only our record's tensor holds it (see _forget_unreachable)
        probe = torch.empty(1, device="meta")
        probe.untyped_storage()
        self._alone = torch._C._storage_Use_Count(_key(probe))

    def __enter__(self) -> "ShardedInit":
        self._hook = torch.nn.modules.module.register_module_parameter_registration_hook(self._on_registered)
        # torch.nn.init's functions run whole on a scratch tensor: most of them never reach the mode (no torch
        # function dispatch), and some read the values they draw (trunc_normal_ resamples what falls outside)
        self._originals = init_functions()
        for name, function in self._originals.items():
            setattr(torch.nn.init, name, self._redirected(function))
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for name, function in self._originals.items():
            setattr(torch.nn.init, name, function)
        self._hook.remove()
        self._forget_unreachable()

    def _redirected(self, initialise: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(initialise)
        def redirected(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            record = self.record_of(tensor)
            if record is None:
                return initialise(tensor, *args, **kwargs)
            self.overwrite(record, tensor, lambda scratch: initialise(scratch, *args, **kwargs))
            return tensor

        return redirected

    def _on_registered(self, module: torch.nn.Module, name: str, param: Optional[torch.nn.Parameter]) -> Any:
        """A parameter joins a module: it continues on the meta device, this rank keeping its rows."""
        if param is None or isinstance(param, torch.nn.parameter.UninitializedParameter):
            return None  # a lazy module's parameter has no shape yet (fully_shard refuses it too)
        with torch._C.DisableTorchFunction():  # our own look at it: its true device
            if self.record_of(param) is not None:
                return None  # registered again (tied weights), or a parameter made from a recorded tensor
            start, stop = rows_of(param.shape, self.world, self.rank)
            if param.is_meta:  # made on the meta device by hand: there is no value to shard
                self._records[_key(param)] = _Record(param.detach(), start, stop, None, "it was made on the meta "
                                                     "device (no value); make it on the CPU inside init_module")
                return None
            value = param.detach()
            rows = None if self.empty else (value.narrow(0, start, stop - start) if value.dim() else value).to(
                "cpu", copy=True).contiguous()
            meta = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                                      requires_grad=param.requires_grad)  # fmt: skip
            meta.__dict__.update(param.__dict__)  # marks libraries set on it (transformers' _is_hf_initialized)
            self._records[_key(meta)] = _Record(meta.detach(), start, stop, rows)
        return meta

    # ------------------------------------------------------------------------------- writes to a parameter
    def record_of(self, tensor: Any) -> Optional[_Record]:
        if not self._records or not isinstance(tensor, torch.Tensor):
            return None
        with torch._C.DisableTorchFunction():  # the tensor's true device (the mode says "cpu" for ours)
            return self._records.get(_key(tensor)) if tensor.is_meta else None

    def overwrite(self, record: _Record, view: torch.Tensor, fill: Callable[[torch.Tensor], Any]) -> None:
        if self.empty:
            return  # empty_init: no value is computed, the random state does not move
        scratch = torch.empty_strided(view.shape, view.stride(), dtype=view.dtype)  # the real tensor's layout:
        fill(scratch)  # a random fill visits the elements in the same order as it would on the parameter
        record.overwrite(view, scratch)
        if scratch.nbytes >= _LARGE:
            del scratch
            release_freed_memory()

    def assign(self, record: _Record, target: torch.Tensor, index: Any, value: Any) -> None:
        """``target[index] = value``."""
        view = target[index]
        if _is_meta(value) or _key(view) != _key(target):
            record.problem = record.problem or "assigned through an index tensor, or from a tensor on the meta device"
            return
        self.overwrite(record, view, lambda scratch: scratch.copy_(torch.as_tensor(value, dtype=scratch.dtype)))

    def moved(self, record: _Record, source: torch.Tensor, name: str, args: Tuple[Any, ...], kwargs: Any) -> Any:
        """``.to(device)`` / ``.cuda()`` keep a meta parameter as it is (``prepare`` places the shards); a copy
        (``clone``, ``copy.deepcopy``) or a dtype conversion is a new tensor with the same rows."""
        if name == "to":
            dtype = torch._C._nn._parse_to(*args[1:], **kwargs)[1]
            result = source if dtype is None or dtype == source.dtype else source.to(dtype)
        elif name in ("cuda", "cpu"):
            result = source
        else:
            result = getattr(source, name)(*args[1:], **{k: v for k, v in kwargs.items() if k != "device"})
        if not isinstance(result, torch.Tensor) or not result.is_meta or _key(result) == _key(source):
            return result
        whole = record.is_whole(source)
        rows = record.rows.to(result.dtype, copy=True) if whole and record.rows is not None else None
        problem = record.problem if whole else "a copy of part of another parameter"
        self._records[_key(result)] = _Record(result.detach(), record.start, record.stop, rows, problem)
        return result

    # -------------------------------------------------------------------------------------------- results
    def owns(self, model: torch.nn.Module) -> bool:
        """True when ``model`` has a parameter built under this context."""
        return any(self.record_of(param) is not None for param in model.parameters())

    def take(self, model: torch.nn.Module) -> Dict[str, Optional[torch.Tensor]]:
        """This rank's rows of each of ``model``'s parameters, by name (None under empty_init), forgotten here;
        a ``ValueError`` naming every parameter whose rows are not known."""
        taken: Dict[str, Optional[torch.Tensor]] = {}
        problems: List[str] = []
        for name, param in model.named_parameters():
            record = self.record_of(param)
            if record is None:
                problems.append(f"{name} was not built inside init_module (it is on {param.device})")
            elif not record.is_whole(param):
                problems.append(f"{name} is a view of another parameter")
            elif record.problem is not None and not self.empty:
                problems.append(f"{name}: {record.problem}")
            else:
                taken[name] = record.rows
        meta_buffers = [name for name, buffer in model.named_buffers() if buffer.is_meta]
        problems += [f"buffer {name} has no value (computed from a parameter on the meta device?)"
                     for name in meta_buffers]  # fmt: skip
        if problems:
            more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
            raise ValueError(
                "init_module cannot build this rank's shards: " + "; ".join(problems[:4]) + more + ". Initialise "
                "parameters inside the init_module block with torch.nn.init, a random or constant fill, copy_ or "
                "an elementwise update (mul_, add_...), or build this model without init_module"
            )
        for param in model.parameters():
            self._records.pop(_key(param), None)
        self._forget_unreachable()
        return taken

    def _forget_unreachable(self) -> None:
        """Drop the rows of tensors nothing holds any more but us (a layer that nn.TransformerEncoder deep-copied,
        then dropped; a clone made along the way)."""
        for key in [key for key, record in self._records.items()
                    if torch._C._storage_Use_Count(_key(record.meta)) <= self._alone]:  # fmt: skip
            del self._records[key]


class SkippedInit:
    """``init_module(empty_init=True)`` without FSDP2: torch.nn.init's functions do nothing inside the block, so
    parameters keep whatever memory they were allocated with (as Lightning's ``init_module(empty_init=True)``): a
    model built fast, for weights loaded right after."""

    def __enter__(self) -> "SkippedInit":
        self._originals = init_functions()
        for name in self._originals:
            setattr(torch.nn.init, name, _returns_its_tensor)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, function in self._originals.items():
            setattr(torch.nn.init, name, function)


def _returns_its_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor
