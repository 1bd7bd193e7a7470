#!/bin/bash
# For the thirty-third session: does the dynamic shared-memory size alone cost? Carried tiles and O in a K slot both
# ran at ~225 KB (the default plan: 193 KB) and both lost 2-4 % on plain d128 at N = 16k, where neither changed the
# main loop. The same default kernels launched with 230,520 B of dynamic shared memory (their layout unchanged: the
# rest is unused, the L1 carve-out smaller), same call, interleaved rounds.
export PYTHONPATH=$PWD
cd benchmarks
S=":smem=230520"
items=""
for it in 128:plain 128:sliding_window 64:plain 128:softcap 128:plain:n=1152; do
  items="$items,$it,$it$S"
done
timeout ${SWEEP_S:-200} python3 v3_sweep.py "${items#,}" ${ROUNDS:-5} 2>&1 | grep -A12 "^# median"
