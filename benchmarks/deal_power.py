"""The persistent grid's tile dealing (runtime/tile_list.py, in order vs LPT) at steady power (GPU; nvidia-smi).

    PYTHONPATH=. python3 benchmarks/deal_power.py [--seconds 3] [--rounds 2]

Sliding window 1024, d = 128, N = 16k, H = 16: each dealing's kernel runs back to back for ``--seconds`` while
``nvidia-smi`` samples the SM clock and board power (clock_power.py). A dealing that shortens one launch's span (its
traced CTA ends, v3_trace.py) keeps the same work and energy, so at the board's power limit its time per call can
stay where it was, with the clock, not the span, giving way: the line pairs time with cycles (time x clock).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import attncompiler as ac
    from attncompiler.runtime import tile_list
    from attncompiler.spec import presets
    from clock_power import _inputs, measure

    q, k, v = _inputs(128, 16384, 16384)
    for r in range(args.rounds):
        got = []
        for deal in ("in_order", "lpt"):
            tile_list.DEAL = deal  # a kernel compiled anew records its launch, list included, at its first call
            kern = ac.compile(presets.sliding_window(1024, 128), "v3")
            ms, clock, _ = measure(f"window 1024 d128, deal {deal} (round {r + 1})", lambda: kern(q, k, v),
                                   args.seconds)
            got.append((ms, clock))
        (a_ms, a_clock), (b_ms, b_clock) = got
        print(f"  lpt / in_order: time {b_ms / a_ms:.4f}, cycles {b_ms * b_clock / (a_ms * a_clock):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
