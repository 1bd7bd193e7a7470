#!/bin/bash
# Fortieth session, one call: (1) the torch.compile fullgraph test that the session's first suite failed (the
# functional API's compile step had lost assume_constant_result), with its new CPU twin; (2) three timing probes of
# the v3 tile boundary (templates/include/attncompiler/v3_fwd.cuh): AC_V3_FREE_S0_TURN / AC_V3_FREE_PV_TURN (a tile's
# S_0 and last P V issued outside the ping-pong's order), AC_V3_SETUP_EARLY (the next tile's place found under the
# last P V), checked by the error-ratio rule, then A/B'd against the default on the window (issue 4) and dense 9-block
# tiles.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 3 -o addopts="" \
  "tests/test_gpu_backward.py::test_torch_compile_fullgraph_block" \
  "tests/test_backward.py::test_functional_attention_traces_whole_under_torch_compile" 2>&1 | tail -3
ALL=AC_V3_FREE_S0_TURN+AC_V3_FREE_PV_TURN+AC_V3_SETUP_EARLY
timeout 200 python3 - "$ALL" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel
from v3_sweep import with_define
bad = 0
for variant in ("AC_V3_FREE_S0_TURN", "AC_V3_FREE_PV_TURN", "AC_V3_SETUP_EARLY", sys.argv[1]):
    for name, spec in (("window1024", presets.sliding_window(1024, 128)), ("window1024_d64", presets.sliding_window(1024, 64)),
                       ("plain", ac.AttentionSpec(128)), ("plain_d64", ac.AttentionSpec(64)),
                       ("softcap", presets.softcap(30.0, 128)), ("alibi", presets.alibi(presets.alibi_slopes(4), 128))):
        kern = with_define(ac.compile(spec, "v3"), variant)
        for n in (113, 1023, 4096):
            r = check_kernel(kern, 2, 4, n)
            bad += not r.ok
            if not r.ok:
                print(f"FAIL {variant} {name} N={n}: {r.message}", flush=True)
print(f"probe checks: {bad} failures")
PY
cd benchmarks
timeout 330 python3 v3_sweep.py "128:plain,128:plain:n=1152,128:plain:n=1152:define=$ALL,128:sliding_window,\
128:sliding_window:define=AC_V3_FREE_S0_TURN,128:sliding_window:define=AC_V3_FREE_PV_TURN,\
128:sliding_window:define=AC_V3_FREE_S0_TURN+AC_V3_FREE_PV_TURN,128:sliding_window:define=AC_V3_SETUP_EARLY,\
128:sliding_window:define=$ALL" ${ROUNDS:-7} > "$out/sweep.log" 2>&1
grep -A12 "^# median" "$out/sweep.log" || tail -20 "$out/sweep.log"
