"""Start a rank's process (or the XLA host) so that it runs the kernel's code, whatever the start method.

Left to itself, multiprocessing gets two things wrong for a notebook:

- a fork-server or spawn child imports the launching script's ``__main__`` again (``__mp_main__``), so a script
  that calls ``notebook_launcher`` without an ``if __name__ == "__main__":`` guard would launch again in every
  rank. Our ranks never need it: the function travels by value (cloudpickle).
- the fork server is a fresh ``python -c`` whose path starts with the current directory (and, before CPython
  3.12.8 / 3.13.1, ignores the kernel's ``sys.path``): from a checkout, or any folder holding another
  ``notebook_accel/``, it would preload *that* copy and hand it to every rank while the kernel runs its own.
  A spawn child likewise imports our package from the kernel's path, where the current directory may come
  first. Both must import the copy the kernel imported; the rank then restores the kernel's own ``sys.path``
  (``rank.process.as_launched``), so the user's modules resolve as in the kernel.
"""
from __future__ import annotations

import importlib.machinery
import multiprocessing.forkserver
import multiprocessing.util
import os
import sys
import threading
from contextlib import contextmanager
from multiprocessing import spawn
from typing import Dict, Iterator

from ...rank.fork_server_owner import KERNEL_TEMPDIR_VARIABLE
from ..environ import temporary_environ

PACKAGE = __name__.split(".")[0]
# The folder the kernel imported the package from (site-packages, or a checkout on its path).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_ROOT = os.path.dirname(PACKAGE_DIR)
# What a fork-server rank imports: the server imports it once, every rank is a fork of a warm interpreter.
SERVER_PRELOAD = ["torch"]
RANK_SIDE_PRELOAD = [f"{PACKAGE}.rank.process", f"{PACKAGE}.wire.payload", f"{PACKAGE}.rank.forkserver_preload"]

_starting = threading.local()


def configure_fork_server(context: multiprocessing.context.BaseContext) -> None:
    """What the fork server preloads when it starts, and how it cleans up after a killed kernel."""
    preload = SERVER_PRELOAD + ([] if _cwd_shadows_package() else RANK_SIDE_PRELOAD)
    context.set_forkserver_preload(preload)
    # Read by the server (it inherits the environment when it starts) to clean up after a killed kernel.
    os.environ[KERNEL_TEMPDIR_VARIABLE] = f"{os.getpid()}:{multiprocessing.util.get_temp_dir()}"


_server_lock = threading.Lock()


def ensure_fork_server() -> None:
    """Start the fork server, if it is not running, so that it preloads the kernel's copy of the package (it
    keeps those modules for its life: every later fork-server rank is a fork of it). One start at a time: the
    background warm start (``warm_start``) and a launch may both ask, and their environment changes must not
    interleave."""
    with _server_lock, starting_rank_process(), temporary_environ(_server_environment()):
        multiprocessing.forkserver.ensure_running()


@contextmanager
def starting_rank_process() -> Iterator[None]:
    """Around ``process.start()`` of a rank (or the XLA host): the child neither re-runs ``__main__`` nor
    imports our package from anywhere but the kernel's copy. Only this thread's starts are affected."""
    _install_preparation_filter()
    _starting.active = True
    try:
        yield
    finally:
        _starting.active = False


def _install_preparation_filter() -> None:
    """Wrap ``spawn.get_preparation_data`` (what a fork-server or spawn child, and the fork server itself on
    a fixed CPython, set up before unpickling anything): while one of our starts is on, no ``__main__`` to
    re-run, and the kernel's copy of the package first on the path."""
    if getattr(spawn.get_preparation_data, "_notebook_accel", False):
        return
    original = spawn.get_preparation_data

    def get_preparation_data(name):
        data = original(name)
        if getattr(_starting, "active", False):
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            if "sys_path" in data:
                data["sys_path"] = [PACKAGE_ROOT] + [entry for entry in data["sys_path"] if entry != PACKAGE_ROOT]
        return data

    get_preparation_data._notebook_accel = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def _server_environment() -> Dict[str, str]:
    """The fork server's ``python -c`` puts the current directory first on its path: on Python >= 3.11
    ``PYTHONSAFEPATH`` leaves it out; then the kernel's package root comes first (``PYTHONPATH``). Set only
    while the server starts (ranks get the launch's own environment, ``as_launched``)."""
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    changes = {"PYTHONPATH": os.pathsep.join([PACKAGE_ROOT] + entries)}
    if sys.version_info >= (3, 11):
        changes["PYTHONSAFEPATH"] = "1"
    return changes


def _cwd_shadows_package() -> bool:
    """The current directory holds another ``notebook_accel`` and nothing keeps the fork server from importing
    it first (Python < 3.11 has no ``PYTHONSAFEPATH``): then the server preloads torch only, and each rank
    imports the rank side itself, from the kernel's copy."""
    if sys.version_info >= (3, 11):
        return False
    spec = importlib.machinery.PathFinder.find_spec(PACKAGE, [os.getcwd()])
    return spec is not None and (spec.origin is None or os.path.dirname(os.path.abspath(spec.origin)) != PACKAGE_DIR)

