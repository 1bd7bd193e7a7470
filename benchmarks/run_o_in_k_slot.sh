#!/bin/bash
# Thirty-second session: O staged in the last K slot (plan option o_in_k_slot: d = 128 gets its third K/V stage back
# on the persistent TMA-store grid). Its GPU tests, then the same-call A/B against the default plan.
export PYTHONPATH=$PWD
timeout ${TEST_S:-110} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q tests/test_v3_tma_store.py \
  -k "o_in_k_slot" 2>&1 | grep -E "passed|failed|FAILED|ERROR|Error" | tail -8
cd benchmarks
K=":o_in_k_slot=true"
items=""
for it in 128:plain 128:sliding_window 128:plain:n=1152 128:sliding_window:n=4096 128:softcap; do
  items="$items,$it,$it$K"
done
timeout ${SWEEP_S:-75} python3 v3_sweep.py "${items#,}" ${ROUNDS:-3} 2>&1 | grep -A12 "^# median"
