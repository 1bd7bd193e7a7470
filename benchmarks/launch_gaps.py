"""What a v3 call costs outside its kernel: every GPU activity of one call, the kernel's own duration (CUPTI, through
torch.profiler) against the CUDA-event time the sweeps report, and calls back to back without the L2 flush.

    PYTHONPATH=. python3 benchmarks/launch_gaps.py "128:plain,128:sliding_window" [--n 16384] [--define NAME]

Items are ``v3_sweep.py``'s (``d:variant[:option=value...]``; B*N = 16k tokens, H*d = 2048, bf16). For each item:

  events      triton's do_bench median (L2 flushed before each call), the figure the sweeps turn into TFLOP/s
  kernel      the median CUPTI duration of the attention kernel over the profiled calls
  others      every other GPU activity one call launches (name, median duration): allocations that run a kernel,
              copies, memsets -- none is expected
  b2b         CUDA events around 20 calls issued back to back (no flush between), per call
  host        wall time per call issued from Python with the GPU idle (median of 50, each synchronized before)

events - kernel is what the event pair adds around the kernel (launch latency, the front of the queue); b2b - kernel is
what consecutive calls lose between kernels.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from _results import option_value
from bench_v3 import _spec
from v3_sweep import _visible_pairs, with_define


def measure(item: str, n_tokens: int, define: str | None) -> None:
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    import attncompiler as ac

    d_s, var, *opts = item.split(":")
    d = int(d_s)
    options = {k: option_value(v) for k, v in (o.split("=") for o in opts)}
    N = int(options.pop("n", n_tokens))
    B, H = n_tokens // N, 2048 // d
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kern = ac.compile(_spec(var, d, H, N), "v3", **options)
    if define:
        kern = with_define(kern, define)
    flops = 4 * B * H * d * _visible_pairs(var, N)
    for _ in range(5):
        kern(q, k, v)
    torch.cuda.synchronize()
    ev_ms = do_bench(lambda: kern(q, k, v), warmup=50, rep=300, return_mode="median")

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    calls = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            kern(q, k, v)
        torch.cuda.synchronize()
    durs: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            durs.setdefault(e.name, []).append(e.time_range.elapsed_us())
    kname = max(durs, key=lambda nm: statistics.median(durs[nm]) * (len(durs[nm]) >= calls))
    kern_us = statistics.median(durs[kname])
    others = {nm: (len(ts), statistics.median(ts)) for nm, ts in durs.items()
              if nm != kname and "zero" not in nm.lower() and "fill" not in nm.lower()}

    torch.cuda.synchronize()
    b2b = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000_000)  # keeps the GPU busy while the host queues the calls (else s waits on the host)
        s.record()
        for _ in range(20):
            kern(q, k, v)
        e.record()
        e.synchronize()
        b2b.append(s.elapsed_time(e) * 1e3 / 20)

    host = []
    for _ in range(50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kern(q, k, v)
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()

    ev_us, b2b_us = ev_ms * 1e3, statistics.median(b2b)
    print(f"{item} (N={N}, define={define}): events {ev_us:.1f} us ({flops / ev_ms / 1e9:.1f} TFLOP/s), "
          f"kernel {kern_us:.1f} us ({flops / kern_us / 1e6:.1f}), b2b {b2b_us:.1f} us ({flops / b2b_us / 1e6:.1f}), "
          f"host {statistics.median(host):.1f} us; events - kernel {ev_us - kern_us:.1f} us", flush=True)
    print(f"  kernel: {kname[:110]} x{len(durs[kname])}", flush=True)
    for nm, (cnt, med) in others.items():
        print(f"  other: {nm[:100]} x{cnt} median {med:.1f} us", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("items")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--define", default=None)
    args = ap.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    for item in args.items.split(","):
        try:
            measure(item, args.n, args.define)
        except Exception as e:  # noqa: BLE001 - one failing item must not end the run
            print(f"{item}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
