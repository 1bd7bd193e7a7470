"""Plans that explain themselves: schedule dispatch, HBM IO reports and tables.

The schedule planners live in :mod:`.v1` (FlashAttention-1 block-size rule) and :mod:`.v2`
(FlashAttention-2 tile search); shared types in :mod:`.model`.  This module re-exports them and
adds :func:`plan` (schedule dispatch), :func:`io_report` / :func:`format_io_report` (predicted HBM
bytes of standard attention vs. the plan's kernel) and :func:`format_candidates`.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from . import resources as R
from .model import Candidate, Plan, PlanError, ProblemDims, elem_bytes, resolve_dims, resolve_target
from .resources import evaluate
from .targets import Target, TargetError, get_target
from .v1 import V1Plan, plan_v1
from .v2 import V2Plan, candidates_v2, plan_v2
from .v3 import V3_OPTIONS, plan_v3, v3_head_dim_error

__all__ = [
    "Plan", "V1Plan", "V2Plan", "Candidate", "ProblemDims", "PlanError", "IOReport",
    "plan", "plan_v1", "plan_v2", "candidates_v2", "io_report", "format_io_report", "format_candidates",
    "format_resource_model",
    "SCHEDULES", "AutoChoice", "choose_auto", "auto_schedule", "check_plan_options", "plan_option_names",
]

# Schedule name -> planner.  A new schedule registers here and, where it applies, is picked by
# choose_auto().
SCHEDULES: dict[str, Callable[..., Plan]] = {"v1": plan_v1, "v2": plan_v2, "v3": plan_v3}


@dataclass(frozen=True)
class AutoChoice:
    """The prefill schedule ``schedule="auto"`` picks for one spec on one target, and why.

    ``reason`` is the first line of the plan's explanation, e.g. "schedule 'auto' on sm_90 -> v2:
    v3 needs head dims that are multiples of 16 and <= 256 (...), got head_dim=40".
    """

    schedule: str
    reason: str


def plan_option_names(schedule: str) -> tuple[str, ...]:
    """The plan options ``schedule``'s planner takes (its parameters after ``(ir_or_dims, target)``); empty for a
    schedule without a planner here (decode)."""
    fn = SCHEDULES.get(schedule)
    return tuple(inspect.signature(fn).parameters)[2:] if fn is not None else ()


def check_plan_options(schedule: str, options: dict[str, Any], context: str = "") -> None:
    """Raise PlanError when ``options`` holds a name ``schedule``'s planner does not take (``context``: why that
    schedule, e.g. the "auto" choice's reason). Schedules without a planner here (decode) are not checked."""
    if schedule not in SCHEDULES:
        return
    known = plan_option_names(schedule)
    foreign = sorted(set(options) - set(known))
    if foreign:
        why = f" ({context})" if context else ""
        raise PlanError(f"{schedule}{why}: expected plan options among {', '.join(known)}, got {', '.join(foreign)}")


def _v3_refusal(ir_or_dims: Any, t: Target, options: dict[str, Any]) -> str | None:
    """Why v3 cannot run this spec with these plan options on ``t`` (None: it can)."""
    if (t.major, t.minor) != (9, 0):
        return f"v3 needs sm_90a (TMA, wgmma, setmaxnreg), got {t.name}"
    foreign = sorted(set(options) - set(V3_OPTIONS))
    if foreign:
        return f"expected v3 plan options ({', '.join(V3_OPTIONS[:3])}), got {', '.join(foreign)}"
    dims = resolve_dims(ir_or_dims)
    bad = v3_head_dim_error(dims.head_dim, dims.head_dim_v)
    if bad:
        return bad
    try:
        plan_v3(ir_or_dims, t, **options)
    except PlanError as e:
        return str(e).split("; use schedule=")[0]
    return None


def choose_auto(ir_or_dims: Any, target: Target | str | None, **options: Any) -> AutoChoice:
    """The prefill schedule of ``schedule="auto"``: v3 on sm_90 (H100 / H200) when :func:`plan_v3`
    accepts the spec (head dims multiples of 16 up to 256) and the plan ``options``; else v2, with
    v3's refusal as the reason.  Other targets: v2.  (Per call, ``compile`` may still run the decode
    schedule, the v2 varlen kernels, or a tuned plan of another schedule; see ``api.compile``.)
    """
    t = resolve_target(target)
    why = _v3_refusal(ir_or_dims, t, dict(options))
    if why is None:
        dims = resolve_dims(ir_or_dims)
        return AutoChoice("v3", f"schedule 'auto' on {t.name} -> v3: Hopper (TMA + wgmma) and D={dims.head_dim}, "
                                f"DV={dims.head_dim_v} are multiples of 16 up to 256")
    return AutoChoice("v2", f"schedule 'auto' on {t.name} -> v2: {why}")


def auto_schedule(target: Target | str | None, ir_or_dims: Any = None, **options: Any) -> str:
    """The schedule name "auto" picks: :func:`choose_auto` for ``ir_or_dims``; without one, the
    target's preference (v3 on sm_90, else v2) -- pass the IR for the real choice."""
    if ir_or_dims is not None:
        return choose_auto(ir_or_dims, target, **options).schedule
    t = resolve_target(target)
    return "v3" if (t.major, t.minor) == (9, 0) else "v2"


def plan(ir_or_dims: Any, schedule: str = "auto", target: Target | str | None = None, **options: Any) -> Plan:
    """Plan ``ir_or_dims`` (AttentionIR or ProblemDims) with ``schedule`` on ``target``.

    ``target`` None means the current CUDA device (:func:`detect_target`).  ``options`` go to the
    schedule's planner (``sram_budget`` for v1; ``block_m``, ``block_n``, ``num_warps``,
    ``q_in_regs``, ``stages`` for v2; ``block_n``, ``stages``, ``persistent`` for v3).  "auto" picks
    by :func:`choose_auto` and puts its reason first in the plan's explanation.
    """
    names = (*SCHEDULES, "auto")
    if schedule not in names:
        raise PlanError(f"unknown schedule {schedule!r}; expected one of {', '.join(names)}")
    t = resolve_target(target)
    if schedule != "auto":
        check_plan_options(schedule, options)
        return SCHEDULES[schedule](ir_or_dims, t, **options)
    choice = choose_auto(ir_or_dims, t, **options)
    check_plan_options(choice.schedule, options, choice.reason)
    return _with_reason(SCHEDULES[choice.schedule](ir_or_dims, t, **options), choice.reason, first=True)


def _with_reason(p: Plan, reason: str, first: bool = False) -> Plan:
    reasons = (reason, *p.reasons) if first else (*p.reasons, reason)
    return dataclasses.replace(p, reasons=reasons)


# --- IO report -----------------------------------------------------------------------------------

Terms = tuple[tuple[str, int], ...]


@dataclass(frozen=True, kw_only=True)
class IOReport:
    """Predicted HBM bytes of standard attention and of the plan's kernel, for one problem size.

    Every term is already multiplied by B*H.  FLOPs count the two matmuls (2 per multiply-add:
    2*Nq*Nk*D + 2*Nq*Nk*DV per head, = 4*Nq*Nk*d when D == DV), halved when causal.  The roofline
    times are lower bounds max(bytes / HBM bandwidth, FLOPs / peak) on the plan's target (None
    where the target or its peak is unknown).
    """

    schedule: str
    target: str
    B: int
    H: int
    Nq: int
    Nk: int
    head_dim: int
    head_dim_v: int
    dtype: str
    causal: bool
    flops: int
    standard_terms: Terms
    schedule_terms: Terms
    standard_order: str
    schedule_order: str
    notes: tuple[str, ...] = ()
    standard_time_s: float | None = None
    schedule_time_s: float | None = None
    masked: bool = False  # a mask expression (not ``causal``) chose the counted tiles

    @property
    def standard_bytes(self) -> int:
        return sum(b for _, b in self.standard_terms)

    @property
    def schedule_bytes(self) -> int:
        return sum(b for _, b in self.schedule_terms)

    @property
    def standard_intensity(self) -> float:
        """FLOPs per HBM byte of standard attention."""
        return self.flops / self.standard_bytes

    @property
    def schedule_intensity(self) -> float:
        """FLOPs per HBM byte of the plan's kernel."""
        return self.flops / self.schedule_bytes


def _check_size(label: str, x: Any) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x <= 0:
        raise PlanError(f"{label} must be a positive int, got {x!r}")
    return x


def _v1_pair_rows(nq: int, nk: int, br: int, bc: int, causal: bool) -> int:
    """Sum over the v1 kernel's (K/V block j, Q block i) pairs of the Q block's rows.

    Without a mask that is Tc * Nq; under the bottom-right causal mask, tiles the mask empties are
    skipped by the kernel (no Q_i, O_i, l_i, m_i traffic)."""
    tc = -(-nk // bc)
    total = 0
    for i in range(-(-nq // br)):
        rows = min(nq, (i + 1) * br) - i * br
        if not causal:
            total += rows * tc
            continue
        last_key = min(nq, (i + 1) * br) - 1 + (nk - nq)
        if last_key >= 0:
            total += rows * min(tc, last_key // bc + 1)
    return total


def _v2_causal_kv_rows(nq: int, nk: int, bm: int, bn: int) -> int:
    """K/V rows one head's query blocks read under a bottom-right causal mask (empty tiles skipped)."""
    total = 0
    for i in range(-(-nq // bm)):
        last_key = min(nq, (i + 1) * bm) - 1 + (nk - nq)  # last key the block's last row sees
        if last_key >= 0:
            total += min(nk, -(-(last_key + 1) // bn) * bn)
    return total


@dataclass(frozen=True)
class _LiveTiles:
    """Non-empty tiles of a mask: per Q block the K/V rows it reads; per K/V block the Q rows."""

    kv_rows: int  # sum over Q blocks of the rows of their non-empty K/V tiles (v2's K/V reads)
    pair_rows: int  # sum over non-empty (K/V block, Q block) tiles of the Q block's rows (v1)
    elements: int  # q x k elements of the non-empty tiles
    tiles: int
    live: int


def _live_tiles(mask: Any, nq: int, nk: int, bm: int, bn: int) -> _LiveTiles | None:
    """Tile skipping as the kernels do it (the mask's tile classifier), or None when the classes
    depend on (b, h) -- the report then counts every tile."""
    from ..ir.bounds import TILE_EMPTY, tile_classifier
    from ..spec.symbols import B as SYM_B, H as SYM_H

    cls = tile_classifier(mask)
    if cls.inputs() & {SYM_B, SYM_H}:
        return None
    kv_rows = pair_rows = elements = tiles = live = 0
    for q_lo in range(0, nq, bm):
        q_hi = min(q_lo + bm, nq) - 1
        for kv_lo in range(0, nk, bn):
            kv_hi = min(kv_lo + bn, nk) - 1
            tiles += 1
            if cls.classify(q_lo, q_hi, kv_lo, kv_hi, 0, 0, nq, nk) == TILE_EMPTY:
                continue
            live += 1
            kv_rows += kv_hi - kv_lo + 1
            pair_rows += q_hi - q_lo + 1
            elements += (q_hi - q_lo + 1) * (kv_hi - kv_lo + 1)
    return _LiveTiles(kv_rows, pair_rows, elements, tiles, live)


def io_report(plan: Plan, B: int, H: int, Nq: int, Nk: int, causal: bool = False, *, mask: Any = None) -> IOReport:
    """Predicted HBM bytes (standard attention vs. ``plan``'s kernel) and FLOPs for one problem.

    standard: read Q, K, V; write S, read S, write P, read P (each Nq x Nk in the element dtype);
    write O.  v1 (FA1 Algorithm 1, Theorem 2: Theta(N^2 d^2 / M)): the fp32 O, l, m workspace
    initialized; K, V read once; each of the Tc = ceil(Nk / B_c) passes reads Q and reads + writes
    O, l, m (under ``causal`` only for the tiles the mask leaves non-empty); a final pass reads the
    fp32 O and writes it in the element dtype.  v2: Q read and O written once; K and V read once per query block,
    Tr = ceil(Nq / BLOCK_M) times (under ``causal`` only up to the diagonal, at BLOCK_N granularity).
    ``mask`` (an IR's mask_expr) generalizes ``causal``: the tiles its classifier proves empty are
    skipped in the counts, as the kernels skip them, and FLOPs count the non-empty tiles only.
    The byte counts are :mod:`.resources`' HBM expressions.  The optional lse output (Nq fp32 per
    head) is left out of every count.
    """
    B, H, Nq, Nk = (_check_size(n, x) for n, x in (("B", B), ("H", H), ("Nq", Nq), ("Nk", Nk)))
    d, dv, e = plan.head_dim, plan.head_dim_v, elem_bytes(plan.dtype)
    vals: dict[Any, int] = {R.BATCH: B, R.HEADS: H, R.NQ: Nq, R.NK: Nk, R.D: d, R.DV: dv, R.ELEM_BYTES: e,
                            R.BLOCK_M: plan.block_m, R.BLOCK_N: plan.block_n}
    flops = evaluate(R.FLOPS, vals)
    if causal:
        flops //= 2
    live = _live_tiles(mask, Nq, Nk, plan.block_m, plan.block_n) if mask is not None and not causal else None
    if live is not None:
        flops = 2 * B * H * live.elements * (d + dv)
    labels = {"qkv": "Q, K, V read", "s": "S = QK^T written + read by softmax", "p": "P written + read by PV",
              "o": "O written"}
    standard: Terms = tuple((labels[k], evaluate(x, vals)) for k, x in R.STANDARD_HBM_TERMS)
    notes: list[str] = []
    if isinstance(plan, V1Plan):
        tc = -(-Nk // plan.block_c)
        # sum of Q rows over the (j, i) pairs: dense Tc*Nq, or only the tiles causal leaves non-empty
        rows = (_v1_pair_rows(Nq, Nk, plan.block_r, plan.block_c, causal) if causal
                else live.pair_rows if live is not None else evaluate(R.V1_PAIR_ROWS_DENSE, vals))
        pairs = (f"{rows}, non-empty causal tiles only" if causal else f"{rows}, non-empty tiles of the mask only"
                 if live is not None else f"{rows} = Tc*Nq = {tc}*{Nq}")
        labels = {
            "init": "workspace init (A1 line 2): O, l, m fp32 written", "kv": "K_j, V_j read once",
            "q": f"Q_i read per (j, i) pair: rows {pairs}", "o": "O_i fp32 read + written per pair",
            "lm": "l_i, m_i fp32 read + written per pair", "final": "final pass: O fp32 read, O written (element dtype)",
        }
        sched: Terms = tuple((labels[k], evaluate(x, {**vals, R.PAIR_ROWS: rows})) for k, x in R.V1_HBM_TERMS)
        m = plan.sram_budget_elems
        order = (f"Theta(N^2 d^2 / M): Nq*Nk*d^2/M = {Nq}*{Nk}*{d}^2/{m} = {Nq * Nk * d * d / m:.4g} "
                 f"elements per head")
        if causal or live is not None:
            notes.append("standard counts do not skip masked blocks")
    elif isinstance(plan, V2Plan) or plan.schedule == "v3":  # v3 moves the same bytes (TMA instead of cp.async)
        tr = -(-Nq // plan.block_m)
        rows = (_v2_causal_kv_rows(Nq, Nk, plan.block_m, plan.block_n) if causal
                else live.kv_rows if live is not None else evaluate(R.V2_KV_ROWS_DENSE, vals))
        labels = {"q": "Q read once", "o": "O written once",
                  "kv": (f"K, V read per query block up to the causal diagonal (Tr={tr})" if causal
                         else f"K, V read per query block, non-empty tiles of the mask only (Tr={tr})"
                         if live is not None else f"K, V read once per query block: Tr={tr}")}
        sched = tuple((labels[k], evaluate(x, {**vals, R.KV_ROWS: rows})) for k, x in R.V2_HBM_TERMS)
        order = f"Theta(N d + N^2 d / BLOCK_M): Tr = ceil({Nq} / {plan.block_m}) = {tr} passes over K, V"
        if causal or live is not None:
            notes.append("standard counts do not skip masked blocks")
    else:
        raise PlanError(f"io_report has no model for schedule {plan.schedule!r}")
    if mask is not None and not causal:
        if live is None:
            notes.append("the mask's tile classes depend on (b, h): every tile counted")
        else:
            notes.append(f"the mask's tile classifier leaves {live.live} of {live.tiles} tiles "
                         f"({live.elements / (Nq * Nk):.4g} of the score matrix) non-empty; FLOPs count those")

    t_std = t_sched = None
    try:
        t = get_target(plan.target)
    except TargetError:
        t = None
    if t is not None:
        peak = {"v1": t.fp32_flops, "v3": t.peak_tensor_flops}.get(plan.schedule, t.mma_sync_flops)
        std_bytes = sum(b for _, b in standard)
        if t.peak_tensor_flops:
            t_std = max(std_bytes / t.hbm_bandwidth, flops / t.peak_tensor_flops)
        if peak:
            t_sched = max(sum(b for _, b in sched) / t.hbm_bandwidth, flops / peak)
        if plan.schedule == "v1":
            notes.append("v1 computes with scalar fp32 FMAs: its roofline uses the CUDA-core fp32 peak")
    return IOReport(
        schedule=plan.schedule, target=plan.target, B=B, H=H, Nq=Nq, Nk=Nk, head_dim=d, head_dim_v=dv,
        dtype=plan.dtype, causal=causal, flops=flops, standard_terms=standard, schedule_terms=sched,
        standard_order="Theta(N d + N^2)", schedule_order=order, notes=tuple(notes),
        standard_time_s=t_std, schedule_time_s=t_sched, masked=mask is not None and not causal,
    )


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n} B ({n / div:.3g} {unit})"
    return f"{n} B"


def _fmt_time(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1e6:.4g} us"


def format_io_report(report: IOReport) -> str:
    """Standard attention and the plan's kernel side by side: bytes, FLOPs, intensity, roofline."""
    r = report
    name = {"v1": "v1 (FA1)", "v2": "v2 (FA2 forward)"}.get(r.schedule, r.schedule)
    rows = [
        ("HBM bytes", _fmt_bytes(r.standard_bytes), _fmt_bytes(r.schedule_bytes)),
        ("FLOPs" + (" (causal: halved)" if r.causal else ""), f"{r.flops:.4g}", f"{r.flops:.4g}"),
        ("FLOP / byte", f"{r.standard_intensity:.4g}", f"{r.schedule_intensity:.4g}"),
        (f"roofline bound on {r.target}", _fmt_time(r.standard_time_s), _fmt_time(r.schedule_time_s)),
    ]
    w0 = max(len(a) for a, _, _ in rows) + 2
    w1 = max(max(len(b) for _, b, _ in rows), len("standard attention")) + 2
    lines = [
        f"HBM IO: {name} plan on {r.target}; B={r.B} H={r.H} Nq={r.Nq} Nk={r.Nk} D={r.head_dim} "
        f"DV={r.head_dim_v} {r.dtype}, " + ("mask: the tiles its classifier leaves non-empty" if r.masked
                                             else f"causal={r.causal}"),
        f"{'':<{w0}}{'standard attention':<{w1}}{name}",
        *(f"{a:<{w0}}{b:<{w1}}{c}" for a, b, c in rows),
        f"{name} moves {r.schedule_bytes / r.standard_bytes:.4g}x the bytes of standard attention",
        f"  standard: {r.standard_order}",
        *(f"    {label}: {b} B" for label, b in r.standard_terms),
        f"  {name}: {r.schedule_order}",
        *(f"    {label}: {b} B" for label, b in r.schedule_terms),
        *(f"  note: {n}" for n in r.notes),
    ]
    return "\n".join(lines)


def format_candidates(cands: list[Candidate]) -> str:
    """A fixed-width table of candidates: configuration, resources, verdict and reason."""
    header = ("rank", "BLOCK_M", "BLOCK_N", "warps", "stages", "MT", "smem B", "regs", "Q regs", "CTAs/SM", "ok",
              "reason")
    rows = [header]
    for c in cands:
        rows.append((
            str(c.rank) if c.accepted else "-", str(c.block_m), str(c.block_n), str(c.num_warps), str(c.stages),
            f"{c.mt:g}",
            str(c.smem_bytes), str(c.est_registers_per_thread) if c.est_registers_per_thread else "-",
            "yes" if c.q_in_regs else "no", str(c.ctas_per_sm) if c.accepted else "-",
            "yes" if c.accepted else "NO", c.reason,
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows)


def format_resource_model(schedule: str) -> str:
    """The schedule's resource model: its sympy expressions and feasibility constraints."""
    from .v1 import V1_SMEM_FITS
    from .v2 import V2_CONSTRAINTS

    if schedule == "v2":
        exprs = [("MT", R.MT), ("threads", R.THREADS), ("smem bytes", R.V2_SMEM_BYTES),
                 *((f"registers: {n}", e) for n, e in R.V2_REGISTER_TERMS), ("registers", R.V2_REGISTERS),
                 *((f"HBM bytes: {n}", e) for n, e in R.V2_HBM_TERMS), ("KV_ROWS without a mask", R.V2_KV_ROWS_DENSE)]
        cons: tuple[R.Constraint, ...] = V2_CONSTRAINTS
    elif schedule == "v1":
        exprs = [("smem bytes", R.V1_SMEM_BYTES), ("registers", R.V1_REGISTERS),
                 *((f"HBM bytes: {n}", e) for n, e in R.V1_HBM_TERMS), ("PAIR_ROWS without a mask", R.V1_PAIR_ROWS_DENSE)]
        cons = (V1_SMEM_FITS,)
    else:
        raise PlanError(f"no resource model for schedule {schedule!r}; expected v1 or v2")
    w = max(len(n) for n, _ in exprs)
    lines = [f"resource model ({schedule}; attncompiler/plan/resources.py), in BLOCK_M, BLOCK_N, D, DV, WARPS, "
             f"STAGES, ELEM_BYTES, Q_IN_REGS, HAS_* and BATCH, HEADS, NQ, NK:"]
    lines += [f"  {n:<{w}} = {e}" for n, e in exprs]
    lines.append("feasible iff every constraint holds:")
    lines += [f"  {c.describe()}" for c in cons]
    return "\n".join(lines)
