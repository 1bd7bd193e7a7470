#!/bin/bash
# Thirty-fourth session: the tile list's dealing rules (runtime/tile_list.py DEALS) against the round robin, same
# call, sliding window 1024 at several lengths, plain beside for issue 4's ratio; and the list with q_prefetch.
export PYTHONPATH=$PWD
cd benchmarks
QP=persistent=true:tma_store_o=true:score_skip=false:q_prefetch=true
items="128:plain,128:sliding_window:$QP,128:sliding_window:$QP:tile_list=true:deal=lpt"
for it in ${ITEMS:-128:sliding_window 128:sliding_window:n=4096 128:sliding_window:n=2048 64:sliding_window}; do
  items="$items,$it,$it:tile_list=true:deal=lpt,$it:tile_list=true:deal=in_order"
done
timeout ${SWEEP_S:-400} python3 v3_sweep.py "$items" ${ROUNDS:-7} 2>&1 | grep -A30 "^# median"
