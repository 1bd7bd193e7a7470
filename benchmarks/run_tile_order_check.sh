#!/bin/bash
# Thirty-second session: tiles_by_head in the planner (balanced masks take the by-head order on the persistent grid):
# the GPU tests that run persistent window kernels, then the same-call A/B of the planner's order against the
# heaviest-first one across sequence lengths (B = 16384 / N).
export PYTHONPATH=$PWD
timeout ${TEST_S:-240} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q tests/test_v3_tma_store.py \
  tests/test_gpu_v3_layout.py tests/test_gpu_v3.py -k "tiles_by_head or tma_store or sliding or window or layout or half or softmax_copies" 2>&1 | grep -E "passed|failed|FAILED|ERROR" | tail -10
cd benchmarks
O=":tiles_by_head=false"
items="128:plain"
for it in 128:sliding_window 128:sliding_window:n=4096 128:sliding_window:n=2048 64:sliding_window:n=4096 128:sliding_window2048:n=4096; do
  items="$items,$it,$it$O"
done
timeout ${SWEEP_S:-200} python3 v3_sweep.py "$items" ${ROUNDS:-7} 2>&1 | grep -A14 "^# median"
