"""v3 (Hopper TMA + wgmma) forward beside v2 and torch SDPA (cuDNN, flash) in one process, bf16.

    PYTHONPATH=. python3 benchmarks/bench_v3.py [--check] [--head-dims 64,128,256] [--variants plain,causal]

Shape: N = 16k, B*N = 16k tokens (B = 1), H*d = 2048.  FLOPs = 4*B*H*N^2*d, halved when causal
(window: the visible pairs).  Timing: triton's do_bench median (CUDA events) over three rotated input
sets; with ``--rounds R`` every backend of a row is timed R times, interleaved, and the median is
reported (the JSON line keeps the min / max).  ``--check`` first runs a few small correctness checks (error-ratio rule, float64 reference)
and prints them.  JSON lines go to $OUT/bench_v3.jsonl (or /tmp).
"""
from __future__ import annotations

import argparse
import json
import os
import traceback

import torch
import torch.nn.functional as F


# variants that are another variant's spec with extra v3 plan options (opt-in options, timed beside the default)
V3_OPTION_VARIANTS = {"softcap_q_prescale": ("softcap", {"q_prescale": True})}


def _spec(name: str, d: int, H: int, N: int):
    from attncompiler.spec import presets

    if name in V3_OPTION_VARIANTS:
        name = V3_OPTION_VARIANTS[name][0]

    if name == "alibi":
        return presets.alibi(presets.alibi_slopes(H), d)
    if name == "alibi_causal":
        return presets.alibi(presets.alibi_slopes(H), d, causal=True)
    if name == "softcap":
        return presets.softcap(30.0, d)
    if name.startswith("sliding_window"):  # sliding_window (1024) or sliding_windowW: 0 <= q - kv <= W
        return presets.sliding_window(int(name[len("sliding_window"):] or 1024), d)
    if name == "fullmask":  # a mask that hides nothing: its code compiled in, every tile FULL (plain's work)
        return presets.plain(d, mask_mod=lambda b, h, q, kv: kv <= q + 2**30, name="fullmask")
    return presets.get_preset(name, head_dim=d, num_heads=H, seqlen=N)


def checks() -> None:
    import attncompiler as ac
    from attncompiler.testing import check_kernel

    cases = [("plain", 128, "bf16", 256), ("plain", 128, "bf16", 113), ("causal", 128, "bf16", 1023),
             ("plain", 64, "fp16", 1023), ("causal", 256, "bf16", 1023), ("alibi", 128, "bf16", 1023),
             ("softcap", 64, "bf16", 517), ("sliding_window", 128, "bf16", 3000)]
    for name, d, dt, n in cases:
        try:
            spec = _spec(name, d, 3, n)
            if dt != "bf16":
                import dataclasses
                spec = dataclasses.replace(spec, dtype=dt)
            kern = ac.compile(spec, "v3")
            res = check_kernel(kern, 2, 3, n)
            print(f"check v3 {name} d={d} {dt} N={n}: {'OK' if res.ok else 'FAIL'} {res}", flush=True)
        except Exception:  # report and go on: one call should show every case
            print(f"check v3 {name} d={d} {dt} N={n}: ERROR", flush=True)
            traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import attncompiler as ac

    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--variants", default="plain,causal")
    ap.add_argument("--schedules", default="v3,v2")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--v3-options", default="", help="e.g. block_n=176,stages=2")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every backend of a row this many times, interleaved; report the medians")
    args = ap.parse_args(argv)
    if args.check:
        checks()
    opts = {k: int(v) for k, v in (kv.split("=") for kv in args.v3_options.split(",") if kv)}
    out_path = os.path.join(os.environ.get("OUT", "/tmp"), "bench_v3.jsonl")
    fout = open(out_path, "a")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    table = []
    N = args.seqlen
    for d in (int(x) for x in args.head_dims.split(",")):
        H = 2048 // d
        B = max(1, 16384 // N)
        sets = [tuple(torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(3)]
        for var in args.variants.split(","):
            causal = var in ("causal", "alibi_causal")
            pairs = N * N if not causal else N * (N + 1) / 2
            if var == "sliding_window":
                w = 1024
                pairs = sum(min(i + 1, w + 1) for i in range(N)) if N <= 65536 else N * w
            flops = 4 * B * H * pairs * d
            fns = {}
            for sched in args.schedules.split(","):
                try:
                    extra = V3_OPTION_VARIANTS.get(var, ("", {}))[1]
                    if sched != "v3" and extra:
                        continue  # a v3 plan option: v3 only
                    kern = ac.compile(_spec(var, d, H, N), sched, **({**opts, **extra} if sched == "v3" else {}))
                    it = [0]

                    def step(kern=kern, it=it):
                        q, k, v = sets[it[0] % 3]
                        it[0] += 1
                        return kern(q, k, v)

                    fns[sched] = step
                except Exception as e:
                    print(f"{sched} {var} d={d}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            if var in ("plain", "causal"):
                for be_name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    it = [0]

                    def peer(be=be, it=it, causal=causal):
                        q, k, v = sets[it[0] % 3]
                        it[0] += 1
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    fns[be_name] = peer
            samples: dict[str, list[float]] = {}
            for _ in range(max(1, args.rounds)):  # interleaved: drift spreads over every backend of the row
                for name, fn in list(fns.items()):
                    try:
                        ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
                        samples.setdefault(name, []).append(flops / ms / 1e9)
                    except Exception as e:
                        print(f"{name} {var} d={d}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                        del fns[name]
            res = {name: sorted(ts)[len(ts) // 2] for name, ts in samples.items()}
            row = {"d": d, "H": H, "B": B, "N": N, "variant": var, "tflops": {k: round(v, 1) for k, v in res.items()},
                   "v3_options": opts, "rounds": max(1, args.rounds),
                   "range": {k: [round(min(ts), 1), round(max(ts), 1)] for k, ts in samples.items()}}
            fout.write(json.dumps(row) + "\n")
            fout.flush()
            table.append(row)
            print(json.dumps(row), flush=True)
    print("\n| d | variant | " + " | ".join(["v3", "v2", "cudnn", "flash", "v3/cudnn", "v3/v2"]) + " |")
    for r in table:
        t = r["tflops"]
        def f(k):
            return f"{t[k]:.0f}" if k in t else "-"
        def ratio(a, b):
            return f"{t[a] / t[b]:.2f}" if a in t and b in t else "-"
        print(f"| {r['d']} | {r['variant']} | {f('v3')} | {f('v2')} | {f('cudnn')} | {f('flash')} | "
              f"{ratio('v3', 'cudnn')} | {ratio('v3', 'v2')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
