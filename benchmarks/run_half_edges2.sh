#!/bin/bash
export PYTHONPATH=$PWD
# Forty-second session, second call: the probe's second form (commit faf4d3c, reverted after it): correctness and A/B.
# To run it again: git checkout faf4d3c -- templates/include/attncompiler/v3_fwd.cuh
cd benchmarks
timeout 110 python3 - <<'PY'
import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel
from v3_sweep import with_define
bad = 0
for name, spec, opts in (("window128", presets.sliding_window(1024, 128), {}), ("window_pers", presets.sliding_window(1024, 128), {"persistent": True}),
                         ("causal128", presets.causal(128), {}), ("window100", presets.sliding_window(100, 128), {})):
    kern = with_define(ac.compile(spec, "v3", half_blocks=True, **opts), "AC_V3_HALF_EDGES")
    for n in (113, 1023, 4096):
        r = check_kernel(kern, 2, 3, n); bad += not r.ok
        print("edges2", name, n, "ok" if r.ok else f"FAIL {r}", flush=True)
print("edges2 failures:", bad)
PY
timeout 190 python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:half_blocks=true:define=AC_V3_HALF_EDGES,128:sliding_window:define=AC_V3_HALF_EDGES" 5 2>&1 | grep -A10 "^# median"
