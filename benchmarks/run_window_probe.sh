#!/bin/bash
# Issue 4 (thirty-first session): is the window's 10 % per-block excess over dense (with its mask off) the mask
# kernel's code (fullmask: a mask that hides nothing, every block FULL) or the window's walk / K/V stream?
# (Measured with one softmax copy, the masked kernels' only layout then: softmax_copies=1 keeps that A/B now.)
export PYTHONPATH=$PWD
cd benchmarks
for it in "128:plain" "128:fullmask:softmax_copies=1" "128:fullmask:softmax_copies=1:late_pv_wait=true"; do
  timeout 60 python3 v3_trace.py "$it" --nk 1152 2>&1 | grep -E "tiles|per block|softmax0|S0 |last PV|epilogue "
done
timeout 60 python3 v3_trace.py "128:sliding_window:softmax_copies=1:late_pv_wait=true" 2>&1 | grep -E "tiles|per block|softmax0"
timeout 60 python3 v3_trace.py "128:sliding_window:softmax_copies=1" 2>&1 | grep -E "tiles|per block|softmax0|S0 |last PV|epilogue "
timeout 300 python3 v3_sweep.py "128:plain,128:fullmask:softmax_copies=1,128:fullmask:softmax_copies=1:late_pv_wait=true,128:sliding_window:softmax_copies=1,128:sliding_window:softmax_copies=1:late_pv_wait=true,128:sliding_window:softmax_copies=1:define=AC_V3_MASK_OFF" 5 2>&1 | grep -A8 "^# median"
