#!/bin/bash
# Thirty-fifth session: the tile boundary with q_prefetch and tile_list on by default for bands (traces of the
# window and of dense 9-block tiles, the option on and off), and issue 4's ratio once more in its own call.
export PYTHONPATH=$PWD
cd benchmarks
OFF=q_prefetch=false:tile_list=false
echo "## trace window d128 N=16k, default vs both off"
timeout 100 python3 v3_trace.py "128:sliding_window,128:sliding_window:$OFF" 2>&1 | tail -30
echo "## trace dense Nk=1152, q_prefetch on vs off"
timeout 80 python3 v3_trace.py "128:plain:q_prefetch=true,128:plain" --nk 1152 2>&1 | tail -30
timeout ${SWEEP_S:-150} python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:$OFF" ${ROUNDS:-9} 2>&1 | grep -A5 "^# median"
