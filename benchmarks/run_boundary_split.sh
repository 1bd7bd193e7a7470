#!/bin/bash
# Thirty-third session: what the persistent grid's tile boundary is made of, end to end. Timing-only defines
# (wrong results; with them undefined the kernels are unchanged): AC_V3_NO_EPILOGUE skips the epilogue (no O, no
# LSE), AC_V3_Q_ONCE reuses the first tile's Q (no reload). Dense 9-block tiles (Nk = 1152 per query) and the
# window, same call, interleaved rounds; then traces of the dense tiles with and without the epilogue.
export PYTHONPATH=$PWD
cd benchmarks
E=define=AC_V3_NO_EPILOGUE
Q=define=AC_V3_Q_ONCE
B=define=AC_V3_NO_EPILOGUE+AC_V3_Q_ONCE
timeout ${SWEEP_S:-300} python3 v3_sweep.py "128:plain:n=1152,128:plain:n=1152:$E,128:plain:n=1152:$Q,128:plain:n=1152:$B,128:sliding_window,128:sliding_window:$E,128:sliding_window:$B,128:plain" ${ROUNDS:-5} 2>&1 | grep -A12 "^# median"
for d in "" "--define AC_V3_NO_EPILOGUE" "--define AC_V3_Q_ONCE"; do
  echo "## trace dense Nk=1152 $d"
  timeout 90 python3 v3_trace.py "128:plain" --nk 1152 $d 2>&1 | tail -14
done
