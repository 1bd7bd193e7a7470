"""Where the host time of a small forward+backward step goes: wall time of the forward with grad, of the backward
alone, and torch.profiler's CPU-side table (self CPU time per op / Python function) of a few steps.

    PYTHONPATH=. python3 benchmarks/host_breakdown.py [--steps 200]
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    kern = ac.compile(presets.causal(128))
    q, k, v = (torch.randn(1, 16, 256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 16, 256, 128, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        kern(q, k, v).backward(do)
    torch.cuda.synchronize()
    fwd = bwd = 0.0
    for _ in range(args.steps):
        q.grad = k.grad = v.grad = None
        t0 = time.perf_counter()
        o = kern(q, k, v)
        t1 = time.perf_counter()
        o.backward(do)
        t2 = time.perf_counter()
        fwd += t1 - t0
        bwd += t2 - t1
    torch.cuda.synchronize()
    print(f"host us per step: forward with grad {fwd / args.steps * 1e6:.0f}, backward {bwd / args.steps * 1e6:.0f} "
          f"(grads set to None each step)")
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, with_stack=False) as prof:
        for _ in range(20):
            q.grad = k.grad = v.grad = None
            kern(q, k, v).backward(do)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
