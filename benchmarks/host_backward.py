"""Host cost of a backward call while the GPU is busy (so no launch waits on the GPU): microseconds per
``run_backward`` call (the full path, then a recorded launch), each of its steps timed alone, then cProfile's top
functions.

    PYTHONPATH=. python3 benchmarks/host_backward.py ["128:causal:n=1024,64:plain:n=1024"] [--calls 200]

Items as v3_sweep.py's (``d:variant[:option=value...]``, B*N = 16k tokens, H*d = 2048, bf16). A long
``torch.cuda._sleep`` is queued before each loop, so every call only enqueues.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats

import torch
from _results import sweep_item
from bench_v3 import _spec
from host_forward import _busy_time


def main(argv: list[str] | None = None) -> int:
    import attncompiler as ac
    from attncompiler.runtime import backward as RB
    from attncompiler.runtime import launch as L

    ap = argparse.ArgumentParser()
    ap.add_argument("items", nargs="?", default="128:causal:n=1024,64:plain:n=1024")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rows", type=int, default=16)
    args = ap.parse_args(argv)
    for item in args.items.split(","):
        d, var, options, N, B, H = sweep_item(item)
        q, k, v, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        kern = ac.compile(_spec(var, d, H, N), "v3", **options)
        o, lse = kern(q, k, v, return_lse=True)
        scale = d ** -0.5
        bopts = getattr(kern, "backward_options", None)

        def call() -> None:
            RB.run_backward(kern.ir, kern.target, do, q, k, v, o, lse, None, {}, scale=scale, dropout_p=0.0,
                            seed=0, offset=0, options=bopts)

        recipes: dict = {}

        def recorded() -> None:  # the recorded launch of runtime/bwd_fastpath.py (the kernel's own buffers)
            RB.run_backward(kern.ir, kern.target, do, q, k, v, o, lse, None, {}, scale=scale, dropout_p=0.0,
                            seed=0, offset=0, options=bopts, recipes=recipes)

        for _ in range(5):
            call()
            recorded()
        torch.cuda.synchronize()
        print(f"{item}: {_busy_time(call, args.calls):.1f} us per backward call on the host (GPU busy); "
              f"recorded launch {_busy_time(recorded, args.calls):.1f} us", flush=True)
        dims = L.check_inputs(q, k, v, kern.ir)
        src = RB.bwd_source(kern.ir, kern.target, options=bopts)
        ws = torch.empty(2, B * H * src.nq_padded(N), device=q.device, dtype=torch.float32)
        dk, dv, dq = (torch.empty_like(t) for t in (k, v, q))
        dq_accum = RB.dq_accumulator(src, dims, q.device) if src.plan.dq_mode == "atomic" else None
        P, Bf = L.pack_params(q, k, v, o, lse, None, dims, scale=scale, dropout_p=0.0, seed=0, offset=0,
                              ir=kern.ir, buffers=[])
        sem = RB.turn_counters(src, dims, q.device)[0]
        bp = RB.bwd_params(do, dq, dk, dv, dq_accum, None, ws, src.nq_padded(N), sem)
        fns = RB.load_bwd(src, q.device.index or 0)
        maps = src.maps(P, bp, dims)
        parts = {
            "check_inputs": lambda: L.check_inputs(q, k, v, kern.ir),
            "bwd_source (cached)": lambda: RB.bwd_source(kern.ir, kern.target, options=bopts),
            "tma_checked_source": lambda: RB.tma_checked_source(src, kern.ir, kern.target,
                                                                (("q", q), ("k", k), ("v", v), ("dout", do)),
                                                                deterministic=False, options=bopts),
            "load_bwd (cached)": lambda: RB.load_bwd(src, q.device.index or 0),
            "lse.to().contiguous()": lambda: lse.to(torch.float32).contiguous(),
            "3 x empty + ws": lambda: (torch.empty_like(k), torch.empty_like(v), torch.empty_like(q),
                                      torch.empty(2, B * H * src.nq_padded(N), device=q.device,
                                                  dtype=torch.float32)),
            "dq_accumulator (empty)": lambda: RB.dq_accumulator(src, dims, q.device),
            "prepare_buffers": lambda: L.prepare_buffers(kern.ir, {}, q.device),
            "pack_params": lambda: L.pack_params(q, k, v, o, lse, None, dims, scale=scale, dropout_p=0.0, seed=0,
                                                 offset=0, ir=kern.ir, buffers=[]),
            "bwd_params": lambda: RB.bwd_params(do, dq, dk, dv, dq_accum, None, ws, src.nq_padded(N), sem),
            "src.maps": lambda: src.maps(P, bp, dims),
            "launch_bwd": lambda: RB.launch_bwd(src, fns, dims, P, bp, Bf, maps, q.device),
        }
        for name, fn in parts.items():
            print(f"  {name:28s} {_busy_time(fn, args.calls):7.2f} us", flush=True)
        torch.cuda._sleep(2_000_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
