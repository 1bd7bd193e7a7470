"""Where a v3 CTA's time goes: phase timestamps (%globaltimer) of every tile of one launch.

    PYTHONPATH=. python3 benchmarks/v3_trace.py "128:sliding_window,128:plain" [--n 16384] [--nk NK]

Each item is bench_v3's ``d:variant[:option=value...]`` (B = 1, H = 2048 / d, Nq = ``--n``, Nk =
``--nk`` or ``--n``).  The generated source is compiled once more with ``-DAC_V3_TRACE`` (v3_fwd.cuh's
marks: one timer read and one store by one thread, where no wgmma is in flight), launched after a
warm-up, and the per-tile timestamps are summarized (medians over tiles, microseconds):

  launch->Q   CTA start to the Q tile landed (barrier init, descriptor prefetch, first TMA round trip)
  S0          Q landed to the first S GEMM done (waits for K_0 too)
  softmax0    the first block's softmax, with nothing to overlap
  per block   the main loop's time per further K/V block (the steady state)
  last PV     the last block's P V GEMM
  epilogue    consumer 0's O / LSE stores; "epi1 - epi0": how much later consumer 1 finishes
  gap         per SM, the next CTA's start minus this CTA's end (non-persistent: the launch of the
              next CTA in the same slot)
  boundary    persistent grid: a tile's main loop done to its CTA's next tile's first softmax done (the last
              P V, the epilogue, the next Q, S_0 and softmax; the CTA of each tile is a trace slot)

Only the traced build runs here: the timer reads add a few instructions per tile, not per block. They can still
move ptxas's schedule: with ``q_prefetch`` plain d128 at Nk = 1152 traced 2.22 us per block (span 343 us) against
1.44 without the option, while untraced the option ran faster (634 vs 603 TFLOP/s, ``qpf_cross.py``; thirty-sixth
session). Compare a traced figure with the untraced kernel's time (``launch_gaps.py``) before reading much into it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from _results import option_value

from attncompiler.bench.v3trace import SLOTS, grid_tail, tile_boundaries


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def trace_item(item: str, n: int, nk: int, spec=None, defines: tuple[str, ...] = ()) -> dict[str, float]:
    """Launch ``item`` traced (``spec``: this spec instead of the item's variant; ``defines``: more
    ``#define`` lines before the source); returns the phase medians (microseconds) and the span."""
    import attncompiler as ac
    from attncompiler.bench.v3trace import run_traced

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_v3 import _spec

    d_s, var, *opts = item.split(":")
    d = int(d_s)
    options = {key: option_value(val) for key, val in (o.split("=") for o in opts)}
    deal = options.pop("deal", None)  # tile_list's dealing rule (runtime/tile_list.py DEALS), as in v3_sweep.py
    H = 2048 // d
    kern = ac.compile(spec if spec is not None else _spec(var, d, H, max(n, nk)), "v3", **options)
    ks = kern.kernel_source
    q = torch.randn(1, H, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, H, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    from attncompiler.runtime import tile_list

    before, tile_list.DEAL = tile_list.DEAL, deal or tile_list.DEAL
    try:
        rows = run_traced(kern, q, k, v, defines=defines, warmup=3)
    finally:
        tile_list.DEAL = before
    plan = ks.plan
    tiles = [dict(zip(SLOTS, map(int, r[: len(SLOTS)]))) for r in rows if r[7] != 0]
    if os.environ.get("OUT"):  # every tile's marks, for analyses this summary does not make
        with open(os.path.join(os.environ["OUT"], f"trace_{item.replace(':', '_').replace('=', '-')}.json"), "w") as f:
            json.dump(tiles, f)
    us = 1e-3
    ph: dict[str, list[float]] = {k: [] for k in ("launch->Q", "S0", "softmax0", "per block", "last PV",
                                                  "epilogue", "  1/l, LSE", "  O to smem", "  barrier",
                                                  "  O to global", "epi1 - epi0", "gap", "boundary", "blocks")}
    for t in tiles:
        if t["start"]:
            ph["launch->Q"].append((t["q"] - t["start"]) * us)
        if t["s0"]:
            ph["S0"].append((t["s0"] - t["q"]) * us)
            ph["softmax0"].append((t["softmax0"] - t["s0"]) * us)
            if t["blocks"] > 1:
                ph["per block"].append((t["loop"] - t["softmax0"]) * us / (t["blocks"] - 1))
            ph["last PV"].append((t["pv"] - t["loop"]) * us)
            ph["epilogue"].append((t["epi0"] - t["pv"]) * us)
            ph["  1/l, LSE"].append((t["epi_scale"] - t["pv"]) * us)
            if t["epi_sts"]:  # the staged epilogue
                ph["  O to smem"].append((t["epi_sts"] - t["epi_scale"]) * us)
            if t["epi_sts"] and t["epi_bar"]:  # (q_prefetch: a producer warp stores O, after these marks)
                ph["  barrier"].append((t["epi_bar"] - t["epi_sts"]) * us)
                ph["  O to global"].append((t["epi0"] - t["epi_bar"]) * us)
        ph["epi1 - epi0"].append((t["epi1"] - t["epi0"]) * us)
        ph["blocks"].append(float(t["blocks"]))
    if plan.persistent:  # a tile's main loop done to its CTA's next tile's first softmax done
        ph["boundary"] = [b * us for b in tile_boundaries(tiles)]
    if not plan.persistent:
        by_sm: dict[int, list[dict[str, int]]] = {}
        for t in tiles:
            by_sm.setdefault(t["sm"], []).append(t)
        for lst in by_sm.values():
            lst.sort(key=lambda t: t["start"])
            for a, b in zip(lst, lst[1:]):
                ph["gap"].append((b["start"] - max(a["epi0"], a["epi1"])) * us)
    t0 = min(t["start"] for t in tiles if t["start"])
    t1 = max(max(t["epi0"], t["epi1"]) for t in tiles)
    out = {name: _median(xs) for name, xs in ph.items()}
    out["span"] = (t1 - t0) * us
    if plan.persistent:  # the grid's tail: each CTA's last epilogue against the launch's last one
        idle = [x * us for x in grid_tail(tiles)]
        out["tail idle"] = sum(idle) / (len(idle) * out["span"])  # share of the CTAs' span spent done
        print(f"  CTA ends before the last: min {idle[0]:.2f}  median {_median(idle):.2f}  max {idle[-1]:.2f} us; "
              f"idle share of the span {out['tail idle']:.3f} ({len(idle)} CTAs)", flush=True)
    out["tiles"] = float(len(tiles))
    print(f"{item} Nq={n} Nk={nk}: BN={plan.block_n} stages={plan.stages}"
          f"{' persistent' if plan.persistent else ''}, {len(tiles)} tiles, span {out['span']:.1f} us", flush=True)
    for name, val in out.items():
        if name not in ("span", "tiles", "tail idle"):
            print(f"  {name:12s} {val:8.2f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("items")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--nk", type=int, default=None)
    ap.add_argument("--define", action="append", default=[], help="#define NAME 1 before the source (repeatable)")
    args = ap.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    for item in args.items.split(","):
        try:
            trace_item(item, args.n, args.nk or args.n, defines=tuple(args.define))
        except Exception as e:  # noqa: BLE001 - one failing item must not end the run
            print(f"{item}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
