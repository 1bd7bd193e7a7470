#!/bin/bash
# The default grid (plan/v3_grid.py: persistent + TMA stores of O where tiles are balanced) against one CTA per tile.
export PYTHONPATH=$PWD
cd benchmarks
timeout 420 python3 v3_sweep.py "128:plain,128:plain:persistent=false,64:plain,64:plain:persistent=false,96:plain,96:plain:persistent=false,128:softcap,128:softcap:persistent=false,128:alibi,128:alibi:persistent=false,64:sliding_window,64:sliding_window:persistent=false,128:sliding_window,128:sliding_window:persistent=false,128:plain:n=2048,128:plain:n=2048:persistent=false,64:plain:n=1024,64:plain:n=1024:persistent=false" 3 2>&1 | grep -A30 "^# median"
