"""v2 planning: tile search for the FlashAttention-2 forward kernel (mma.sync m16n8k16).

Facts of the v2 kernel (``templates/v2_fwd.cu.j2``, ``include/attncompiler/v2_fwd.cuh``):

* a CTA of W warps owns BLOCK_M query rows; each warp owns 16*MT of them, MT = BLOCK_M / (16*W)
  m16 mma tiles, MT in {1, 2};
* the CTA loops over BLOCK_N-wide K/V tiles, through STAGES K/V shared-memory buffers (1: FA2's
  V_j-during-QK^T / K_{j+1}-during-PV overlap; 2: double-buffered K/V);
* shared memory, registers and HBM traffic are the sympy expressions of :mod:`.resources`
  (``V2_SMEM_BYTES``, ``V2_REGISTERS``, ``V2_HBM_TERMS``) -- the only place they are written;
  feasibility is the constraint set :data:`V2_CONSTRAINTS` over them.

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
   deterministic tie-break), 8. more K/V stages when occupancy is unchanged (double-buffered K/V
   with one barrier per tile measured 1-5% faster at D = 64 and 128 on an H200, 2026-11-21,
   docs/perf-notes.md).

The register estimate depends on the variant (:class:`~.resources.VariantFeatures`): a score_mod,
dropout's Philox state or a mask reading a buffer add one register per m16 x n8 tile of S
(:data:`~.resources.VARIANT_REGS_PER_S_TILE`), which can push the widest tiles over 255 and make
the search pick a narrower BLOCK_N; the reasons say so.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import sympy

from . import resources as R
from .model import Candidate, Plan, PlanError, ProblemDims, occupancy, resolve_dims, resolve_target, elem_bytes
from .resources import (
    A_FRAG_REGS_PER_TILE, ACC_REGS_PER_TILE, MMA_K, MMA_M, MMA_N, REG_OVERHEAD, SMEM_ROW_PAD, VARIANT_REGS_PER_S_TILE,
    Constraint, VariantFeatures, evaluate, target_values, variant_features,
)
from .scoreskip import score_skip_choice
from .targets import Target

__all__ = [
    "V2Plan", "plan_v2", "candidates_v2", "v2_smem_bytes", "v2_register_estimate", "preferred_block_n",
    "V2_BLOCK_M_CHOICES", "V2_BLOCK_N_CHOICES", "V2_NUM_WARPS_CHOICES", "V2_MT_CHOICES", "V2_STAGES_CHOICES",
    "V2_CONSTRAINTS", "MMA_M", "MMA_N", "MMA_K", "SMEM_ROW_PAD", "REG_OVERHEAD", "VARIANT_REGS_PER_S_TILE",
    "Q_IN_REGS_MAX",
    "HEAD_DIM_MULTIPLE", "HEAD_DIM_MAX", "OCCUPANCY_WARPS_CAP", "RANK_KEYS", "ACC_REGS_PER_TILE",
    "A_FRAG_REGS_PER_TILE",
]

# --- the search space and policy ------------------------------------------------------------------
V2_BLOCK_M_CHOICES = (64, 128)
V2_BLOCK_N_CHOICES = (32, 64, 128)
V2_NUM_WARPS_CHOICES = (4, 8)
V2_MT_CHOICES = (1, 2)  # m16 row tiles per warp
V2_STAGES_CHOICES = (1, 2)  # K/V shared-memory buffers (V2Config::STAGES)
HEAD_DIM_MULTIPLE = 16  # D and DV are k / n extents of m16n8k16 tiles
HEAD_DIM_MAX = 256
Q_IN_REGS_MAX = 200  # keep Q fragments in registers only while the total estimate stays <= 200
OCCUPANCY_WARPS_CAP = 8  # ranking counts resident warps per SM up to this many (model assumption)

#: Feasibility: every constraint must hold (the register one with Q in registers when it is kept).
V2_CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint("D mod 16", sympy.Mod(R.D, HEAD_DIM_MULTIPLE), allowed=(0,)),
    Constraint("DV mod 16", sympy.Mod(R.DV, HEAD_DIM_MULTIPLE), allowed=(0,)),
    Constraint("D", R.D, limit=sympy.Integer(HEAD_DIM_MAX)),
    Constraint("DV", R.DV, limit=sympy.Integer(HEAD_DIM_MAX)),
    Constraint("BLOCK_M", R.BLOCK_M, allowed=V2_BLOCK_M_CHOICES),
    Constraint("BLOCK_N", R.BLOCK_N, allowed=V2_BLOCK_N_CHOICES),
    Constraint("num_warps", R.WARPS, allowed=V2_NUM_WARPS_CHOICES),
    Constraint("stages", R.STAGES, allowed=V2_STAGES_CHOICES),
    Constraint("threads", R.THREADS, limit=R.THREAD_LIMIT),
    Constraint("smem", R.V2_SMEM_BYTES, limit=R.SMEM_LIMIT),
    Constraint("MT", R.MT, allowed=V2_MT_CHOICES),
    Constraint("registers", R.V2_REGISTERS, limit=R.REG_LIMIT),
)
_CONSTRAINTS = {c.name: c for c in V2_CONSTRAINTS}

RANK_KEYS: tuple[str, ...] = (
    "MT (m16 tiles per warp)",
    f"resident warps/SM (up to {OCCUPANCY_WARPS_CAP})",
    "BLOCK_N closeness to the preferred width",
    "larger BLOCK_M (fewer K/V passes)",
    "fewer registers",
    "fewer warps",
    "larger BLOCK_N",
    "more K/V stages (same occupancy)",
)


def _values(bm: int, bn: int, w: int, stages: int, d: int, dv: int, eb: int, q_regs: bool,
            feats: VariantFeatures) -> dict[sympy.Symbol, int]:
    return {R.BLOCK_M: bm, R.BLOCK_N: bn, R.WARPS: w, R.STAGES: stages, R.D: d, R.DV: dv, R.ELEM_BYTES: eb,
            R.Q_IN_REGS: int(q_regs), **feats.values()}


def v2_smem_bytes(block_m: int, block_n: int, d: int, dv: int, eb: int = 2, stages: int = 1) -> int:
    """``V2Layout::kSmemBytes``: the Q tile (rows padded to max(D, DV) + 8) and ``stages`` K and V
    tiles (rows padded by :data:`SMEM_ROW_PAD`), in bytes."""
    return evaluate(R.V2_SMEM_BYTES, {R.BLOCK_M: block_m, R.BLOCK_N: block_n, R.D: d, R.DV: dv, R.ELEM_BYTES: eb,
                                      R.STAGES: stages})


def v2_register_estimate(mt: int, block_n: int, d: int, dv: int,
                         variant: Any = None) -> dict[str, int]:
    """Per-thread register estimate by part: o, s, q (only if Q is kept in registers), overhead and
    the variant term (``variant``: an AttentionIR or :class:`VariantFeatures`; None = plain)."""
    feats = variant_features(variant) if variant is not None else VariantFeatures()
    vals = {R.BLOCK_M: MMA_M * mt, R.WARPS: 1, R.BLOCK_N: block_n, R.D: d, R.DV: dv, R.Q_IN_REGS: 1,
            **feats.values()}
    return {name: evaluate(expr, vals) for name, expr in R.V2_REGISTER_TERMS}


def preferred_block_n(d: int, dv: int) -> int:
    """128 for head dims <= 64 and > 128, else 64 (see the module docstring, ranking key 3).

    At 192/256 each warp owns 16 rows (MT = 1) and is shared-memory-bandwidth bound; a 128-wide
    K/V tile halves the per-tile softmax and barrier overhead (measured +4% at D = 256)."""
    m = max(d, dv)
    return 128 if (m <= 64 or m > 128) else 64


def _dims_problems(d: int, dv: int) -> list[str]:
    vals = {R.D: d, R.DV: dv}
    out = []
    for label in ("D", "DV"):
        ok = _CONSTRAINTS[f"{label} mod 16"].check(vals).ok and _CONSTRAINTS[label].check(vals).ok
        if not ok:
            x = d if label == "D" else dv
            out.append(f"{label}={x} must be a multiple of {HEAD_DIM_MULTIPLE} and <= {HEAD_DIM_MAX} "
                       f"(m16n8k16 tiles)")
    return out


def _choices(xs: tuple[int, ...]) -> str:
    return "{" + ", ".join(map(str, xs)) + "}"


def _reg_parts(r: dict[str, int]) -> str:
    txt = f"O {r['o']} + S {r['s']} + overhead {r['overhead']}"
    return txt + (f" + variant {r['variant']}" if r.get("variant") else "")


def _evaluate(bm: int, bn: int, w: int, stages: int, dims: ProblemDims, t: Target, q_in_regs: bool | None,
              feats: VariantFeatures) -> Candidate:
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    vals = {**_values(bm, bn, w, stages, d, dv, eb, False, feats), **target_values(t)}
    chk = {c.name: c.check(vals) for c in V2_CONSTRAINTS if c.name != "registers"}
    threads = evaluate(R.THREADS, vals)
    mt = chk["MT"].value
    problems = _dims_problems(d, dv)
    for name, label, xs in (("BLOCK_M", "BLOCK_M", V2_BLOCK_M_CHOICES), ("BLOCK_N", "BLOCK_N", V2_BLOCK_N_CHOICES),
                            ("num_warps", "num_warps", V2_NUM_WARPS_CHOICES), ("stages", "stages", V2_STAGES_CHOICES)):
        if not chk[name].ok:
            problems.append(f"{label}={chk[name].value} not in {_choices(xs)}")
    if not chk["threads"].ok:
        problems.append(f"{threads} threads > {t.max_threads_per_block} per block")
    smem = chk["smem"].value
    if not chk["smem"].ok:
        problems.append(f"smem {smem} B > {t.max_smem_per_block_optin} B per-block limit on {t.name}")
    regs, q_regs = 0, False
    if not chk["MT"].ok:
        problems.append(f"MT = {bm} / (16*{w}) = {mt:g} not in {_choices(V2_MT_CHOICES)}")
    else:
        r = v2_register_estimate(int(mt), bn, d, dv, feats)
        base = evaluate(R.V2_REGISTERS, vals)  # Q not in registers
        limit = t.max_registers_per_thread
        if base > limit:
            problems.append(f"registers ~{base}/thread > {limit} ({_reg_parts(r)})")
        elif q_in_regs is True and base + r["q"] > limit:
            problems.append(f"registers ~{base + r['q']}/thread > {limit} with Q in registers "
                            f"({_reg_parts(r)} + Q {r['q']})")
        q_regs = (base + r["q"] <= Q_IN_REGS_MAX) if q_in_regs is None else q_in_regs
        regs = evaluate(R.V2_REGISTERS, {**vals, R.Q_IN_REGS: int(q_regs)})
    occ = occupancy(t, smem, regs, threads) if regs else None
    ctas = occ.ctas_per_sm if occ else 0
    common = dict(schedule="v2", block_m=bm, block_n=bn, num_warps=w, num_threads=threads, mt=mt, q_in_regs=q_regs,
                  smem_bytes=smem, est_registers_per_thread=regs, stages=stages)
    if problems:
        return Candidate(**common, ctas_per_sm=ctas, accepted=False, reason="; ".join(problems))
    if ctas == 0:
        assert occ is not None
        return Candidate(**common, ctas_per_sm=0, accepted=False,
                         reason=f"no CTA fits on an SM ({occ.explain(t, smem, regs, threads)})")
    warps = min(ctas * w, OCCUPANCY_WARPS_CAP)
    pref = preferred_block_n(d, dv)
    score = (int(mt), warps, -abs(bn.bit_length() - pref.bit_length()), bm, -regs, -w, bn, stages)
    reason = (f"feasible: MT={int(mt)}, smem {smem} B <= {t.max_smem_per_block_optin} B, ~{regs} regs/thread "
              f"<= {t.max_registers_per_thread} ({'Q in registers' if q_regs else 'Q in smem'}), "
              f"{ctas} CTA(s)/SM ({ctas * w} warps)")
    return Candidate(**common, ctas_per_sm=ctas, accepted=True, reason=reason, score=score)


def candidates_v2(ir_or_dims: Any, target: Target | str | None, *, block_m: int | None = None,
                  block_n: int | None = None, num_warps: int | None = None,
                  q_in_regs: bool | None = None, stages: int | None = None) -> list[Candidate]:
    """Every configuration the v2 search considers, accepted and rejected, each with its reason.

    ``ir_or_dims``: an AttentionIR (its score_mod / dropout / mask enter the register estimate) or
    ProblemDims (a plain variant).  Forced values (``block_m=...`` etc.) restrict the enumeration
    to them (a value outside the allowed set is evaluated, and rejected with its reason).  Accepted
    candidates come first, best first (``rank`` 1, 2, ...), then the rejected ones in enumeration
    order.
    """
    dims = resolve_dims(ir_or_dims)
    feats = variant_features(ir_or_dims)
    t = resolve_target(target)
    bms = (block_m,) if block_m is not None else V2_BLOCK_M_CHOICES
    bns = (block_n,) if block_n is not None else V2_BLOCK_N_CHOICES
    ws = (num_warps,) if num_warps is not None else V2_NUM_WARPS_CHOICES
    ss = (stages,) if stages is not None else V2_STAGES_CHOICES
    cands = [_evaluate(bm, bn, w, s, dims, t, q_in_regs, feats) for s in ss for bm in bms for bn in bns for w in ws]
    accepted = sorted((c for c in cands if c.accepted), key=lambda c: c.score, reverse=True)
    ranked = [dataclasses.replace(c, rank=i) for i, c in enumerate(accepted, 1)]
    return ranked + [c for c in cands if not c.accepted]


@dataclass(frozen=True, kw_only=True)
class V2Plan(Plan):
    """A FlashAttention-2 forward plan: BLOCK_M x BLOCK_N tiles, W warps of MT m16 tiles each."""

    mt: int  # m16 row tiles per warp (each warp owns 16*mt query rows)
    q_in_regs: bool  # Q fragments kept in registers across the K/V loop (else re-read from smem)
    stages: int = 1  # K/V shared-memory buffers (V2Config::STAGES)
    score_skip: bool = False  # skip the K/V blocks whose every P underflows (plan/scoreskip.py)

    @property
    def options(self) -> dict[str, Any]:
        """The plan options that reproduce this plan (``plan_v2(ir, target, **p.options)``)."""
        return {"block_m": self.block_m, "block_n": self.block_n, "num_warps": self.num_warps,
                "q_in_regs": self.q_in_regs, "stages": self.stages, "score_skip": self.score_skip}

    def _config_lines(self) -> list[str]:
        lines = super()._config_lines()
        lines[0] += (f"; MT={self.mt} ({16 * self.mt} rows/warp); Q in {'registers' if self.q_in_regs else 'smem'}"
                     f"; STAGES={self.stages}")
        return lines


def _key_diff(a: tuple[int, ...], b: tuple[int, ...]) -> str:
    for name, x, y in zip(RANK_KEYS, a, b):
        if x != y:
            return f"{name} ({x} vs {y})"
    return "identical score"


def _variant_reason(ir_or_dims: Any, feats: VariantFeatures, best: Candidate, dims: ProblemDims, t: Target,
                    forced: dict[str, Any]) -> list[str]:
    """Why the variant's registers matter: the term, and the plain variant's choice it rules out."""
    if not feats.costly:
        return []
    var = v2_register_estimate(int(best.mt), best.block_n, dims.head_dim, dims.head_dim_v, feats)["variant"]
    out = [f"variant: {feats.describe()} -> +{VARIANT_REGS_PER_S_TILE} register per m16 x n8 tile of S, "
           f"MT*(BLOCK_N/8) = {var} here (calibrated with nvcc -Xptxas -v on the rendered kernels)"]
    plain = [c for c in candidates_v2(dims, t, **forced) if c.accepted]
    if plain and plain[0].config + (plain[0].stages,) != best.config + (best.stages,):
        p0 = plain[0]
        mine = candidates_v2(ir_or_dims, t, block_m=p0.block_m, block_n=p0.block_n, num_warps=p0.num_warps,
                             stages=p0.stages, q_in_regs=forced.get("q_in_regs"))[0]
        why = mine.reason if not mine.accepted else f"it ranks lower with the variant's registers (~{mine.est_registers_per_thread})"
        out.append(f"a plain variant would use BLOCK_M={p0.block_m}, BLOCK_N={p0.block_n}, {p0.num_warps} warps "
                   f"(~{p0.est_registers_per_thread} regs/thread); this variant's registers rule it out: {why}")
    return out


def plan_v2(ir_or_dims: Any, target: Target | str | None, *, block_m: int | None = None,
            block_n: int | None = None, num_warps: int | None = None,
            q_in_regs: bool | None = None, stages: int | None = None, score_skip: bool | None = None) -> V2Plan:
    """Best v2 configuration on ``target`` (or the forced one), with the reasons for it.

    Raises :class:`PlanError`, carrying the rejection reasons, when nothing feasible remains.
    """
    dims = resolve_dims(ir_or_dims)
    feats = variant_features(ir_or_dims)
    t = resolve_target(target)
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    dim_problems = _dims_problems(d, dv)
    if dim_problems:
        raise PlanError(f"v2 cannot tile head_dim={d}, head_dim_v={dv}: " + "; ".join(dim_problems))
    cands = candidates_v2(ir_or_dims, t, block_m=block_m, block_n=block_n, num_warps=num_warps,
                          q_in_regs=q_in_regs, stages=stages)
    accepted = [c for c in cands if c.accepted]
    rejected = [c for c in cands if not c.accepted]
    forced = {k: v for k, v in (("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps),
                                ("q_in_regs", q_in_regs), ("stages", stages)) if v is not None}
    forced_txt = ", ".join(f"{k}={v}" for k, v in forced.items())
    if not accepted:
        why = "; ".join(f"BLOCK_M={c.block_m} BLOCK_N={c.block_n} warps={c.num_warps} stages={c.stages}: {c.reason}"
                        for c in rejected)
        what = f"forced config ({forced_txt})" if forced else "any config"
        raise PlanError(f"no feasible v2 plan for {what} on {t.name} (D={d}, DV={dv}, {dims.dtype}, "
                        f"{feats.describe()}): {why}")
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
                   f" x warps {_choices(V2_NUM_WARPS_CHOICES if num_warps is None else (num_warps,))}"
                   f" x stages {_choices(V2_STAGES_CHOICES if stages is None else (stages,))}): "
                   f"{len(accepted)} feasible, {len(rejected)} rejected")
    reasons += _variant_reason(ir_or_dims, feats, best, dims, t, forced)
    reasons.append(f"chosen BLOCK_M={best.block_m}, BLOCK_N={best.block_n}, {best.num_warps} warps, STAGES="
                   f"{best.stages}: MT = {best.block_m} / (16*{best.num_warps}) = {mt} m16 tiles per warp "
                   f"({16 * mt} query rows)")
    qs = max(d, dv) + SMEM_ROW_PAD
    reasons.append(f"smem = (BLOCK_M*(max(D, DV)+8) + STAGES*BLOCK_N*((D+8) + (DV+8))) * {eb} = ({best.block_m}*{qs} + "
                   f"{best.stages}*{best.block_n}*({d + 8} + {dv + 8})) * {eb} = {best.smem_bytes} B "
                   f"<= {t.max_smem_per_block_optin} B")
    r = v2_register_estimate(mt, best.block_n, d, dv, feats)
    base = r["o"] + r["s"] + r["overhead"] + r["variant"]
    if best.q_in_regs:
        q_txt = (f"Q fragments MT*(D/16)*4 = {r['q']} kept in registers (total {base + r['q']} "
                 f"{'<= ' + str(Q_IN_REGS_MAX) if q_in_regs is None else '(forced)'})")
    else:
        q_txt = (f"Q in registers would add {r['q']} -> {base + r['q']}"
                 + (f" > {Q_IN_REGS_MAX}, so Q is re-read from smem" if q_in_regs is None else
                    ", not kept (forced)"))
    var_txt = f" + variant {r['variant']}" if r["variant"] else ""
    reasons.append(f"registers ~ O MT*(DV/8)*4 = {r['o']} + S MT*(BLOCK_N/8)*4 = {r['s']} + overhead "
                   f"{r['overhead']}{var_txt} = {base} <= {t.max_registers_per_thread}; {q_txt}")
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
        reasons.append(f"beat the runner-up BLOCK_M={ru.block_m}, BLOCK_N={ru.block_n}, {ru.num_warps} warps, "
                       f"STAGES={ru.stages} on {_key_diff(best.score, ru.score)}")
    skip, why_skip = score_skip_choice(ir_or_dims, "v2", score_skip)
    reasons.append(why_skip)
    for c in rejected:
        reasons.append(f"rejected BLOCK_M={c.block_m}, BLOCK_N={c.block_n}, {c.num_warps} warps, STAGES={c.stages}: "
                       f"{c.reason}")
    return V2Plan(
        schedule="v2", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype,
        block_m=best.block_m, block_n=best.block_n, num_warps=best.num_warps, num_threads=best.num_threads,
        smem_bytes=best.smem_bytes, est_registers_per_thread=best.est_registers_per_thread,
        ctas_per_sm=best.ctas_per_sm, reasons=tuple(reasons), mt=mt, q_in_regs=best.q_in_regs, stages=best.stages,
        score_skip=skip,
    )
