"""What every rank does around the user's function, whatever started it.

A process rank (``rank/process.py``), the in-kernel rank (``backends/inline.py``) and a TPU
device thread all call ``run_rank``: install the rank's channel, make tqdm report and pdb ask whoever launched
(``rank.prompts``), run the function, open pdb on its failure when asked to (post-mortem), send the failure event
or the result (tensors moved to CPU first), and deliver the metrics ``report`` held back before the rank's end.
How the rank got its process, its output streams and its function is the backend's business.
"""
from __future__ import annotations

import bdb
import io
import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import cloudpickle

from ..wire.channel import set_rank_channel
from ..wire.events import RankFailed, RankResult
from ..wire.peer_errors import reacts_to_a_peer
from ..wire.results import ResultPickler, goes_from_device, share_pieces
# Imported here, not when first used: every process that can start a rank (the kernel, whose forks inherit
# them; the fork server, which preloads this module) pays for them once instead of in every rank.
from . import metrics  # noqa: F401  - patch_tqdm's, imported by every rank otherwise
from .device_memory import maybe_send_device_memory
from .hints import explain_pitfalls
from .progress import patch_tqdm
from .prompts import PromptInterrupted, call_user_function, post_mortem as open_post_mortem, route_prompts
from .tracebacks import format_user_traceback

# (function, args, kwargs), produced on demand: unpickled from bytes, or the kernel's own objects under fork
LoadFunction = Callable[[], Tuple[Callable, Tuple, Dict[str, Any]]]


@dataclass
class RankRun:
    """How the function ended in this rank. ``exit_code`` is what the rank's process should exit with."""

    exit_code: int
    value: Any = None                           # the return value (not pickled)
    exception: Optional[BaseException] = None   # what the function raised, when it failed
    failure: Optional[RankFailed] = None        # the event sent for it


def run_rank(load: LoadFunction, sender: Any, *, send_result: bool, thread_only: bool = False,
             passthrough: Tuple[type, ...] = (), post_mortem: bool = False) -> RankRun:
    """Run the launched function as rank ``sender.rank``; report its failure or result on ``sender``.

    ``sys.exit(0)`` (or ``sys.exit()``) in the function is a normal end with no value, ``sys.exit(n)`` a
    failure whose exit code is ``n``, as for a Python script. Exceptions of a ``passthrough`` type (the
    in-kernel rank's interrupt and timeout) propagate unreported. ``thread_only`` installs the channel for
    this thread alone (ranks that are threads of one process). ``post_mortem``: an exception the function
    raises opens pdb in the frame that raised it (asking whoever launched) before the failure is reported.

    Example::

        run = run_rank(lambda: (train, (0.1,), {}), sender, send_result=True)
        os._exit(run.exit_code)
    """
    set_rank_channel(sender, thread_only=thread_only)
    undo_patch: Callable[[], None] = lambda: None  # noqa: E731
    undo_prompts = route_prompts()
    loaded = False
    try:
        try:
            undo_patch = patch_tqdm()  # before unpickling: names cloudpickle resolves get the patched tqdm
            function, args, kwargs = load()
            loaded = True
            value = call_user_function(function, args, kwargs)
        except passthrough:
            raise
        except SystemExit as exc:
            code = exit_code_of(exc)
            if code != 0:
                return _failed(sender, exc, undo_patch, code)
            value = None
        except BaseException as exc:  # KeyboardInterrupt too: the kernel decides whether it was an interrupt
            if post_mortem and loaded and isinstance(exc, Exception) and not isinstance(exc, bdb.BdbQuit) and \
                    not reacts_to_a_peer(f"{type(exc).__name__}: {exc}"):
                # before the failure is sent: the kernel then ends the launch. Not on a failure that reacts to a
                # peer's (gloo's "Connection closed by peer" once the root cause's pdb ended): only the root cause
                # is debugged, its peers are stopped.
                _post_mortem(exc)
            return _failed(sender, exc, undo_patch, 1, loading=not loaded)
        try:
            undo_patch()  # delivers the metrics report() still held back, before the result ends the rank
            if send_result:
                send_result_event(sender, value)
        except BaseException as exc:  # e.g. a return value that cannot be pickled
            return _failed(sender, exc, lambda: None, 1)
        return RankRun(0, value=value)
    finally:
        undo_patch()
        undo_prompts()
        if thread_only:  # a process rank keeps its channel: its threads and atexit handlers may still report
            set_rank_channel(None, thread_only=True)


def _post_mortem(exc: BaseException) -> None:
    """pdb on the failure; whatever ends it (``q``, an interrupt, pdb's own error), the failure is reported next."""
    try:
        open_post_mortem(exc)
    except (Exception, PromptInterrupted, KeyboardInterrupt):
        pass


def exit_code_of(exc: SystemExit) -> int:
    """The process exit code Python gives ``sys.exit(code)``: 0 for None, the int, else 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int) and not isinstance(exc.code, bool):
        return exc.code
    return 1


def _failed(sender: Any, exc: BaseException, undo_patch: Callable[[], None], exit_code: int, *,
            loading: bool = False) -> RankRun:
    try:
        undo_patch()
    except Exception:
        pass
    maybe_send_device_memory(sender, force=True)  # the peak at the failure, for an out-of-memory message
    failure = failure_event(sender.rank, exc, loading=loading)
    sender.send(failure)
    return RankRun(exit_code, exception=exc, failure=failure)


# Classes of the notebook's ``__main__`` that this rank has as the kernel's own (inherited under fork, registered
# by name otherwise): qualified name -> the class. What the rank sends back names them instead of copying them.
_kernel_classes: Dict[str, type] = {}


def main_classes(main_namespace: Dict[str, Any]) -> Dict[str, type]:
    """The classes ``__main__`` defines, by name."""
    return {name: value for name, value in main_namespace.items()
            if isinstance(value, type) and value.__module__ == "__main__" and value.__qualname__ == name}


def remember_kernel_classes(main_namespace: Dict[str, Any], found: Optional[Dict[str, type]] = None) -> None:
    """Note the ``__main__`` classes the kernel has too (call once the rank's ``__main__`` holds them: a forked
    rank's is the notebook's own, ``process.register_in_main`` fills a fork-server or spawn rank's); ``found``:
    ``main_classes`` of it, worked out already (by the kernel, for its forked ranks)."""
    _kernel_classes.update(main_classes(main_namespace) if found is None else found)


class _KernelClasses:
    """A cloudpickle pickler, except that a class the kernel has in its ``__main__`` travels by reference.
    cloudpickle copies a ``__main__`` class by value, and a forked rank's copy comes back as a *different* class,
    so ``except MyError`` and ``isinstance(result, Result)`` in the notebook would not match. (A class the rank
    got by value from the kernel comes back as the kernel's own anyway: cloudpickle tracks those.)"""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type) and _kernel_classes.get(obj.__qualname__) is obj:
            return NotImplemented  # pickle's own way for a class: ``__main__.<name>``, found in the kernel
        return super().reducer_override(obj)  # type: ignore[misc]


class _KernelClassPickler(_KernelClasses, cloudpickle.Pickler):
    pass


class _ResultPickler(_KernelClasses, ResultPickler):
    """The kernel's classes by name, and large tensors and arrays set aside for shared memory."""


def dumps_for_kernel(value: Any) -> bytes:
    """Pickle ``value`` for the kernel: by value where needed (cloudpickle), the kernel's classes by name."""
    buffer = io.BytesIO()
    _KernelClassPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def send_result_event(sender: Any, value: Any) -> None:
    """Send the return value to the kernel as a ``RankResult``; the kernel never touches a device. Where the channel
    carries files, its large tensors and arrays travel through shared memory, copied once (``wire.results``) — a
    large CUDA tensor straight from the GPU into it; otherwise everything is in the pickle, tensors moved to CPU."""
    try:
        passes_files = getattr(sender, "passes_files", False)
        value = to_cpu(value, keep=goes_from_device if passes_files else None)
        if not passes_files:
            sender.send(RankResult(rank=sender.rank, payload=dumps_for_kernel(value)))
            return
        buffer, storages, buffers = io.BytesIO(), [], []
        pickler = _ResultPickler(buffer, storages, buffers)
        pickler.dump(value)
        pickler.clear_memo()  # it is in a cycle (its buffer callback): the memo must not keep the value alive
        shared, fds = share_pieces(storages, buffers, getattr(sender, "result_pool", None))
    except Exception as err:
        raise TypeError(
            f"the function's return value ({type(value).__name__}) cannot be sent back to the kernel: "
            f"{type(err).__name__}: {err}. Return plain data, tensors or a state_dict instead."
        ) from err
    try:
        sender.send(RankResult(rank=sender.rank, payload=buffer.getvalue(), shared=shared), fds)
    finally:
        for fd in fds:
            os.close(fd)


def to_cpu(value: Any, keep: Optional[Callable[[Any], bool]] = None) -> Any:
    """``value`` with every tensor (in dicts, lists, tuples, namedtuples) detached and moved to CPU; those for
    which ``keep`` says so are only detached (a large CUDA tensor, copied from its GPU into shared memory)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    if isinstance(value, torch.Tensor):
        detached = value.detach()
        return detached if keep is not None and keep(detached) else detached.cpu()
    if isinstance(value, dict):
        moved = {key: to_cpu(item, keep) for key, item in value.items()}
        try:
            return type(value)(moved)  # OrderedDict, state_dict's own class
        except TypeError:  # e.g. defaultdict, whose first argument is a factory
            return moved
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_cpu(item, keep) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(item, keep) for item in value)
    return value


def failure_event(rank: int, exc: BaseException, *, loading: bool = False) -> RankFailed:
    """A ``RankFailed`` for ``exc``, pickling the exception itself when possible. ``loading``: the function and
    its arguments could not even be loaded in the rank (unpickling failed), so running it again cannot help."""
    explain_pitfalls(exc)  # a note where Python's message does not say why (a notebook name made local)
    text, full_text = format_user_traceback(exc)  # starts at the user's code; the full one for bug reports
    try:
        # Without its traceback (frames do not pickle) and cause chain (may hold unpicklable objects).
        # with_traceback(None) changes exc in place: put everything back (the in-kernel rank raises exc).
        saved_cause, saved_context, saved_tb = exc.__cause__, exc.__context__, exc.__traceback__
        exc.__cause__ = exc.__context__ = None
        try:
            pickled: Optional[bytes] = dumps_for_kernel(exc.with_traceback(None))
        finally:
            exc.__cause__, exc.__context__ = saved_cause, saved_context
            exc.__traceback__ = saved_tb
    except Exception:
        pickled = None
    return RankFailed(rank=rank, exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                      message=str(exc), traceback=text, exception=pickled, full_traceback=full_text,
                      loading=loading)
