#!/bin/bash
# The v3 backward at head dims rounded up to whole warpgroup halves (MLA's D = 192, DV = 128; 192 x 192): its GPU
# tests first (fail fast), then backward TFLOP/s against v2 and cuDNN (v3_bwd_sweep.py, N = 16k, B = 1,
# H = 2048 // D), then the full GPU suite (run_suite_check.sh) for what time is left.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
timeout ${TESTS_S:-150} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q -rf \
  tests/test_gpu_v3_bwd.py -k "split_dims or refusals or auto_backward or d256" > "$out/mla_tests.log" 2>&1
echo "MLA_TESTS_RC=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/mla_tests.log" | tail -12
timeout ${BENCH_S:-150} python3 benchmarks/v3_bwd_sweep.py "${MLA_CONFIGS:-192:plain:dv=128,192:plain:dv=128:schedule=v2,\
192:cudnn:dv=128,192:causal:dv=128,192:causal:dv=128:schedule=v2,192:cudnn_causal:dv=128,192:plain,192:plain:schedule=v2,\
192:cudnn,256:plain:dv=128}" ${MLA_ROUNDS:-2} 2>&1 | tail -40
SUITE_S=${SUITE_S:-330} FUZZ_S=0 bash benchmarks/run_suite_check.sh
