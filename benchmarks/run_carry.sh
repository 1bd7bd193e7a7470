#!/bin/bash
# Thirty-second session: carried tiles (plan option carry_tiles). Their GPU tests, then the same-call A/B against the
# default plan (persistent grid with TMA stores of O) at N = 16k and at short loops (n = 1152: 9 key blocks per tile).
export PYTHONPATH=$PWD
timeout ${CARRY_TEST_S:-200} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q tests/test_gpu_v3_carry.py 2>&1 | tail -8
cd benchmarks
C=":persistent=true:tma_store_o=true:carry_tiles=true"
items=""
for it in 128:plain 128:sliding_window 64:sliding_window 64:plain 128:softcap 128:plain:n=1152 64:alibi 128:sliding_window:n=4096; do
  items="$items,$it,$it$C"
done
timeout ${CARRY_SWEEP_S:-330} python3 v3_sweep.py "${items#,}" ${ROUNDS:-5} 2>&1 | grep -A20 "^# median"
