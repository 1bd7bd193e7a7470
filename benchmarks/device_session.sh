#!/usr/bin/env bash
# One device call: GPU tests, then the benchmarks, logs under $OUT.
#   bash benchmarks/device_session.sh [pytest-args...]
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
python3 -m attncompiler run alibi --shape 2,16,4096 2>&1 | tail -4
python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
python3 benchmarks/bench_forward.py 2>&1 | tee "$OUT/bench_forward.log" | tail -16
