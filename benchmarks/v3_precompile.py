"""Compile every kernel tests/test_gpu_v3.py uses into the disk cache, in parallel processes (NVRTC
is the slow part of that test file).  PYTHONPATH=. python3 benchmarks/v3_precompile.py"""
from __future__ import annotations

import sys
import time
from pathlib import Path


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import test_gpu_v3 as T

    import attncompiler as ac
    from attncompiler.runtime.compiler import precompile_to_disk
    from attncompiler.spec import presets

    specs = [T.spec_for(n, d, dt, s) for n in T.PRESET_NAMES for d in (64, 96, 128, 256) for dt in ("bf16", "fp16")
             for s in T.SEQLENS]
    specs += [T.spec_for(n, 192, "bf16", 1023) for n in ("plain", "causal", "softcap")]
    jobs = []
    for sp in specs:
        jobs.append(ac.compile(sp, "v3", build=False, target="sm_90").kernel_source)
    for name in ("plain", "causal", "sliding_window", "document", "dropout"):
        for d in (64, 128):
            for s in (113, 1023, 4096):
                jobs.append(ac.compile(T.spec_for(name, d, "bf16", s), "v3", build=False, target="sm_90",
                                       persistent=True).kernel_source)
    for d in (64, 128, 256):
        for sp in (presets.plain(d), presets.causal(d)):
            for pers in (False, True):
                jobs.append(ac.compile(sp, "v3", build=False, target="sm_90", persistent=pers).kernel_source)
    for bn, st in ((64, 2), (96, 3), (176, 2), (128, 1)):
        jobs.append(ac.compile(presets.causal(128), "v3", build=False, target="sm_90", block_n=bn,
                               stages=st).kernel_source)
    uniq = list(dict.fromkeys((k.source, k.arch) for k in jobs))
    t = time.time()
    n = precompile_to_disk(uniq, workers=16)
    print(f"precompiled {n} v3 kernels in {time.time() - t:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
