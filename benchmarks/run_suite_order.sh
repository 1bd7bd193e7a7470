#!/bin/bash
# Thirty-second session: the full GPU suite (summary line printed), then the same-call A/B of the persistent grid's
# tile order for the sliding window (AC_V3_TILE_BY_HEAD: a head's query blocks on neighbouring CTAs, as unmasked
# kernels have it, instead of every head's heaviest query blocks first).
export PYTHONPATH=$PWD
timeout ${SUITE_S:-440} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q 2>&1 | grep -E "passed|failed|error|FAILED|ERROR" | tail -12
cd benchmarks
timeout ${SWEEP_S:-120} python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:define=AC_V3_TILE_BY_HEAD,64:sliding_window,64:sliding_window:define=AC_V3_TILE_BY_HEAD" ${ROUNDS:-5} 2>&1 | grep -A8 "^# median"
