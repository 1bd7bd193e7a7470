#!/bin/bash
# Dropout's device pair (AttnParams.rng_state, attncompiler/runtime/rng.py): the CUDA-graph and recorded-launch GPU
# tests, then dropout forward time with the by-value kernels against the device-pair kernels, two rounds.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
timeout ${TEST_S:-300} python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -rf -x \
  tests/test_gpu_cuda_graphs.py tests/test_gpu_fastpath.py > "$out/tests.log" 2>&1
echo "PYTEST_RC=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" "$out/tests.log" | tail -20
for r in 1 2; do
  echo "== round $r"; python3 benchmarks/dropout_rng_ab.py $( [ $r = 1 ] && echo --sass ) 2>&1 | tail -8
done
