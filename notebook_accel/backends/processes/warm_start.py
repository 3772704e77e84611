"""A warm fork server where CUDA is live: started in the background when ``notebook_accel`` is imported.

Once CUDA is initialised in the kernel (Colab after any cell touched the GPU), ranks cannot be forked from it and
come from the fork server, whose first start imports torch (and anything else it preloads): seconds, paid by the
first launch or Session. Where the kernel has CUDA live, or is about to (torch imported and NVML counts a GPU), the
package starts the server at import, in a daemon thread, so that it is warm by the time the first cell launches.

What it must not do:

- slow ``import notebook_accel`` anywhere: the package's check at import reads only the environment, ``sys.modules``
  (a CUDA build of torch) and whether a CUDA driver library is mapped; everything else (this module, NVML, the
  backend) is imported in the thread;
- start twice: the server is multiprocessing's one per kernel, and ``starting.ensure_fork_server`` (called by a
  launch too) is serialised, so a launch at once waits for the start under way and reuses it;
- outlive the kernel: the server ends when the kernel does (multiprocessing's lifeline pipe), and the thread is a
  daemon;
- run anywhere but a kernel: not in a rank (``RANK`` / ``LOCAL_RANK`` set, a multiprocessing child), nor in the
  fork server itself, which imports the package when it preloads the rank side.

``NOTEBOOK_ACCEL_WARM_START=0`` turns it off. What the start spent reaches the dashboard's header
(``describe``, in the launch's ``LaunchStarted``).

Example::

    import torch; torch.ones(1, device="cuda")      # an earlier cell: CUDA is live
    import notebook_accel                            # the fork server starts now, in the background
    notebook_launcher(train, num_processes=2, device="cpu")   # ranks come from the warm server
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from ...process_role import is_kernel_process, warm_start_switched_off

IMPORT_THREAD = "notebook_accel-warm-start"   # the thread the package's import starts (notebook_accel/__init__.py)


@dataclass
class WarmStart:
    """One background start of the fork server: when it began, when the server could fork (its preload done)."""

    began: float = field(default_factory=time.monotonic)
    ready: Optional[float] = None        # monotonic time a probe process forked from the warm server
    error: Optional[str] = None
    skipped: Optional[str] = None        # why nothing was started (CUDA not live after all)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def seconds_to_ready(self) -> Optional[float]:
        return None if self.ready is None else self.ready - self.began


_warm: Optional[WarmStart] = None
_lock = threading.Lock()


def in_a_kernel_process() -> bool:
    """Not switched off, and a process that may start ranks (``process_role``)."""
    return not warm_start_switched_off() and is_kernel_process()


def maybe_start(in_this_thread: bool = False) -> Optional[WarmStart]:
    """Start the fork server in the background if this kernel may need it (see the module's docstring); the start
    under way or done, if one began. ``in_this_thread``: the caller is a background thread already (the
    package's import starts one, so that not even this module is imported in the kernel's own thread)."""
    global _warm
    with _lock:
        if _warm is not None or not in_a_kernel_process():
            return _warm
        if "torch" not in sys.modules and not _cuda_driver_mapped():
            return None
        _warm = warm = WarmStart()
    if in_this_thread:
        _start(warm)
    else:
        threading.Thread(target=_start, args=(warm,), name="notebook_accel-warm-start", daemon=True).start()
    return warm


def _cuda_driver_mapped() -> bool:
    try:
        with open("/proc/self/maps") as maps:
            return any("/libcuda.so" in line for line in maps)
    except OSError:
        return False


def cuda_live_or_about_to_be() -> bool:
    """CUDA is initialised here (by torch or any driver user), or torch is imported and NVML counts a GPU. Never
    initialises CUDA: NVML is asked directly, without the ``cudaGetDeviceCount`` fallback of ``device_count``."""
    from ...plan.devices import cuda_driver_initialized, cuda_initialized

    if cuda_initialized() or cuda_driver_initialized():
        return True
    torch = sys.modules.get("torch")
    if torch is None or not torch.backends.cuda.is_built():
        return False
    count_nvml = getattr(torch.cuda, "_device_count_nvml", None)
    try:
        return count_nvml is not None and count_nvml() > 0
    except Exception:
        return False


def _start(warm: WarmStart) -> None:
    try:
        if not cuda_live_or_about_to_be():
            warm.skipped = "CUDA is not live here: ranks are forked from the kernel"
            return
        import multiprocessing

        from .starting import configure_fork_server, ensure_fork_server, starting_rank_process

        context = multiprocessing.get_context("forkserver")
        configure_fork_server(context)
        ensure_fork_server()
        # The server answers a fork request only once its preload (torch, the rank side) is imported: a probe
        # process, forked and gone at once, says when that was.
        from ...rank.fork_server_owner import probe

        process = context.Process(target=probe, name="notebook_accel-warm-start-probe", daemon=True)
        with starting_rank_process():
            process.start()
        warm.ready = time.monotonic()
        process.join(30)
    except Exception as error:  # a failed warm start leaves the first launch to start the server, as before
        warm.error = f"{type(error).__name__}: {error}"
    finally:
        warm.done.set()


def wait(timeout: Optional[float] = None) -> Optional[WarmStart]:
    """The background start of this kernel (None if none began), once it ended or ``timeout`` passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    # The package's import starts a thread that imports this module before it begins the start: until it has,
    # ``_warm`` is still None (a loaded machine can take over a second there), so wait for that thread first.
    for thread in threading.enumerate():
        if thread.name == IMPORT_THREAD and thread is not threading.current_thread():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if _warm is not None:
        _warm.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return _warm


def describe() -> str:
    """For the dashboard's header of a fork-server launch: what the start spent, e.g. ``fork server warm (started
    at import, ready in 3.9 s)``; "" where no background start began."""
    warm = _warm
    if warm is None or warm.skipped:
        return ""
    if warm.error:
        return f"fork server: the warm start at import failed ({warm.error})"
    if warm.ready is None:
        return f"fork server warming up (started at import {time.monotonic() - warm.began:.1f} s ago)"
    return f"fork server warm (started at import, ready in {warm.seconds_to_ready:.1f} s)"
