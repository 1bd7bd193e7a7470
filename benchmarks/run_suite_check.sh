#!/bin/bash
# A session's first device call after launch-path changes made without a GPU: the full GPU suite (its log to $OUT;
# the slowest tests listed; faulthandler names a test that hangs past 150 s), then the long fuzz from $FUZZ_START
# for what time is left (FUZZ_S seconds; SUITE_WORKERS: pytest-xdist workers, default 8). The forty-first session
# turned the spill re-plan on for v2 (its kernels that spill 32 B or more at BLOCK_N 128 are built at 64); its GPU
# tests and the suite ran on the GPU after that change.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
# worksteal (pytest-xdist >= 3.2) moves queued tests off a worker that waits in a module's precompiling fixture
dist=$(python3 -c "import xdist; v = tuple(int(x) for x in xdist.__version__.split('.')[:2]); \
print('worksteal' if v >= (3, 2) else 'load')" 2>/dev/null || echo load)
echo "pytest-xdist --dist $dist, ${SUITE_WORKERS:-8} workers"
timeout ${SUITE_S:-540} python3 -m pytest -m gpu -p no:cacheprovider -n ${SUITE_WORKERS:-8} --dist "$dist" -o addopts="" -q -rf \
  -o faulthandler_timeout=150 --durations=25 > "$out/suite.log" 2>&1
echo "PYTEST_RC=$?"
grep -E "^(FAILED|ERROR)|passed|failed|Timeout|most recent call first" "$out/suite.log" | tail -30
grep -A27 "slowest 25 durations" "$out/suite.log" | tail -26
if [ "${FUZZ_S:-0}" -gt 0 ]; then
  timeout "$FUZZ_S" python3 benchmarks/fuzz_long.py 400 --start "${FUZZ_START:-104731}" --v1-every 0 --bwd-every 0 \
    --decode-every 0 --v3-every 1 --chunk 24 > "$out/fuzz.log" 2>&1
  tail -4 "$out/fuzz.log"
fi
