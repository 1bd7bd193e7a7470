"""The v2 backward's spilling plans against narrower ones: ptxas's spills (NVRTC, this GPU's arch) and backward time
per plan, interleaved rounds, bf16, B*N = 16k tokens, H*d = 2048.

    PYTHONPATH=. python3 benchmarks/v2_bwd_spill_ab.py [--n 4096] [--rounds 3] [--cases causal:64,dropout:64,...]

Each case runs the v2 backward (``backward_options["schedule"] = "v2"``) with its default plan and with each of
``ALTERNATIVES`` (plan options of ``plan_v2_bwd``), timed by triton's do_bench (median) over ``torch.autograd.grad``
of a retained graph. On an H100 / H200 the code is sm_90a's: a stand-in for the A100's sm_80, where the v2 backward
is the one that runs (the spills differ in size between the two, not in where they come from: the dK / dV
accumulators and a warp's scores at BLOCK_M x BLOCK_N per warp).
"""
from __future__ import annotations

import argparse
import statistics

import torch

#: plan options tried beside the default: 8 warps at MTK 1 (half the keys per warp), and a 16-row query step
ALTERNATIVES: dict[str, dict] = {
    "default": {},
    "bm64-w8": {"block_m": 64, "num_warps": 8, "mtk": 1},
    "bm32-w8": {"block_m": 32, "num_warps": 8, "mtk": 1},
    "bm16": {"block_m": 16},
}
CASES = "plain:64,causal:64,dropout:64,sliding_window:64,document:64,dropout:128,sliding_window:128,document:128"


def _spec(name: str, d: int, H: int, N: int):
    import attncompiler as ac
    from bench_v3 import _spec as bench_spec

    if name == "dropout":
        return ac.AttentionSpec(head_dim=d, dropout_p=0.1, name="dropout")
    return bench_spec(name, d, H, N)


def main(argv: list[str] | None = None) -> int:
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.runtime.backward import bwd_source
    from attncompiler.runtime.compiler import ptxas_report

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=CASES)
    args = ap.parse_args(argv)
    N = args.n
    print(f"# {torch.cuda.get_device_name()}  v2 backward, bf16, N = {N}", flush=True)
    runs = []
    for case in args.cases.split(","):
        name, d_s = case.split(":")
        d = int(d_s)
        B, H = max(1, 16384 // N), 2048 // d
        kern = ac.compile(_spec(name, d, H, N))
        leaves = [torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
        dout = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16)
        out = kern(*leaves)
        for label, opts in ALTERNATIVES.items():
            try:
                src = bwd_source(kern.ir, kern.target, options={"schedule": "v2", **opts})
            except Exception as e:  # noqa: BLE001 - a refused plan is a row, not the end
                print(f"{case} {label}: refused ({str(e)[:100]})", flush=True)
                continue
            rep = ptxas_report(src.source, src.arch)
            p = src.plan
            desc = (f"BM {p.block_m} W {p.num_warps} BN {p.block_n} {p.layout}{' split' if p.split_dkv else ''}, "
                    f"spills {rep.spill_stores if rep else '?'} / {rep.spill_loads if rep else '?'} B")
            runs.append((case, label, kern, leaves, dout, out, opts, desc))
            print(f"{case} {label}: {desc}", flush=True)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for case, label, kern, leaves, dout, out, opts, desc in runs:
            kern.backward_options = {"schedule": "v2", **opts}

            def bwd() -> None:
                torch.autograd.grad(out, leaves, dout, retain_graph=True)

            if r == 0:
                bwd()  # (compiles and loads this plan's kernels)
            ms = do_bench(bwd, warmup=10, rep=150, return_mode="median")
            times.setdefault((case, label), []).append(ms)
            print(f"round {r} {case} {label}: {ms:.3f} ms", flush=True)
    print("# medians (ms), and default / this")
    for case in dict.fromkeys(c for c, *_ in runs):
        base = statistics.median(times[(case, "default")]) if (case, "default") in times else None
        for (c, label), ts in times.items():
            if c == case:
                m = statistics.median(ts)
                desc = next(x[-1] for x in runs if x[0] == c and x[1] == label)
                print(f"{case:20s} {label:8s} {m:7.3f} ms  x{(base / m) if base else float('nan'):.3f}  ({desc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
