"""SM clock and board power while one v3 kernel runs back to back (GPU; needs nvidia-smi).

    PYTHONPATH=. python3 benchmarks/clock_power.py [--seconds 3] [--rounds 2] [--set window|variants|poly|all]

Each kernel runs for ``--seconds`` while ``nvidia-smi`` samples the SM clock and the board's power draw every
50 ms; the line gives the time per call, the median clock and the median power.  ``window``: full attention
(d = 128, N = 16k, H = 16), the sliding window 1024 and dense attention over Nk = 1152 keys (the window's
short K/V loop without a mask), with the window's time and its cycles (time x clock) over full attention's,
per visible pair.  ``variants``: plain and softcap at d = 64 and 128 (N = 16k, H*d = 2048), softcap over plain
in time and in cycles.  ``poly``: softcap with 0 / 1 / 2 (d = 128) and 0 / 4 / 6 (d = 64) of every 8 exponentials on
the FMA pipes, in time and in cycles.  ``cudnn``: dense attention over Nk = 1152 keys per pair over full attention,
ours beside SDPA cuDNN's.

Why: on the H100 every one of these kernels draws the board's power limit, so the clock, not the kernel,
gives way (docs/perf-notes.md, thirteenth session).  A kernel that stalls more gets a higher clock, so a
time ratio and a cycle ratio differ, and hiding idle phases does not shorten a run whose energy stays.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time


def _sampler() -> subprocess.Popen:
    return subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                             "-lms", "50"], stdout=subprocess.PIPE, text=True)


def run_kernel(name: str, spec, d: int, nq: int, nk: int, seconds: float, define: str | None = None,
               **options) -> tuple[float, float, float]:
    """(ms per call, median SM clock in MHz, median board power in W) of ``spec``'s v3 kernel (plan ``options``;
    ``define``: compiled with ``#define define 1`` in front, as v3_sweep.py's ``define=``)."""
    import torch

    import attncompiler as ac

    kern = ac.compile(spec, "v3", **options)
    if define:
        from v3_sweep import with_define

        kern = with_define(kern, define)
    q, k, v = _inputs(d, nq, nk)
    out = torch.empty_like(q)
    return measure(name, lambda: kern(q, k, v, out=out), seconds)


def _inputs(d: int, nq: int, nk: int) -> tuple:
    import torch

    heads = 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, heads, nq, d, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(1, heads, nk, d, device="cuda", generator=g).bfloat16() for _ in range(2))
    return q, k, v


def measure(name: str, fn, seconds: float) -> tuple[float, float, float]:
    """(ms per call, median SM clock in MHz, median board power in W) of ``fn()`` run back to back."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(20):
        fn()
    end.record()
    torch.cuda.synchronize()
    reps = max(1, int(seconds / (start.elapsed_time(end) / 20 * 1e-3)))
    smi = _sampler()
    time.sleep(0.3)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].strip().splitlines() if line.strip()]
    rows = rows[8:-2] or rows  # drop the samples from before the first launch and after the last
    clock = statistics.median(float(r[0]) for r in rows)
    power = statistics.median(float(r[1]) for r in rows)
    ms = start.elapsed_time(end) / reps
    print(f"{name:44s} {ms:8.4f} ms/call   SM clock {clock:6.0f} MHz   power {power:5.0f} W   ({len(rows)} samples)",
          flush=True)
    return ms, clock, power


def cudnn_set(seconds: float) -> None:
    """The short K/V loop's cost per pair, ours beside SDPA cuDNN's: dense attention over Nk = 1152 keys (the window
    1024's tile span) over full attention at N = 16k, in time and in cycles (d = 128). Is what cuDNN saves on short
    tiles energy (its clock stays) or cycles (its clock rises less)?"""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attncompiler.spec import presets

    n, nk = 16384, 1152
    plain = presets.get_preset("plain", head_dim=128)
    res = {}
    # the default for plain attention (plan/v3_grid.py): the persistent grid writing O by TMA stores from its own
    # tile; "no O store": timing-only, the epilogue's global O stores compiled out (AC_V3_NO_O_STORE): what an
    # asynchronous epilogue could save at most
    ours = {"v3 (default: persistent, TMA stores)": {}, "v3 one CTA per tile": {"persistent": False},
            "v3 persistent, direct stores": {"persistent": True},
            "v3 persistent, no O store": {"persistent": True, "define": "AC_V3_NO_O_STORE"}}
    for who in (*ours, "cuDNN"):
        for label, kv in (("full", n), ("dense 1152", nk)):
            if who in ours:
                res[(who, label)] = run_kernel(f"{who} {label}", plain, 128, n, kv, seconds, **ours[who])
            else:
                q, k, v = _inputs(128, n, kv)

                def fn(q=q, k=k, v=v) -> torch.Tensor:
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        return F.scaled_dot_product_attention(q, k, v)

                res[(who, label)] = measure(f"{who} {label}", fn, seconds)
        (tf, cf, _), (td, cd, _) = res[(who, "full")], res[(who, "dense 1152")]
        print(f"  {who}: dense Nk = 1152 per pair over full: time {td / tf * n / nk:.3f}x, cycles "
              f"{td * cd / (tf * cf) * n / nk:.3f}x", flush=True)


def window_set(seconds: float) -> None:
    from attncompiler.spec import presets

    n, w = 16384, 1024
    full = run_kernel("full, N = 16k", presets.get_preset("plain", head_dim=128), 128, n, n, seconds)
    win = run_kernel("window 1024", presets.sliding_window(w, 128), 128, n, n, seconds)
    dense = run_kernel("dense, Nk = 1152", presets.get_preset("plain", head_dim=128), 128, n, 128 + w, seconds)
    visible = (w * (w + 1) // 2 + (n - w) * (w + 1)) / (n * n)
    print(f"  window / full over the visible fraction: time {win[0] / full[0] / visible:.3f}x, cycles "
          f"{win[0] * win[1] / (full[0] * full[1]) / visible:.3f}x; dense Nk = 1152 per pair: time "
          f"{dense[0] / full[0] * n / (128 + w):.3f}x, cycles {dense[0] * dense[1] / (full[0] * full[1]) * n / (128 + w):.3f}x",
          flush=True)


def variants_set(seconds: float) -> None:
    from attncompiler.spec import presets

    n = 16384
    for d in (64, 128):
        res = {name: run_kernel(f"{name} d = {d}", presets.get_preset(name, head_dim=d, num_heads=2048 // d, seqlen=n),
                                d, n, n, seconds) for name in ("plain", "softcap")}
        (tp, cp, _), (ts, cs, _) = res["plain"], res["softcap"]
        print(f"  d = {d}: softcap / plain speed: time {tp / ts:.3f}, cycles {tp * cp / (ts * cs):.3f}", flush=True)


def poly_set(seconds: float) -> None:
    """Softcap with its exponentials moved to the FMA pipes (plan option exp2_poly): does the FMA-pipe work cost
    clock under the power limit (time ratio) more than it saves XU cycles (cycle ratio)?"""
    from attncompiler.spec import presets

    n = 16384
    for d, polys in ((128, (0, 1, 2)), (64, (0, 4, 6))):
        spec = presets.get_preset("softcap", head_dim=d, num_heads=2048 // d, seqlen=n)
        base = None
        for poly in polys:
            r = run_kernel(f"softcap d = {d} poly {poly}", spec, d, n, n, seconds, exp2_poly=poly)
            base = base or r
            print(f"  over poly {polys[0]}: speed in time {base[0] / r[0]:.3f}, in cycles "
                  f"{base[0] * base[1] / (r[0] * r[1]):.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="time each kernel runs while sampled (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="repeat the set (default 2)")
    ap.add_argument("--set", choices=("window", "variants", "poly", "cudnn", "all"), default="all")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("clock_power.py needs a CUDA GPU")
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.max.sm,power.limit", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip())
    for _ in range(args.rounds):
        if args.set in ("window", "all"):
            window_set(args.seconds)
        if args.set in ("variants", "all"):
            variants_set(args.seconds)
        if args.set in ("poly", "all"):
            poly_set(args.seconds)
        if args.set in ("cudnn", "all"):
            cudnn_set(args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
