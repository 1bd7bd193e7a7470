"""Host-side cost of one decode call (cProfile over 300 calls): where the launch path spends its time.

    PYTHONPATH=. python3 benchmarks/profile_decode_host.py
"""
from __future__ import annotations

import cProfile
import pstats
import sys

import torch


def main() -> int:
    import attncompiler as ac
    from attncompiler.spec import presets

    kern = ac.compile(presets.plain(128))
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, 32768, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(5):
        kern(q, k, v)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        kern(q, k, v)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
