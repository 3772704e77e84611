#!/usr/bin/env bash
# One short run on a GPU machine (GPU time is scarce): the CUDA tests, then benchmarks/bench_gpu.py; put both
# outputs in the note. Run from the checkout with the venv active; the tests import the installed package, so it
# is installed first (pytest, not `python -m pytest`, which would put the checkout first on the path).
set -u
pip install -q --no-deps --no-build-isolation . || exit 1
pytest -q -s -m cuda -p no:cacheprovider tests/test_cuda_machine.py tests/test_debugging.py tests/test_cuda_payload.py \
    tests/test_accelerator_distributed.py 2>&1 | tail -60
python benchmarks/bench_gpu.py "$@"
