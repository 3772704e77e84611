"""Shared fixtures: every test must leave no process and no temp file behind."""
from __future__ import annotations

import multiprocessing.process
import multiprocessing.util
import os
import shutil
import sys
import tempfile
import time

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Our own temp dir for the whole session, inherited by every rank and script the tests start, so the
# leftover check below sees only what this suite made (not other programs sharing /tmp).
SESSION_TMP = tempfile.mkdtemp(prefix="notebook_accel-tests-")
os.environ["TMPDIR"] = tempfile.tempdir = SESSION_TMP


# Removed at exit after multiprocessing removed its own temp dir inside it (priority -100 runs first).
multiprocessing.util.Finalize(None, shutil.rmtree, args=(SESSION_TMP,), kwargs={"ignore_errors": True},
                              exitpriority=-101)


def is_kept_helper(process: psutil.Process) -> bool:
    """multiprocessing's fork server and resource tracker stay up on purpose (warm second launch);
    they belong to this process and exit with it. So do a fake Ray cluster's process trees until its test module
    ends (``ray_cluster.KEPT_TREES``; looked up, not imported: ``conftest`` may name notebooks/' conftest there)."""
    kept = getattr(sys.modules.get("ray_cluster"), "KEPT_TREES", ())
    try:
        command = " ".join(process.cmdline())
        if kept and any(ancestor.pid in kept for ancestor in [process] + process.parents()):
            return True
    except psutil.Error:
        return True
    return "multiprocessing.forkserver" in command or "multiprocessing.resource_tracker" in command


def leftover_children(timeout: float = 5.0):
    """Children of this process still alive after ``timeout`` (zombies and kept helpers excluded)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE and not is_kept_helper(child):
                    alive.append(child)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def temp_entries():
    kept = multiprocessing.process.current_process()._config.get("tempdir")  # the fork server's socket dir
    return {name for name in os.listdir(tempfile.gettempdir())
            if os.path.join(tempfile.gettempdir(), name) != kept}


@pytest.fixture(autouse=True)
def no_leftovers():
    """Fail a test that leaves a child process or a new temp file/dir behind."""
    before = temp_entries()
    yield
    alive = leftover_children()
    for child in alive:
        child.kill()
    assert not alive, f"processes left running: {[(c.pid, c.cmdline()) for c in alive]}"
    # pytest's own tmp_path root, and torch's inductor cache (torch 2.13 creates it on the first
    # optimizer.step(), in any process) are not ours.
    new = {name for name in temp_entries() - before if not name.startswith(("pytest-of-", "torchinductor_"))}
    assert not new, f"temp entries left behind: {sorted(new)}"
