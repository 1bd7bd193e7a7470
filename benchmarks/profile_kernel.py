"""Launch one compiled kernel a few times, for a profiler to capture (ncu on the device).

    PYTHONPATH=. ncu --clock-control none -k regex:attn_fwd --launch-skip 2 --launch-count 1 \
        --section WarpStateStats python3 benchmarks/profile_kernel.py 64:softcap [--n 4096] [--nk NK]
    PYTHONPATH=. python3 benchmarks/profile_kernel.py decode --n 32768   # B=1, H=32, H_kv=8, Nq=1

An item is bench_v3's ``d:variant[:option=value...]`` (v3, B = 1, H = 2048 / d, Nq = ``--n``, Nk =
``--nk`` or ``--n``) or ``decode`` (plain d = 128, B = 1, H = 32, H_kv = 8, Nq = 1, Nk = ``--n``:
schedule auto picks the split-KV decode).  Runs ``--launches`` calls (default 3) and synchronizes;
prints the plan.  Nothing is timed here: the profiler measures.
"""
from __future__ import annotations

import argparse
import sys

import torch
from _results import option_value


def main(argv: list[str] | None = None) -> int:
    import attncompiler as ac
    from attncompiler.spec import presets

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_v3 import _spec

    ap = argparse.ArgumentParser()
    ap.add_argument("item")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--nk", type=int, default=None)
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args(argv)
    nk = args.nk or args.n
    if args.item == "decode":
        kern = ac.compile(presets.plain(128))
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, 8, nk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    else:
        d_s, var, *opts = args.item.split(":")
        d = int(d_s)
        options = {key: option_value(val) for key, val in (o.split("=") for o in opts)}
        H = 2048 // d
        kern = ac.compile(_spec(var, d, H, max(args.n, nk)), "v3", **options)
        q = torch.randn(1, H, args.n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, H, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(args.launches):
        kern(q, k, v)
    torch.cuda.synchronize()
    plan = kern._decode.plan if getattr(kern, "_decode", None) is not None else kern.kernel_source.plan
    print(f"{args.item} Nq={args.n} Nk={nk}: {type(plan).__name__} block_n={getattr(plan, 'block_n', '-')} "
          f"stages={getattr(plan, 'stages', '-')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
