#!/bin/bash
# Thirty-first session: the GPU suite on softmax_copies (two copies for masks at BLOCK_N, DV <= 128), then the
# same-call A/B of the new default against one copy.
export PYTHONPATH=$PWD
timeout 470 python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q 2>&1 | tail -15
cd benchmarks
timeout 110 python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:softmax_copies=1,128:causal,128:causal:softmax_copies=1,64:sliding_window,64:causal,256:causal,128:document,128:prefix_lm" 3 2>&1 | grep -A12 "^# median"
