#!/bin/bash
# Thirty-fifth session: q_prefetch and tile_list on by default for bands (Q_PREFETCH_BANDS, TILE_LIST_MASKS), the
# producer at 40 registers with q_prefetch. First the GPU tests of those kernels (q_prefetch, tile_list, the v3
# presets, the v3 fuzz), then one interleaved sweep: the new defaults against both options off, plain d128 for issue
# 4's ratio, and the timing-only AC_V3_NO_MASK_PASS (masked blocks skip the mask: what evaluating it costs).
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
timeout ${TESTS_S:-200} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q \
  tests/test_v3_q_prefetch.py tests/test_v3_tile_list.py tests/test_gpu_v3.py tests/test_gpu_fuzz.py -k "not v2 and not v1 and not decode and not backward" \
  > "$out/tests.log" 2>&1
echo "TESTS_RC=$?"; tail -3 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log" | head
OFF=q_prefetch=false:tile_list=false
cd benchmarks
timeout ${SWEEP_S:-330} python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:$OFF,128:sliding_window:define=AC_V3_NO_MASK_PASS,64:sliding_window,64:sliding_window:$OFF,128:sliding_window:n=4096,128:sliding_window:n=4096:$OFF" ${ROUNDS:-7} \
  > "$out/sweep.log" 2>&1
echo "SWEEP_RC=$?"; grep -A12 "^# median" "$out/sweep.log"
