#!/bin/bash
# Issue 4 (docs/perf-notes.md, thirty-first session): the window's unmasked blocks run 10 % slower than dense ones
# (AC_V3_MASK_OFF traces). Its kernel has one softmax copy and, at d < 192, no late P V wait, so ptxas waits for the
# previous P V before the softmax (benchmarks/v3_sass.py: "P V overlap no"). A/B: late_pv_wait=true, two copies.
export PYTHONPATH=$PWD
cd benchmarks
timeout 300 python3 v3_sweep.py "128:sliding_window,128:sliding_window:late_pv_wait=true,128:sliding_window:define=AC_V3_TWO_COPIES,128:plain,64:sliding_window,64:sliding_window:late_pv_wait=true,64:sliding_window:define=AC_V3_TWO_COPIES,128:causal,128:causal:late_pv_wait=true,128:causal:define=AC_V3_TWO_COPIES,64:causal:late_pv_wait=true,64:causal" 3 2>&1 | grep -A14 "^# median"
timeout 60 python3 v3_trace.py "128:sliding_window" --define AC_V3_TWO_COPIES 2>&1 | grep -E "tiles|per block|softmax0"
