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
