"""Masked work scales with visible work: sliding window 1024 vs full attention at N = 16k (GPU).

    PYTHONPATH=. python3 benchmarks/bench_masked_scaling.py [--n 16384] [--window 1024] [--tuned]
        [--schedule v2|v3] [--plans 128x64w4s2,64x64w4s2 | --plans block_n=128:persistent=true,...] [--diag]

``--schedule`` (default v2) picks the forward schedule timed; with v3 the ``--plans`` are plan_v3
options as ``option=value`` pairs joined by ``:``.

bf16, d = 128, B = 1, H = 16.  The issue's criterion: t(window) / t(full) <= 1.3 x the visible
fraction (visible (q, k) pairs / N^2).  Also printed: the fraction of the score matrix in tiles the
classifier leaves non-empty (the floor any tiled kernel pays: a window's edges fill whole tiles),
the achieved HBM bandwidth of each run (the plan's IO report bytes / time) and TFLOP/s over the
visited tiles.  The plans are the model's (``--tuned``: both specs are autotuned at this shape first
-- v2 plans, cached per GPU -- and compiled with the tuned v2 plan's options).  Each kernel is checked against the float64 reference
at N = 2048 before it is timed.  Writes $OUT/bench_masked_scaling.json when $OUT is set.

``--plans`` also times the window with explicit v2 plan options (``BMxBNwWsS``, optional ``q`` for Q
in registers: ``compile(spec, "v2", block_m=BM, block_n=BN, num_warps=W, stages=S)``); the criterion
is then reported for the model's plan and for the best of the listed ones.  ``--diag`` adds the
references that split the window's overhead: full attention over exactly as many keys as one window
CTA visits (Nk = BLOCK_M + window, so every CTA runs the same number of FULL tiles with no mask code:
the cost of a short K/V loop by itself) and causal (half the tiles, one partial tile per CTA).
``--steady SECONDS`` also runs full attention and the window back to back for that long each while ``nvidia-smi``
samples the SM clock and board power (``clock_power.py``): every d = 128 kernel runs at the board's power limit on an
H100 / H200, so the ratio at steady power differs from the timed loop's (fortieth session: 1.427x back to back where
do_bench read 1.34-1.37x), and the ratio in cycles (time x clock) says how much of it is clock.
``--peers`` times the same criterion for FlexAttention (``torch.compile(flex_attention)``, its block
mask built before timing, same 128x128 block tiling floor) and cuDNN SDPA's short-loop efficiency (dense
Nk = 128 + window keys against Nk = N; SDPA has no sliding window of its own): what the fastest kernels
there are pay for short K/V loops on this GPU, in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys


def visible_fraction(n: int, window: int) -> float:
    """(q, k) pairs with 0 <= q - k <= window, over n^2."""
    w = min(window, n - 1)
    head = w * (w + 1) // 2  # rows q < w see q + 1 keys: sum_{q<w} (q + 1)
    tail = (n - w) * (w + 1)  # rows q >= w see w + 1 keys
    return (head + tail) / (n * n)


def parse_plan(text: str) -> dict:
    """``128x64w4s2`` (``q`` suffix: Q in registers) -> v2 plan options; ``block_n=128:persistent=true``
    (``option=value`` pairs joined by ``:``) -> v3 (or any schedule's) plan options as given."""
    if "=" in text:
        opts: dict = {}
        for item in text.strip().split(":"):
            key, _, val = item.partition("=")
            if not key or not val:
                raise argparse.ArgumentTypeError(f"plan: expected option=value pairs joined by ':', got {text!r}")
            opts[key] = val == "true" if val in ("true", "false") else int(val)
        return opts
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)(q?)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"plan: expected BMxBNwWsS[q] like 128x64w4s2, got {text!r}")
    bm, bn, w, st, q = m.groups()
    return dict(block_m=int(bm), block_n=int(bn), num_warps=int(w), stages=int(st), q_in_regs=bool(q))


def peer_ratios(B: int, H: int, N: int, d: int, window: int, reps: int) -> dict:
    """FlexAttention's t(window) / t(full) and cuDNN's per-pair cost at Nk = 128 + window vs Nk = N."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from attncompiler.runtime.autotune import benchmark_ms

    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    flex = torch.compile(flex_attention, dynamic=False)

    def window_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)

    block_mask = create_block_mask(window_mask, None, None, N, N, device="cuda")
    out = dict(flex_full=benchmark_ms(lambda i: flex(q, k, v), reps=reps, warmup=5),
               flex_window=benchmark_ms(lambda i: flex(q, k, v, block_mask=block_mask), reps=reps, warmup=5))
    nk = min(N, 128 + window)
    ks, vs = k[:, :, :nk].contiguous(), v[:, :, :nk].contiguous()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out["cudnn_full"] = benchmark_ms(lambda i: sdpa(q, k, v), reps=reps, warmup=5)
        out["cudnn_short"] = benchmark_ms(lambda i: sdpa(q, ks, vs), reps=reps, warmup=5)
    out["nk_short"] = nk
    return out


def steady_ratio(full_kern, win_kern, qkv: tuple, out, seconds: float, frac: float) -> dict:
    """Full attention and the window, each back to back for ``seconds`` (clock_power.measure): their times, SM clocks
    and board power, and the window's time over full's per visible fraction, in time and in cycles."""
    from clock_power import measure  # benchmarks/ is on sys.path when this runs as a script

    q, k, v = qkv
    tf, cf, pf = measure("full, back to back", lambda: full_kern(q, k, v, out=out), seconds)
    tw, cw, pw = measure("window, back to back", lambda: win_kern(q, k, v, out=out), seconds)
    r = dict(full_ms=tf, full_mhz=cf, full_w=pf, window_ms=tw, window_mhz=cw, window_w=pw,
             ratio_over_visible=tw / tf / frac, cycles_ratio_over_visible=tw * cw / (tf * cf) / frac)
    print(f"steady power: t(window) / t(full) = {tw:.4f} / {tf:.4f} ms = {r['ratio_over_visible']:.3f}x the visible "
          f"fraction ({cw:.0f} / {cf:.0f} MHz, {pw:.0f} / {pf:.0f} W); in cycles {r['cycles_ratio_over_visible']:.3f}x")
    return r


def main(argv: list[str] | None = None) -> int:
    import torch

    import attncompiler as ac
    from attncompiler.plan.planner import format_io_report, io_report
    from attncompiler.runtime.autotune import autotune, benchmark_ms
    from attncompiler.spec import presets
    from attncompiler.testing import check_kernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tuned", action="store_true", help="autotune both specs first, then use the tuned plans")
    ap.add_argument("--plans", type=lambda t: [parse_plan(x) for x in t.split(",") if x], default=[],
                    help="also time the window with these v2 plans, e.g. 128x64w4s2,64x64w4s2")
    ap.add_argument("--diag", action="store_true", help="also time the dense short-loop and causal references")
    ap.add_argument("--peers", action="store_true",
                    help="also time FlexAttention's window / full and cuDNN's short-loop efficiency (same run)")
    ap.add_argument("--steady", type=float, default=0.0,
                    help="also run full and window back to back this many seconds each, with SM clock and power")
    ap.add_argument("--schedule", default="v2", choices=("v2", "v3"),
                    help="the forward schedule timed (v3: sm_90 only; --plans then take option=value pairs)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_masked_scaling: expected a CUDA GPU, got none", file=sys.stderr)
        return 2
    B, H, N, d = 1, args.heads, args.n, args.head_dim
    specs = {"full": presets.plain(d), f"window {args.window}": presets.sliding_window(args.window, d)}
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = [tuple(torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for _ in range(3)]
    out = torch.empty(B, H, N, d, device="cuda", dtype=torch.bfloat16)
    sched = args.schedule
    print(f"# {torch.cuda.get_device_name()}: {sched} forward, bf16, B={B} H={H} N={N} d={d}", flush=True)
    res: dict[str, dict] = {}
    kerns: dict[str, object] = {}

    def run(name: str, kern, nk: int = N, show_io: bool = False) -> dict | None:
        chk = check_kernel(kern, 1, 2, 2048, min(nk, 2048))
        if not chk.ok:
            print(f"{name}: WRONG ANSWER at N=2048: {chk}", file=sys.stderr)
            return None
        kv = [(q, k[:, :, :nk].contiguous(), v[:, :, :nk].contiguous()) for q, k, v in sets] if nk != N else sets
        ms = benchmark_ms(lambda i: kern(*kv[i % len(kv)], out=out), reps=args.reps, warmup=5)
        rep = io_report(kern.plan, B, H, N, nk, mask=kern.ir.mask_expr)
        p = kern.plan
        r = res[name] = dict(ms=ms, plan=f"{p.block_m}x{p.block_n} w{p.num_warps} S{getattr(p, 'stages', 1)}"
                             f"{' q' if getattr(p, 'q_in_regs', False) else ''}"
                             f"{' persistent' if getattr(p, 'persistent', False) else ''}", nk=nk,
                             bytes=rep.schedule_bytes, flops=rep.flops, gbps=rep.schedule_bytes / ms / 1e6,
                             tflops=rep.flops / ms / 1e9, tile_fraction=rep.flops / (4 * B * H * N * N * d))
        print(f"{name:>22}: {ms:8.3f} ms  plan {r['plan']:<14} {r['tflops']:6.1f} TFLOP/s (visited "
              f"tiles)  {r['gbps']:7.1f} GB/s achieved HBM (IO report bytes / time)", flush=True)
        if show_io:
            print("\n".join("    " + ln for ln in format_io_report(rep).splitlines()[:6]))
        return r

    for name, spec in specs.items():
        if args.tuned:  # plans of the timed schedule only
            tuned = autotune(spec, (B, H, N, d), schedule=sched, max_candidates=8)
        kern = kerns[name] = ac.compile(spec, sched, **tuned.options) if args.tuned else ac.compile(spec, sched)
        if run(name, kern, show_io=name != "full") is None:
            return 1
    wname = f"window {args.window}"
    full, win = res["full"], res[wname]
    frac = visible_fraction(N, args.window)
    for opts in args.plans:
        tag = (":".join(f"{k}={v}" for k, v in opts.items()) if "q_in_regs" not in opts else
               f"{opts['block_m']}x{opts['block_n']}w{opts['num_warps']}s{opts['stages']}"
               f"{'q' if opts['q_in_regs'] else ''}")
        try:
            kern = ac.compile(specs[wname], sched, **opts)
        except Exception as e:  # an infeasible plan (registers, shared memory): say so, go on
            print(f"{wname} [{tag}]: not compiled: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        if run(f"{wname} [{tag}]", kern) is None:
            return 1
    if args.diag:
        wplan = ac.compile(specs[wname], sched).plan
        nk = min(N, wplan.block_m + args.window)
        dname = f"full Nk={nk} (dense)"
        run(dname, ac.compile(specs["full"], sched), nk=nk)
        run("causal", ac.compile(presets.causal(d), sched))
        dense = res[dname]
        print(f"\nshort-loop reference: full attention over Nk = BLOCK_M + window = {nk} keys (every CTA: "
              f"{-(-nk // wplan.block_n)} FULL tiles, no mask): {dense['ms']:.3f} ms = "
              f"{dense['ms'] / full['ms'] / frac:.3f}x the visible fraction of t(full); per visited tile vs full: "
              f"{dense['ms'] / dense['flops'] / (full['ms'] / full['flops']):.3f}x")
        c = res["causal"]
        print(f"causal: t / t(full) = {c['ms'] / full['ms']:.4f} (visible fraction ~0.5; per visited tile vs full: "
              f"{c['ms'] / c['flops'] / (full['ms'] / full['flops']):.3f}x)")
    peers = None
    if args.peers:
        peers = peer_ratios(B, H, N, d, args.window, args.reps)
        fr = peers["flex_window"] / peers["flex_full"]
        print(f"\npeers: FlexAttention window / full = {peers['flex_window']:.3f} / {peers['flex_full']:.3f} ms = "
              f"{fr / frac:.3f}x the visible fraction")
        nks = peers["nk_short"]
        print(f"peers: cuDNN dense Nk = {nks}: {peers['cudnn_short']:.3f} ms, Nk = {N}: {peers['cudnn_full']:.3f} ms; "
              f"per (q, k) pair {peers['cudnn_short'] / nks / (peers['cudnn_full'] / N):.3f}x the long loop's cost")
    steady = steady_ratio(kerns["full"], kerns[wname], sets[0], out, args.steady, frac) if args.steady > 0 else None
    ratio = win["ms"] / full["ms"]
    ok = ratio <= 1.3 * frac
    print(f"\nvisible fraction {frac:.4f}; non-empty-tile fraction {win['tile_fraction']:.4f} "
          f"(tiling floor {win['tile_fraction'] / frac:.3f}x the visible fraction)")
    print(f"t(window) / t(full) = {win['ms']:.3f} / {full['ms']:.3f} = {ratio:.4f} = {ratio / frac:.3f}x the visible "
          f"fraction (criterion <= 1.3x): {'PASS' if ok else 'FAIL'}")
    best_name = min((k for k in res if k.startswith(wname)), key=lambda k: res[k]["ms"])
    best = res[best_name]
    best_ratio = best["ms"] / full["ms"]
    if best_name != wname:
        print(f"best window plan {best['plan']}: {best['ms']:.3f} ms = {best_ratio / frac:.3f}x the visible fraction "
              f"(tiling floor {best['tile_fraction'] / frac:.3f}x): {'PASS' if best_ratio <= 1.3 * frac else 'FAIL'}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_masked_scaling.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), N=N, window=args.window, runs=res,
                           visible_fraction=frac, ratio=ratio, ratio_over_visible=ratio / frac, ok=ok,
                           best_plan=best["plan"], best_ratio_over_visible=best_ratio / frac, peers=peers,
                           steady=steady),
                      f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
