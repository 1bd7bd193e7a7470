"""Is the sliding window's per-block excess over dense attention memory-side? The window 1024 (d = 128, N = 16k,
H = 16) with its own K/V per head against the same kernel with one K/V head shared by all 16 (GQA, H_kv = 1: the
K/V stream is 8 MB and stays in L2, as dense attention over 1152 keys does), and dense Nk = 1152 (H_kv 16 and 1).

    PYTHONPATH=. python3 benchmarks/window_kv_l2.py [ROUNDS]

Prints ms per call (CUDA events, median of ROUNDS interleaved rounds of 20 calls after a warm-up)."""
from __future__ import annotations

import statistics
import sys

import torch

import attncompiler as ac
from attncompiler.spec import presets


def _time(fn, reps: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main(argv: list[str] | None = None) -> int:
    rounds = int((argv or sys.argv[1:] or ["5"])[0])
    n, h, d = 16384, 16, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, h, n, d, device="cuda", generator=g).bfloat16()
    cases = {}
    for label, spec, nk in (("window", presets.sliding_window(1024, d), n), ("dense 1152", presets.plain(d), 1152)):
        kern = ac.compile(spec, "v3")
        for hkv in (h, 1):
            k, v = (torch.randn(1, hkv, nk, d, device="cuda", generator=g).bfloat16() for _ in range(2))
            out = torch.empty_like(q)
            fn = (lambda kern=kern, k=k, v=v, out=out: kern(q, k, v, out=out))
            fn()
            cases[f"{label}, H_kv = {hkv}"] = fn
    res: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            _time(fn, 3)
            res[name].append(_time(fn))
    print(f"# {torch.cuda.get_device_name()}, plan {kern.plan.block_m}x{kern.plan.block_n} stages {kern.plan.stages}"
          f" persistent {kern.plan.persistent}")
    for name, xs in res.items():
        print(f"{name:22s} {statistics.median(xs):.4f} ms (min {min(xs):.4f}, max {max(xs):.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
