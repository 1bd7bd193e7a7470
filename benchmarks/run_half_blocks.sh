#!/bin/bash
# Thirty-first session: the full GPU suite on the main loop as restructured for half_blocks (default kernels: the
# same instructions, scheduled anew), the layout options' own GPU tests, and the same-call A/B of half_blocks.
export PYTHONPATH=$PWD
timeout 400 python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q --ignore=tests/test_gpu_v3_layout.py 2>&1 | tail -4
timeout 100 python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q tests/test_gpu_v3_layout.py 2>&1 | tail -6
cd benchmarks
timeout 85 python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:half_blocks=true,64:sliding_window,64:sliding_window:half_blocks=true,128:causal,128:causal:half_blocks=true" 3 2>&1 | grep -A8 "^# median"
