#!/bin/bash
# Thirty-fifth session: the window's main loop read 1.63 us per block traced with q_prefetch + tile_list against 1.54
# without. Which option, and is it the consumers' 232 registers (timing-only AC_V3_REGS_24_240: 24 / 240, the
# producer spilling)? Traces, then one interleaved sweep.
export PYTHONPATH=$PWD
cd benchmarks
R=define=AC_V3_REGS_24_240
timeout 120 python3 v3_trace.py "128:sliding_window,128:sliding_window:q_prefetch=false:tile_list=false,128:sliding_window:q_prefetch=false,128:sliding_window:tile_list=false" 2>&1 | grep -E "^128|per block|last PV|epilogue |span"
timeout 60 python3 v3_trace.py "128:sliding_window" --define AC_V3_REGS_24_240 2>&1 | grep -E "^128|per block|last PV|epilogue |span"
timeout ${SWEEP_S:-200} python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:$R,128:sliding_window:q_prefetch=false:tile_list=false,128:sliding_window:q_prefetch=false,128:sliding_window:tile_list=false" ${ROUNDS:-7} 2>&1 | grep -A7 "^# median"
