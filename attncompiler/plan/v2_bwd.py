"""v2 backward planning: tiles of the dK/dV kernel and of the deterministic dQ kernel.

Facts of ``templates/include/attncompiler/v2_bwd.cuh`` as module constants:

* dK/dV kernel: a CTA of W warps owns BLOCK_N = 16 * MTK * W keys; each warp owns 16 * MTK of them
  (MTK m16 tiles) and keeps their dK (MTK*D/8*4 fp32 per thread) and dV (MTK*DV/8*4) in registers.
  Per step of BLOCK_M queries the warp holds S^T and dP^T (MTK*BLOCK_M/8*4 each).
* its shared memory: K and V tiles, two stages of (Q, dO, lse2, dsum) and the transposed dS tile
  for the dQ product, rows padded by 8 elements:
      (BN*(D+8) + BN*(DV+8) + 2*BM*(D+8) + 2*BM*(DV+8) + BN*(BM+8)) * 2 + 2 * 2*BM*4 bytes
* the dQ product (atomic mode) splits BLOCK_M x D over a DQ_WARPS_M x DQ_WARPS_N warp grid whose
  tiles are multiples of 16 x 16; its accumulator is (BM/WQM/16)*(D/WQN/8)*4 fp32 per thread.
* when dK + dV + S + dP exceed the register budget (large head dims) the work is split in two
  launches: dV (+ S) and dK (+ S, dP, dQ).  Costs one more Q K^T product.
* deterministic dQ kernel: forward-like, 16 * MT query rows per warp, S, dP (MT*BN/8*4 each) and dQ
  (MT*D/8*4) in registers; smem Q, dO and two stages of K, V.

Ranking of feasible dK/dV configurations (higher first; :data:`BWD_RANK_KEYS`):
1. no split (5 products instead of 6), 2. MTK (shared-memory bytes per mma fall with MTK: the
B operand -- Q, dO -- is reused for MTK key tiles), 3. BLOCK_N closeness to 128 (FlashAttention-2's
key tile), 4. BLOCK_M closeness to 64, 5. more warps, 6. fewer registers.

``dq_mode``: "atomic" (default, measured the faster: the dQ product reuses the dK kernel's dS and
adds into an fp32 accumulator with 16-byte reds) or "separate" (deterministic: a second kernel
recomputes S, dP and dS per query block, at the cost of two more products).  H200, bf16, N = 16k:
atomic 248 / separate 210 TFLOP/s (D=128), 237 / 214 (D=64) -- docs/backward.md.

The register estimate is a ranking model, not ptxas: REG_OVERHEAD is calibrated so that the
measured-best dK/dV configs fit the budget (ptxas allocates 255 for them, with <= 64 B of spills
outside the hot loop in the masked variants); configs above the budget spill heavily (D=128 with
BLOCK_M=128 measured 151 vs 248 TFLOP/s).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .model import Plan, PlanError, ProblemDims, elem_bytes, occupancy, resolve_dims, resolve_target
from .targets import Target

__all__ = [
    "V2BwdPlan", "BwdCandidate", "plan_v2_bwd", "candidates_v2_bwd", "kv_smem_bytes", "kv_register_estimate",
    "dq_smem_bytes", "dq_register_estimate", "BWD_RANK_KEYS", "REG_BUDGET", "DQ_MODES",
]

PAD = 8  # elements of padding per smem row
REG_BUDGET = 240  # estimated registers/thread a config may use (ptxas' 255 minus a safety margin)
REG_OVERHEAD = 48  # addresses, indices, loop state, lse2 / dsum values
KV_WARPS = (4, 8)
KV_MTK = (1, 2)
KV_BLOCK_M = (32, 64, 128)
DQ_MODES = ("atomic", "separate")
PRE_WARPS, PRE_ROWS = 8, 4

BWD_RANK_KEYS: tuple[str, ...] = (
    "no dK/dV split", "MTK (m16 key tiles per warp)", "BLOCK_N closeness to 128", "BLOCK_M closeness to 64",
    "more warps", "fewer registers",
)


def kv_smem_bytes(bm: int, bn: int, d: int, dv: int, eb: int = 2) -> int:
    """Shared memory of the dK/dV kernel (see the module docstring)."""
    return (bn * (d + PAD) + bn * (dv + PAD) + 2 * bm * (d + PAD) + 2 * bm * (dv + PAD) + bn * (bm + PAD)) * eb \
        + 2 * 2 * bm * 4


def kv_register_estimate(mtk: int, bm: int, d: int, dv: int, split: bool) -> dict[str, int]:
    """Per-thread registers by part; with ``split`` the larger of the two passes."""
    dk, dvr = mtk * d // 8 * 4, mtk * dv // 8 * 4
    s = mtk * bm // 8 * 4
    if split:
        total = max(dvr + s, dk + 2 * s) + REG_OVERHEAD
    else:
        total = dk + dvr + 2 * s + REG_OVERHEAD
    return {"dk": dk, "dv": dvr, "s": s, "dp": s, "overhead": REG_OVERHEAD, "total": total}


def dq_smem_bytes(bm: int, bn: int, d: int, dv: int, eb: int = 2) -> int:
    return (bm * (d + PAD) + bm * (dv + PAD) + 2 * bn * (d + PAD + dv + PAD)) * eb


def dq_register_estimate(mt: int, bn: int, d: int) -> int:
    return 2 * mt * bn // 8 * 4 + mt * d // 8 * 4 + REG_OVERHEAD


def _dq_grid(w: int, bm: int, d: int) -> tuple[int, int] | None:
    """Warp grid (WQM, WQN) of the dQ product: 16x16-divisible tiles, least shared-memory traffic
    per warp (each warp reads BM/WQM rows of dS and D/WQN columns of K, over all BLOCK_N keys)."""
    grids = [(wqm, w // wqm) for wqm in range(1, w + 1) if w % wqm == 0]
    ok = [(bm // m + d // n, -m, (m, n)) for m, n in grids
          if bm % m == 0 and (bm // m) % 16 == 0 and d % n == 0 and (d // n) % 16 == 0]
    return min(ok)[2] if ok else None


@dataclass(frozen=True, kw_only=True)
class BwdCandidate:
    """One dK/dV configuration the search looked at, with why it was accepted or rejected."""

    block_m: int
    block_n: int
    num_warps: int
    mtk: int
    split_dkv: bool
    smem_bytes: int
    est_registers_per_thread: int
    dq_warps: tuple[int, int] | None
    accepted: bool
    reason: str
    score: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class V2BwdPlan(Plan):
    """The backward plan: dK/dV kernel tiles (Plan's fields) plus the dQ kernel's and the mode."""

    mtk: int
    split_dkv: bool
    dq_mode: str
    dq_warps_m: int
    dq_warps_n: int
    dq_block_m: int
    dq_block_n: int
    dq_num_warps: int
    dq_smem_bytes: int
    pre_warps: int = PRE_WARPS
    pre_rows: int = PRE_ROWS

    def _config_lines(self) -> list[str]:
        lines = super()._config_lines()
        lines[0] = (f"  dK/dV kernel: BLOCK_N={self.block_n} keys per CTA x BLOCK_M={self.block_m} query rows per "
                    f"step; {self.num_warps} warps of MTK={self.mtk} key tiles"
                    f"{'; dV and dK in two launches' if self.split_dkv else ''}")
        lines.append(f"  dQ: {self.dq_mode}" + (
            f" (product split {self.dq_warps_m}x{self.dq_warps_n} warps, fp32 reds)" if self.dq_mode == "atomic" else
            f" (attn_bwd_dq: {self.dq_block_m} rows x {self.dq_block_n} keys, {self.dq_num_warps} warps, "
            f"{self.dq_smem_bytes} B smem)"))
        return lines


def _evaluate(bm: int, w: int, mtk: int, split: bool, dims: ProblemDims, t: Target) -> BwdCandidate:
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    bn = 16 * mtk * w
    smem = kv_smem_bytes(bm, bn, d, dv, eb)
    regs = kv_register_estimate(mtk, bm, d, dv, split)
    grid = _dq_grid(w, bm, d)
    problems = []
    if smem > t.max_smem_per_block_optin:
        problems.append(f"smem {smem} B > {t.max_smem_per_block_optin} B per-block limit on {t.name}")
    if regs["total"] > REG_BUDGET:
        problems.append(f"registers ~{regs['total']}/thread > budget {REG_BUDGET} (dK {regs['dk']} + dV {regs['dv']} + "
                        f"S {regs['s']} + dP {regs['dp']} + overhead {REG_OVERHEAD}{', split' if split else ''})")
    if grid is None:
        problems.append(f"no warp grid tiles the dQ product {bm}x{d} with {w} warps in 16x16 tiles")
    if problems:
        return BwdCandidate(block_m=bm, block_n=bn, num_warps=w, mtk=mtk, split_dkv=split, smem_bytes=smem,
                            est_registers_per_thread=regs["total"], dq_warps=grid, accepted=False,
                            reason="; ".join(problems))
    score = (int(not split), mtk, -abs(bn.bit_length() - 8), -abs(bm.bit_length() - 7), w, -regs["total"])
    return BwdCandidate(block_m=bm, block_n=bn, num_warps=w, mtk=mtk, split_dkv=split, smem_bytes=smem,
                        est_registers_per_thread=regs["total"], dq_warps=grid, accepted=True,
                        reason=f"feasible: smem {smem} B, ~{regs['total']} regs/thread", score=score)


def candidates_v2_bwd(ir_or_dims: Any, target: Target | str | None, *, block_m: int | None = None,
                      num_warps: int | None = None, mtk: int | None = None,
                      split_dkv: bool | None = None) -> list[BwdCandidate]:
    """Every dK/dV configuration considered (forced values restrict the search), best first."""
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    cands = [_evaluate(bm, w, m, sp, dims, t)
             for bm in ((block_m,) if block_m else KV_BLOCK_M)
             for w in ((num_warps,) if num_warps else KV_WARPS)
             for m in ((mtk,) if mtk else KV_MTK)
             for sp in ((split_dkv,) if split_dkv is not None else (False, True))]
    acc = sorted((c for c in cands if c.accepted), key=lambda c: c.score, reverse=True)
    return acc + [c for c in cands if not c.accepted]


def _dq_kernel(dims: ProblemDims, t: Target) -> tuple[int, int, int, int, list[str]]:
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    for bm, w, bn in ((64, 4, 64), (64, 4, 32), (64, 4, 16)):
        mt = bm // (16 * w)
        regs = dq_register_estimate(mt, bn, d)
        smem = dq_smem_bytes(bm, bn, d, dv, eb)
        if regs <= REG_BUDGET and smem <= t.max_smem_per_block_optin:
            return bm, bn, w, smem, [
                f"dQ kernel: BLOCK_M={bm} ({w} warps x 16 rows), BLOCK_N={bn}: registers ~ S+dP 2*{bn // 8 * 4 * mt} "
                f"+ dQ {mt * d // 8 * 4} + {REG_OVERHEAD} = {regs} <= {REG_BUDGET}; smem {smem} B"]
    raise PlanError(f"no feasible dQ kernel for D={d}, DV={dv} on {t.name}")


def plan_v2_bwd(ir_or_dims: Any, target: Target | str | None, *, dq_mode: str = "atomic",
                block_m: int | None = None, num_warps: int | None = None, mtk: int | None = None,
                split_dkv: bool | None = None) -> V2BwdPlan:
    """The backward plan for ``ir_or_dims`` on ``target`` (forced values override the search).

    ``dq_mode`` "atomic" or "separate" (deterministic).  Raises PlanError with every rejection
    reason when nothing fits."""
    if dq_mode not in DQ_MODES:
        raise PlanError(f"dq_mode: expected one of {DQ_MODES}, got {dq_mode!r}")
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    d, dv = dims.head_dim, dims.head_dim_v
    for label, x in (("D", d), ("DV", dv)):
        if x % 16 or x > 256:
            raise PlanError(f"v2 backward cannot tile {label}={x}: expected a multiple of 16, <= 256 (mma.sync m16n8k16)")
    cands = candidates_v2_bwd(dims, t, block_m=block_m, num_warps=num_warps, mtk=mtk, split_dkv=split_dkv)
    accepted = [c for c in cands if c.accepted]
    if not accepted:
        why = "; ".join(f"BM={c.block_m} W={c.num_warps} MTK={c.mtk} split={c.split_dkv}: {c.reason}" for c in cands)
        raise PlanError(f"no feasible v2 backward plan on {t.name} (D={d}, DV={dv}): {why}")
    best = accepted[0]
    wqm, wqn = best.dq_warps  # type: ignore[misc]
    regs = kv_register_estimate(best.mtk, best.block_m, d, dv, best.split_dkv)
    dq_bm, dq_bn, dq_w, dq_smem, dq_reasons = _dq_kernel(dims, t)
    occ = occupancy(t, best.smem_bytes, best.est_registers_per_thread, best.num_warps * 32)
    reasons = [
        f"D={d}, DV={dv} ({dims.dtype}) on {t.name}: smem <= {t.max_smem_per_block_optin} B/block, "
        f"register budget {REG_BUDGET}/thread (of {t.max_registers_per_thread})",
        f"searched {len(cands)} dK/dV configs: {len(accepted)} feasible",
        f"chosen BLOCK_N = 16*MTK*W = 16*{best.mtk}*{best.num_warps} = {best.block_n} keys per CTA, BLOCK_M = "
        f"{best.block_m} query rows per step" + (" (dV and dK in separate launches)" if best.split_dkv else ""),
        f"registers ~ dK {regs['dk']} + dV {regs['dv']} + S^T {regs['s']} + dP^T {regs['dp']} + overhead "
        f"{REG_OVERHEAD} -> {regs['total']}" + (" (max over the two passes)" if best.split_dkv else ""),
        f"smem = (BN*(D+8) + BN*(DV+8) + 2*BM*(D+8) + 2*BM*(DV+8) + BN*(BM+8))*2 + 16*BM = {best.smem_bytes} B",
        occ.explain(t, best.smem_bytes, best.est_registers_per_thread, best.num_warps * 32),
        f"dQ product warp grid {wqm} x {wqn}: {best.block_m // wqm} rows x {d // wqn} columns per warp",
        f"dQ mode {dq_mode!r}: " + ("fp32 accumulator + red.global.add (not bit-reproducible)" if dq_mode == "atomic"
                                    else "separate attn_bwd_dq pass, no atomics (bit-identical run to run)"),
        *dq_reasons,
        f"ranking (higher first): {'; '.join(BWD_RANK_KEYS)}",
    ]
    for c in cands:
        if not c.accepted:
            reasons.append(f"rejected BM={c.block_m}, W={c.num_warps}, MTK={c.mtk}, split={c.split_dkv}: {c.reason}")
    return V2BwdPlan(
        schedule="v2_bwd", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype, block_m=best.block_m,
        block_n=best.block_n, num_warps=best.num_warps, num_threads=best.num_warps * 32, smem_bytes=best.smem_bytes,
        est_registers_per_thread=best.est_registers_per_thread, ctas_per_sm=occ.ctas_per_sm, reasons=tuple(reasons),
        mtk=best.mtk, split_dkv=best.split_dkv, dq_mode=dq_mode, dq_warps_m=wqm, dq_warps_n=wqn, dq_block_m=dq_bm,
        dq_block_n=dq_bn, dq_num_warps=dq_w, dq_smem_bytes=dq_smem if dq_mode == "separate" else 0,
    )


def with_dq_mode(plan: V2BwdPlan, dq_mode: str) -> V2BwdPlan:
    """The same tiles with another dQ mode."""
    return dataclasses.replace(plan, dq_mode=dq_mode)
