"""In-order vs LPT tile dealing (runtime/tile_list.py) under three timings of one kernel (GPU).

    PYTHONPATH=. python3 benchmarks/deal_timing.py [--rounds 3] [--n 16384]

Sliding window 1024, d = 128, B = 16k / N, H = 16, interleaved rounds: triton's do_bench (an L2 flush before each call,
what v3_sweep.py and bench_masked_scaling.py report), 200 calls back to back on rotated inputs (CUDA events around
the loop), and the same loop with an L2 flush (a 256 MB memset) between calls, timed around the kernels only.
"""
from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=16384)
    args = ap.parse_args(argv)
    import torch
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.runtime import tile_list
    from attncompiler.spec import presets

    shape = (max(1, 16384 // args.n), 16, args.n, 128)
    sets = [tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(3)]
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for deal in ("in_order", "lpt"):
            tile_list.DEAL = deal  # a kernel compiled anew records its launch, list included, at its first call
            kern = ac.compile(presets.sliding_window(1024, 128), "v3")
            it = [0]

            def step() -> None:
                q, k, v = sets[it[0] % 3]
                it[0] += 1
                kern(q, k, v)

            res.setdefault((deal, "do_bench"), []).append(do_bench(step, warmup=50, rep=300, return_mode="median"))
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            for _ in range(20):
                step()
            ev[0].record()
            for _ in range(200):
                step()
            ev[1].record()
            torch.cuda.synchronize()
            res.setdefault((deal, "back to back"), []).append(ev[0].elapsed_time(ev[1]) / 200)
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(100)]
            for a, b in pairs:
                flush.zero_()
                a.record()
                step()
                b.record()
            torch.cuda.synchronize()
            res.setdefault((deal, "flushed, events"), []).append(statistics.median(a.elapsed_time(b) for a, b in pairs))
    print(f"N = {args.n}", flush=True)
    for how in ("do_bench", "back to back", "flushed, events"):
        a, b = (statistics.median(res[(d, how)]) for d in ("in_order", "lpt"))
        print(f"{how:16s} in_order {a * 1e3:7.1f} us   lpt {b * 1e3:7.1f} us   lpt / in_order {b / a:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
