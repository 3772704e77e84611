"""The README's first commands are what CI runs, the demo they start works, and every code block of the README
and of the docs pages (docs/*.md) runs, or is checked, as its ``<!-- readme-test: HOW (WHY) -->`` line says
(tests/doc_blocks.py lists the HOWs). A block moved to another page is checked there."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import doc_blocks
from scripts import REPO, script_env


README = os.path.join(REPO, "README.md")
PAGES = doc_blocks.pages(REPO)
PAGE_NAMES = [os.path.relpath(page, REPO) for page in PAGES]


def blocks_of_every_page(how: str, lang=None):
    """The blocks checked ``how`` on every page, README first."""
    return [block for page in PAGES for block in doc_blocks.of(page, how, lang)]


def pages_with(how: str):
    return [page for page in PAGES if doc_blocks.of(page, how)]


def _ids(blocks):
    return [f"{block.name}:{block.line}" for block in blocks]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_NAMES)
def test_every_block_says_how_it_is_checked(page):
    hows = {"python": doc_blocks.PYTHON_HOWS, "bash": doc_blocks.BASH_HOWS, "": doc_blocks.PLAIN_HOWS}
    for block in doc_blocks.blocks(page):
        assert block.how is not None, f"{block}: no <!-- readme-test: ... --> line above it"
        assert block.how in hows.get(block.lang, ()), f"{block}: not a way to check a {block.lang or 'plain'} block"
        assert block.how in {"run", "kernel cell"} or block.why, f"{block}: say why in (...)"


def test_every_way_of_checking_is_used():
    """Each HOW checks some block somewhere: a test over no block would pass (or skip) while checking nothing."""
    used = {block.how for page in PAGES for block in doc_blocks.blocks(page)}
    unused = (doc_blocks.PYTHON_HOWS | doc_blocks.BASH_HOWS | doc_blocks.PLAIN_HOWS) - used
    assert not unused, f"no block is checked {sorted(unused)}: did a page lose them?"
    assert any(block.code.startswith("%%ranks") for block in blocks_of_every_page("kernel cell")), \
        "no page runs a %%ranks cell"


def test_ci_runs_the_readme_set_up_and_test_commands():
    """The README's first commands are what a fresh machine runs: .ci/run runs each line, in the same order; a
    ``ci`` block on a docs page (building the docs) is run by .ci/run too."""
    with open(os.path.join(REPO, ".ci", "run")) as ci:
        ci_lines = [line.strip() for line in ci]
    blocks = doc_blocks.of(README, "ci", "bash")
    first_shell_blocks = [block for block in doc_blocks.blocks(README) if block.lang == "bash"][:2]
    assert [block.line for block in blocks] == [block.line for block in first_shell_blocks], \
        "the set-up and test commands must be the README's first shell blocks"
    for block in blocks_of_every_page("ci", "bash"):
        commands = doc_blocks.command_lines(block.code)
        assert commands, f"{block}: no commands"
        where = [ci_lines.index(command) if command in ci_lines else -1 for command in commands]
        assert -1 not in where, f"{block}: not in .ci/run: {commands[where.index(-1)]}"
        assert where == sorted(where), f"{block}: .ci/run runs these in another order"
    assert any("pytest" in block.code for block in blocks) and any("notebook_accel.demo" in block.code
                                                                  for block in blocks)


@pytest.mark.timeout(180)
def test_demo_trains_over_two_cpu_processes(tmp_path):
    assert "python -m notebook_accel.demo" in doc_blocks.of(README, "ci", "bash")[0].code
    done = subprocess.run([sys.executable, "-m", "notebook_accel.demo", "--epochs", "4"], cwd=tmp_path,
                          env=script_env(), capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    match = re.search(r"trained on 2 CPU processes in [\d.]+ s: held-out accuracy ([\d.]+)", done.stdout)
    assert match, done.stdout[-3000:]
    assert float(match.group(1)) > 0.8  # a 64-128-10 MLP reaches ~0.93 on digits in a few epochs
    assert "[rank 1]" in done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr  # the demo's own code warns about nothing
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) <= 30, lines  # compact: no line for a bar that opens, none for a leave=False inner loop


# ------------------------------------------------------------------------------------- the pages' Python

def _entry_point_calls(code: str):
    """``(entry point, keywords)`` of each call of a public entry point the code makes by name."""
    import ast

    from notebook_accel.plan.options import ENTRY_POINTS

    return [(node.func.id, [keyword.arg for keyword in node.keywords]) for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ENTRY_POINTS]


NAMES_ONLY = blocks_of_every_page("names only", "python")


@pytest.mark.parametrize("block", NAMES_ONLY, ids=_ids(NAMES_ONLY))
def test_blocks_that_cannot_run_here_name_only_real_options(block):
    from notebook_accel.plan.options import ENTRY_POINTS, options_for

    calls = _entry_point_calls(block.code)
    assert calls, f"{block}: calls no entry point by name, so nothing here checks it"
    for entry, keywords in calls:
        accepted = {option.name for option in options_for(entry)} | set(ENTRY_POINTS[entry])
        assert set(keywords) <= accepted, f"{block}: {entry} takes no {sorted(set(keywords) - accepted)}"


TRANSCRIPTS = blocks_of_every_page("transcript")


@pytest.mark.parametrize("block", TRANSCRIPTS, ids=_ids(TRANSCRIPTS))
def test_transcript_blocks_name_the_tests_that_type_them(block):
    """An interactive exchange cannot run unattended: the tests that drive it for real must exist."""
    named = re.findall(r"tests/test_\w+\.py", block.why or "")
    assert named, f"{block}: name the tests that type this exchange"
    for path in named:
        assert os.path.exists(os.path.join(REPO, path)), f"{block}: {path} does not exist"


SIGNATURES = blocks_of_every_page("signature", "python")


@pytest.mark.parametrize("block", SIGNATURES, ids=_ids(SIGNATURES))
def test_signature_blocks_are_the_functions_signatures(block):
    import ast
    import inspect

    import notebook_accel

    code = block.code
    function = getattr(notebook_accel, code.strip().split("(", 1)[0])
    without_comments = "\n".join(line.split("#")[0].rstrip() for line in code.strip().splitlines())
    definition = ast.parse("def " + without_comments + ": pass").body[0]
    arguments = definition.args
    documented = {}
    for argument, default in zip(arguments.args[-len(arguments.defaults):] + arguments.kwonlyargs,
                                 arguments.defaults + arguments.kw_defaults):
        documented[argument.arg] = ast.literal_eval(default)
    actual = {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()
              if parameter.default is not inspect.Parameter.empty}
    assert documented == actual, block


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
RUN_BLOCKS = blocks_of_every_page("run", "python")


def stand_ins_for(block) -> str:
    """The page's own stand-ins above ``block`` (what a reader pastes), or the test's where the page has none."""
    own = [stand_in.code for stand_in in doc_blocks.of(block.page, "stand in", "python") if stand_in.line < block.line]
    return "".join(own) if own else STAND_INS


def test_the_first_example_of_the_readme_and_getting_started_runs_with_the_pages_own_stand_ins():
    for page in (README, os.path.join(REPO, "docs", "getting-started.md")):
        first = doc_blocks.of(page, "run", "python")[0]
        assert stand_ins_for(first) != STAND_INS and "def make_model" in stand_ins_for(first), page


@pytest.mark.timeout(180)
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=_ids(RUN_BLOCKS))
def test_runnable_blocks_run_as_written(block, tmp_path):
    check = "\nprint('STATE', sorted(state), all(isinstance(v, torch.Tensor) for v in state.values()))\n"
    script = tmp_path / "readme_block.py"
    script.write_text(stand_ins_for(block) + block.code + check)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=script_env(), capture_output=True,
                          text=True, timeout=170)
    assert done.returncode == 0, f"{block}\n" + done.stdout[-2000:] + done.stderr[-3000:]
    assert "STATE ['0.bias', '0.weight', '2.bias', '2.weight'] True" in done.stdout


TPU_BLOCKS = blocks_of_every_page("fake tpu", "python")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("block", TPU_BLOCKS, ids=_ids(TPU_BLOCKS))
def test_tpu_blocks_run_on_a_fake_tpu_host(block, tmp_path):
    """No TPU here: the block runs on a fake v5e-2 host (fake sysfs and the fake torch_xla, tests/fake_tpu.py)."""
    from fake_tpu import tpu_host_env

    stand_in = ("from notebook_accel import notebook_launcher\n"
                "def train():\n    import torch_xla.runtime as xr\n    return xr.global_ordinal()\n")
    script = tmp_path / "tpu_block.py"
    script.write_text(stand_in + block.code + "\nprint('STATE', state)\n")
    env = {**tpu_host_env(str(tmp_path / "sysfs"), "v5e-2"), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=220)
    assert done.returncode == 0, f"{block}\n" + done.stdout[-2000:] + done.stderr[-3000:]
    assert "STATE 0" in done.stdout  # rank 0's value, from the last assignment (one core)
    if "compile_cache=\"~/xla_cache\"" in block.code:
        assert os.listdir(tmp_path / "xla_cache"), "compile_cache='~/xla_cache' made no cache"


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


def _shown(cell) -> str:
    """What a kernel cell shows as its value (its last expression's repr)."""
    return "".join(output["data"]["text/plain"] for output in cell.outputs if output["output_type"] == "execute_result")


KERNEL_PAGES = pages_with("kernel cell")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("page", KERNEL_PAGES, ids=[os.path.relpath(page, REPO) for page in KERNEL_PAGES])
def test_kernel_cell_blocks_run_in_a_real_kernel(page, tmp_path, monkeypatch):
    """A page's kernel cells (IPython syntax: ``%%ranks``, ``%load_ext``) run as consecutive cells of one notebook,
    and each ``output`` block is what the cell above it shows."""
    import nbformat
    from nbclient import NotebookClient

    name = os.path.relpath(page, REPO)
    blocks = doc_blocks.blocks(page)
    cells = [block for block in blocks if block.how == "kernel cell"]
    expected = {blocks[index - 1].line: block.code.strip() for index, block in enumerate(blocks)
                if block.how == "output" and blocks[index - 1].how == "kernel cell"}
    assert len(expected) == len(doc_blocks.of(page, "output")), f"{name}: an output block not right after a kernel cell"
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])  # the notebook_accel under test
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell.code) for cell in cells])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on a cell's error
    printing = [cell for cell in notebook.cells if cell.source.startswith("%%ranks") and "print(" in cell.source]
    for ranks_cell in printing:
        printed = "".join(output.get("text", "") for output in ranks_cell.outputs)
        assert "[rank 0] " in printed and "[rank 1] " in printed, f"{name}: {ranks_cell.source}\nprinted {printed!r}"
    for block, cell in zip(cells, notebook.cells):
        if block.line in expected:
            assert _shown(cell) == expected[block.line], f"{block}: shows {_shown(cell)!r}"


# ------------------------------------------------------------------------------------- the pages' shell

def _stand_in_scripts(folder) -> None:
    script = ("import os, sys\n"
              "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'args', sys.argv[1:])\n")
    (folder / "train.py").write_text(script)
    (folder / "my_package").mkdir()
    (folder / "my_package" / "__init__.py").write_text("")
    (folder / "my_package" / "train.py").write_text(script)


SHELL_PAGES = pages_with("shell")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", SHELL_PAGES, ids=[os.path.relpath(page, REPO) for page in SHELL_PAGES])
def test_shell_blocks_run_line_by_line(page, tmp_path):
    blocks = doc_blocks.of(page, "shell", "bash")
    _stand_in_scripts(tmp_path)
    env = {**script_env(), "HF_HOME": str(tmp_path / "hf"), "HOME": str(tmp_path)}
    env.pop("NOTEBOOK_ACCEL_CONFIG_FILE", None)
    for block in blocks:
        for command in doc_blocks.command_lines(block.code):
            done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, input="\n" * 40, capture_output=True,
                                  text=True, timeout=240)
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"{block}: `{command}` exited {done.returncode}:\n{output[-3000:]}"
            if " launch " in f" {command} ":
                assert "args ['--epochs', '3']" in output or "args ['--lr', '3e-4']" in output, output[-2000:]
    if any(command.startswith("notebook-accel config") for block in blocks
           for command in doc_blocks.command_lines(block.code)):
        assert (tmp_path / "hf" / "notebook_accel" / "default_config.yaml").exists()


def test_files_blocks_name_scripts_that_exist_and_extras_that_exist():
    import configparser

    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    extras = set(setup["options.extras_require"])
    blocks = blocks_of_every_page("files", "bash")
    assert blocks
    for block in blocks:
        for command in doc_blocks.command_lines(block.code):
            for extra in re.findall(r'pip install "\.\[([\w,]+)\]"', command):
                assert set(extra.split(",")) <= extras, f"{block}: no extra {extra}"
            for script in re.findall(r"((?:benchmarks|scripts)/[\w./]+)", command):
                path = os.path.join(REPO, script)
                assert os.path.isfile(path), f"{block}: {script} does not exist"
                if script.endswith(".py"):
                    done = subprocess.run([sys.executable, path, "--help"], env=script_env(), capture_output=True,
                                          text=True, timeout=120)
                    assert done.returncode == 0 and "usage" in done.stdout, f"{script} --help: {done.stderr[-2000:]}"
