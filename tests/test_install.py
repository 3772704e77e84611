"""Installed as users install it: a wheel, with the checkout nowhere on the path.

An editable install once hid a sub-package that the wheel left out (no ``__init__.py``, so
``packages = find:`` skipped it) and ``from notebook_accel import notebook_launcher`` failed for every user.
These tests build the real wheel and run a 2-rank launch and a notebook from it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile

import nbformat
import pytest
from nbclient import NotebookClient

import notebook_accel
from scripts import REPO, run_script, script_env

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), REPO], capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheels = [name for name in os.listdir(out) if name.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return str(out / wheels[0])


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> str:
    """The wheel installed into a folder of its own (its dependencies are this Python's)."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                           "--target", str(site), wheel], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return str(site)


def installed_env(site: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = site
    return env


def test_the_wheel_ships_every_module_of_the_source_tree(wheel):
    package = os.path.join(REPO, "notebook_accel")
    source = {os.path.relpath(os.path.join(folder, name), REPO).replace(os.sep, "/")
              for folder, _, names in os.walk(package) if "__pycache__" not in folder
              for name in names if name.endswith(".py")}
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.endswith(".py")}
    assert source - shipped == set(), "modules the wheel leaves out (a folder without __init__.py?)"


LAUNCH = """
import os, sys
import notebook_accel
from notebook_accel import notebook_launcher
assert notebook_accel.__file__.startswith({site!r}), notebook_accel.__file__

def train(scale):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)]) * scale
    dist.all_reduce(total)
    return total.item()

print("FORK", notebook_launcher(train, args=(2.0,), num_processes=2, display="none"))
print("FORKSERVER", notebook_launcher(train, args=(1.0,), num_processes=2, display="none",
                                      start_method="forkserver"))
"""


def test_a_two_rank_launch_runs_from_the_installed_wheel(installed, tmp_path):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(LAUNCH.format(site=installed))],
                          cwd=tmp_path, env=installed_env(installed), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FORK 6.0" in done.stdout and "FORKSERVER 3.0" in done.stdout


def test_the_quickstart_notebook_runs_from_the_installed_wheel(installed, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", installed)
    notebook = nbformat.read(os.path.join(REPO, "notebooks", "quickstart.ipynb"), as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        f"import notebook_accel\nassert notebook_accel.__file__.startswith({installed!r}), notebook_accel.__file__"))
    NotebookClient(notebook, timeout=200, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if output.output_type == "error"]
    assert not errors
    said = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
    assert "after pdb, the launch raised rank 1's error: ValueError(" in said, said  # not "rank 1 's error"


def test_ci_tests_the_installed_package_not_the_checkout():
    """CI installs the package as users do (no -e): the suite must then import that install."""
    if os.environ.get("CI") != "true":
        pytest.skip("development runs may import the checkout; CI (CI=true) must not")
    location = os.path.realpath(notebook_accel.__file__)
    checkout = os.path.realpath(os.path.join(REPO, "notebook_accel")) + os.sep
    # CI's venv may live inside the clone (.venv): what matters is that the package came from an install
    assert not location.startswith(checkout), f"CI imported the checkout: {location}"
    assert f"{os.sep}site-packages{os.sep}" in location, f"not an installed copy: {location}"


def test_scripts_and_subprocesses_import_the_notebook_accel_under_test():
    """What the tests start (``run_script``, a plain ``python -c`` with the scripts' environment) imports the same
    notebook_accel as pytest, even when pytest runs from the checkout (``python -c`` puts the current directory
    first on the path: the checkout's copy would win over the installed one)."""
    code = "import notebook_accel; print(notebook_accel.__file__)"
    done = run_script(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == notebook_accel.__file__
    plain = subprocess.run([sys.executable, "-c", code], env=script_env(), capture_output=True, text=True,
                           timeout=120)
    assert plain.stdout.strip() == notebook_accel.__file__, plain.stderr[-2000:]
