"""v2 planning: tile search for the FlashAttention-2 forward kernel (mma.sync m16n8k16).

Facts of the v2 kernel (``templates/v2_fwd.cu.j2``), as module constants:

* a CTA of W warps owns BLOCK_M query rows; each warp owns 16*MT of them, MT = BLOCK_M / (16*W)
  m16 mma tiles, MT in {1, 2};
* the CTA loops over BLOCK_N-wide K/V tiles;
* shared memory holds one Q tile, one K tile and one V tile in the element dtype, every row padded
  by 8 elements against bank conflicts:
      smem = (BLOCK_M*(D+8) + BLOCK_N*(D+8) + BLOCK_N*(DV+8)) * 2 bytes
* registers per thread (estimate): the O accumulator MT*(DV/8)*4 fp32, the S accumulator
  MT*(BLOCK_N/8)*4 fp32, Q fragments MT*(D/16)*4 when Q is kept in registers, ~40 overhead.

Ranking model (higher first; every key is documented in :data:`RANK_KEYS`):

1. MT: a warp reads its K/V fragments from shared memory once per k-step and reuses them for its
   MT m16 row tiles, so smem traffic per FLOP falls as 1/MT.
2. Resident warps per SM, counted up to :data:`OCCUPANCY_WARPS_CAP` (model assumption: beyond 8
   warps, i.e. 2 per scheduler, the kernel is bound by tensor-core issue, not latency).
3. BLOCK_N closeness to the preferred width: 128 when max(D, DV) <= 64 (cheap S tiles; a wide key
   tile amortizes the per-tile max/rescale and barriers), 64 above (the O accumulator is already
   large; a 64-wide S tile keeps registers under 255 and K/V tiles small).
4. Larger BLOCK_M: K and V are re-read from HBM/L2 once per query block, Tr = ceil(Nq/BLOCK_M).
5. Fewer estimated registers (less risk of spills), 6. fewer warps, 7. larger BLOCK_N (a
   deterministic tie-break).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .model import Candidate, Plan, PlanError, ProblemDims, occupancy, resolve_dims, resolve_target, elem_bytes
from .targets import Target

__all__ = [
    "V2Plan", "plan_v2", "candidates_v2", "v2_smem_bytes", "v2_register_estimate", "preferred_block_n",
    "V2_BLOCK_M_CHOICES", "V2_BLOCK_N_CHOICES", "V2_NUM_WARPS_CHOICES", "V2_MT_CHOICES", "MMA_M", "MMA_N",
    "MMA_K", "SMEM_ROW_PAD", "REG_OVERHEAD", "Q_IN_REGS_MAX", "HEAD_DIM_MULTIPLE", "HEAD_DIM_MAX",
    "OCCUPANCY_WARPS_CAP", "RANK_KEYS",
]

# --- facts of the v2 kernel ------------------------------------------------------------------
MMA_M, MMA_N, MMA_K = 16, 8, 16  # mma.sync.aligned.m16n8k16 (bf16/fp16 in, fp32 accumulate)
ACC_REGS_PER_TILE = 4  # an m16n8 fp32 accumulator is 128 values over 32 lanes: 4 per thread
A_FRAG_REGS_PER_TILE = 4  # an m16k16 bf16 A fragment is 256 values over 32 lanes: 8 halves = 4 regs
SMEM_ROW_PAD = 8  # elements of padding per smem row (16 B) so ldmatrix rows hit distinct banks
V2_BLOCK_M_CHOICES = (64, 128)
V2_BLOCK_N_CHOICES = (32, 64, 128)
V2_NUM_WARPS_CHOICES = (4, 8)
V2_MT_CHOICES = (1, 2)  # m16 row tiles per warp
HEAD_DIM_MULTIPLE = 16  # D and DV are k / n extents of m16n8k16 tiles
HEAD_DIM_MAX = 256
REG_OVERHEAD = 40  # addresses, loop indices, row max m and row sum l, masks
Q_IN_REGS_MAX = 200  # keep Q fragments in registers only while the total estimate stays <= 200
OCCUPANCY_WARPS_CAP = 8  # ranking counts resident warps per SM up to this many (model assumption)

RANK_KEYS: tuple[str, ...] = (
    "MT (m16 tiles per warp)",
    f"resident warps/SM (up to {OCCUPANCY_WARPS_CAP})",
    "BLOCK_N closeness to the preferred width",
    "larger BLOCK_M (fewer K/V passes)",
    "fewer registers",
    "fewer warps",
    "larger BLOCK_N",
)


def v2_smem_bytes(block_m: int, block_n: int, d: int, dv: int, eb: int = 2) -> int:
    """Q tile + one K tile + one V tile, rows padded by :data:`SMEM_ROW_PAD` elements."""
    return (block_m * (d + SMEM_ROW_PAD) + block_n * (d + SMEM_ROW_PAD) + block_n * (dv + SMEM_ROW_PAD)) * eb


def v2_register_estimate(mt: int, block_n: int, d: int, dv: int) -> dict[str, int]:
    """Per-thread register estimate by part: o, s, q (only if Q is kept in registers), overhead."""
    return {
        "o": mt * (dv // MMA_N) * ACC_REGS_PER_TILE,
        "s": mt * (block_n // MMA_N) * ACC_REGS_PER_TILE,
        "q": mt * (d // MMA_K) * A_FRAG_REGS_PER_TILE,
        "overhead": REG_OVERHEAD,
    }


def preferred_block_n(d: int, dv: int) -> int:
    """128 for head dims <= 64, else 64 (see the module docstring, ranking key 3)."""
    return 128 if max(d, dv) <= 64 else 64


def _dims_problems(d: int, dv: int) -> list[str]:
    out = []
    for label, x in (("D", d), ("DV", dv)):
        if x % HEAD_DIM_MULTIPLE or x > HEAD_DIM_MAX:
            out.append(f"{label}={x} must be a multiple of {HEAD_DIM_MULTIPLE} and <= {HEAD_DIM_MAX} "
                       f"(m16n8k16 tiles)")
    return out


def _choices(xs: tuple[int, ...]) -> str:
    return "{" + ", ".join(map(str, xs)) + "}"


def _evaluate(bm: int, bn: int, w: int, dims: ProblemDims, t: Target, q_in_regs: bool | None) -> Candidate:
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    threads = w * t.warp_size
    mt = bm / (MMA_M * w)
    problems = _dims_problems(d, dv)
    if bm not in V2_BLOCK_M_CHOICES:
        problems.append(f"BLOCK_M={bm} not in {_choices(V2_BLOCK_M_CHOICES)}")
    if bn not in V2_BLOCK_N_CHOICES:
        problems.append(f"BLOCK_N={bn} not in {_choices(V2_BLOCK_N_CHOICES)}")
    if w not in V2_NUM_WARPS_CHOICES:
        problems.append(f"num_warps={w} not in {_choices(V2_NUM_WARPS_CHOICES)}")
    if threads > t.max_threads_per_block:
        problems.append(f"{threads} threads > {t.max_threads_per_block} per block")
    smem = v2_smem_bytes(bm, bn, d, dv, eb)
    if smem > t.max_smem_per_block_optin:
        problems.append(f"smem {smem} B > {t.max_smem_per_block_optin} B per-block limit on {t.name}")
    regs, q_regs = 0, False
    if mt not in V2_MT_CHOICES:
        problems.append(f"MT = {bm} / (16*{w}) = {mt:g} not in {_choices(V2_MT_CHOICES)}")
    else:
        r = v2_register_estimate(int(mt), bn, d, dv)
        base = r["o"] + r["s"] + r["overhead"]
        limit = t.max_registers_per_thread
        parts = f"O {r['o']} + S {r['s']} + overhead {r['overhead']}"
        if base > limit:
            problems.append(f"registers ~{base}/thread > {limit} ({parts})")
        elif q_in_regs is True and base + r["q"] > limit:
            problems.append(f"registers ~{base + r['q']}/thread > {limit} with Q in registers "
                            f"({parts} + Q {r['q']})")
        q_regs = (base + r["q"] <= Q_IN_REGS_MAX) if q_in_regs is None else q_in_regs
        regs = base + r["q"] if q_regs else base
    occ = occupancy(t, smem, regs, threads) if regs else None
    ctas = occ.ctas_per_sm if occ else 0
    if problems:
        return Candidate(schedule="v2", block_m=bm, block_n=bn, num_warps=w, num_threads=threads, mt=mt,
                         q_in_regs=q_regs, smem_bytes=smem, est_registers_per_thread=regs, ctas_per_sm=ctas,
                         accepted=False, reason="; ".join(problems))
    if ctas == 0:
        return Candidate(schedule="v2", block_m=bm, block_n=bn, num_warps=w, num_threads=threads, mt=mt,
                         q_in_regs=q_regs, smem_bytes=smem, est_registers_per_thread=regs, ctas_per_sm=0,
                         accepted=False, reason=f"no CTA fits on an SM ({occ.explain(t, smem, regs, threads)})")
    warps = min(ctas * w, OCCUPANCY_WARPS_CAP)
    pref = preferred_block_n(d, dv)
    score = (int(mt), warps, -abs(bn.bit_length() - pref.bit_length()), bm, -regs, -w, bn)
    reason = (f"feasible: MT={int(mt)}, smem {smem} B <= {t.max_smem_per_block_optin} B, ~{regs} regs/thread "
              f"<= {t.max_registers_per_thread} ({'Q in registers' if q_regs else 'Q in smem'}), "
              f"{ctas} CTA(s)/SM ({ctas * w} warps)")
    return Candidate(schedule="v2", block_m=bm, block_n=bn, num_warps=w, num_threads=threads, mt=mt,
                     q_in_regs=q_regs, smem_bytes=smem, est_registers_per_thread=regs, ctas_per_sm=ctas,
                     accepted=True, reason=reason, score=score)


def candidates_v2(ir_or_dims: Any, target: Target | str | None, *, block_m: int | None = None,
                  block_n: int | None = None, num_warps: int | None = None,
                  q_in_regs: bool | None = None) -> list[Candidate]:
    """Every configuration the v2 search considers, accepted and rejected, each with its reason.

    Forced values (``block_m=...`` etc.) restrict the enumeration to them (a value outside the
    allowed set is evaluated, and rejected with its reason).  Accepted candidates come first, best
    first (``rank`` 1, 2, ...), then the rejected ones in enumeration order.
    """
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    bms = (block_m,) if block_m is not None else V2_BLOCK_M_CHOICES
    bns = (block_n,) if block_n is not None else V2_BLOCK_N_CHOICES
    ws = (num_warps,) if num_warps is not None else V2_NUM_WARPS_CHOICES
    cands = [_evaluate(bm, bn, w, dims, t, q_in_regs) for bm in bms for bn in bns for w in ws]
    accepted = sorted((c for c in cands if c.accepted), key=lambda c: c.score, reverse=True)
    ranked = [dataclasses.replace(c, rank=i) for i, c in enumerate(accepted, 1)]
    return ranked + [c for c in cands if not c.accepted]


@dataclass(frozen=True, kw_only=True)
class V2Plan(Plan):
    """A FlashAttention-2 forward plan: BLOCK_M x BLOCK_N tiles, W warps of MT m16 tiles each."""

    mt: int  # m16 row tiles per warp (each warp owns 16*mt query rows)
    q_in_regs: bool  # Q fragments kept in registers across the K/V loop (else re-read from smem)

    def _config_lines(self) -> list[str]:
        lines = super()._config_lines()
        lines[0] += f"; MT={self.mt} ({16 * self.mt} rows/warp); Q in {'registers' if self.q_in_regs else 'smem'}"
        return lines


def _key_diff(a: tuple[int, ...], b: tuple[int, ...]) -> str:
    for name, x, y in zip(RANK_KEYS, a, b):
        if x != y:
            return f"{name} ({x} vs {y})"
    return "identical score"


def plan_v2(ir_or_dims: Any, target: Target | str | None, *, block_m: int | None = None,
            block_n: int | None = None, num_warps: int | None = None,
            q_in_regs: bool | None = None) -> V2Plan:
    """Best v2 configuration on ``target`` (or the forced one), with the reasons for it.

    Raises :class:`PlanError`, carrying the rejection reasons, when nothing feasible remains.
    """
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    dim_problems = _dims_problems(d, dv)
    if dim_problems:
        raise PlanError(f"v2 cannot tile head_dim={d}, head_dim_v={dv}: " + "; ".join(dim_problems))
    cands = candidates_v2(dims, t, block_m=block_m, block_n=block_n, num_warps=num_warps, q_in_regs=q_in_regs)
    accepted = [c for c in cands if c.accepted]
    rejected = [c for c in cands if not c.accepted]
    forced = {k: v for k, v in (("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps),
                                ("q_in_regs", q_in_regs)) if v is not None}
    forced_txt = ", ".join(f"{k}={v}" for k, v in forced.items())
    if not accepted:
        why = "; ".join(f"BLOCK_M={c.block_m} BLOCK_N={c.block_n} warps={c.num_warps}: {c.reason}" for c in rejected)
        what = f"forced config ({forced_txt})" if forced else "any config"
        raise PlanError(f"no feasible v2 plan for {what} on {t.name} (D={d}, DV={dv}, {dims.dtype}): {why}")
    best = accepted[0]
    mt = int(best.mt)
    reasons = [
        f"D={d}, DV={dv} ({dims.dtype}): multiples of {HEAD_DIM_MULTIPLE}, <= {HEAD_DIM_MAX} (mma.sync m16n8k16)",
        f"limits on {t.name}: smem {t.max_smem_per_block_optin} B per block (opt-in), {t.smem_per_sm} B per SM; "
        f"registers <= {t.max_registers_per_thread}/thread, {t.registers_per_sm}/SM",
    ]
    if forced:
        reasons.append(f"forced by the caller: {forced_txt}")
    reasons.append(f"searched {len(cands)} configs (BLOCK_M {_choices(V2_BLOCK_M_CHOICES if block_m is None else (block_m,))}"
                   f" x BLOCK_N {_choices(V2_BLOCK_N_CHOICES if block_n is None else (block_n,))}"
                   f" x warps {_choices(V2_NUM_WARPS_CHOICES if num_warps is None else (num_warps,))}): "
                   f"{len(accepted)} feasible, {len(rejected)} rejected")
    reasons.append(f"chosen BLOCK_M={best.block_m}, BLOCK_N={best.block_n}, {best.num_warps} warps: "
                   f"MT = {best.block_m} / (16*{best.num_warps}) = {mt} m16 tiles per warp ({16 * mt} query rows)")
    reasons.append(f"smem = (BLOCK_M*(D+8) + BLOCK_N*(D+8) + BLOCK_N*(DV+8)) * {eb} = ({best.block_m}*{d + 8} + "
                   f"{best.block_n}*{d + 8} + {best.block_n}*{dv + 8}) * {eb} = {best.smem_bytes} B "
                   f"<= {t.max_smem_per_block_optin} B")
    r = v2_register_estimate(mt, best.block_n, d, dv)
    base = r["o"] + r["s"] + r["overhead"]
    if best.q_in_regs:
        q_txt = (f"Q fragments MT*(D/16)*4 = {r['q']} kept in registers (total {base + r['q']} "
                 f"{'<= ' + str(Q_IN_REGS_MAX) if q_in_regs is None else '(forced)'})")
    else:
        q_txt = (f"Q in registers would add {r['q']} -> {base + r['q']}"
                 + (f" > {Q_IN_REGS_MAX}, so Q is re-read from smem" if q_in_regs is None else
                    ", not kept (forced)"))
    reasons.append(f"registers ~ O MT*(DV/8)*4 = {r['o']} + S MT*(BLOCK_N/8)*4 = {r['s']} + overhead "
                   f"{r['overhead']} = {base} <= {t.max_registers_per_thread}; {q_txt}")
    occ = occupancy(t, best.smem_bytes, best.est_registers_per_thread, best.num_threads)
    reasons.append(occ.explain(t, best.smem_bytes, best.est_registers_per_thread, best.num_threads))
    if best.smem_bytes > t.static_smem_per_block:
        reasons.append(f"{best.smem_bytes} B > {t.static_smem_per_block} B static limit: launch with the "
                       f"dynamic shared memory opt-in")
    pref = preferred_block_n(d, dv)
    reasons.append(f"ranking (higher first): {'; '.join(RANK_KEYS)}; preferred BLOCK_N = {pref} for "
                   f"max(D, DV) = {max(d, dv)} ({'<= 64' if pref == 128 else '> 64'})")
    if len(accepted) > 1:
        ru = accepted[1]
        reasons.append(f"beat the runner-up BLOCK_M={ru.block_m}, BLOCK_N={ru.block_n}, {ru.num_warps} warps on "
                       f"{_key_diff(best.score, ru.score)}")
    for c in rejected:
        reasons.append(f"rejected BLOCK_M={c.block_m}, BLOCK_N={c.block_n}, {c.num_warps} warps: {c.reason}")
    return V2Plan(
        schedule="v2", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype,
        block_m=best.block_m, block_n=best.block_n, num_warps=best.num_warps, num_threads=best.num_threads,
        smem_bytes=best.smem_bytes, est_registers_per_thread=best.est_registers_per_thread,
        ctas_per_sm=best.ctas_per_sm, reasons=tuple(reasons), mt=mt, q_in_regs=best.q_in_regs,
    )
