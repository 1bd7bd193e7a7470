"""Decode kernel configurations (warps, BLOCK_N, stages, L2 prefetch hint, K/V loader, folded combine) beside
torch SDPA, CUDA-graph replays (GPU time).

    PYTHONPATH=. python3 benchmarks/decode_sweep.py            # every configuration below
    PYTHONPATH=. python3 benchmarks/decode_sweep.py --options  # only the loader x fold_combine grid
    PYTHONPATH=. python3 benchmarks/decode_sweep.py --splits   # split counts x tile shapes, B = 1

Shapes (bf16, d = 128, Nq = 1): (B, H, H_kv, Nk) = (1, 32, 8, 32k) (many splits, combine), (4, 32, 8, 64k),
(8, 32, 32, 32k) and (8, 32, 32, 128k) (one split: the split kernel alone).  Each configuration is compiled with
``compile(spec, "decode", num_warps=, block_n=, stages=, l2_hint=, loader=, fold_combine=)`` and checked against
SDPA before it is timed.  ``loader="bulk"`` (cp.async.bulk per K/V row, sm_90+) takes no L2 hint; on an older
GPU its configurations fail to plan and are skipped with the planner's message.  ``fold_combine`` only changes
calls with more than one split (the 'splits' column); the graph then holds a counter memset and one kernel
instead of two kernels.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

from attncompiler.runtime.launch import AttnInputs

# (warps, BLOCK_N, stages, L2 hint, loader, fold_combine)
OPTION_GRID = tuple((4, 64, 3, 0 if ld == "bulk" else 256, ld, fold)
                    for ld in ("cp_async", "bulk") for fold in (False, True))
CONFIGS = ((4, 64, 3, 0, "cp_async", False), (4, 64, 3, 128, "cp_async", False), *OPTION_GRID,
           (8, 128, 3, 256, "cp_async", False), (8, 128, 3, 0, "bulk", False), (4, 128, 2, 256, "cp_async", False),
           (4, 128, 2, 0, "bulk", False))
SHAPES = ((1, 32, 8, 32768), (4, 32, 8, 65536), (8, 32, 32, 32768), (8, 32, 32, 131072))
# --splits: (warps, BLOCK_N, stages, loader) x forced split counts (None: choose_splits'); times are per call of
# 20-call CUDA graphs (bench_decode.graph_batch_ms: the graph's launch latency spread out)
SPLIT_TILES = ((4, 64, 3, "cp_async"), (4, 64, 3, "tma"), (4, 64, 4, "tma"), (8, 128, 3, "tma"), (4, 128, 3, "tma"),
               (4, 128, 3, "cp_async"))
SPLIT_COUNTS = (None, 16, 32)
SPLIT_SHAPES = ((1, 32, 8, 32768), (1, 32, 8, 131072), (8, 32, 32, 32768))


def sweep_splits() -> int:
    """Split counts x tile shapes at B = 1 (``--splits``): which decomposition streams fastest."""
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.runtime import decode as rt
    from attncompiler.spec import presets
    from bench_decode import graph_batch_ms

    chosen = rt.split_choice
    forced: list = [None]
    rt.split_choice = lambda plan, dims, num_splits=None: chosen(plan, dims, forced[0] or num_splits)
    spec = presets.plain(128)
    for B, H, H_kv, N in SPLIT_SHAPES:
        q = torch.randn(B, H, 1, 128, device="cuda", dtype=torch.bfloat16)
        kv = [tuple(torch.randn(B, H_kv, N, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
              for _ in range(2)]
        nbytes = 2 * q.numel() * 2 + 2 * kv[0][0].numel() * 2
        gqa = H != H_kv
        ref = F.scaled_dot_product_attention(q, *kv[0], enable_gqa=gqa)
        sd = graph_batch_ms(do_bench, [lambda kk=kk, vv=vv: F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa)
                                       for kk, vv in kv])
        print(f"# {(B, H, H_kv, N)}: SDPA {sd * 1e3:.1f} us", flush=True)
        for w, bn, st, ld in SPLIT_TILES:
            kern = ac.compile(spec, "decode", num_warps=w, block_n=bn, stages=st, loader=ld)
            for ns in SPLIT_COUNTS if H != H_kv else (None,):
                forced[0] = ns
                err = float((kern(q, *kv[0]).float() - ref.float()).abs().max())
                ms = graph_batch_ms(do_bench, [lambda kk=kk, vv=vv: kern(q, kk, vv) for kk, vv in kv])
                s = rt.split_choice(kern.plan, AttnInputs(B, H, H_kv, 1, N, 128, 128)).num_splits
                print(f"  {ld:>8} warps {w} BN {bn} stages {st} ctas/SM {kern.plan.ctas_per_sm} splits {s:>3}"
                      f"{' (auto)' if ns is None else ''}: {ms * 1e3:7.1f} us  {nbytes / ms / 1e9:5.2f} TB/s  "
                      f"x sdpa {sd / ms:5.2f}  err {err:.1e}", flush=True)
        forced[0] = None
        del q, kv
        torch.cuda.empty_cache()
    return 0


def main(argv: list[str]) -> int:
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.runtime import decode as rt
    from attncompiler.runtime.launch import AttnInputs
    from attncompiler.spec import presets
    from bench_decode import graph_ms

    if "--splits" in argv:
        return sweep_splits()
    configs = OPTION_GRID if "--options" in argv else CONFIGS
    out = open(os.path.join(os.environ.get("OUT", "/tmp"), "decode_sweep.jsonl"), "a")
    spec = presets.plain(128)
    kerns = {}
    for cfg in configs:
        w, bn, st, l2, ld, fold = cfg
        try:
            kerns[cfg] = ac.compile(spec, "decode", num_warps=w, block_n=bn, stages=st, l2_hint=l2, loader=ld,
                                    fold_combine=fold)
        except Exception as e:  # noqa: BLE001
            print(f"config {cfg}: {type(e).__name__}: {e}", flush=True)
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
            o2 = kern(q, k, v)  # after the graph's replays: the fold_combine counters must still start at zero
            err = max(err, float((o2.float() - ref.float()).abs().max()))
            s = rt.split_choice(kern.plan, AttnInputs(B, H, H_kv, 1, N, 128, 128)).num_splits
            rec = {"shape": (B, H, H_kv, N), "cfg": cfg, "loader": kern.plan.loader,
                   "fold_combine": kern.plan.fold_combine, "ctas_per_sm": kern.plan.ctas_per_sm, "splits": s,
                   "us": ms * 1e3, "sdpa_us": sd * 1e3, "tbps": nbytes / ms / 1e9, "err": err,
                   "device": torch.cuda.get_device_name()}
            out.write(json.dumps(rec) + "\n")
            table.append(rec)
        del q, k, v
        torch.cuda.empty_cache()
    print(f"{'shape':>22} {'warps,BN,st,L2,loader,fold':>36} {'cta/SM':>6} {'splits':>6} {'us':>8} {'sdpa us':>8} "
          f"{'x sdpa':>6} {'TB/s':>5} {'err':>8}")
    for r in table:
        print(f"{str(r['shape']):>22} {str(r['cfg']):>36} {r['ctas_per_sm']:>6} {r['splits']:>6} {r['us']:>8.1f} "
              f"{r['sdpa_us']:>8.1f} {r['sdpa_us'] / r['us']:>6.2f} {r['tbps']:>5.2f} {r['err']:>8.1e}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main(sys.argv[1:]))
