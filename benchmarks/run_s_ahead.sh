#!/bin/bash
# Thirty-eighth session: a tile's first two S GEMMs in its first turn (plan option s_ahead, off by default) -- its GPU
# tests, then a same-call A/B against the model's plan (ITEMS: d:variant[:opt=val] without the option; each runs with
# and without it, ROUNDS interleaved rounds). Prediction (docs/perf-notes.md, thirty-eighth session): ~2 % on short
# tiles (the window, N = 1152), nothing on plain at N = 16k.
export PYTHONPATH=$PWD
timeout ${TEST_S:-200} python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -x tests/test_v3_s_ahead.py \
  > "${OUT:-/tmp}/s_ahead_tests.log" 2>&1
rc=$?
tail -4 "${OUT:-/tmp}/s_ahead_tests.log"
[ $rc -eq 0 ] || { echo "tests rc=$rc: no sweep"; exit $rc; }
cd benchmarks
S=s_ahead=true
items=""
for it in ${ITEMS:-128:sliding_window 128:plain:n=1152 128:plain 128:causal 128:softcap 128:sliding_window:n=4096}; do
  items="$items,$it,$it:$S"
done
timeout ${SWEEP_S:-300} python3 v3_sweep.py "${items#,}" ${ROUNDS:-7} 2>&1 | grep -A16 "^# median"
