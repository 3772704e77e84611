#!/usr/bin/env bash
# The TPU backend on the real torch_xla, on its CPU client (no TPU needed): tests marked `xla`.
#
# Set-up, once (7.2 GB: torch 2.9 from PyPI is a CUDA build; with uv half a minute from a cold cache, with pip
# about 25 minutes on a 2-core machine), in a venv of its own (.ci/run does this when the venv is missing):
#   pip install uv && uv venv /work/venvs/xla
#   VIRTUAL_ENV=/work/venvs/xla uv pip install "torch==2.9.*" "torch_xla==2.9.*" cloudpickle ipywidgets \
#       ipykernel tqdm psutil pytest pytest-timeout
# Then:   scripts/test_xla_cpu.sh            (XLA_VENV=/path/to/venv to use another one)
#
# Fails when a test fails or is skipped (torch_xla missing from the venv, say): this job exists to run them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${XLA_VENV:-/work/venvs/xla}"
# Our package from this checkout (never installed into that venv); setup.cfg's addopts name nbval's
# option, which that venv does not have, and deselect `xla`: replace them.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PJRT_DEVICE=CPU CPU_NUM_DEVICES=2
report="$(mktemp --suffix=.xml)"
trap 'rm -f "$report"' EXIT
status=0
"$VENV/bin/python" -m pytest -o addopts="" -m xla -p no:cacheprovider -q -rs --junitxml="$report" \
    tests/test_xla_real.py "$@" || status=$?
"$VENV/bin/python" - "$report" "$status" <<'PY'
import sys
import xml.etree.ElementTree as ElementTree

root = ElementTree.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
ran = sum(int(suite.get("tests", 0)) for suite in suites)
skipped = sum(int(suite.get("skipped", 0)) for suite in suites)
if ran == 0 or skipped:
    sys.exit(f"scripts/test_xla_cpu.sh: {skipped} of {ran} XLA tests skipped (see above why): that fails this job")
if sys.argv[2] != "0":
    sys.exit(f"scripts/test_xla_cpu.sh: pytest exited {sys.argv[2]}")
print(f"scripts/test_xla_cpu.sh: {ran} XLA tests ran, none skipped")
PY
