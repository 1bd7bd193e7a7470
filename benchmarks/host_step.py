"""Host time of a small training step: ``kern(q, k, v).backward(do)`` at a shape whose kernels take far less
than the host side, through the eager ``autograd.Function`` path and through the ``torch.library`` custom op
(forced), interleaved in one process, and the eager step with the backward's full path (no recorded launch);
then the step's kernel time (torch.profiler) and a cProfile of the eager step.

    PYTHONPATH=. python3 benchmarks/host_step.py [--rounds 2] [--steps 200] [--profile 25]

Prints microseconds per step (wall clock over ``--steps`` steps, synchronized at both ends), padded and packed.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch


@contextmanager
def custom_op_path() -> Iterator[None]:
    """Route differentiable calls through the custom ops, as torch.compile's tracing does."""
    from attncompiler import autograd

    keep = autograd.plain_tensor
    autograd.plain_tensor = lambda t: False
    try:
        yield
    finally:
        autograd.plain_tensor = keep


class _NoRecord(dict):
    """A recipe table that keeps nothing: every backward takes the full path."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


@contextmanager
def full_path_backward(kern: object, forward: bool = False) -> Iterator[None]:
    """Backwards without recorded launches (runtime/bwd_fastpath.py), for the A/B; ``forward``: forwards too (the
    state of packed-sequence calls before runtime/varlen_fastpath.py)."""
    keep = kern._bwd_recipes, kern._recipes
    kern._bwd_recipes = _NoRecord()
    if forward:
        kern._recipes = _NoRecord()
    try:
        yield
    finally:
        kern._bwd_recipes, kern._recipes = keep


def time_steps(step: Callable[[], None], n: int) -> float:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--profile", type=int, default=25, help="rows of the cProfile table (0: none)")
    ap.add_argument("--ab", type=int, default=0,
                    help="only the A/B of recorded launches (padded: the backward's; packed: forward and backward): "
                         "this many alternations of --steps steps each, medians")
    args = ap.parse_args()
    kern = ac.compile(presets.causal(128))
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(1, 16, 256, 128, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 16, 256, 128, device=dev, dtype=dt)
    lens = [100, 37, 119]
    cu = torch.tensor([0, *lens]).cumsum(0).to(device=dev, dtype=torch.int32)
    pq, pk, pv = (torch.randn(sum(lens), 16, 128, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    pdo = torch.randn(sum(lens), 16, 128, device=dev, dtype=dt)

    def padded() -> None:
        kern(q, k, v).backward(do)

    def packed() -> None:
        kern(pq, pk, pv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens)).backward(pdo)

    def sdpa_step() -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    def fwd_only() -> None:
        with torch.no_grad():
            kern(q, k, v)

    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  causal d=128 (1, 16, 256, 128) bf16, "
          f"schedule {kern.schedule}; us per step")
    if args.ab:
        for name, fn, forward in (("padded", padded, False), ("packed", packed, True)):
            rec, full = [], []
            for _ in range(args.ab):
                rec.append(time_steps(fn, args.steps))
                with full_path_backward(kern, forward):
                    full.append(time_steps(fn, args.steps))
            rec.sort()
            full.sort()
            what = "forward and backward" if forward else "backward"
            print(f"eager {name} step, {args.ab} alternations of {args.steps} steps: recorded {what} median "
                  f"{rec[len(rec) // 2]:.0f} (range {rec[0]:.0f}-{rec[-1]:.0f}), full-path {what} median "
                  f"{full[len(full) // 2]:.0f} (range {full[0]:.0f}-{full[-1]:.0f})")
        return
    print(f"{'round':>5s} {'what':>8s} {'eager':>9s} {'custom op':>10s}")
    for r in range(args.rounds):
        for name, fn in (("padded", padded), ("packed", packed)):
            eager = time_steps(fn, args.steps)
            with custom_op_path():
                op = time_steps(fn, args.steps)
            print(f"{r:5d} {name:>8s} {eager:9.0f} {op:10.0f}")
        with full_path_backward(kern):
            print(f"{r:5d} {'padded':>8s} {time_steps(padded, args.steps):9.0f}  (backward without a recorded launch)")
        print(f"{r:5d} {'no_grad':>8s} {time_steps(fwd_only, args.steps):9.0f}")
        print(f"{r:5d} {'sdpa':>8s} {time_steps(sdpa_step, args.steps):9.0f}  (torch SDPA, flash, causal)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as tp:
        for _ in range(args.steps):
            padded()
        torch.cuda.synchronize()
    kernels = sum(e.self_device_time_total for e in tp.key_averages()) / args.steps
    print(f"padded: device (kernel) time per step {kernels:.0f} us")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            padded()
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(args.profile)
        stats.sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
