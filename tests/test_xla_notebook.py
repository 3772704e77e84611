"""notebooks/tpu_colab.ipynb with every cell, the TPU-only ones included, in a real Jupyter kernel on a fake
TPU host (no TPU here: fake sysfs + the fake torch_xla of tests/fake_torch_xla, v2-8's shape: 4 worker
processes × 2 device threads). nbval runs the same notebook on CPU in the default run, where the TPU-only
cells say why they skip."""
from __future__ import annotations

import os
import shutil
import tempfile

import nbformat
import pytest
from nbclient import NotebookClient

from fake_tpu import tpu_env
from scripts import REPO

pytestmark = pytest.mark.timeout(300)


def test_the_tpu_notebook_runs_every_cell_on_a_tpu_host(tmp_path, monkeypatch):
    for key, value in tpu_env(str(tmp_path / "sysfs"), "v2-8").items():
        monkeypatch.setenv(key, value)
    # The kernel's fork server leaves its socket dir behind when the kernel is shut down: give the kernel a
    # short-pathed TMPDIR of its own (AF_UNIX paths are short) and remove it afterwards.
    kernel_tmp = tempfile.mkdtemp(prefix="nbk-", dir="/tmp")
    monkeypatch.setenv("TMPDIR", kernel_tmp)
    try:
        run_every_cell(tmp_path)
    finally:
        shutil.rmtree(kernel_tmp, ignore_errors=True)


def run_every_cell(tmp_path) -> None:
    notebook = nbformat.read(os.path.join(REPO, "notebooks", "tpu_colab.ipynb"), as_version=4)
    for cell in notebook.cells:  # every cell runs, the TPU-only ones on their TPU branch
        if cell.cell_type == "code":
            cell.source = cell.source.replace("/tmp/xla_cache", str(tmp_path / "xla_cache"))
    NotebookClient(notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    text = {index: "".join(output.get("text", "") for output in cell.get("outputs", []))
            for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"}
    assert "best device:    xla (TPU v2 × 8)" in text[2]
    assert "8 ranks on cpu: loss" in "".join(text.values())  # the fake's devices are the CPU
    assert "steps, final loss" in text[6]
    assert "second launch (from the cache)" in text[8]
    assert sorted(os.listdir(tmp_path / "xla_cache")) == [f"process-{index}" for index in range(4)]
    assert [line.split(":")[0] for line in text[9].splitlines()] == [f"rank {rank}/8" for rank in range(8)]
    assert "raised: rank 1 gave up - from rank 1" in text[11]
