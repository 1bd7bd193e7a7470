#!/bin/bash
# Thirty-fourth session: a tile's first block in the previous tile's tail (plan option carry_tiles, on q_prefetch) --
# its GPU tests, then a same-call A/B of three plans per item (ITEMS: d:variant[:opt=val]): the default, q_prefetch,
# and q_prefetch with carry_tiles; then (TRACE=1) a trace of dense 9-block tiles with it.
export PYTHONPATH=$PWD
timeout ${TEST_S:-200} python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -x ${TESTS:-tests/test_v3_carry_tiles.py} \
  > /tmp/carry_tests.log 2>&1
rc=$?
tail -6 /tmp/carry_tests.log
[ $rc -eq 0 ] || { grep -E "Error|assert|FAILED" /tmp/carry_tests.log | head -30; echo "tests rc=$rc: no sweep"; exit $rc; }
cd benchmarks
Q=persistent=true:tma_store_o=true:score_skip=false:q_prefetch=true
items=""
for it in ${ITEMS:-128:sliding_window 128:sliding_window:n=4096 128:plain:n=1152 128:plain 64:sliding_window}; do
  items="$items,$it,$it:$Q,$it:$Q:carry_tiles=true"
done
timeout ${SWEEP_S:-300} python3 v3_sweep.py "${items#,}" ${ROUNDS:-5} 2>&1 | grep -A20 "^# median"
[ "${TRACE:-0}" = 0 ] || timeout 60 python3 v3_trace.py "128:plain:$Q:carry_tiles=true" --nk 1152 2>&1 | grep -E "S0|softmax0|per block|last PV|epilogue|LSE|smem|boundary"
