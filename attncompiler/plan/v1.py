"""v1 planning: FlashAttention-1's block-size rule (Dao et al. 2022, Algorithm 1, line 1).

FA1 sets, for an on-chip SRAM of M elements and head dim d:

    B_c = ceil(M / (4d)),   B_r = min(ceil(M / (4d)), d)

and then realizes those sizes for the v1 kernel (``templates/v1_fwd.cu.j2``), whose layout facts
are the module constants below: one thread per query row, Q_i / K_j / V_j tiles and the fp32 S/P
tile in shared memory; O, l and m stay in the fp32 HBM workspace, read and written once per
(K/V block j, Q block i) pair exactly as Algorithm 1 does.  Shared memory, registers and HBM
traffic are the expressions of :mod:`.resources` (``V1_SMEM_BYTES`` with BLOCK_M = B_r, BLOCK_N
= B_c; ``V1_REGISTERS``; ``V1_HBM_TERMS``); the fit is the constraint :data:`V1_SMEM_FITS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import resources as R
from .model import Plan, PlanError, occupancy, resolve_dims, resolve_target, elem_bytes
from .resources import V1_EST_REGISTERS, V1_S_TILE_ELEM_BYTES, Constraint, evaluate
from .targets import Target

__all__ = [
    "V1Plan", "plan_v1", "fa1_block_sizes", "v1_smem_bytes",
    "V1_MIN_BLOCK_R", "V1_MAX_BLOCK_R", "V1_BLOCK_R_MULTIPLE", "V1_MAX_BLOCK_C", "V1_BLOCK_C_STEP",
    "V1_MIN_BLOCK_C", "V1_S_TILE_ELEM_BYTES", "V1_EST_REGISTERS", "V1_HEAD_DIM_MULTIPLE", "V1_SMEM_FITS",
]

# --- facts of the v1 kernel ------------------------------------------------------------------
V1_HEAD_DIM_MULTIPLE = 8  # D and DV rows are loaded 16 bytes (8 elements) at a time
V1_BLOCK_R_MULTIPLE = 32  # one thread per query row, whole warps: B_r is a multiple of the warp size
V1_MIN_BLOCK_R = 32  # at least one warp
V1_MAX_BLOCK_R = 1024  # threads per block (CUDA limit)
V1_MAX_BLOCK_C = 256  # the kernel's loop over a K/V block is bounded by 256 keys
V1_BLOCK_C_STEP = 16  # B_c shrinks in steps of 16 keys (a multiple of 16 after the first step)
V1_MIN_BLOCK_C = 16  # smallest K/V block the shrinking goes to before shrinking B_r
#: The realized tiles must fit the SRAM limit (min of the budget and the target's per-block limit).
V1_SMEM_FITS = Constraint("smem", R.V1_SMEM_BYTES, limit=R.SMEM_LIMIT)


def fa1_block_sizes(m_elems: int, d: int) -> tuple[int, int]:
    """FA1 Algorithm 1 line 1: (B_r, B_c) = (min(ceil(M/(4d)), d), ceil(M/(4d)))."""
    if m_elems <= 0 or d <= 0:
        raise PlanError(f"FA1 rule needs M > 0 and d > 0, got M={m_elems}, d={d}")
    b_c = -(-m_elems // (4 * d))
    return min(b_c, d), b_c


def v1_smem_bytes(block_r: int, block_c: int, d: int, dv: int, eb: int = 2) -> int:
    """Shared memory of the v1 kernel: Q_i + K_j + V_j (element dtype) + S/P tile (fp32)."""
    return evaluate(R.V1_SMEM_BYTES, {R.BLOCK_M: block_r, R.BLOCK_N: block_c, R.D: d, R.DV: dv, R.ELEM_BYTES: eb})


def _smem_formula(br: int, bc: int, d: int, dv: int, eb: int) -> str:
    return (f"{br}*{d}*{eb} + {bc}*{d}*{eb} + {bc}*{dv}*{eb} + {br}*{bc}*{V1_S_TILE_ELEM_BYTES} = "
            f"{v1_smem_bytes(br, bc, d, dv, eb)} B")


@dataclass(frozen=True, kw_only=True)
class V1Plan(Plan):
    """A FlashAttention-1 plan: B_r = block_r query rows (threads), B_c = block_c keys per block."""

    block_r: int
    block_c: int
    sram_budget_bytes: int  # the M of FA1, in bytes
    sram_budget_elems: int  # M in elements of the compute dtype
    fa1_block_r: int  # the rule's B_r before realization
    fa1_block_c: int  # the rule's B_c before realization

    def _config_lines(self) -> list[str]:
        return [
            f"  FA1 rule: B_r={self.fa1_block_r}, B_c={self.fa1_block_c} (M={self.sram_budget_elems} elements)"
            f" -> realized B_r={self.block_r} query rows (1 thread each), B_c={self.block_c} keys",
            f"  smem {self.smem_bytes} B/CTA{' (dynamic smem opt-in)' if self.needs_smem_optin else ''}; "
            f"~{self.est_registers_per_thread} registers/thread; ~{self.ctas_per_sm} CTA(s)/SM",
        ]


def plan_v1(ir_or_dims: Any, target: Target | str | None, sram_budget: int | None = None) -> V1Plan:
    """Plan the v1 (FlashAttention-1) kernel.

    ``sram_budget`` is FA1's M in bytes (default: the target's max dynamic smem per block).  The
    rule's sizes are realized for the v1 kernel: B_r becomes a multiple of 32 in [32, 1024];
    B_c is capped at 256; while the tiles overflow the per-block limit, B_c shrinks in steps of 16
    (down to 16), then B_r in steps of 32.  Every step is recorded in ``reasons``.
    """
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    reasons: list[str] = []
    if d % V1_HEAD_DIM_MULTIPLE or dv % V1_HEAD_DIM_MULTIPLE:
        raise PlanError(f"v1 cannot tile head_dim={d}, head_dim_v={dv}: both must be multiples of "
                        f"{V1_HEAD_DIM_MULTIPLE} (the v1 kernel moves rows 16 bytes at a time)")

    limit = t.max_smem_per_block_optin
    if sram_budget is None:
        budget = limit
        reasons.append(f"SRAM budget: {budget} B = {t.name}'s max dynamic shared memory per block (opt-in)")
    else:
        if not isinstance(sram_budget, int) or isinstance(sram_budget, bool) or sram_budget <= 0:
            raise PlanError(f"sram_budget must be a positive number of bytes, got {sram_budget!r}")
        budget = sram_budget
        reasons.append(f"SRAM budget: {budget} B (given; {t.name} allows {limit} B per block)")
        if budget > limit:
            reasons.append(f"the budget {budget} B exceeds the {limit} B per-block limit on {t.name}: "
                           f"the FA1 rule uses {budget} B, the realized tiles must fit {limit} B")
        limit = min(limit, budget)

    m = budget // eb
    if m == 0:
        raise PlanError(f"SRAM budget {budget} B holds no {dims.dtype} element")
    fa1_r, fa1_c = fa1_block_sizes(m, d)
    reasons.append(f"M = {budget} B / {eb} B = {m} elements of {dims.dtype}")
    reasons.append(f"FA1 Algorithm 1 line 1: B_c = ceil(M / (4d)) = ceil({m} / (4*{d})) = {fa1_c}; "
                   f"B_r = min(ceil(M / (4d)), d) = min({fa1_c}, {d}) = {fa1_r}")

    # B_r: one thread per query row, whole warps, within the block size limits.
    max_r = min(V1_MAX_BLOCK_R, t.max_threads_per_block)
    br = max(V1_MIN_BLOCK_R, min(max_r, fa1_r // V1_BLOCK_R_MULTIPLE * V1_BLOCK_R_MULTIPLE))
    if br == fa1_r:
        reasons.append(f"B_r = {br}: one thread per query row, {br // 32} warps (a multiple of 32 in "
                       f"[{V1_MIN_BLOCK_R}, {max_r}])")
    else:
        reasons.append(f"B_r = {fa1_r} -> {br}: the v1 kernel runs one thread per query row, so B_r must be "
                       f"a multiple of {V1_BLOCK_R_MULTIPLE} in [{V1_MIN_BLOCK_R}, {max_r}]")
    bc = fa1_c
    if bc > V1_MAX_BLOCK_C:
        reasons.append(f"B_c = {bc} capped at {V1_MAX_BLOCK_C} (the v1 kernel's largest K/V block)")
        bc = V1_MAX_BLOCK_C

    reasons.append(f"v1 smem = Q_i B_r*D*{eb} + K_j B_c*D*{eb} + V_j B_c*DV*{eb} + S/P tile "
                   f"B_r*B_c*{V1_S_TILE_ELEM_BYTES} (fp32) bytes; limit {limit} B")
    # Shrink until the tiles fit: B_c first (to a multiple of 16, then by 16), then B_r by 32.
    def fits(br: int, bc: int) -> bool:
        return V1_SMEM_FITS.check({R.BLOCK_M: br, R.BLOCK_N: bc, R.D: d, R.DV: dv, R.ELEM_BYTES: eb,
                                   R.SMEM_LIMIT: limit}).ok

    while not fits(br, bc):
        over = f"smem = {_smem_formula(br, bc, d, dv, eb)} > {limit} B limit on {t.name}"
        if bc > V1_MIN_BLOCK_C:
            new_bc = bc // V1_BLOCK_C_STEP * V1_BLOCK_C_STEP
            if new_bc == bc:
                new_bc = bc - V1_BLOCK_C_STEP
            new_bc = max(new_bc, V1_MIN_BLOCK_C)
            reasons.append(f"B_r={br}, B_c={bc}: {over}; shrink B_c to {new_bc}")
            bc = new_bc
        elif br > V1_MIN_BLOCK_R:
            reasons.append(f"B_r={br}, B_c={bc}: {over}; B_c is at its minimum, shrink B_r to "
                           f"{br - V1_BLOCK_R_MULTIPLE}")
            br -= V1_BLOCK_R_MULTIPLE
        else:
            reasons.append(f"B_r={br}, B_c={bc}: {over}; both at their minimum")
            raise PlanError(f"no v1 tiling fits: {over} even at B_r={br}, B_c={bc}\n  "
                            + "\n  ".join(reasons))
    smem = v1_smem_bytes(br, bc, d, dv, eb)
    reasons.append(f"B_r={br}, B_c={bc}: smem = {_smem_formula(br, bc, d, dv, eb)} <= {limit} B: fits")
    if smem > t.static_smem_per_block:
        reasons.append(f"{smem} B > {t.static_smem_per_block} B static limit: launch with the dynamic "
                       f"shared memory opt-in")
    regs = evaluate(R.V1_REGISTERS)
    occ = occupancy(t, smem, regs, br)
    reasons.append(occ.explain(t, smem, regs, br))
    reasons.append("HBM traffic: K_j, V_j read once; Q_i and the fp32 O_i, l_i, m_i are read/written once per "
                   "(j, i) pair, i.e. Tc = ceil(Nk / B_c) passes (FA1 Theorem 2: Theta(N^2 d^2 / M))")
    return V1Plan(
        schedule="v1", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype,
        block_m=br, block_n=bc, num_warps=br // 32, num_threads=br, smem_bytes=smem,
        est_registers_per_thread=regs, ctas_per_sm=occ.ctas_per_sm, reasons=tuple(reasons),
        block_r=br, block_c=bc, sram_budget_bytes=budget, sram_budget_elems=m,
        fa1_block_r=fa1_r, fa1_block_c=fa1_c,
    )
