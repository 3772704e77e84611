"""The README's first commands are what CI runs, and the demo they start works."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from scripts import REPO, script_env


def readme_blocks():
    with open(os.path.join(REPO, "README.md")) as readme:
        return re.findall(r"```bash\n(.*?)```", readme.read(), re.S)


def test_ci_runs_the_readme_test_commands():
    test_block = next(block for block in readme_blocks() if "pytest" in block)
    with open(os.path.join(REPO, ".ci", "run")) as ci:
        ci_lines = [line.strip() for line in ci]
    commands = [line.strip() for line in test_block.splitlines() if line.strip() and not line.startswith("#")]
    assert commands, "the README has no test commands"
    for command in commands:
        assert command in ci_lines, f"README command not in .ci/run: {command}"


@pytest.mark.timeout(180)
def test_demo_trains_over_two_cpu_processes(tmp_path):
    demo_block = readme_blocks()[0]
    assert "python -m notebook_accel.demo" in demo_block
    done = subprocess.run([sys.executable, "-m", "notebook_accel.demo", "--epochs", "4"], cwd=tmp_path,
                          env=script_env(), capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    match = re.search(r"trained on 2 CPU processes in [\d.]+ s: held-out accuracy ([\d.]+)", done.stdout)
    assert match, done.stdout[-3000:]
    assert float(match.group(1)) > 0.8  # a 64-128-10 MLP reaches ~0.93 on digits in a few epochs
    assert "[rank 1]" in done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr  # the demo's own code warns about nothing


# ------------------------------------------------------------------------------------- the README's Python

PYTHON_BLOCK = re.compile(r"<!-- readme-test: (?P<how>[a-z ]+?)(?: \((?P<why>[^)]*)\))? -->\n```python\n(?P<code>.*?)```",
                          re.S)


def python_blocks():
    with open(os.path.join(REPO, "README.md")) as readme:
        text = readme.read()
    marked = [match.groupdict() for match in PYTHON_BLOCK.finditer(text)]
    return text.count("```python"), marked


def test_every_python_block_says_how_it_is_checked():
    total, marked = python_blocks()
    assert len(marked) == total, "a ```python block in README.md has no <!-- readme-test: ... --> line above it"
    assert {block["how"] for block in marked} <= {"run", "signature", "names only", "kernel cell"}
    assert all(block["why"] for block in marked if block["how"] != "run")


def _launcher_keywords(code: str):
    import ast

    return [keyword.arg for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "notebook_launcher" for keyword in node.keywords]


def test_blocks_that_cannot_run_here_name_only_real_options():
    from notebook_accel.plan.options import OPTIONS

    blocks = [block["code"] for block in python_blocks()[1] if block["how"] == "names only"]
    assert blocks and all(_launcher_keywords(code) for code in blocks)
    for code in blocks:
        assert set(_launcher_keywords(code)) <= set(OPTIONS) | {"args", "kwargs", "config"}, code


def test_the_signature_block_is_the_launchers_signature():
    import ast
    import inspect

    from notebook_accel import notebook_launcher

    code = next(block["code"] for block in python_blocks()[1] if block["how"] == "signature")
    without_comments = "\n".join(line.split("#")[0].rstrip() for line in code.strip().splitlines())
    definition = ast.parse("def " + without_comments + ": pass").body[0]
    arguments = definition.args
    documented = {}
    for argument, default in zip(arguments.args[-len(arguments.defaults):] + arguments.kwonlyargs,
                                 arguments.defaults + arguments.kw_defaults):
        documented[argument.arg] = ast.literal_eval(default)
    actual = {name: parameter.default for name, parameter in inspect.signature(notebook_launcher).parameters.items()
              if parameter.default is not inspect.Parameter.empty}
    assert documented == actual


STAND_INS = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

def make_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

def make_loader():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(64, 8, generator=generator)
    return DataLoader(TensorDataset(inputs, (inputs.sum(dim=1) > 0).long()), batch_size=8)

loss_fn = torch.nn.functional.cross_entropy
'''


@pytest.mark.timeout(180)
@pytest.mark.parametrize("index", range(sum(1 for block in python_blocks()[1] if block["how"] == "run")))
def test_runnable_blocks_run_as_written(index, tmp_path):
    code = [block["code"] for block in python_blocks()[1] if block["how"] == "run"][index]
    check = "\nprint('STATE', sorted(state), all(isinstance(v, torch.Tensor) for v in state.values()))\n"
    script = tmp_path / "readme_block.py"
    script.write_text(STAND_INS + code + check)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=script_env(), capture_output=True,
                          text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "STATE ['0.bias', '0.weight', '2.bias', '2.weight'] True" in done.stdout


def test_the_notebooks_run_top_to_bottom_as_run_all_does():
    # nbval runs every notebook cell by cell in the default run; with no cell skipped, that is what *Run All*
    # does on any runtime: hardware-only cells must branch and say why they skip, not be skipped by the test.
    import glob

    import nbformat

    for path in glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        skipped = [index for index, cell in enumerate(notebook.cells)
                   if cell.cell_type == "code" and "NBVAL_SKIP" in cell.source]
        assert skipped == [], f"{os.path.basename(path)}: cells {skipped} are skipped by the test run"


@pytest.mark.timeout(180)
def test_kernel_cell_blocks_run_in_a_real_kernel(tmp_path, monkeypatch):
    """The Session blocks (IPython syntax: ``%%ranks``, ``%load_ext``) run as consecutive cells of a notebook."""
    import nbformat
    from nbclient import NotebookClient

    cells = [block["code"] for block in python_blocks()[1] if block["how"] == "kernel cell"]
    assert cells and any(cell.startswith("%%ranks") for cell in cells)
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])  # the notebook_accel under test
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell) for cell in cells])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on a cell's error
    ranks_cell = next(cell for cell in notebook.cells if cell.source.startswith("%%ranks"))
    printed = "".join(output.get("text", "") for output in ranks_cell.outputs)
    assert "[rank 0] tensor(" in printed and "[rank 1] tensor(" in printed, printed
