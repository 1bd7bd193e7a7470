#!/bin/bash
# Recorded packed-sequence launches (runtime/varlen_fastpath.py): their GPU tests, the packed and recording tests
# they touch, then the host time per packed call (host_varlen.py). Logs to $OUT.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
timeout ${TESTS_S:-300} python3 -m pytest -m gpu -p no:cacheprovider -n ${WORKERS:-8} -o addopts="" -q -rf \
  tests/test_gpu_varlen_fastpath.py tests/test_gpu_varlen.py tests/test_gpu_varlen_graphs.py tests/test_gpu_fastpath.py \
  > "$out/tests.log" 2>&1
echo "PYTEST_RC=$?"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/tests.log" | tail -30
(cd benchmarks && timeout ${BENCH_S:-120} python3 host_varlen.py --calls 150 --rows 12 > "$out/host_varlen.log" 2>&1)
head -8 "$out/host_varlen.log"
