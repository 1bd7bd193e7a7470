#!/bin/bash
# Thirty-sixth session: traced at Nk = 1152, plain d128 with q_prefetch ran 2.22 us per block against 1.44 without
# (span 343 vs 238 us), while the window's loop lost only 1.65 vs 1.56. Does producer warp 1's poll of o_staged
# cost the plain loop its issue slots? Traces with the timing-only waits (a back-off, a suspend hint, no O store),
# then one interleaved sweep.
export PYTHONPATH=$PWD
cd benchmarks
for d in NONE AC_V3_STORE_WARP_SLEEP AC_V3_STORE_WARP_HINT AC_V3_NO_O_STORE; do
  echo "## trace plain q_prefetch Nk=1152 --define $d"
  timeout 40 python3 v3_trace.py "128:plain:q_prefetch=true" --nk 1152 --define $d 2>&1 | grep -E "^128|per block|last PV|boundary|span"
done
H=define=AC_V3_STORE_WARP_HINT
S=define=AC_V3_STORE_WARP_SLEEP
timeout ${SWEEP_S:-200} python3 v3_sweep.py "128:plain,128:plain:q_prefetch=true,128:plain:q_prefetch=true:$S,128:plain:q_prefetch=true:$H,128:plain:n=2048,128:plain:n=2048:q_prefetch=true,128:plain:n=2048:q_prefetch=true:$H,128:sliding_window,128:sliding_window:$H" ${ROUNDS:-3} 2>&1 | grep -A10 "^# median"
