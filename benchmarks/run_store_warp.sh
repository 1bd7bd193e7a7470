#!/bin/bash
# For the thirty-sixth session: with q_prefetch the window's main loop traced 1.62-1.66 us per block against 1.54
# without, while the consumers' main-loop SASS is the same (76 vs 77 instructions between the loop's wgmmas, the same
# R2URs; the extra ones are the producer's). Suspect: producer warp 1 polling its o_staged mbarrier for a whole tile,
# on the SM sub-partition of two consumer warps. Timing-only AC_V3_STORE_WARP_SLEEP polls with a 256 ns back-off;
# AC_V3_STORE_WARP_HINT waits in mbarrier.try_wait with a 1 ms suspend-time hint (the thread sleeps until the
# phase completes); AC_V3_NO_O_STORE skips the stores (wrong output). Traces (the tracer follows tile lists since the thirty-fifth
# session: its boundary column is new), then one interleaved sweep.
export PYTHONPATH=$PWD
cd benchmarks
S=define=AC_V3_STORE_WARP_SLEEP
W=define=AC_V3_STORE_WARP_HINT
N=define=AC_V3_NO_O_STORE
timeout 120 python3 v3_trace.py "128:sliding_window,128:sliding_window:q_prefetch=false" 2>&1 | grep -E "^128|per block|last PV|epilogue |boundary|span"
for d in AC_V3_STORE_WARP_SLEEP AC_V3_STORE_WARP_HINT AC_V3_NO_O_STORE; do
  echo "## trace --define $d"
  timeout 60 python3 v3_trace.py "128:sliding_window" --define $d 2>&1 | grep -E "^128|per block|last PV|epilogue |boundary|span"
done
timeout ${SWEEP_S:-200} python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:$S,128:sliding_window:$W,128:sliding_window:$N,128:sliding_window:q_prefetch=false,64:sliding_window,64:sliding_window:$S,128:plain:q_prefetch=true,128:plain:q_prefetch=true:$S" ${ROUNDS:-7} 2>&1 | grep -A11 "^# median"
