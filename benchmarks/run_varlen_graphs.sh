#!/bin/bash
# Packed sequences in CUDA graphs (runtime/varlen.py: calls with both max_seqlen read nothing on the host once
# captured; varlen.cuh clamps and reports inconsistent cu_seqlens): the packed and CUDA-graph GPU tests, then a
# training step on packed sequences eager, compiled and under reduce-overhead.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
timeout ${TEST_S:-360} python3 -m pytest -m gpu -p no:cacheprovider -n 8 --dist worksteal -o addopts="" -q -rf \
  tests/test_gpu_varlen_graphs.py tests/test_gpu_varlen.py tests/test_gpu_cuda_graphs.py \
  tests/test_gpu_v3_bwd.py > "$out/tests.log" 2>&1
echo "PYTEST_RC=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" "$out/tests.log" | tail -25
timeout ${BENCH_S:-150} python3 benchmarks/reduce_overhead.py --only packed 2>&1 | tail -12
