"""attncompiler v3 against FlexAttention on score_mod variants, the shape of the brief's Flex figures.

    PYTHONPATH=. python3 benchmarks/flex_variants.py [--rounds 5]

bf16, N = 8k, B = 2, H*d = 2048, non-causal, head dims 64 and 128; variants ALiBi (``s + slope[h] *
(kv - q)``), plain and soft-capping 30. Flex is ``torch.compile(flex_attention)`` with the same
score_mod as a Python callable. Every (variant, backend) is timed once per round (Triton's do_bench
median), rounds interleaved, and the medians over the rounds are printed with the ratio's range.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.spec import presets

    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--rounds", type=int, default=5)
    opts = args.parse_args(argv)
    flex = torch.compile(flex_attention, dynamic=False)
    N, B = 8192, 2
    cases = []
    for d in (64, 128):
        H = 2048 // d
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        slopes = presets.alibi_slopes(H).to("cuda")
        mods = {
            "alibi": (lambda s, b, h, qi, ki, sl=slopes: s + sl[h] * (ki - qi), presets.alibi(presets.alibi_slopes(H), d)),
            "plain": (None, presets.plain(d)),
            "softcap": (lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0), presets.softcap(30.0, d)),
        }
        for name, (mod, spec) in mods.items():
            kern = ac.compile(spec, "v3")
            cases.append((d, name, lambda kern=kern, q=q, k=k, v=v: kern(q, k, v),
                          lambda mod=mod, q=q, k=k, v=v: flex(q, k, v, score_mod=mod), 4.0 * B * H * N * N * d))
    res: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    for _ in range(opts.rounds):
        for d, name, ours, theirs, flops in cases:
            t_o = do_bench(ours, warmup=25, rep=150, return_mode="median")
            t_f = do_bench(theirs, warmup=25, rep=150, return_mode="median")
            res.setdefault((d, name), []).append((flops / t_o / 1e9, flops / t_f / 1e9, t_f / t_o))
    print(f"# {torch.cuda.get_device_name()}, N={N}, B={B}, bf16, medians of {opts.rounds} interleaved rounds")
    for (d, name), rows in res.items():
        def med(i: int) -> float:
            return sorted(x[i] for x in rows)[len(rows) // 2]
        lo, hi = min(x[2] for x in rows), max(x[2] for x in rows)
        print(f"d={d} {name}: v3 {med(0):.0f}  flex {med(1):.0f} TFLOP/s  v3/flex {med(2):.2f} (range {lo:.2f}-{hi:.2f})",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
