"""Serializing the user's function and arguments once, in the kernel, before any process starts."""
from __future__ import annotations

import pickle
from typing import Any, Callable, Dict, Iterator, List, Tuple

import cloudpickle

from .errors import LaunchConfigError


def dumps_payload(function: Callable, args: Tuple, kwargs: Dict[str, Any]) -> bytes:
    """cloudpickle ``(function, args, kwargs)``; on failure, name the object that cannot be pickled.

    >>> data = dumps_payload(lambda x: x + 1, (1,), {})
    """
    try:
        return cloudpickle.dumps((function, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:
        culprit = find_unpicklable(function, args, kwargs)
        where = f": {culprit}" if culprit else ""
        raise LaunchConfigError(
            f"cannot send the launched function to the ranks, because something it uses cannot be "
            f"pickled{where} ({type(err).__name__}: {err}). Create such objects (open files, locks, "
            f"sockets, CUDA streams, generators) inside the function instead of capturing them."
        ) from err


def loads_payload(data: bytes) -> Tuple[Callable, Tuple, Dict[str, Any]]:
    return pickle.loads(data)


def find_unpicklable(function: Callable, args: Tuple, kwargs: Dict[str, Any]) -> str:
    """A human description of the first object that cloudpickle refuses, e.g. "captured variable 'lock'"."""
    for label, value in _candidates(function, args, kwargs):
        try:
            cloudpickle.dumps(value)
        except Exception as err:
            return f"{label} ({type(value).__name__}: {err})"
    return ""


def _candidates(function: Callable, args: Tuple, kwargs: Dict[str, Any]) -> Iterator[Tuple[str, Any]]:
    for index, value in enumerate(args):
        yield f"args[{index}]", value
    for key, value in kwargs.items():
        yield f"kwargs[{key!r}]", value
    code = getattr(function, "__code__", None)
    closure = getattr(function, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, closure):
            try:
                yield f"captured variable {name!r}", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        function_globals = getattr(function, "__globals__", {})
        for name in _global_names(code):
            if name in function_globals:
                yield f"global {name!r}", function_globals[name]
    yield "the function itself", function


def _global_names(code) -> List[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):  # nested functions / comprehensions
            names.extend(_global_names(const))
    return names
