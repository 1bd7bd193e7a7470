"""Packed sequences (varlen) vs the same batch padded to its longest sequence: forward and
forward+backward times (median of triton.testing.do_bench), causal, bf16.

    PYTHONPATH=. python3 benchmarks/varlen_bench.py [--head-dim 128] [--heads 16] [--schedule v2|v3|auto]
        [--backward auto,v2,v3:dq_red=1]

The schedule is the compiled kernel's (v3: Hopper; packed batches then run the v3 varlen forward). The
backward runs once per ``--backward`` schedule (``kern.backward_options["schedule"]``: auto = v3 on sm_90 at
d = 48-128, packed batches included, else v2; ``schedule:option=value...`` adds backward plan options), so the
backwards are compared in one process.
"""
from __future__ import annotations

import argparse

import torch


def main() -> None:
    import triton.testing

    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--schedule", default="v2")
    ap.add_argument("--backward", default="auto", help="comma-separated backward schedules: auto, v2, v3")
    args = ap.parse_args()
    D, H = args.head_dim, args.heads
    kern = ac.compile(presets.causal(D), args.schedule)
    g = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  causal bf16 d={D} H={H} schedule={kern.schedule}")
    print(f"{'seqlens':44s} {'fwd varlen':>11s} {'fwd padded':>11s} {'f+b varlen':>11s} {'f+b padded':>11s}")
    rand = torch.randint(1, 2048, (32,), generator=g).tolist()
    for lens in ([4096] * 4, [512, 3000, 128, 4096, 1000, 77, 2048, 300], rand):
        tq, B, mx = sum(lens), len(lens), max(lens)
        cu = torch.tensor([0, *lens]).cumsum(0).to(device="cuda", dtype=torch.int32)
        q, k, v = (torch.randn(tq, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        qp, kp, vp = (torch.randn(B, H, mx, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                      for _ in range(3))
        do = torch.randn(tq, H, D, device="cuda", dtype=torch.bfloat16)
        dop = torch.randn(B, H, mx, D, device="cuda", dtype=torch.bfloat16)

        def fv():
            with torch.no_grad():
                kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)

        def fp():
            with torch.no_grad():
                kern(qp, kp, vp)

        def bv():
            o = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)
            torch.autograd.grad(o, (q, k, v), do)

        def bp():
            o = kern(qp, kp, vp)
            torch.autograd.grad(o, (qp, kp, vp), dop)

        name = str(lens) if len(lens) <= 8 else f"{len(lens)} random in [1, 2048), total {tq}"
        for bwd in args.backward.split(","):
            sched, *opts = bwd.split(":")
            kern.backward_options = {"schedule": sched,
                                     **{k: int(v) if v.isdigit() else v for k, v in (o.split("=") for o in opts)}}
            t = [triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median") for f in (fv, fp, bv, bp)]
            print(f"{name[:36]:36s} bwd {bwd:4s}" + " ".join(f"{x:9.3f}ms" for x in t))
            kt = [_kernel_ms(f) for f in (fv, fp, bv, bp)]
            print(f"{'  kernels only (profiler, attn_*)':44s} " + " ".join(f"{x:9.3f}ms" for x in kt))


def _kernel_ms(fn, reps: int = 10) -> float:
    """Device time of the attncompiler kernels (attn_*) per call, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    us = sum(e.device_time_total for e in prof.key_averages() if e.key.startswith("attn_"))
    return us / reps / 1000.0


if __name__ == "__main__":
    main()
