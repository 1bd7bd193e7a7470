#!/bin/bash
# For the thirty-seventh session: plans checked against ptxas's report (attncompiler/runtime/spills.py, SPILL_REPLAN
# off). 30 of 380 random fuzz specs' default v3 plans spilled 4-344 B on sm_90a; the re-plan takes the first narrower
# BLOCK_N that spills nothing. First the GPU test of the re-planned kernel, then the A/B of ten spilling specs (model
# vs re-planned, N = 4096, 3 rounds). If the re-plan wins (or ties) where the spills are large, turn SPILL_REPLAN on,
# run the full GPU suite, and decide a threshold for small spills (8-20 B) from the same table.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" tests/test_spills.py 2>&1 | tail -3
timeout ${AB_S:-300} python3 benchmarks/spill_ab.py --rounds ${ROUNDS:-3} 2>&1 | grep -v -i warn
