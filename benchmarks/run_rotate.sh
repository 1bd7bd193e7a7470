#!/bin/bash
# Experiment: the rotated K/V walk (AC_KV_ROTATE) -- correctness, A/B, and phase traces of the default grid.
export PYTHONPATH=$PWD
cd benchmarks
timeout 120 python3 - <<'PY'
import torch, attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel
from v3_sweep import with_define
for name, spec in (("window128", presets.sliding_window(1024, 128)), ("window64", presets.sliding_window(256, 64)),
                   ("causal128", presets.causal(128)), ("prefix_lm", presets.get_preset("prefix_lm", head_dim=128))):
    for opts in ({}, {"persistent": False}):
        kern = with_define(ac.compile(spec, "v3", **opts), "AC_KV_ROTATE")
        for n in (1023, 4096):
            r = check_kernel(kern, 2, 3, n)
            print("rotate", name, opts, n, "ok" if r.ok else f"FAIL {r}", flush=True)
PY
timeout 300 python3 v3_sweep.py "128:sliding_window,128:sliding_window:define=AC_KV_ROTATE,64:sliding_window,64:sliding_window:define=AC_KV_ROTATE,128:plain,128:sliding_window:persistent=false,128:sliding_window:persistent=false:define=AC_KV_ROTATE,128:causal,128:causal:define=AC_KV_ROTATE" 3 2>&1 | grep -A30 "^# median"
timeout 60 python3 v3_trace.py "128:sliding_window" 2>&1 | tail -16
timeout 60 python3 v3_trace.py "128:plain" --nk 1152 2>&1 | tail -16
