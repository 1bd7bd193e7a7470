#!/bin/bash
# Next session's first device call: the full GPU suite with q_prefetch and tile_list on by default for bands
# (plan/v3_grid.py Q_PREFETCH_BANDS, TILE_LIST_MASKS; patched in the device's copy only). The thirty-fourth session's
# run with them on did not finish within 470 s (~400 s without): the log goes to $OUT, and pytest's faulthandler dumps
# every thread's stack for a test that runs over 150 s, so a hang names its test.
set -u
sed -i 's/^Q_PREFETCH_BANDS = False/Q_PREFETCH_BANDS = True/; s/^TILE_LIST_MASKS = False/TILE_LIST_MASKS = True/' \
  attncompiler/plan/v3_grid.py
grep -E "^(Q_PREFETCH_BANDS|TILE_LIST_MASKS) =" attncompiler/plan/v3_grid.py
out=${OUT:-/tmp}
PYTHONPATH=$PWD timeout ${SUITE_S:-540} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -o addopts="" -q \
  -o faulthandler_timeout=150 --durations=25 > "$out/suite.log" 2>&1
echo "PYTEST_RC=$?"
grep -E "^(FAILED|ERROR)|passed|failed|Timeout|most recent call first" "$out/suite.log" | tail -30
