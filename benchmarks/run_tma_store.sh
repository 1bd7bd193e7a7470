#!/bin/bash
# One device call for the persistent epilogue with TMA stores (tma_store_o): its GPU tests, then the A/B.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -x tests/test_v3_tma_store.py 2>&1 | tail -15
cd benchmarks
timeout 200 python3 v3_sweep.py "128:sliding_window,128:sliding_window:persistent=true,128:sliding_window:persistent=true:tma_store_o=true,128:plain,128:plain:persistent=true,128:plain:persistent=true:tma_store_o=true,128:causal,128:causal:persistent=true:tma_store_o=true" 3 2>&1 | grep -A20 "^# median"
timeout 150 python3 clock_power.py --set cudnn --rounds 1 --seconds 2 2>&1 | grep -v Warning
