#!/usr/bin/env bash
# The TPU backend on the real torch_xla, on its CPU client (no TPU needed): tests marked `xla`.
#
# Set-up, once (~7 GB: torch 2.9 from PyPI is a CUDA build), in a venv of its own:
#   python -m venv /work/venvs/xla
#   /work/venvs/xla/bin/pip install "torch==2.9.*" "torch_xla==2.9.*" cloudpickle ipywidgets ipykernel \
#       tqdm psutil pytest pytest-timeout
# Then:   scripts/test_xla_cpu.sh            (XLA_VENV=/path/to/venv to use another one)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${XLA_VENV:-/work/venvs/xla}"
# Our package from this checkout (never installed into that venv); setup.cfg's addopts name nbval's
# option, which that venv does not have, and deselect `xla`: replace them.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PJRT_DEVICE=CPU CPU_NUM_DEVICES=2
exec "$VENV/bin/python" -m pytest -o addopts="" -m xla -p no:cacheprovider -q tests/test_xla_real.py "$@"
