#!/bin/bash
# Forty-second session: half blocks only outside the loop (AC_V3_HALF_EDGES with half_blocks=true: S_0 and the
# last P V at half width where a warpgroup's rows see only half of that block; whole-width GEMMs inside the loop).
# Its second form (the parts taken only for S_0 and the last block, commit faf4d3c) is run_half_edges2.sh.
# The define was removed after this measurement (docs/perf-notes.md, forty-second session); to run it again:
#   git checkout e91cb5f -- templates/include/attncompiler/v3_fwd.cuh
# Correctness by the error-ratio rule, then the same-call A/B against the default and the in-loop half blocks.
grep -q AC_V3_HALF_EDGES templates/include/attncompiler/v3_fwd.cuh || {
  echo "AC_V3_HALF_EDGES is not in v3_fwd.cuh: git checkout e91cb5f -- templates/include/attncompiler/v3_fwd.cuh first"; exit 1; }
export PYTHONPATH=$PWD
cd benchmarks
timeout 150 python3 - <<'PY'
import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel
from v3_sweep import with_define
cases = (("window128", presets.sliding_window(1024, 128), {}), ("window64", presets.sliding_window(256, 64), {}),
         ("causal128", presets.causal(128), {}), ("causal64", presets.causal(64), {}), ("causal256", presets.causal(256), {}),
         ("prefix_lm", presets.get_preset("prefix_lm", head_dim=128), {}),
         ("document", presets.get_preset("document", head_dim=128, num_heads=3, seqlen=4096), {}),
         ("causal_wgwalk", presets.causal(128), {"block_n": 64}),
         ("alibi_causal", presets.alibi(presets.alibi_slopes(3), 128, causal=True), {}),
         ("window_pers", presets.sliding_window(1024, 128), {"persistent": True}),
         ("window100", presets.sliding_window(100, 128), {}))
bad = 0
for name, spec, opts in cases:
    kern = with_define(ac.compile(spec, "v3", half_blocks=True, **opts), "AC_V3_HALF_EDGES")
    for n in (113, 1023, 4096):
        r = check_kernel(kern, 2, 3, n)
        bad += not r.ok
        print("edges", name, opts, n, "ok" if r.ok else f"FAIL {r}", flush=True)
    if name == "causal128":
        r = check_kernel(kern, 2, 3, 1500, 517, H_kv=1); bad += not r.ok; print("edges causal GQA", r.ok)
print("edges failures:", bad)
PY
timeout 300 python3 v3_sweep.py "128:plain,128:sliding_window,128:sliding_window:half_blocks=true:define=AC_V3_HALF_EDGES,128:sliding_window:half_blocks=true,64:sliding_window,64:sliding_window:half_blocks=true:define=AC_V3_HALF_EDGES,128:causal,128:causal:half_blocks=true:define=AC_V3_HALF_EDGES,256:causal,256:causal:half_blocks=true:define=AC_V3_HALF_EDGES" 5 2>&1 | grep -A30 "^# median"
