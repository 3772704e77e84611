"""nbval runs these notebooks in real kernels. ``ray_cluster.ipynb`` starts a fake two-node Ray cluster from its
kernel; while it runs, that kernel (and so every Ray process it starts) gets what the Ray tests' clusters get
(``tests/ray_cluster.py``): Ray's files in a temp dir of its own, and ``tests/ray_fast_imports`` first on the path —
without it, every Ray process's import of ``rfc3987_syntax`` can take a loaded machine's raylet past Ray's fixed 30 s
start-up wait. Nothing changes for the other notebooks, or for a user running the notebook."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

RAY_NOTEBOOK = "ray_cluster.ipynb"
FAST_IMPORTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "ray_fast_imports")
_saved: dict = {}


def _is_ray_notebook(item) -> bool:
    return item is not None and os.path.basename(str(item.fspath)) == RAY_NOTEBOOK


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the notebook's kernel starts (at its first cell): Ray's environment for it."""
    if _is_ray_notebook(item) and not _saved:
        _saved.update({name: os.environ.get(name) for name in ("RAY_TMPDIR", "PYTHONPATH")})
        _saved["temp"] = tempfile.mkdtemp(prefix="na-nb-ray-", dir="/tmp")  # short: Ray's socket paths
        os.environ["RAY_TMPDIR"] = _saved["temp"]
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [FAST_IMPORTS, _saved["PYTHONPATH"]]))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the notebook's last cell: the environment as it was, Ray's temp dir removed."""
    if _is_ray_notebook(item) and _saved and not _is_ray_notebook(nextitem):
        temp = _saved.pop("temp")
        for name, value in _saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _saved.clear()
        shutil.rmtree(temp, ignore_errors=True)


# --------------------------------------------------------------- what the ranks print in big_models.ipynb

BIG_MODELS = "big_models.ipynb"


def _is_fsdp2_showcase(item) -> bool:
    """big_models.ipynb's FSDP2 cell: the one that builds the plugin and launches."""
    source = getattr(getattr(item, "cell", None), "source", "")
    return (os.path.basename(str(item.fspath)) == BIG_MODELS and "FullyShardedDataParallelPlugin(" in source
            and "notebook_launcher(" in source)


def fsdp2_showcase_problem(printed: str):
    """What is wrong with what the FSDP2 cell printed (None when nothing): the ranks' lines must reach the cell, and
    nothing else (no warning of torch's or ours)."""
    if "FSDP2 over 2 ranks: this rank holds" not in printed:
        return f"the ranks' 'FSDP2 over 2 ranks: this rank holds' lines are not in the cell's output:\n{printed}"
    if "Warning" in printed:
        return f"the FSDP2 cell printed a warning:\n{printed}"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """nbval's own run of big_models.ipynb is the one run of it: after its FSDP2 cell ran, what the ranks printed
    there is checked (before, tests/test_fsdp.py ran the notebook a second time, up to that cell, for this)."""
    result = yield
    if _is_fsdp2_showcase(item):
        printed = "".join(output.get("text", "") for output in item.test_outputs or [])
        problem = fsdp2_showcase_problem(printed)
        assert problem is None, problem
    return result
