"""Host cost of packed-sequence calls while the GPU is busy (so no launch waits on the GPU): microseconds per
no-grad forward, per autograd forward and per backward, from their recorded launches and on the full path (the
recordings dropped before each call), beside the padded calls of the same kernel; then cProfile's top functions of
the packed calls.

    PYTHONPATH=. python3 benchmarks/host_varlen.py [--head-dim 128] [--calls 200] [--rows 14] [--rounds 1]

Causal bf16, H = 16, eight sequences of 64-1000 tokens (short kernels, where host time shows). A long
``torch.cuda._sleep`` is queued before each loop, so every call only enqueues.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats

import torch
from host_forward import _busy_time


def main(argv: list[str] | None = None) -> int:
    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rows", type=int, default=14, help="cProfile rows (0: no profile)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    H, D = 16, args.head_dim
    lens = [64, 1000, 300, 512, 77, 640, 128, 900]
    tq, mx = sum(lens), max(lens)
    cu = torch.tensor([0, *lens]).cumsum(0).to(device="cuda", dtype=torch.int32)
    kern = ac.compile(presets.causal(D), "auto")
    q, k, v, do = (torch.randn(tq, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    qp, kp, vp, dop = (torch.randn(1, H, 1024, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qpg, kpg, vpg = (t.clone().requires_grad_() for t in (qp, kp, vp))
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)

    def packed_fwd() -> None:
        with torch.no_grad():
            kern(q, k, v, **kw)

    def packed_fwd_grad() -> None:
        kern(qg, kg, vg, **kw)

    o = kern(qg, kg, vg, **kw)

    def packed_bwd() -> None:
        torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)

    def padded_fwd() -> None:
        with torch.no_grad():
            kern(qp, kp, vp)

    def padded_fwd_grad() -> None:
        kern(qpg, kpg, vpg)

    op = kern(qpg, kpg, vpg)

    def padded_bwd() -> None:
        torch.autograd.grad(op, (qpg, kpg, vpg), dop, retain_graph=True)

    def full(fn, table):  # the full path: the recordings dropped before each call (which then records again)
        def call() -> None:
            table.clear()
            fn()
        return call

    calls = {"packed forward, no grad": packed_fwd,
             "packed forward, no grad, full path": full(packed_fwd, kern._recipes),
             "packed forward, autograd": packed_fwd_grad,
             "packed forward, autograd, full path": full(packed_fwd_grad, kern._recipes),
             "packed backward": packed_bwd, "packed backward, full path": full(packed_bwd, kern._bwd_recipes),
             "padded forward, no grad (1, 16, 1024)": padded_fwd, "padded forward, autograd": padded_fwd_grad,
             "padded backward": padded_bwd}
    for fn in calls.values():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}  causal bf16 d={D} H={H} {kern.schedule}, packed lens {lens}", flush=True)
    for r in range(args.rounds):
        for name, fn in calls.items():
            print(f"  round {r}  {name:40s} {_busy_time(fn, args.calls):7.1f} us per call on the host", flush=True)
    for name in ("packed forward, no grad", "packed backward") if args.rows else ():
        torch.cuda._sleep(2_000_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            calls[name]()
        prof.disable()
        torch.cuda.synchronize()
        print(f"--- {name}: cProfile", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
