#!/bin/bash
# Forty-second session: issue 4's criterion (sliding window 1024 over full attention at N = 16k, per visible
# fraction) at each head dim of the reference shapes (bf16, B = 1, H*d = 2048), v3, do_bench 20 repetitions each;
# at d = 128 also FlexAttention's ratio and cuDNN's short-loop cost in the same call (--peers).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cd benchmarks
for d in 128 64 256; do
  extra=""; [ "$d" = 128 ] && extra="--peers"
  timeout 150 python3 bench_masked_scaling.py --schedule v3 --head-dim $d --heads $((2048 / d)) $extra 2>&1 \
    | grep -v -i warn | grep -E "^#|ms  plan|visible|peers|fraction" 
done
