#!/bin/bash
# The v2 spill re-plan (forty-first session): its GPU tests, then v2 kernels whose model plan spills on sm_90a against
# the narrower plan ptxas's report picks (every spill re-planned, --min-bytes 1, to find where it stops paying), and
# two presets at both widths (plain d64 and ALiBi d128: 16 B and 40 B on sm_80).
set -u
export PYTHONPATH=$PWD
python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" tests/test_spills.py 2>&1 | tail -3
python3 benchmarks/spill_ab.py --schedule v2 --min-bytes 1 --rounds 3 2>&1 | grep -v Warning
python3 benchmarks/spill_widths.py 0 64 32 --schedule v2 --preset alibi --head-dim 128 2>&1 | tail -4
python3 benchmarks/spill_widths.py 0 128 64 --schedule v2 --preset plain --head-dim 64 2>&1 | tail -4
