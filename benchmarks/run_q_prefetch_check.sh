#!/bin/bash
# Thirty-third session, second form of q_prefetch (1/l and the LSE taken while the last P V runs): its GPU tests,
# then same-call A/B against the default O-tile plan.
export PYTHONPATH=$PWD
timeout ${TEST_S:-120} python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -x tests/test_v3_q_prefetch.py \
  > /tmp/qp_tests.log 2>&1
rc=$?
tail -2 /tmp/qp_tests.log
[ $rc -eq 0 ] || { echo "tests rc=$rc: no sweep"; exit $rc; }
cd benchmarks
Q=q_prefetch=true
items=""
for it in 128:plain 128:sliding_window 128:plain:n=1152 128:softcap 128:sliding_window:n=4096; do
  items="$items,$it,$it:$Q"
done
timeout ${SWEEP_S:-110} python3 v3_sweep.py "${items#,}" ${ROUNDS:-5} 2>&1 | grep -A12 "^# median"
