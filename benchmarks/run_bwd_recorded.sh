#!/bin/bash
# The forty-third session's device calls: the recorded backward launch (runtime/bwd_fastpath.py) and the dQ
# accumulator zeroed by the preprocess kernel (AttnBwdParams::dq_accum_floats).
# 1. the backward tests first (fast feedback), 2. the full GPU suite (a launch-path and template change), 3. host
# time of a backward call, full path against recorded (host_backward.py), and of a small eager training step, A/B
# (host_step.py --ab), 4. the GPU fuzz for what time is left (FUZZ_S seconds), the backward on every second seed.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" -x tests/test_gpu_fastpath.py \
  -k "backward" 2>&1 | tail -5
echo "BWD_TESTS_RC=${PIPESTATUS[0]}"
SUITE_S=${SUITE_S:-430} FUZZ_S=0 bash benchmarks/run_suite_check.sh
timeout 120 python3 benchmarks/host_backward.py "128:causal:n=1024,64:plain:n=256" --calls 200 2>&1 | \
  grep -E "us per backward|^  [a-z0-9_]" | head -30
timeout 150 python3 benchmarks/host_step.py --ab ${AB:-9} --steps 100 --profile 0 2>&1 | tail -2
if [ "${FUZZ_S:-0}" -gt 0 ]; then
  timeout "$FUZZ_S" python3 benchmarks/fuzz_long.py 400 --start "${FUZZ_START:-104731}" --v1-every 0 --bwd-every 2 \
    --decode-every 4 --v3-every 1 --chunk 24 > "$out/fuzz.log" 2>&1
  tail -4 "$out/fuzz.log"
fi
