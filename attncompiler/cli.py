"""The ``attncompiler`` command: show generated CUDA, explain plans, run a variant on the GPU.

    attncompiler show SPEC [--schedule auto|v1|v2|v3|decode] [--arch sm_90] [--backward [--deterministic]]
                           (--backward: the v3 backward on sm_90 at d = 48-128, 192, 256, else v2; --option schedule=v2)
                                                                print the generated CUDA
    attncompiler plan SPEC [--schedule ...] [--arch ...] [--all] [--sram-budget BYTES] [--shape B,H,N]
                           [--backward [--deterministic]]  (the backward's plan and why v3 is not used)
    attncompiler run  SPEC [--schedule ...] [--shape B,H,N]     compile, check against float64, time
    attncompiler tune SPEC --shape B,H,N,D [--schedule auto|v1|v2|v3] [--max-candidates K] [--force]
    attncompiler presets                                        list preset names

SPEC is a preset name (``causal``, ``alibi``, ...) or ``path/to/file.py:NAME`` where NAME is an
AttentionSpec or a function returning one.  Without a GPU, ``run`` plans, renders and compiles the
kernel with nvcc for the given arch instead of running it.  ``plan --all`` adds the resource model
(sympy expressions and constraints) and every candidate with its verdict; ``--sram-budget`` is
FA1's M for v1 (it selects v1 under ``--schedule auto``).  Under ``--schedule auto`` (the default)
``plan`` and ``show`` put the choice and its reason first in the plan's explanation (v3 on sm_90 /
sm_90a when v3 supports the head dims, else v2: ``attncompiler.plan.planner.choose_auto``).  ``tune``
(GPU) benchmarks the feasible plans (``auto``: v2's and, on sm_90, v3's), prints every candidate's
time and keeps the fastest, with its schedule, for ``compile(schedule="auto")``.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["main", "load_spec"]


def load_spec(text: str, *, head_dim: int, dtype: str, num_heads: int = 4, seqlen: int = 1024):
    """A preset name or ``file.py:NAME`` -> AttentionSpec."""
    from .spec.presets import get_preset
    from .spec.spec import AttentionSpec

    if ":" in text and text.split(":", 1)[0].endswith(".py"):
        path, name = text.split(":", 1)
        p = Path(path)
        if not p.is_file():
            raise SystemExit(f"attncompiler: spec file not found: expected a file at {path}")
        mod_spec = importlib.util.spec_from_file_location(p.stem, p)
        assert mod_spec is not None and mod_spec.loader is not None
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        if not hasattr(mod, name):
            raise SystemExit(f"attncompiler: {path} has no {name!r}; expected an AttentionSpec or a function")
        obj = getattr(mod, name)
        spec = obj() if callable(obj) and not isinstance(obj, AttentionSpec) else obj
        if not isinstance(spec, AttentionSpec):
            raise SystemExit(f"attncompiler: {text}: expected an AttentionSpec, got {type(spec).__name__}")
        return spec
    return get_preset(text, head_dim=head_dim, dtype=dtype, num_heads=num_heads, seqlen=seqlen)


def _target(arch: str | None):
    from .plan.targets import detect_target, get_target

    if arch:
        return get_target(arch)
    try:
        import torch

        if torch.cuda.is_available():
            return detect_target()
    except ImportError:
        pass
    return get_target("sm_90")


def _plan_options(items: Sequence[str] | None) -> dict[str, object]:
    """``--option KEY=VALUE`` items as plan options: true / false as bools, integers as ints."""
    out: dict[str, object] = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option: expected KEY=VALUE (e.g. q_prescale=true, block_n=96), got {item!r}")
        low = text.strip().lower()
        if key.strip() == "schedule":  # the backward's schedule (show --backward --option schedule=v2)
            out["schedule"] = low
            continue
        if low in ("true", "false"):
            out[key.strip()] = low == "true"
            continue
        try:
            out[key.strip()] = int(low)
        except ValueError:
            raise ValueError(f"--option {key.strip()}: expected true, false or an integer, got {text!r}") from None
    return out


def _kernel_source(args):
    import dataclasses

    from .codegen.schedule import get_schedule
    from .ir.build import build_ir
    from .plan.planner import check_plan_options, choose_auto

    spec = load_spec(args.spec, head_dim=args.head_dim, dtype=args.dtype, num_heads=args.heads, seqlen=args.seqlen)
    tgt = _target(args.arch)
    budget = getattr(args, "sram_budget", None)
    if budget is not None and args.schedule == "v2":
        raise ValueError(f"--sram-budget is FA1's M: expected --schedule v1 (or auto), got --schedule {args.schedule}")
    if budget is not None and args.schedule == "auto":
        print("note: --sram-budget is FA1's M, so the v1 schedule is planned", file=sys.stderr)
        args.schedule = "v1"
    ir = build_ir(spec)
    given = _plan_options(getattr(args, "option", None))
    choice = choose_auto(ir, tgt, **given) if args.schedule == "auto" else None
    name = choice.schedule if choice is not None else args.schedule
    sched = get_schedule(name)
    opts = {"sram_budget": budget} if name == "v1" and budget is not None else {}
    opts.update(given)
    check_plan_options(name, opts, choice.reason if choice is not None else "")
    plan = sched.make_plan(ir, tgt, **opts)
    if choice is not None:  # the choice and why, first in the explanation (and the source's banner)
        plan = dataclasses.replace(plan, reasons=(choice.reason, *plan.reasons))
    return spec, ir, tgt, sched, sched.render(ir, plan, tgt)


def _cmd_show(args) -> int:
    if getattr(args, "backward", False):
        from .ir.build import build_ir
        from .runtime.backward import bwd_source

        spec = load_spec(args.spec, head_dim=args.head_dim, dtype=args.dtype, num_heads=args.heads,
                         seqlen=args.seqlen)
        tgt = _target(args.arch)
        ir = build_ir(spec)
        # what .backward() runs: the v3 backward on sm_90 where it applies, else v2 (--option schedule=v2|v3)
        print(bwd_source(ir, tgt, deterministic=args.deterministic,
                         options=_plan_options(getattr(args, "option", None))).source)
        return 0
    _, _, _, _, ks = _kernel_source(args)
    print(ks.source)
    return 0


def _ints(text: str, n: int, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != n or min(vals) <= 0:
        raise ValueError(f"--shape: expected {what} ({n} positive ints), got {text!r}")
    return vals


def _cmd_plan_backward(args) -> int:
    from .ir.build import build_ir, format_ir
    from .plan.v3_bwd import v3_bwd_auto_refusal
    from .runtime.backward import bwd_source

    spec = load_spec(args.spec, head_dim=args.head_dim, dtype=args.dtype, num_heads=args.heads, seqlen=args.seqlen)
    tgt = _target(args.arch)
    ir = build_ir(spec)
    opts = _plan_options(getattr(args, "option", None))
    src = bwd_source(ir, tgt, deterministic=args.deterministic, options=opts)
    print(format_ir(ir))
    print()
    print(src.plan.describe())
    refusal = v3_bwd_auto_refusal(ir, tgt, deterministic=args.deterministic)
    if src.plan.schedule != "v3_bwd":
        why = refusal or f"asked for {opts.get('schedule', 'auto')!r} with options {sorted(opts)}"
        print(f"\nv3 backward not used: {why}")
    return 0


def _ptxas_line(ks) -> str:
    """ptxas's report of the kernel source ``ks`` through NVRTC: registers and spills, or why it could not run."""
    from .runtime.compiler import CompileError, nvrtc_unavailable, ptxas_report

    why = nvrtc_unavailable()
    if why is not None:
        return f"machine code: not compiled ({why})"
    try:
        rep = ptxas_report(ks.source, ks.arch)
    except CompileError as e:
        return f"machine code: NVRTC refused the source for {ks.arch}: {str(e)[:300]}"
    spills = (f"spills {rep.spill_stores} B stores / {rep.spill_loads} B loads (local memory: slower)"
              if rep.spill_bytes else "no spills")
    regs = f"{rep.registers} registers per thread"
    if ks.schedule == "v3":
        regs += " at launch (setmaxnreg then moves them from the producer warpgroup to the consumers)"
    return f"machine code (ptxas through NVRTC, {rep.arch}): {regs}, {spills}"


def _cmd_plan(args) -> int:
    from .ir.build import format_ir
    from .plan.planner import candidates_v2, format_candidates, format_io_report, format_resource_model, io_report

    if getattr(args, "backward", False):
        return _cmd_plan_backward(args)
    if args.shape:
        B, H, N = _ints(args.shape, 3, "B,H,N")
        args.heads, args.seqlen = H, N
    else:
        N = args.seqlen
        B, H = max(1, 16384 // N), args.heads
    _, ir, tgt, _, ks = _kernel_source(args)
    print(format_ir(ir))
    print()
    print(ks.plan.describe())
    print()
    if ks.schedule == "decode":  # no IO model: the run-time split choice for one query row against N keys
        from .plan.decode import choose_splits

        c = choose_splits(ks.plan, B=B, H=H, H_kv=H, Nq=1, Nk=N)
        print(f"split choice for B={B}, H=H_kv={H}, Nq=1, Nk={N}: {c.num_splits} split(s)")
        print("\n".join(f"  {r}" for r in c.reasons))
        return 0
    # masked tiles the classifier proves empty are skipped by the kernels, and in the report
    print(format_io_report(io_report(ks.plan, B, H, N, N, mask=ir.mask_expr)))
    if getattr(args, "ptxas", False):
        print()
        print(_ptxas_line(ks))
    if args.all:
        print()
        if ks.schedule == "v3":  # no sympy resource model: the tile space with each tile's numbers
            from .plan.v3_candidates import format_candidates_v3

            print(format_candidates_v3(ir, tgt))
            return 0
        print(format_resource_model(ks.schedule))
        if ks.schedule == "v2":
            print()
            print(format_candidates(candidates_v2(ir, tgt)))
    return 0


def _cmd_tune(args) -> int:
    from .runtime.autotune import TuneError, autotune, format_tune_result

    B, H, N, D = _ints(args.shape, 4, "B,H,N,D")
    spec = load_spec(args.spec, head_dim=D, dtype=args.dtype, num_heads=H, seqlen=N)
    try:
        res = autotune(spec, (B, H, N, D), schedule=args.schedule, max_candidates=args.max_candidates,
                       force=args.force, reps=args.reps, progress=not args.quiet)
    except TuneError as e:
        print(f"attncompiler: tune: {e}", file=sys.stderr)
        return 2
    print(format_tune_result(res))
    return 0


def _cmd_bench(args) -> int:
    from .bench.runner import run_args

    return run_args(args)


def _cmd_presets(args) -> int:
    from .spec.presets import PRESETS

    for name in PRESETS:
        print(name)
    return 0


def _cmd_run(args) -> int:
    import torch

    B, H, N = (int(x) for x in args.shape.split(","))
    args.heads, args.seqlen = H, N  # presets sized per head / per token follow the shape
    spec, ir, tgt, sched, ks = _kernel_source(args)
    print(ks.plan.describe())
    if not torch.cuda.is_available():
        from .runtime.compiler import CompileError, compile_with_nvcc

        src = ks.source
        hooks = src[src.index("struct Variant {"):]
        hooks = hooks[: hooks.index("\n};") + 3]
        print(f"\nno CUDA device: the variant's hooks in the generated CUDA "
              f"({len(src.splitlines())} lines in all; `attncompiler show {args.spec}` prints them):\n")
        print(hooks)
        print(f"\ncompiling offline with nvcc for {ks.arch} ...")
        try:
            rep = compile_with_nvcc(ks.source, ks.arch)
        except CompileError as e:
            print(e)
            return 1
        print(f"nvcc {ks.arch}: {rep.registers} registers, {rep.spill_stores} B spill stores, "
              f"{rep.spill_loads} B spill loads, {rep.stack_bytes} B stack, {rep.seconds:.2f} s")
        return 0
    from .api import compile as ac_compile
    from .reference import eager_attention, error_ratio_check, reference_attention

    t0 = time.perf_counter()
    kern = ac_compile(spec, args.schedule, **_plan_options(args.option))
    t_compile = time.perf_counter() - t0
    dt = torch.bfloat16 if ir.dtype == "bf16" else torch.float16
    q = torch.randn(B, H, N, ir.head_dim, device="cuda", dtype=dt)
    k = torch.randn(B, H, N, ir.head_dim, device="cuda", dtype=dt)
    v = torch.randn(B, H, N, ir.head_dim_v, device="cuda", dtype=dt)
    seed = 1234
    out = kern(q, k, v, seed=seed)
    bufs = kern._buffers
    ref = reference_attention(q, k, v, ir, buffers=bufs, seed=seed)
    eag = eager_attention(q, k, v, ir, buffers=bufs, seed=seed)
    ok, msg = error_ratio_check(out, ref, eag)
    print(f"\ncompile {t_compile:.2f} s (schedule {ks.schedule}, {ks.arch})")
    print(f"accuracy vs float64 reference: {msg} -> {'PASS' if ok else 'FAIL'}")
    for _ in range(3):
        kern(q, k, v, seed=seed)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    e0.record()
    for _ in range(reps):
        kern(q, k, v, seed=seed)
    e1.record()
    torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / reps
    flops = 4 * B * H * N * N * ir.head_dim
    print(f"time {ms:.3f} ms for B={B} H={H} N={N} d={ir.head_dim}: {flops / ms / 1e9:.1f} TFLOP/s "
          f"(dense-equivalent FLOPs, 4*B*H*N^2*d)")
    return 0 if ok else 1


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="attncompiler", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", help="preset name (see `attncompiler presets`) or path/to/file.py:NAME")
        p.add_argument("--schedule", default="auto", choices=["auto", "v1", "v2", "v3", "decode"])
        p.add_argument("--arch", default=None, help="target, e.g. sm_80, sm_90 (default: this GPU, else sm_90)")
        p.add_argument("--head-dim", type=int, default=128)
        p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
        p.add_argument("--heads", type=int, default=16, help="heads (presets sized per head, e.g. ALiBi slopes)")
        p.add_argument("--seqlen", type=int, default=1024, help="sequence length (presets sized per token)")

    def options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--option", action="append", metavar="KEY=VALUE",
                       help="a plan option of the schedule, repeatable (e.g. --option q_prescale=true "
                            "--option block_n=96; `attncompiler plan SPEC` lists the schedule's reasons)")

    p = sub.add_parser("show", help="print the generated CUDA source")
    common(p)
    options(p)
    p.add_argument("--backward", action="store_true",
                   help="print the backward kernels .backward() runs, whatever --schedule says: v3 on sm_90 "
                        "for head dims 48-128, 192 and 256, else v2 (--option schedule=v2|v3 and the backward's plan "
                        "options)")
    p.add_argument("--deterministic", action="store_true",
                   help="with --backward: the deterministic variant (dQ added in a fixed order: v3's CTAs take "
                        "turns per query block, v2 runs a separate dQ pass)")
    p.set_defaults(fn=_cmd_show)
    p = sub.add_parser("plan", help="print the IR, the plan and why, and the IO report")
    common(p)
    options(p)
    p.add_argument("--all", action="store_true", help="list every candidate, accepted and rejected, with why")
    p.add_argument("--sram-budget", type=int, default=None, help="v1: FA1's M in bytes (selects v1 under auto)")
    p.add_argument("--shape", default=None, help="B,H,N for the IO report (default B=16384/N, --heads, --seqlen)")
    p.add_argument("--backward", action="store_true",
                   help="the backward's plan instead (v3 on sm_90 for head dims 48-128, 192 and 256, else v2; "
                        "--option schedule=v2|v3 and the backward's plan options), and why v3 is not used where it "
                        "is not")
    p.add_argument("--deterministic", action="store_true", help="with --backward: the deterministic backward")
    p.add_argument("--ptxas", action="store_true",
                   help="also compile the forward kernel with NVRTC and print ptxas's registers and spills (no GPU)")
    p.set_defaults(fn=_cmd_plan)
    p = sub.add_parser("run", help="compile, check against the float64 reference and time (GPU)")
    common(p)
    options(p)
    p.add_argument("--shape", default="2,16,1024", help="B,H,N (default 2,16,1024)")
    p.set_defaults(fn=_cmd_run)
    p = sub.add_parser("tune", help="benchmark the feasible plans on this GPU and keep the fastest")
    common(p)
    p.add_argument("--shape", required=True, help="B,H,N,D (D sets the head dim)")
    p.add_argument("--max-candidates", type=int, default=12, help="plans to benchmark, best-ranked first")
    p.add_argument("--reps", type=int, default=10, help="timed batches per candidate (median)")
    p.add_argument("--force", action="store_true", help="re-benchmark even if a tuned plan is cached")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=_cmd_tune)
    p = sub.add_parser("bench", help="benchmark suite beside SDPA and FlexAttention: JSON, markdown, plots (GPU)")
    from .bench import add_arguments as bench_arguments

    bench_arguments(p)
    p.set_defaults(fn=_cmd_bench)
    p = sub.add_parser("presets", help="list preset names")
    p.set_defaults(fn=_cmd_presets)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"attncompiler: error: {e}", file=sys.stderr)
        return 2
