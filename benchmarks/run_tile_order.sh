#!/bin/bash
# Thirty-second session: the persistent grid's tile order for balanced masks, same call, interleaved rounds:
# the default (every head's heaviest query blocks first) vs AC_V3_TILE_BY_HEAD (a head's query blocks on
# neighbouring CTAs, as unmasked kernels have it).
export PYTHONPATH=$PWD
cd benchmarks
D=":define=AC_V3_TILE_BY_HEAD"
items="128:plain"
for it in 128:sliding_window 64:sliding_window 128:sliding_window:n=4096 128:sliding_window2048 64:sliding_window256; do
  items="$items,$it,$it$D"
done
timeout ${SWEEP_S:-400} python3 v3_sweep.py "$items" ${ROUNDS:-9} 2>&1 | grep -A14 "^# median"
