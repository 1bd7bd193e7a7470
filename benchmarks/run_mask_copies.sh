#!/bin/bash
# Issue 4 (thirty-first session): a mask kernel whose blocks are all FULL (fullmask) ran 14 % slower than plain.
# Its one softmax copy makes ptxas wait for the previous P V before the exponentials, and a second copy was
# slower because ptxas took the branch on the block's class for divergent (BRA.DIV, BSSY around the shuffles).
# A/B: the class voted warp-uniform (AC_V3_VOTE_MASKED) with two softmax copies (AC_V3_TWO_COPIES).
export PYTHONPATH=$PWD
cd benchmarks
VT=define=AC_V3_VOTE_MASKED+AC_V3_TWO_COPIES
timeout 400 python3 v3_sweep.py "128:plain,128:fullmask,128:fullmask:$VT,128:sliding_window,128:sliding_window:$VT,128:causal,128:causal:$VT,64:sliding_window,64:sliding_window:$VT,64:causal,64:causal:$VT,256:causal,256:causal:$VT,128:document,128:document:$VT,128:fullmask:define=AC_V3_VOTE_MASKED" 5 2>&1 | grep -A18 "^# median"
timeout 60 python3 v3_trace.py "128:sliding_window" --define AC_V3_VOTE_MASKED --define AC_V3_TWO_COPIES 2>&1 | grep -E "tiles|per block|softmax0"
timeout 60 python3 v3_trace.py "128:fullmask" --nk 1152 --define AC_V3_VOTE_MASKED --define AC_V3_TWO_COPIES 2>&1 | grep -E "tiles|per block|softmax0"
