"""Sweep v3 tile options (BLOCK_N, STAGES) at N = 16k, bf16, H*d = 2048; prints TFLOP/s per config.

    PYTHONPATH=. python3 benchmarks/v3_sweep.py "128:plain:128:2,128:causal:128:3:p,..."   (":p" = persistent)
"""
from __future__ import annotations

import sys

import torch


def main(argv: list[str]) -> int:
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.spec import presets

    N = 16384
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    sets_by_d: dict[int, list] = {}
    for item in argv[0].split(","):
        d, var, bn, st, *rest = item.split(":")
        d, bn, st = int(d), int(bn), int(st)
        pers = bool(rest and rest[0] == "p")
        H = 2048 // d
        if d not in sets_by_d:
            sets_by_d[d] = [tuple(torch.randn(1, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                            for _ in range(3)]
        sets = sets_by_d[d]
        causal = var == "causal"
        flops = 4 * H * d * (N * (N + 1) / 2 if causal else N * N)
        try:
            kern = ac.compile(getattr(presets, var)(d), "v3", block_n=bn, stages=st, persistent=pers)
            it = [0]

            def step(kern=kern):
                q, k, v = sets[it[0] % 3]
                it[0] += 1
                return kern(q, k, v)

            ms = do_bench(step, warmup=50, rep=300, return_mode="median")
            print(f"d={d} {var} BN={bn} stages={st}{' persistent' if pers else ''}: {flops / ms / 1e9:.1f} TFLOP/s "
                  f"({ms:.3f} ms)", flush=True)
        except Exception as e:
            print(f"d={d} {var} BN={bn} stages={st}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
