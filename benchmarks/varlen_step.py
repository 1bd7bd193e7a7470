"""Packed sequences: forward + backward step time under several backward plans, interleaved in one process.

    PYTHONPATH=. python3 benchmarks/varlen_step.py [--head-dim 128] [--heads 16] [--rounds 7] [--steps 20]
        [--backward v3:dq_red=1,v3:dq_red=2]

Causal bf16 through the automatic forward. Each round times ``--steps`` steps of every backward plan in turn
(synchronized at both ends), so that the host's drift between rounds hits every plan alike (timing the plans one
after the other once read as a host stall that was not there: docs/backward.md, twenty-second session). Prints per
plan the median step time, the range over rounds, the median time for ``torch.autograd.grad`` to return (the
backward's host time), and the profiler's device time per step with its largest kernels.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _options(item: str) -> dict:
    sched, *opts = item.split(":")
    return {"schedule": sched, **{k: int(v) if v.isdigit() else v for k, v in (o.split("=") for o in opts)}}


def main() -> None:
    import attncompiler as ac
    from attncompiler.spec import presets
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backward", default="v3:dq_red=1,v3:dq_red=2", help="comma-separated schedule:option=value")
    args = ap.parse_args()
    H, D = args.heads, args.head_dim
    kern = ac.compile(presets.causal(D), "auto")
    modes = {m: _options(m) for m in args.backward.split(",")}
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(1, 2048, (32,), generator=g).tolist()
    print(f"{torch.cuda.get_device_name()}  causal bf16 d={D} H={H} forward {kern.schedule}", flush=True)
    for lens in ([512, 3000, 128, 4096, 1000, 77, 2048, 300], [4096] * 4, rand):
        tq, mx = sum(lens), max(lens)
        cu = torch.tensor([0, *lens]).cumsum(0).to(device="cuda", dtype=torch.int32)
        q, k, v = (torch.randn(tq, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(tq, H, D, device="cuda", dtype=torch.bfloat16)

        def step(m: str, marks: list[float] | None = None) -> None:
            kern.backward_options = modes[m]
            o = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)
            t0 = time.perf_counter()
            torch.autograd.grad(o, (q, k, v), do)
            if marks is not None:
                marks.append(time.perf_counter() - t0)

        for m in modes:
            for _ in range(5):
                step(m)
        wall: dict[str, list[float]] = {m: [] for m in modes}
        host: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for m in modes:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step(m, host[m])
                torch.cuda.synchronize()
                wall[m].append((time.perf_counter() - t0) / args.steps * 1e3)
        name = str(lens) if len(lens) <= 8 else f"32 random, total {tq}"
        for m in modes:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step(m)
                torch.cuda.synchronize()
            evs = [(e.key, e.device_time_total / 10) for e in prof.key_averages() if e.device_time_total > 0]
            top = "; ".join(f"{k[:40]} {t:.0f}" for k, t in sorted(evs, key=lambda x: -x[1])[:6])
            print(f"{name[:40]:40s} {m}: step {statistics.median(wall[m]):.3f} ms ({min(wall[m]):.3f}-"
                  f"{max(wall[m]):.3f}), backward host {statistics.median(host[m]) * 1e3:.3f} ms, device "
                  f"{sum(t for _, t in evs):.0f} us/step: {top}", flush=True)


if __name__ == "__main__":
    main()
