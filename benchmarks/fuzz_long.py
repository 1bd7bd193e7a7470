"""The long GPU fuzz run: N random spec x shape cases through the real kernels (one spec per seed).

    PYTHONPATH=. python3 benchmarks/fuzz_long.py N [--start S] [--v1-every K] [--bwd-every K]
                                                   [--v3-every K] [--decode-every K] [--chunk C]
                                                   [--workers W] [--head-dims DxDV,...]

Seed s runs ``attncompiler.fuzz.random_spec(s)`` on ``random_shape(s)`` through v2 (every seed),
v1 (every K-th seed), the backward (every K-th seed) and, on sm_90, v3 with the seed's plan options
(``fuzz.v3_options``; every K-th seed, and the backward after it where the seed takes one), and the
decode schedule (every K-th seed: ``fuzz.random_decode_spec`` on ``random_decode_shape``, with
``fuzz.decode_options``) -- the checks of tests/test_gpu_fuzz.py
(``attncompiler.fuzz.run_case``), on seeds that test file does not use (default start 100000).
Kernels are compiled by NVRTC in parallel C seeds at a time before they run.  Prints one line per
failure with the case's description, writes every result as JSON lines to $OUT/fuzz_long.jsonl
(or /tmp), and exits 1 if any case failed (2 for a crash of the harness).  ``--head-dims 192x128,192x192``
draws the specs' (D, DV) from those pairs instead of ``fuzz.GPU_HEAD_DIMS`` (e.g. the backward above 128, whose
consumers split by role).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def main(argv: list[str] | None = None) -> int:
    import torch

    from attncompiler import fuzz
    from attncompiler.plan.targets import detect_target
    from attncompiler.runtime.compiler import precompile_to_disk

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, help="number of seeds")
    ap.add_argument("--start", type=int, default=100_000, help="first seed (default 100000)")
    ap.add_argument("--v1-every", type=int, default=5, help="also run v1 on every K-th seed (0: never)")
    ap.add_argument("--bwd-every", type=int, default=3, help="also run the backward on every K-th seed (0: never)")
    ap.add_argument("--v3-every", type=int, default=1, help="also run v3 on every K-th seed on sm_90 (0: never)")
    ap.add_argument("--decode-every", type=int, default=2, help="also run a decode case on every K-th seed (0: never)")
    ap.add_argument("--chunk", type=int, default=64, help="seeds compiled in parallel before running")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="NVRTC processes")
    ap.add_argument("--head-dims", default=None,
                    help="(D, DV) pairs to draw from, e.g. 192x128,192x192 (default: fuzz.GPU_HEAD_DIMS)")
    args = ap.parse_args(argv)
    if args.n < 1 or args.start < 0 or args.chunk < 1:
        ap.error(f"expected n >= 1, --start >= 0, --chunk >= 1, got {args.n}, {args.start}, {args.chunk}")
    head_dims = fuzz.GPU_HEAD_DIMS
    if args.head_dims:
        try:
            head_dims = tuple((int(d), int(dv)) for d, dv in (p.split("x") for p in args.head_dims.split(",")))
        except ValueError:
            ap.error(f"expected --head-dims like 192x128,192x192, got {args.head_dims!r}")
    if not torch.cuda.is_available():
        print("fuzz_long: expected a CUDA GPU, got none", file=sys.stderr)
        return 2
    tgt = detect_target()
    v3_ok = args.v3_every > 0 and torch.cuda.get_device_capability() == (9, 0)
    out_path = os.path.join(os.environ.get("OUT", "/tmp"), "fuzz_long.jsonl")
    print(f"# {torch.cuda.get_device_name()} ({tgt.name}), seeds {args.start}..{args.start + args.n - 1}, "
          f"results -> {out_path}", flush=True)
    t0 = time.perf_counter()
    n_cases = n_fail = 0
    with open(out_path, "a") as fout:
        for c0 in range(args.start, args.start + args.n, args.chunk):
            seeds = range(c0, min(c0 + args.chunk, args.start + args.n))
            specs = {s: fuzz.random_spec(s, head_dims=head_dims) for s in seeds}
            v1 = [s for s in seeds if args.v1_every and s % args.v1_every == 0]
            bwd = [s for s in seeds if args.bwd_every and s % args.bwd_every == 0]
            jobs = fuzz.compile_jobs([specs[s].spec for s in seeds], tgt)
            jobs += fuzz.compile_jobs([specs[s].spec for s in v1], tgt, schedules=("v1",))
            jobs += fuzz.compile_jobs([specs[s].spec for s in bwd], tgt, schedules=(), backward=True)
            v3 = [s for s in seeds if v3_ok and s % args.v3_every == 0]
            jobs += fuzz.compile_jobs([specs[s].spec for s in v3], tgt, schedules=("v3",),
                                      options=[fuzz.v3_options(s) for s in v3])
            dec = {s: fuzz.random_decode_spec(s) for s in seeds if args.decode_every and s % args.decode_every == 0}
            jobs += fuzz.compile_jobs([fs.spec for fs in dec.values()], tgt, schedules=("decode",),
                                      options=[fuzz.decode_options(s) for s in dec])
            precompile_to_disk(jobs, workers=args.workers)
            for s in seeds:
                shape = fuzz.random_shape(s)
                runs = [("v2", s in bwd)] + ([("v1", False)] if s in v1 else [])
                runs += ([("v3", s in bwd)] if s in v3 else []) + ([("decode", False)] if s in dec else [])
                for schedule, backward in runs:
                    n_cases += 1
                    opts = {"v3": fuzz.v3_options, "decode": fuzz.decode_options}.get(schedule, lambda _: {})(s)
                    fs, case_shape = ((dec[s], fuzz.random_decode_shape(s)) if schedule == "decode"
                                      else (specs[s], shape))
                    try:
                        ok, msg = fuzz.run_case(fs, case_shape, schedule=schedule, backward=backward, seed=s,
                                                options=opts)
                    except Exception as e:  # a compile error or crash is a failure of this case
                        ok, msg = False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}\n{fs}"
                    n_fail += not ok
                    fout.write(json.dumps({"seed": s, "schedule": schedule, "options": opts, "backward": backward,
                                           "shape": case_shape, "ok": ok, "message": msg}) + "\n")
                    if not ok:
                        print(f"FAIL seed {s} {schedule}{' +bwd' if backward else ''}: {msg}\n", flush=True)
            fout.flush()
            print(f"  seeds < {seeds[-1] + 1}: {n_cases} cases, {n_fail} failed, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(f"{n_cases} cases, {n_fail} failed ({time.perf_counter() - t0:.0f} s)")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
