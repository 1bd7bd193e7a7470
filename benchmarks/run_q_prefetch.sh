#!/bin/bash
# Thirty-third session: the persistent grid's Q a tile ahead (plan option q_prefetch) -- GPU tests, then same-call
# A/B against the default O-tile plan, then a trace of dense 9-block tiles with it.
export PYTHONPATH=$PWD
timeout ${TEST_S:-150} python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -x tests/test_v3_q_prefetch.py \
  > /tmp/qp_tests.log 2>&1
rc=$?
tail -4 /tmp/qp_tests.log
[ $rc -eq 0 ] || { echo "tests rc=$rc: no sweep"; exit $rc; }
cd benchmarks
Q=q_prefetch=true
items=""
for it in 128:plain 128:sliding_window 128:plain:n=1152 64:sliding_window 128:softcap 64:plain; do
  items="$items,$it,$it:$Q"
done
timeout ${SWEEP_S:-240} python3 v3_sweep.py "${items#,}" ${ROUNDS:-5} 2>&1 | grep -A14 "^# median"
timeout 60 python3 v3_trace.py "128:plain:$Q" --nk 1152 2>&1 | grep -E "S0|softmax0|per block|last PV|epilogue|LSE|smem|boundary"
