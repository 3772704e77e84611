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
