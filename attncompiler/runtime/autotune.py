"""Per-GPU autotuner: benchmark the model's feasible plans, keep the fastest, remember it.

:func:`autotune` takes the candidates the planner accepts (ranked by its model, pruned to
``max_candidates``, the model's own choice always first; ``schedule="auto"``, the default, takes
v2's and -- on sm_90 -- v3's, interleaved by rank after the model's choice of
:func:`~attncompiler.plan.planner.choose_auto`), compiles each, checks it against the
float64 reference on a small shape and times it with CUDA events on the requested shape (median
of ``reps`` timed batches after warmup, rotating over several input sets so repeated runs do not
measure L2).  A candidate that fails to compile, to launch or to match the reference scores
``inf``.  The winner replaces the model's choice only when it is faster by more than ``min_gain``
(timing noise must not flip plans).  The stored result records which schedule won.

Results persist through :mod:`.tuned` (keys, the JSON store, lookups; re-exported here), and
tuning one key holds a per-key lock, so concurrent processes never benchmark the same key twice:
the second one waits, then reads the first one's result.  ``compile(schedule="auto")`` consults
:func:`find_tuned`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import sys
from typing import Any, Callable, Mapping, Optional, Sequence, Union, overload

from .. import env
from .tuned import (
    DeviceInfo, Shape, TuneError, TunedCandidate, TunedStore, TuneKey, TuneResult, auto_lookup_order, device_info,
    find_tuned, lookup_tuned, package_fingerprint, seqlen_bucket, spec_hash, store, tune_key,
)

__all__ = [
    "DeviceInfo", "TuneKey", "TunedCandidate", "TuneResult", "TuneError", "TunedStore", "autotune",
    "find_tuned", "lookup_tuned", "auto_lookup_order", "device_info", "package_fingerprint", "spec_hash", "seqlen_bucket",
    "tune_key", "tune_candidates", "tune_plans", "tune_stats", "format_tune_result", "store", "benchmark_ms",
    "format_options", "TUNE_SCHEDULES",
]

#: the schedules :func:`autotune` tunes ("auto": v2 and, on sm_90, v3 candidates together)
TUNE_SCHEDULES = ("auto", "v1", "v2", "v3")

_stats = {"tunes": 0, "benchmarks": 0, "cache_hits": 0}


def tune_stats() -> dict[str, int]:
    """Counters of this process: tunes run, candidates benchmarked, results served from the cache."""
    return dict(_stats)


# --- candidates -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _renders_stages() -> bool:
    """Whether the v2 codegen passes the plan's STAGES to the template (else only STAGES=1 renders)."""
    from ..codegen.schedule import get_schedule
    from ..ir.build import build_ir
    from ..plan.targets import get_target
    from ..plan.v2 import plan_v2
    from ..spec.spec import AttentionSpec

    ir = build_ir(AttentionSpec(head_dim=64))
    t = get_target("sm_90")
    ks = get_schedule("v2").render(ir, plan_v2(ir, t, block_m=128, block_n=64, num_warps=4, stages=2), t)
    return "STAGES = 2;" in ks.source


def tune_candidates(ir: Any, target: Any, schedule: str = "v2", max_candidates: Optional[int] = None
                    ) -> list[dict[str, Any]]:
    """Plan options of one ``schedule`` to benchmark, the model's choice first, then by model rank.

    v2: every accepted candidate of :func:`~attncompiler.plan.v2.candidates_v2`, each also with Q
    kept in / out of registers where that is feasible too (STAGES = 2 only once the codegen renders
    it).  v1: the FA1 rule at SRAM budgets M, M/2, M/4 and 48 KiB (distinct tilings only).  v3:
    :func:`~attncompiler.plan.v3_candidates.candidates_v3` (BLOCK_N, K/V stages, persistent grid), empty where
    v3 cannot run (not sm_90, head dims).  "auto" mixes schedules: see :func:`tune_plans`.
    """
    from ..plan.model import PlanError
    from ..plan.v1 import plan_v1
    from ..plan.v2 import candidates_v2, plan_v2
    from ..plan.v3_candidates import candidates_v3

    if schedule == "v2":
        base = plan_v2(ir, target)
        opts = [base.options]
        skip = {"score_skip": base.score_skip}  # the tiles are searched; the score skip stays the model's
        for c in (c for c in candidates_v2(ir, target) if c.accepted):
            flip = candidates_v2(ir, target, block_m=c.block_m, block_n=c.block_n, num_warps=c.num_warps,
                                 stages=c.stages, q_in_regs=not c.q_in_regs)[0]
            opts += [{**c.options, **skip}] + ([{**flip.options, **skip}] if flip.accepted else [])
        if not _renders_stages():
            opts = [o for o in opts if o["stages"] == 1]
    elif schedule == "v1":
        limit = target.max_smem_per_block_optin
        opts, seen = [], set()
        for budget in (None, limit // 2, limit // 4, 48 * 1024):
            try:
                p = plan_v1(ir, target, sram_budget=budget)
            except Exception:
                continue
            if (p.block_r, p.block_c) not in seen:
                seen.add((p.block_r, p.block_c))
                opts.append({} if budget is None else {"sram_budget": budget})
    elif schedule == "v3":
        try:
            opts = candidates_v3(ir, target)
        except PlanError:
            opts = []
    else:
        raise TuneError(f"schedule: expected 'v1', 'v2' or 'v3' (tune_plans also takes 'auto'), got {schedule!r}")
    out: list[dict[str, Any]] = []
    for o in opts:
        if o not in out:
            out.append(o)
    if max_candidates is not None:
        if max_candidates < 1:
            raise TuneError(f"max_candidates: expected a positive int or None, got {max_candidates!r}")
        out = out[:max_candidates]
    return out


def tune_plans(ir: Any, target: Any, schedule: str = "auto", max_candidates: Optional[int] = None
               ) -> list[tuple[str, dict[str, Any]]]:
    """``(schedule, plan options)`` pairs to benchmark, the model's choice first.

    A single schedule: :func:`tune_candidates`.  "auto": the candidates of the schedule
    :func:`~attncompiler.plan.planner.choose_auto` picks and of the other one of v2 / v3 (v3's only on
    sm_90 and where it supports the head dims), interleaved by rank starting with the model's choice,
    so that ``max_candidates`` keeps the best-ranked of both.
    """
    from ..plan.planner import choose_auto

    if schedule not in TUNE_SCHEDULES:
        raise TuneError(f"schedule: expected one of {', '.join(TUNE_SCHEDULES)}, got {schedule!r}")
    if schedule != "auto":
        return [(schedule, o) for o in tune_candidates(ir, target, schedule, max_candidates)]
    if max_candidates is not None and max_candidates < 1:
        raise TuneError(f"max_candidates: expected a positive int or None, got {max_candidates!r}")
    first = choose_auto(ir, target).schedule
    second = "v2" if first == "v3" else "v3"
    lists = [[(s, o) for o in tune_candidates(ir, target, s)] for s in (first, second)]
    out = [x[i] for i in range(max(len(x) for x in lists)) for x in lists if i < len(x)]
    return out if max_candidates is None else out[:max_candidates]


def format_options(o: Mapping[str, Any], schedule: str = "") -> str:
    """Plan options in short form: ``BM=128 BN=64 W=4 Qreg=0 S=1`` (``schedule`` given: ``v3 BN=128 S=3 P=0``)."""
    head = f"{schedule} " if schedule else ""
    if not o:
        return head + "(model default)"
    short = {"block_m": "BM", "block_n": "BN", "num_warps": "W", "q_in_regs": "Qreg", "stages": "S",
             "sram_budget": "M", "persistent": "P", "tma_store_o": "TS",
             "q_prefetch": "QP", "tile_list": "TL"}
    return head + " ".join(f"{short.get(k, k)}={int(v) if isinstance(v, bool) else v}" for k, v in o.items())


class _Progress:
    """A one-line text progress bar on stderr."""

    def __init__(self, total: int, label: str, enabled: bool, width: int = 24) -> None:
        self.total, self.label, self.enabled, self.width = total, label, enabled, width
        self.done = 0

    def step(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        fill = self.width * self.done // max(self.total, 1)
        bar = "#" * fill + "-" * (self.width - fill)
        sys.stderr.write(f"\r[tune {self.label}] |{bar}| {self.done}/{self.total} {text[:60]:<60}")
        sys.stderr.flush()
        if self.done == self.total:
            sys.stderr.write("\n")


# --- measuring ------------------------------------------------------------------------------------
def benchmark_ms(fn: Callable[[int], Any], *, reps: int = 10, warmup: int = 3, target_ms: float = 2.0) -> float:
    """Median GPU time (ms) of one ``fn(i)`` call (``i`` counts calls: use it to rotate input sets),
    from CUDA events around ``reps`` batches of calls (a batch lasts about ``target_ms``) after
    ``warmup`` calls; a spin kernel ahead of each batch lets the CPU queue the whole batch, so
    Python launch overhead is not what gets measured."""
    import torch

    for i in range(warmup):
        fn(i)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(max(warmup, 1)):
        fn(i)
    e1.record()
    torch.cuda.synchronize()
    per_call = max(e0.elapsed_time(e1) / max(warmup, 1), 1e-3)
    inner = max(1, min(50, math.ceil(target_ms / per_call)))
    sleep = getattr(torch.cuda, "_sleep", None)
    pairs = []
    n = 0
    for _ in range(reps):
        if sleep is not None:  # ~1 ms + ~0.2 ms per call (at ~2 GHz): longer than queuing the batch takes
            sleep(2_000_000 + inner * 400_000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn(n)
            n += 1
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) / inner for a, b in pairs)


def _measure(spec: Any, schedule: str, target: Any, options: Mapping[str, Any], shape: Shape, sets: list,
             *, reps: int, warmup: int, check: bool) -> TunedCandidate:
    import torch

    from ..api import compile as ac_compile
    from ..testing import check_kernel

    B, H, N, _ = shape
    try:
        kern = ac_compile(spec, schedule, target=target, build=True, **options)
        if check:
            res = check_kernel(kern, 1, 2, min(N, 257), min(N, 300))
            if not res.ok:
                return TunedCandidate(dict(options), math.inf, f"wrong answer: {res}")
        out = torch.empty(B, H, N, kern.ir.head_dim_v, device=sets[0][0].device, dtype=sets[0][0].dtype)
        _stats["benchmarks"] += 1
        ms = benchmark_ms(lambda i: kern(*sets[i % len(sets)], out=out, seed=1234), reps=reps, warmup=warmup)
        return TunedCandidate(dict(options), ms)
    except Exception as e:  # compile errors, launch errors, planner refusals: this candidate scores inf
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return TunedCandidate(dict(options), math.inf, f"{type(e).__name__}: {first[:300]}")


def _check_shape(shape: Any, ir: Any) -> Shape:
    if not isinstance(shape, (tuple, list)) or len(shape) != 4 or not all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape):
        raise TuneError(f"shape: expected (B, H, N, D) of positive ints, got {shape!r}")
    if shape[3] != ir.head_dim:
        raise TuneError(f"shape: expected D = the spec's head_dim {ir.head_dim}, got {shape[3]}")
    return tuple(shape)  # type: ignore[return-value]


def _input_sets(shape: Shape, ir: Any, n: int) -> list:
    """``n`` random (q, k, v) sets on the current GPU (timing rotates over them)."""
    import torch

    B, H, N, D = shape
    dt = torch.bfloat16 if ir.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(0)
    return [tuple(torch.randn(B, H, N, d, device="cuda", dtype=dt, generator=g) for d in (D, D, ir.head_dim_v))
            for _ in range(n)]


def _tune_one(spec: Any, ir: Any, shape: Shape, *, schedule: str, max_candidates: Optional[int], progress: bool,
              reps: int, warmup: int, input_sets: int, force: bool, check: bool, min_gain: float) -> TuneResult:
    from ..plan.targets import detect_target

    info = device_info()
    target = detect_target()
    key = tune_key(ir, shape[2], schedule, info)
    st = store()
    if not force:
        hit = st.get(key)
        if hit is not None:
            _stats["cache_hits"] += 1
            return dataclasses.replace(hit, shape=shape)
    lock = st.key_lock(key)
    if lock is not None:
        lock.acquire()
    try:
        if not force:  # another process may have tuned this key while we waited for the lock
            hit = st.get(key)
            if hit is not None:
                _stats["cache_hits"] += 1
                return dataclasses.replace(hit, shape=shape)
        _stats["tunes"] += 1
        cands = tune_plans(ir, target, schedule, max_candidates)
        if not cands:
            raise TuneError(f"no {schedule} plan to tune on {target.name} for D={ir.head_dim}, DV={ir.head_dim_v}")
        mixed = schedule == "auto"
        B, H, N, D = shape
        sets = _input_sets(shape, ir, input_sets)
        bar = _Progress(len(cands), f"{schedule} B={B} H={H} N={N} D={D}", progress)
        results = []
        for rank, (sched, opts) in enumerate(cands, 1):
            r = _measure(spec, sched, target, opts, shape, sets, reps=reps, warmup=warmup, check=check)
            results.append(dataclasses.replace(r, model_rank=rank, schedule=sched))
            label = format_options(opts, sched if mixed else "")
            bar.step(f"{label}: {r.ms:.4g} ms" if math.isfinite(r.ms) else f"{label}: failed")
        del sets
        default = results[0]
        best = min(results, key=lambda r: r.ms)
        if not math.isfinite(best.ms):
            raise TuneError("no candidate produced a correct kernel: " + "; ".join(
                f"{format_options(r.options, r.schedule if mixed else '')}: {r.error}" for r in results))
        if math.isfinite(default.ms) and best.ms > default.ms * (1.0 - min_gain):
            best = default  # not faster by more than min_gain: keep the model's choice
        res = TuneResult(key=key, shape=shape, options=dict(best.options), ms=best.ms,
                         default_options=dict(default.options), default_ms=default.ms, candidates=tuple(results),
                         path=str(st.path) if st.path else None, schedule=best.schedule,
                         default_schedule=default.schedule)
        st.put(res)
        if env.verbose():
            print(f"[attncompiler] tuned {key.digest()}: {format_options(res.options, res.schedule)} {res.ms:.4g} ms "
                  f"(model default {default.ms:.4g} ms)", file=sys.stderr)
        return res
    finally:
        if lock is not None:
            lock.release()


@overload
def autotune(spec: Any, shapes: Shape, **kw: Any) -> TuneResult: ...
@overload
def autotune(spec: Any, shapes: Sequence[Shape], **kw: Any) -> list[TuneResult]: ...


def autotune(spec: Any, shapes: Union[Shape, Sequence[Shape]], *, schedule: str = "auto",
             max_candidates: Optional[int] = 12, progress: bool = True, reps: int = 10, warmup: int = 3,
             input_sets: int = 3, force: bool = False, check: bool = True, min_gain: float = 0.02
             ) -> Union[TuneResult, list[TuneResult]]:
    """Tune ``spec`` (an AttentionSpec) on the current GPU for ``shapes`` -- one (B, H, N, D) or a list.

    ``schedule``: "auto" (default: v2 and, on sm_90, v3 candidates; the result's ``schedule`` says
    which won), "v1", "v2" or "v3".  ``compile(schedule="auto")`` uses any of these entries except
    v1's (:func:`~attncompiler.runtime.tuned.find_tuned`).  Each shape's seqlen bucket is tuned once
    and remembered (see the module docstring); a cached result is returned without benchmarking
    unless ``force``.  Returns a :class:`TuneResult` (a list of them for a list of shapes).  Raises
    :class:`TuneError` without a GPU, for a bad shape or schedule, or when every candidate fails.
    """
    from ..ir.build import build_ir
    from ..spec.spec import AttentionSpec

    if not isinstance(spec, AttentionSpec):
        raise TuneError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
    if schedule not in TUNE_SCHEDULES:
        raise TuneError(f"schedule: expected one of {', '.join(TUNE_SCHEDULES)}, got {schedule!r}")
    if not 0.0 <= min_gain < 1.0:
        raise TuneError(f"min_gain: expected a fraction in [0, 1), got {min_gain!r}")
    for name, v in (("reps", reps), ("input_sets", input_sets)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TuneError(f"{name}: expected a positive int, got {v!r}")
    ir = build_ir(spec)
    single = isinstance(shapes, (tuple, list)) and len(shapes) == 4 and all(isinstance(x, int) for x in shapes)
    todo = [shapes] if single else list(shapes)  # type: ignore[list-item]
    checked = [_check_shape(s, ir) for s in todo]
    device_info()  # fails early without a GPU
    out = [_tune_one(spec, ir, s, schedule=schedule, max_candidates=max_candidates, progress=progress, reps=reps,
                     warmup=warmup, input_sets=input_sets, force=force, check=check, min_gain=min_gain)
           for s in checked]
    return out[0] if single else out


def format_tune_result(res: TuneResult) -> str:
    """The candidate table (model rank, options, time, ratio to the model default) and the choice."""
    B, H, N, D = res.shape
    k = res.key
    mixed = k.schedule == "auto"  # candidates of several schedules: name each one's
    lines = [f"autotune {k.schedule} on {k.gpu_name} ({k.sm_arch}, CUDA runtime {k.cuda_runtime}, driver {k.driver}); "
             f"B={B} H={H} N={N} D={D} {k.dtype}, seqlen bucket {k.seqlen_bucket}"
             + ("  [from cache]" if res.from_cache else "")]
    rows = [("model rank", "plan options", "time ms", "vs default", "status")]
    for c in sorted(res.candidates, key=lambda c: (c.ms, c.model_rank)):
        ok = math.isfinite(c.ms)
        kept = dict(c.options) == dict(res.options) and c.schedule == res.schedule
        rows.append((str(c.model_rank), format_options(c.options, c.schedule if mixed else ""),
                     f"{c.ms:.4f}" if ok else "inf",
                     f"{res.default_ms / c.ms:.3f}x" if ok and math.isfinite(res.default_ms) else "-",
                     ("kept" if kept else "ok") if ok else (c.error or "failed")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    lines.append(f"chosen: {format_options(res.options, res.schedule if mixed else '')}: {res.ms:.4f} ms; model "
                 f"default {format_options(res.default_options, res.default_schedule if mixed else '')}: "
                 f"{res.default_ms:.4f} ms ({res.speedup:.3f}x)")
    if res.path:
        lines.append(f"stored in {res.path} (entry {k.digest()})")
    return "\n".join(lines)
