#!/bin/bash
# Fortieth session: what the v3 forward's memory traffic costs under the board's power limit (every d = 128 kernel
# runs at ~690 W of 700). Timing-only probes (wrong results; commit faeb5da and the session's notes):
#   AC_V3_KV_HALF_BOXES      half of each K / V tile copied (half the L2 -> SM bytes; the other half's operands stale)
#   AC_V3_KV_HALF_BOXES_ROT  half copied, the copied half alternating per use of a stage (operands keep changing)
#   AC_V3_KV_SAME_BLOCKS     every K / V copy reads block 0 or 1 (the same L2 -> SM bytes, no HBM reads of K / V)
#   AC_V3_Q_SAME             every Q copy reads tile 0's rows (no HBM reads of Q)
#   AC_V3_NO_O_STORE         no O stores (no HBM writes of O)
# Time, SM clock and board power per kernel run back to back; cycles = time x clock; issue 4's ratio = the window's
# time over plain's (default kernel) times the window's visible fraction.
export PYTHONPATH=$PWD
cd benchmarks
timeout 420 python3 - <<'PY'
import os
import attncompiler as ac
from attncompiler.spec import presets
from clock_power import run_kernel
N = 16384
vf = sum(min(i + 1, 1025) for i in range(N)) / N / N
DEFINES = [None] + os.environ.get("DEFINES", "AC_V3_KV_HALF_BOXES AC_V3_KV_SAME_BLOCKS").split()
times = {}
for name, spec in (("plain", ac.AttentionSpec(128)), ("window", presets.sliding_window(1024, 128))):
    for define in DEFINES:
        ms, mhz, w = run_kernel(name, spec, 128, N, N, float(os.environ.get("SECONDS", "3")), define=define)
        times[name, define] = (ms, mhz)
for define in DEFINES:
    (tp, cp), (tw, cw) = times["plain", define], times["window", define]
    tp0, cp0 = times["plain", None]
    tw0, cw0 = times["window", None]
    print(f"{define or 'default':60s} plain {tp:.4f} ms {cp:5.0f} MHz (speed {tp0 / tp:.3f}, cycles {tp0 * cp0 / (tp * cp):.3f})"
          f" | window {tw:.4f} ms {cw:5.0f} MHz (speed {tw0 / tw:.3f}, cycles {tw0 * cw0 / (tw * cw):.3f})"
          f" | window / (default plain x vf) {tw / (tp0 * vf):.3f}, / (same-probe plain x vf) {tw / (tp * vf):.3f}")
PY
