"""plain d128 at Nq = 16384 and short Nk (dense tiles of Nk / 128 blocks) with and without q_prefetch, untraced:
triton do_bench medians, 3 interleaved rounds, TFLOP/s over Nq x Nk pairs (B = 1, H = 16, bf16).

    PYTHONPATH=. python3 benchmarks/qpf_cross.py [NK ...]
"""
from __future__ import annotations

import sys

import torch


def main(argv: list[str]) -> int:
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.spec import presets

    nks = [int(a) for a in argv] or [1152]
    H, d, nq = 16, 128, 16384
    res: dict[tuple[int, bool], list[float]] = {}
    for _ in range(3):
        for nk in nks:
            q = torch.randn(1, H, nq, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(1, H, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            for qp in (False, True):
                kern = ac.compile(presets.plain(d), "v3", q_prefetch=qp)
                ms = do_bench(lambda: kern(q, k, v), warmup=25, rep=150, return_mode="median")
                res.setdefault((nk, qp), []).append(4 * H * d * nq * nk / ms / 1e9)
    for (nk, qp), xs in res.items():
        xs = sorted(xs)
        print(f"plain d128 Nq={nq} Nk={nk} q_prefetch={qp}: {xs[len(xs) // 2]:.1f} TFLOP/s (min {xs[0]:.1f}, max {xs[-1]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
