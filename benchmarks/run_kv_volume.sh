#!/bin/bash
# Fortieth session: is the K/V stream's L2 -> SM volume what bounds the v3 forward at d >= 128? Two timing-only
# probes of the producer (v3_producer.cuh): AC_V3_KV_HALF_BOXES copies half of each K / V tile (half the bytes),
# AC_V3_KV_SAME_BLOCKS copies every block's bytes from block 0 or 1 (the same volume, all L2 hits). Time, SM clock and
# board power per kernel run back to back (cycles = time x clock separate a clock gain from a throughput gain).
export PYTHONPATH=$PWD
cd benchmarks
timeout 300 python3 - <<'PY'
import attncompiler as ac
from attncompiler.spec import presets
from clock_power import run_kernel
import os
DEFINES = [None] + os.environ.get("DEFINES", "AC_V3_KV_HALF_BOXES AC_V3_KV_SAME_BLOCKS").split()
for name, spec, d in (("plain d128", ac.AttentionSpec(128), 128), ("window d128", presets.sliding_window(1024, 128), 128),
                      ("plain d256", ac.AttentionSpec(256), 256))[:int(os.environ.get("KINDS", "3"))]:
    base = None
    for define in DEFINES:
        ms, mhz, w = run_kernel(name, spec, d, 16384, 16384, 3.0, define=define)
        cyc = ms * mhz
        base = base or (ms, cyc)
        print(f"{name:12s} {define or 'default':22s} {ms:.4f} ms {mhz:6.0f} MHz {w:5.0f} W  "
              f"speed {base[0] / ms:.3f} (time) {base[1] / cyc:.3f} (cycles)", flush=True)
PY
