#!/bin/bash
# Experiment: the peeled main loop (AC_V3_PEEL: FULL blocks first with a mask-free body) -- correctness and A/B.
# The define was removed after this measurement (docs/perf-notes.md, thirtieth session); to run it again:
#   git checkout cb8a7af -- templates/include/attncompiler/v3_fwd.cuh
grep -q AC_V3_PEEL templates/include/attncompiler/v3_fwd.cuh || {
  echo "AC_V3_PEEL is not in v3_fwd.cuh: git checkout cb8a7af -- templates/include/attncompiler/v3_fwd.cuh first"; exit 1; }
export PYTHONPATH=$PWD
cd benchmarks
timeout 120 python3 - <<'PY'
import torch, attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel
from v3_sweep import with_define
cases = (("window128", presets.sliding_window(1024, 128), {}), ("window64", presets.sliding_window(256, 64), {}),
         ("causal128", presets.causal(128), {}), ("causal64", presets.causal(64), {}), ("causal256", presets.causal(256), {}),
         ("prefix_lm", presets.get_preset("prefix_lm", head_dim=128), {}),
         ("document", presets.get_preset("document", head_dim=128, num_heads=3, seqlen=4096), {}),
         ("causal_wgwalk", presets.causal(128), {"block_n": 64}), ("alibi_causal", presets.alibi(presets.alibi_slopes(3), 128, causal=True), {}),
         ("window_pers", presets.sliding_window(1024, 128), {"persistent": True}))
bad = 0
for name, spec, opts in cases:
    kern = with_define(ac.compile(spec, "v3", **opts), "AC_V3_PEEL")
    for n in (1023, 4096):
        r = check_kernel(kern, 2, 3, n)
        bad += not r.ok
        print("peel", name, opts, n, "ok" if r.ok else f"FAIL {r}", flush=True)
    if name == "causal128":
        r = check_kernel(kern, 2, 3, 1500, 517, H_kv=1); bad += not r.ok; print("peel causal GQA", r.ok)
print("peel failures:", bad)
PY
timeout 240 python3 v3_sweep.py "128:sliding_window,128:sliding_window:define=AC_V3_PEEL,64:sliding_window,64:sliding_window:define=AC_V3_PEEL,128:causal,128:causal:define=AC_V3_PEEL,64:causal,64:causal:define=AC_V3_PEEL,256:causal,256:causal:define=AC_V3_PEEL,128:document,128:document:define=AC_V3_PEEL,128:plain" 3 2>&1 | grep -A30 "^# median"
