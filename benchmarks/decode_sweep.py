"""Decode kernel configurations (warps, BLOCK_N, stages, L2 prefetch hint) beside torch SDPA, CUDA-graph replays (GPU time).

    PYTHONPATH=. python3 benchmarks/decode_sweep.py

Shapes (bf16, d = 128, Nq = 1): (B, H, H_kv, Nk) = (1, 32, 8, 32k) (many splits, combine), (4, 32, 8, 64k),
(8, 32, 32, 32k) (one split: the split kernel alone).  Each configuration is compiled with
``compile(spec, "decode", num_warps=, block_n=, stages=, l2_hint=)`` and checked against SDPA before it is timed.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

CONFIGS = ((4, 64, 3, 0), (4, 64, 3, 128), (4, 64, 3, 256), (8, 128, 3, 0), (8, 128, 3, 256), (4, 128, 2, 256))
SHAPES = ((1, 32, 8, 32768), (4, 32, 8, 65536), (8, 32, 32, 32768))


def main() -> int:
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.runtime import decode as rt
    from attncompiler.runtime.launch import AttnInputs
    from attncompiler.spec import presets
    from bench_decode import graph_ms

    out = open(os.path.join(os.environ.get("OUT", "/tmp"), "decode_sweep.jsonl"), "a")
    spec = presets.plain(128)
    kerns = {}
    for w, bn, st, l2 in CONFIGS:
        try:
            kerns[(w, bn, st, l2)] = ac.compile(spec, "decode", num_warps=w, block_n=bn, stages=st, l2_hint=l2)
        except Exception as e:  # noqa: BLE001
            print(f"config {(w, bn, st, l2)}: {type(e).__name__}: {e}", flush=True)
    table = []
    for B, H, H_kv, N in SHAPES:
        q = torch.randn(B, H, 1, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, H_kv, N, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        nbytes = 2 * q.numel() * 2 + 2 * k.numel() * 2
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=H != H_kv)
        sd = graph_ms(do_bench, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=H != H_kv))
        for cfg, kern in kerns.items():
            o = kern(q, k, v)
            err = float((o.float() - ref.float()).abs().max())
            ms = graph_ms(do_bench, lambda: kern(q, k, v))
            s = rt.split_choice(kern.plan, AttnInputs(B, H, H_kv, 1, N, 128, 128)).num_splits
            rec = {"shape": (B, H, H_kv, N), "cfg": cfg, "ctas_per_sm": kern.plan.ctas_per_sm, "splits": s,
                   "us": ms * 1e3, "sdpa_us": sd * 1e3, "tbps": nbytes / ms / 1e9, "err": err}
            out.write(json.dumps(rec) + "\n")
            table.append(rec)
        del q, k, v
        torch.cuda.empty_cache()
    print(f"{'shape':>22} {'warps,BN,st,L2':>16} {'cta/SM':>6} {'splits':>6} {'us':>8} {'sdpa us':>8} {'x sdpa':>6} "
          f"{'TB/s':>5} {'err':>8}")
    for r in table:
        print(f"{str(r['shape']):>22} {str(r['cfg']):>16} {r['ctas_per_sm']:>6} {r['splits']:>6} {r['us']:>8.1f} "
              f"{r['sdpa_us']:>8.1f} {r['sdpa_us'] / r['us']:>6.2f} {r['tbps']:>5.2f} {r['err']:>8.1e}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
