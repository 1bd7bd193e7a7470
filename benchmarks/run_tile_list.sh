#!/bin/bash
# Thirty-fourth session: the persistent grid's tiles dealt by a host list (plan option tile_list) -- its GPU tests,
# then a same-call A/B (ITEMS: d:variant[:opt=val]; each with and without the list), plain beside for the ratio.
export PYTHONPATH=$PWD
timeout ${TEST_S:-200} python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -x ${TESTS:-tests/test_v3_tile_list.py} \
  > /tmp/tl_tests.log 2>&1
rc=$?
tail -4 /tmp/tl_tests.log
[ $rc -eq 0 ] || { grep -E "Error|assert|FAILED" /tmp/tl_tests.log | head -30; echo "tests rc=$rc: no sweep"; exit $rc; }
cd benchmarks
QP=tma_store_o=true:score_skip=false:q_prefetch=true
items="128:plain"
for it in ${ITEMS:-128:sliding_window 128:sliding_window:$QP 128:sliding_window:n=4096 128:sliding_window:n=2048 64:sliding_window}; do
  items="$items,$it,$it:tile_list=true"
done
timeout ${SWEEP_S:-300} python3 v3_sweep.py "$items" ${ROUNDS:-5} 2>&1 | grep -A20 "^# median"
