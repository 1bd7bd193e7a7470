#!/bin/bash
# Next for issue 4 (docs/perf-notes.md, thirtieth session): split the sliding window's per-block excess over dense
# attention into the masked blocks' own work (AC_V3_MASK_OFF: timing only, every block unmasked) and the rest.
export PYTHONPATH=$PWD
cd benchmarks
timeout 200 python3 v3_sweep.py "128:sliding_window,128:sliding_window:define=AC_V3_MASK_OFF,128:plain,64:sliding_window,64:sliding_window:define=AC_V3_MASK_OFF" 3 2>&1 | grep -A10 "^# median"
timeout 60 python3 v3_trace.py "128:sliding_window" 2>&1 | grep -E "tiles|per block|softmax0"
timeout 60 python3 v3_trace.py "128:sliding_window" --define AC_V3_MASK_OFF 2>&1 | grep -E "tiles|per block|softmax0"
timeout 60 python3 v3_trace.py "128:plain" --nk 1152 2>&1 | grep -E "tiles|per block|softmax0"
