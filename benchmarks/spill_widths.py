"""One spec's kernel at several key-tile widths: ptxas's report and the time of each (spill thresholds).

    PYTHONPATH=. python3 benchmarks/spill_widths.py SEED BLOCK_N [BLOCK_N ...] [--n 4096] [--rounds 3]
        [--schedule v3|v2] [--preset NAME --head-dim D]

The spec is ``attncompiler.fuzz.random_spec(SEED, max_seqlen=n)``, or with ``--preset`` the preset NAME at head dim
D (SEED is then ignored; ALiBi gets H slopes); B = 4, H = 4, Nq = Nk = n, bf16 unless the fuzz spec says fp16;
triton's do_bench median over interleaved rounds, TFLOP/s over all pairs (4 B H N^2 D). v2 on sm_90 spills where
v2 on sm_80 does (thirty-seventh session: ALiBi d128 at BLOCK_N 64, 104 B of stores on sm_90a, 40 B on sm_80), so
an H200 can measure v2's thresholds too.
"""
from __future__ import annotations

import argparse

import torch


def main(argv: list[str] | None = None) -> int:
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler import fuzz
    from attncompiler.runtime.compiler import ptxas_report

    ap = argparse.ArgumentParser()
    ap.add_argument("seed", type=int)
    ap.add_argument("widths", nargs="+", type=int)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schedule", default="v3", choices=("v3", "v2"))
    ap.add_argument("--preset", default=None)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args(argv)
    if args.preset:
        from attncompiler.spec import presets

        spec = presets.get_preset(args.preset, head_dim=args.head_dim, num_heads=4, seqlen=args.n)
        print(f"preset {args.preset} d {args.head_dim}, {args.schedule}", flush=True)
    else:
        fs = fuzz.random_spec(args.seed, max_seqlen=args.n)
        spec = fs.spec
        print(f"seed {args.seed}: {fs.description.splitlines()[0]}, {args.schedule}", flush=True)
    kerns = {}
    for bn in args.widths:
        kern = ac.compile(spec, args.schedule, block_n=bn)
        ks = kern.kernel_source
        print(f"  BLOCK_N {bn}: {ptxas_report(ks.source, ks.arch)}", flush=True)
        kerns[bn] = kern
    base = next(iter(kerns.values()))
    dt = torch.bfloat16 if base.ir.dtype == "bf16" else torch.float16
    d, dv = base.ir.head_dim, base.ir.head_dim_v
    q, k = (torch.randn(4, 4, args.n, d, device="cuda", dtype=dt) for _ in range(2))
    v = torch.randn(4, 4, args.n, dv, device="cuda", dtype=dt)
    flops = 4 * 4 * 4 * args.n * args.n * d
    rows: dict[int, list[float]] = {}
    for _ in range(args.rounds):
        for bn, kern in kerns.items():
            ms = do_bench(lambda kern=kern: kern(q, k, v), warmup=10, rep=60, return_mode="median")
            rows.setdefault(bn, []).append(flops / ms / 1e9)
    for bn, r in rows.items():
        print(f"  BLOCK_N {bn}: {sorted(r)[len(r) // 2]:.1f} TFLOP/s (median of {len(r)})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
