#!/bin/bash
# Issue 4 (thirty-first session): a mask kernel whose blocks are all FULL (fullmask) ran 14 % slower than plain.
# With one softmax copy ptxas waits for the previous P V before the exponentials; a second copy had been slower
# because ptxas took the branch on the block's class for divergent (BRA.DIV, BSSY around the shuffles).
# A/B of plan option softmax_copies (2: the masked kernels' default at BLOCK_N, DV <= 128; the block's class is
# voted warp-uniform in every masked kernel). The session measured the same A/B with source defines before the
# option existed (one copy then had no vote): docs/perf-notes.md, thirty-first session, step 3.
export PYTHONPATH=$PWD
cd benchmarks
timeout 400 python3 v3_sweep.py "128:plain,128:fullmask:softmax_copies=1,128:fullmask:softmax_copies=2,128:sliding_window:softmax_copies=1,128:sliding_window:softmax_copies=2,128:causal:softmax_copies=1,128:causal:softmax_copies=2,64:sliding_window:softmax_copies=1,64:sliding_window:softmax_copies=2,64:causal:softmax_copies=1,64:causal:softmax_copies=2,256:causal:softmax_copies=1,256:causal:softmax_copies=2,128:document:softmax_copies=1,128:document:softmax_copies=2" 5 2>&1 | grep -A18 "^# median"
timeout 60 python3 v3_trace.py "128:sliding_window:softmax_copies=2" 2>&1 | grep -E "tiles|per block|softmax0"
timeout 60 python3 v3_trace.py "128:fullmask:softmax_copies=2" --nk 1152 2>&1 | grep -E "tiles|per block|softmax0"
