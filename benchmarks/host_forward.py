"""Host cost of a v3 forward call while the GPU is busy (so no launch waits on the GPU): microseconds per call,
then cProfile's top functions; ``--parts``: each step of the call timed alone, and the whole call with ``out=``
(recorded and full path); ``--sdpa``: torch SDPA's call.

    PYTHONPATH=. python3 benchmarks/host_forward.py ["128:sliding_window,128:plain:n=1024"] [--calls 300] [--parts]

Items as v3_sweep.py's (``d:variant[:option=value...]``, B*N = 16k tokens, H*d = 2048, bf16). A long
``torch.cuda._sleep`` is queued first, so every call below only enqueues.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from _results import sweep_item
from bench_v3 import _spec


def main(argv: list[str] | None = None) -> int:
    import attncompiler as ac

    ap = argparse.ArgumentParser()
    ap.add_argument("items", nargs="?", default="128:sliding_window,128:plain:n=1024")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rows", type=int, default=18)
    ap.add_argument("--sort", default="tottime", help="pstats sort keys, comma-separated (tottime,cumulative)")
    ap.add_argument("--sdpa", action="store_true", help="also time torch SDPA's call (flash backend) the same way")
    ap.add_argument("--parts", action="store_true", help="time each step of the call alone (no cProfile)")
    args = ap.parse_args(argv)
    for item in args.items.split(","):
        d, var, options, N, B, H = sweep_item(item)
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        kern = ac.compile(_spec(var, d, H, N), "v3", **options)
        for _ in range(10):
            kern(q, k, v)
        torch.cuda.synchronize()
        print(f"{item}: {_busy_time(lambda: kern(q, k, v), args.calls):.1f} us per call on the host (GPU busy)",
              flush=True)
        if args.sdpa:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            from torch.nn.functional import scaled_dot_product_attention as sdpa

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                t = _busy_time(lambda: sdpa(q, k, v), args.calls)
            print(f"{item}: SDPA (flash) {t:.1f} us per call on the host", flush=True)
        if args.parts:
            _parts(kern, q, k, v, args.calls)
            continue
        torch.cuda._sleep(2_000_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            kern(q, k, v)
        prof.disable()
        torch.cuda.synchronize()
        for key in args.sort.split(","):
            pstats.Stats(prof).sort_stats(key).print_stats(args.rows)
    return 0


def _busy_time(fn, calls: int) -> float:
    """Microseconds per ``fn()`` with the GPU busy (minimum of three loops)."""
    best = float("inf")
    for _ in range(3):
        torch.cuda._sleep(1_000_000_000)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def _parts(kern, q, k, v, calls: int) -> None:
    """The steps of one call: the recorded launch's (runtime/fastpath.py) and the full path's."""
    from attncompiler.codegen.schedule import get_schedule
    from attncompiler.runtime import fastpath
    from attncompiler.runtime import launch as L

    ks = kern.kernel_source
    dims = L.check_inputs(q, k, v, kern.ir)
    o = torch.empty(q.shape[:3] + (kern.ir.head_dim_v,), device=q.device, dtype=q.dtype)
    P, Bf = L.pack_params(q, k, v, o, None, None, dims, scale=0.1, dropout_p=0.0, seed=0, offset=0, ir=kern.ir,
                          buffers=[])
    fl = get_schedule("v3").forward_launch(ks, dims, Bf, q.device)
    recipe = next(iter(kern._recipes.values()))

    def full() -> None:
        kern._recipes.clear()
        kern(q, k, v)

    out = torch.empty_like(o)
    kern(q, k, v, out=out)  # records the out= signature

    def full_out() -> None:
        kern._recipes.clear()
        kern(q, k, v, out=out)

    parts = {
        "whole call (recorded launch)": lambda: kern(q, k, v),
        "whole call (full path)": full,
        "whole call, out= (recorded launch)": lambda: kern(q, k, v, out=out),
        "whole call, out= (full path)": full_out,
        "  signature": lambda: fastpath.signature(q, k, v, False, None, None),
        "  fastpath.run": lambda: fastpath.run(recipe, q, k, v, None, 0, kern._buffers),
        "  launch alone": lambda: fl.launch(P, 0),
        "  torch.empty (o)": lambda: torch.empty(recipe.o_shape, device=q.device, dtype=q.dtype),
        "  check_inputs": lambda: L.check_inputs(q, k, v, kern.ir),
        "  pack_params": lambda: L.pack_params(q, k, v, o, None, None, dims, scale=0.1, dropout_p=0.0, seed=0,
                                               offset=0, ir=kern.ir, buffers=[]),
        "  forward_launch (lookups)": lambda: get_schedule("v3").forward_launch(ks, dims, Bf, q.device),
    }
    for name, fn in parts.items():
        print(f"  {name:32s} {_busy_time(fn, calls):7.2f} us", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
