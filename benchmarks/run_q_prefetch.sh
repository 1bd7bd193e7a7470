#!/bin/bash
# Thirty-third session: the persistent grid's Q a tile ahead (plan option q_prefetch) -- its GPU tests, then same-call
# A/B against the default O-tile plan (ITEMS: d:variant[:opt=val] without the option; each runs with and without),
# then a trace of dense 9-block tiles with it (TRACE=0: none).
export PYTHONPATH=$PWD
timeout ${TEST_S:-150} python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -x tests/test_v3_q_prefetch.py \
  > /tmp/qp_tests.log 2>&1
rc=$?
tail -4 /tmp/qp_tests.log
[ $rc -eq 0 ] || { echo "tests rc=$rc: no sweep"; exit $rc; }
cd benchmarks
Q=q_prefetch=true
items=""
for it in ${ITEMS:-128:plain 128:sliding_window 128:plain:n=1152 128:softcap 128:sliding_window:n=4096}; do
  items="$items,$it,$it:$Q"
done
timeout ${SWEEP_S:-240} python3 v3_sweep.py "${items#,}" ${ROUNDS:-5} 2>&1 | grep -A12 "^# median"
[ "${TRACE:-1}" = 0 ] || timeout 60 python3 v3_trace.py "128:plain:$Q" --nk 1152 2>&1 | grep -E "S0|softmax0|per block|last PV|epilogue|LSE|smem|boundary"
