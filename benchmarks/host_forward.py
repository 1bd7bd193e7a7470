"""Host cost of a v3 forward call while the GPU is busy (so no launch waits on the GPU): microseconds per call,
then cProfile's top functions.

    PYTHONPATH=. python3 benchmarks/host_forward.py ["128:sliding_window,128:plain:n=1024"] [--calls 300]

Items as v3_sweep.py's (``d:variant[:option=value...]``, B*N = 16k tokens, H*d = 2048, bf16). A long
``torch.cuda._sleep`` is queued first, so every call below only enqueues.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from _results import option_value
from bench_v3 import _spec


def main(argv: list[str] | None = None) -> int:
    import attncompiler as ac

    ap = argparse.ArgumentParser()
    ap.add_argument("items", nargs="?", default="128:sliding_window,128:plain:n=1024")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rows", type=int, default=18)
    args = ap.parse_args(argv)
    for item in args.items.split(","):
        d_s, var, *opts = item.split(":")
        d = int(d_s)
        options = {k: option_value(v) for k, v in (o.split("=") for o in opts)}
        N = int(options.pop("n", 16384))
        B, H = 16384 // N, 2048 // d
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        kern = ac.compile(_spec(var, d, H, N), "v3", **options)
        for _ in range(10):
            kern(q, k, v)
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time ahead of the calls
            t0 = time.perf_counter()
            for _ in range(args.calls):
                kern(q, k, v)
            times.append((time.perf_counter() - t0) / args.calls * 1e6)
            torch.cuda.synchronize()
        print(f"{item}: {min(times):.1f} us per call on the host (GPU busy; runs {', '.join(f'{t:.1f}' for t in times)})",
              flush=True)
        torch.cuda._sleep(2_000_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            kern(q, k, v)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
