"""Forward TFLOP/s of attncompiler v1 and v2 beside torch SDPA (flash = FlashAttention-2, cuDNN), one process.

    PYTHONPATH=. python3 benchmarks/bench_forward.py [--quick]

Grid: B*N = 16k tokens, H*d = 2048, N in {1k, 4k, 16k}, d in {64, 128}, causal and not, bf16.
FLOPs = 4*B*H*N^2*d, halved when causal.  Timing: triton's do_bench median (CUDA events), inputs
rotated over several sets so that repeated runs do not measure L2.  v1 (FlashAttention-1's loop
order, one CTA per (batch, head), scalar FMA) runs only at N <= 4k: it is the slow baseline by design.
Writes JSON lines to $OUT/bench_forward.jsonl (or /tmp) and prints a table with ratios to the peers.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _results import Results, device_banner


def main(argv: list[str] | None = None) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="N = 16k only")
    ap.add_argument("--head-dims", default="64,128")
    args = ap.parse_args(argv)
    log = Results("bench_forward")
    dev = device_banner()
    rows, rec = log.rows, log.add

    seqlens = (16384,) if args.quick else (1024, 4096, 16384)
    for d in (int(x) for x in args.head_dims.split(",")):
        H = 2048 // d
        for N in seqlens:
            B = max(1, 16384 // N)
            nsets = 3
            sets = [tuple(torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    for _ in range(nsets)]
            for causal in (False, True):
                flops = 4 * B * H * N * N * d / (2 if causal else 1)
                spec = presets.causal(d) if causal else presets.plain(d)
                fns = {}
                for sched in ("v2", "v1"):
                    if sched == "v1" and N > 4096:
                        continue
                    kern = ac.compile(spec, sched)
                    fns[sched] = kern
                for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                    def peer(q, k, v, be=be):
                        with sdpa_kernel([be]):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    fns[name] = peer
                res = {}
                for name, fn in fns.items():
                    it = [0]

                    def step(fn=fn):
                        q, k, v = sets[it[0] % nsets]
                        it[0] += 1
                        return fn(q, k, v)
                    rep = 30 if name == "v1" else 200
                    try:
                        ms = do_bench(step, warmup=10 if name == "v1" else 25, rep=rep, return_mode="median")
                        res[name] = flops / ms / 1e9
                        rec(what=name, d=d, N=N, B=B, H=H, causal=causal, ms=round(ms, 4), tflops=round(res[name], 1))
                    except Exception as e:  # a failing peer is reported, not fatal
                        rec(what=name, d=d, N=N, causal=causal, error=str(e)[:200])
                rows.append(dict(summary=True, d=d, N=N, causal=causal, **res))
    print(f"\n# forward TFLOP/s, bf16, {dev}; ratio = v2 / peer")
    print(f"{'d':>4} {'N':>6} {'causal':>6} {'v1':>6} {'v2':>6} {'flash':>6} {'cudnn':>6} {'v2/flash':>8} {'v2/cudnn':>8}")
    for r in rows:
        if not r.get("summary"):
            continue
        g = lambda k: r.get(k, float("nan"))  # noqa: E731
        print(f"{r['d']:>4} {r['N']:>6} {str(r['causal']):>6} {g('v1'):>6.0f} {g('v2'):>6.0f} {g('sdpa_flash'):>6.0f} "
              f"{g('sdpa_cudnn'):>6.0f} {g('v2') / g('sdpa_flash'):>8.2f} {g('v2') / g('sdpa_cudnn'):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
