#!/bin/bash
# Issue 5's closing table in one device call (it needs an H100: the criteria are ratios to cuDNN on that GPU).
#   bash benchmarks/run_issue5.sh      (logs and JSON lines under $OUT)
# 1. v3 beside SDPA cuDNN / flash, bf16, N = 16k, B*N = 16k, H*d = 2048, d = 64 / 128 / 256, plain and causal, ALiBi
#    and softcap (ratios to plain v3 from the same rows), medians of 3 interleaved rounds.
# 2. ALiBi and softcap against FlexAttention (torch.compile'd), N = 8k, B = 2, d = 64 / 128, 3 rounds.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
timeout ${BENCH_S:-330} python3 benchmarks/bench_v3.py --head-dims 64,128,256 --variants plain,causal,alibi,softcap \
  --schedules v3 --rounds ${ROUNDS:-3} 2>&1 | grep -v -i warn | tee "$OUT/issue5_bench_v3.log" | tail -30
timeout ${FLEX_S:-200} python3 benchmarks/flex_variants.py --rounds ${ROUNDS:-3} 2>&1 | grep -v -i warn \
  | tee "$OUT/issue5_flex.log" | tail -20
