"""The v3 score skip against the same plan without it, by sequence length: ALiBi's slopes (the skip pays) and
flat slopes 2^-8 (nothing to skip: what the bound's pass costs).

    PYTHONPATH=. python3 benchmarks/score_skip.py [--rounds 3] [--schedule v3|v2] [--head-dims 64,128]

bf16, B*N = 16k tokens, H*d = 2048, non-causal, d = 64 and 128 (``--head-dims``); N = 1024 .. 16384. Prints microseconds per
call (Triton's do_bench, median over the rounds, the two kernels interleaved) and no-skip / skip.
"""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    import torch
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schedule", default="v3", choices=("v2", "v3"))
    ap.add_argument("--head-dims", default="64,128")
    args = ap.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, schedule {args.schedule}", flush=True)
    for d in (int(x) for x in args.head_dims.split(",")):
        H = 2048 // d
        for slopes_name, slopes in (("alibi", presets.alibi_slopes(H)), ("flat 2^-8", torch.full((H,), 2.0**-8))):
            spec = presets.alibi(slopes, d)
            on = ac.compile(spec, args.schedule)
            off = ac.compile(spec, args.schedule, **{**on.plan.options, "score_skip": False})
            for N in (1024, 2048, 4096, 16384):
                B = max(1, 16384 // N)
                q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                ts: dict[str, list[float]] = {"on": [], "off": []}
                for _ in range(args.rounds):
                    for name, kern in (("on", on), ("off", off)):
                        ts[name].append(do_bench(lambda kern=kern: kern(q, k, v), warmup=5, rep=40))
                t_on, t_off = (sorted(ts[n])[len(ts[n]) // 2] for n in ("on", "off"))
                print(f"d={d} {slopes_name:9s} B={B:2d} N={N:5d}: skip {t_on * 1e3:8.1f} us  no skip "
                      f"{t_off * 1e3:8.1f} us  no skip / skip {t_off / t_on:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
