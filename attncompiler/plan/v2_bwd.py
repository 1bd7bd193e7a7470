"""v2 backward planning: tiles of the dK/dV kernel and of the deterministic dQ kernel.

Facts of ``templates/include/attncompiler/v2_bwd.cuh`` as module constants:

* dK/dV kernel: a CTA of W warps owns BLOCK_N = 16 * MTK * W keys and keeps their dK and dV in
  registers (BLOCK_N*(D+DV)/(32*W) fp32 per thread) while it walks the query blocks.  Two warp
  layouts:
  - "1d": each warp owns 16 * MTK keys for every product (S^T, dP^T, dV, dK with P^T / dS^T as
    register A operands); every warp reads all of Q and dO twice per step.
  - "2d" (FlashAttention-2's): S^T / dP^T on an s_warps_k x (W / s_warps_k) warp grid, z P^T and
    dS^T through shared memory, dK / dV on a kv_warps_k x (W / kv_warps_k) grid (keys x columns);
    with equal key splits (reg_half) each warp takes its own slice of the dK/dV reduction from
    registers before the barrier.  ~15 % fewer shared-memory bytes per mma at D = 128.
  Per step of BLOCK_M queries a warp holds S^T and dP^T tiles (MTK*BLOCK_M/8*4 fp32 each in 1-D).
* its shared memory: K and V tiles, two stages of (Q, dO, lse2, dsum), two BN x BM element tiles
  (2-D: z P^T and dS^T; 1-D: dS^T double-buffered for the deferred dQ product), rows padded by 8
  elements, and for D % 128 == 0 a BM x (D + D/8) fp32 dQ staging area:
      (BN*(D+8) + BN*(DV+8) + 2*BM*(D+8) + 2*BM*(DV+8) + 2*BN*(BM+8)) * 2 + 2 * 2*BM*4 [+ BM*(D+D/8)*4]
  (one BN x BM tile and no staging when the work is split).
* the dQ product (atomic mode) splits BLOCK_M x D over a DQ_WARPS_M x DQ_WARPS_N warp grid whose
  tiles are multiples of 16 x 16; its accumulator is (BM/WQM/16)*(D/WQN/8)*4 fp32 per thread.  The
  partial dQ goes to an fp32 accumulator by reds: 8-byte reds from registers (dq_red_vec=2), 16-byte
  reds after a lane-pair shuffle (4), or (dq_stage=1, 2-D) staged per warp in shared memory and
  added with 16-byte reds covering whole 128-byte row segments (dq_stage=2: one bulk TMA reduce per
  row on sm_90, measured slower).
* when dK + dV + S + dP exceed the register budget (large head dims) the work is split in two
  launches: dV (+ S) and dK (+ S, dP, dQ).  Costs one more Q K^T product.
* deterministic dQ kernel: forward-like, 16 * MT query rows per warp, S, dP (MT*BN/8*4 each) and dQ
  (MT*D/8*4) in registers; smem Q, dO and two stages of K, V.

Ranking of feasible dK/dV configurations (higher first; :data:`BWD_RANK_KEYS`):
1. no split (5 products instead of 6), 2. MTK, 3. BLOCK_N closeness to 128 (FlashAttention-2's
key tile), 4. BLOCK_M closeness to 64, 5. more warps, 6. fewer shared-memory bytes per mma
(:func:`kv_smem_traffic`, which picks the layout and the 2-D warp grids for the chosen tiles),
7. fewer registers, 8. more key warps in the dK/dV grid.

``dq_mode``: "atomic" (default, measured the faster) or "separate" (deterministic: a second kernel
recomputes S, dP and dS per query block, at the cost of two more products).  Measurements (H200,
bf16, N = 16k) are in docs/backward.md.

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
    "dq_smem_bytes", "dq_register_estimate", "kv_smem_traffic", "BWD_RANK_KEYS", "REG_BUDGET", "DQ_MODES",
    "KV_LAYOUTS", "needs_split", "dq_stage_bytes",
]

PAD = 8  # elements of padding per smem row
REG_BUDGET = 240  # estimated registers/thread a config may use (ptxas' 255 minus a safety margin)
REG_OVERHEAD = 48  # addresses, indices, loop state, lse2 / dsum values
KV_LAYOUTS = ("2d", "1d")
KV_WARPS = (4, 8)
KV_MTK = (1, 2)
KV_BLOCK_M = (32, 64, 128)
DQ_MODES = ("atomic", "separate")
PRE_WARPS, PRE_ROWS = 8, 4

BWD_RANK_KEYS: tuple[str, ...] = (
    "no dK/dV split", "MTK (m16 key tiles per warp)", "BLOCK_N closeness to 128", "BLOCK_M closeness to 64",
    "more warps", "fewer shared-memory bytes per mma (kv_smem_traffic, 8 B buckets: picks the layout)",
    "fewer registers", "more key warps in the dK/dV grid",
)


def needs_split(d: int, dv: int) -> bool:
    """True when dK + dV accumulators cannot share registers with the smallest S^T / dP^T tiles
    (16 fp32 each): the dK/dV work is then split in two launches (1-D layout)."""
    return (d + dv) // 2 + 2 * 16 + REG_OVERHEAD > REG_BUDGET


def kv_smem_bytes(bm: int, bn: int, d: int, dv: int, eb: int = 2, *, split: bool | None = None) -> int:
    """Shared memory of the dK/dV kernel (see the module docstring): two BN x BM tiles after the
    stages (2-D: z P^T and dS^T; 1-D: dS^T double-buffered), one when the work is split (default:
    :func:`needs_split`)."""
    if split is None:
        split = needs_split(d, dv)
    tiles = 1 if split else 2
    stage = 0 if split else dq_stage_bytes(bm, d)
    return (bn * (d + PAD) + bn * (dv + PAD) + 2 * bm * (d + PAD) + 2 * bm * (dv + PAD) + tiles * bn * (bm + PAD)) \
        * eb + 2 * 2 * bm * 4 + stage


def dq_stage_bytes(bm: int, d: int) -> int:
    """The fp32 dQ staging area of non-split plans with D a multiple of 128 (the head dims whose dQ
    warp tiles have >= 32 columns): BM rows of D + D/8 floats, i.e. each warp's RQ x CQ tile with
    rows padded by 4 floats. Other head dims reserve none (and cannot stage)."""
    return bm * (d + d // 8) * 4 if d % 128 == 0 else 0


def _grid2d(w: int, wk: int, rows: int, cols: int, col_tile: int) -> tuple[int, int] | None:
    """(m16 row tiles, n8 column tiles) per warp when ``w`` warps split rows x cols as wk x (w // wk),
    or None if that grid does not tile them (rows in 16s, columns in ``col_tile``s, n8 tiles even)."""
    if w % wk:
        return None
    wc = w // wk
    if rows % (16 * wk) or cols % (col_tile * wc):
        return None
    return rows // (16 * wk), cols // (8 * wc)


def kv_register_estimate(mtk: int, bm: int, d: int, dv: int, split: bool, *, layout: str = "1d", w: int = 0,
                         s_warps_k: int = 0, kv_warps_k: int = 0) -> dict[str, int]:
    """Per-thread registers by part; with ``split`` the larger of the two passes (1-D layout only)."""
    if layout == "2d":
        bn = 16 * mtk * w
        mts, nts = _grid2d(w, s_warps_k, bn, bm, 16)  # type: ignore[misc]
        mtv, ntk = _grid2d(w, kv_warps_k, bn, d, 16)  # type: ignore[misc]
        ntv = dv // (8 * (w // kv_warps_k))
        dk, dvr, s = mtv * ntk * 4, mtv * ntv * 4, mts * nts * 4
        return {"dk": dk, "dv": dvr, "s": s, "dp": s, "overhead": REG_OVERHEAD, "total": dk + dvr + 2 * s + REG_OVERHEAD}
    dk, dvr = mtk * d // 8 * 4, mtk * dv // 8 * 4
    s = mtk * bm // 8 * 4
    if split:
        total = max(dvr + s, dk + 2 * s) + REG_OVERHEAD
    else:
        total = dk + dvr + 2 * s + REG_OVERHEAD
    return {"dk": dk, "dv": dvr, "s": s, "dp": s, "overhead": REG_OVERHEAD, "total": total}


def kv_smem_traffic(layout: str, bm: int, w: int, mtk: int, d: int, dv: int, *, s_warps_k: int = 0,
                    kv_warps_k: int = 0, dq_warps: tuple[int, int] | None = None, split: bool = False) -> float:
    """Shared-memory bytes per m16n8k16 mma of one query step of a CTA (the ranking model).

    Counts every ldmatrix.x4 as 512 B, the P^T / dS^T stores and the cp.async writes of Q and dO.
    The kernel is shared-memory-bandwidth-bound at ~60 % of 128 B/clk/SM (docs/backward.md)."""
    bn = 16 * mtk * w
    kd, kdv, km, kn = d // 16, dv // 16, bm // 16, bn // 16
    atomic = dq_warps is not None
    if layout == "2d":
        mts, nts = _grid2d(w, s_warps_k, bn, bm, 16)  # type: ignore[misc]
        mtv, ntk = _grid2d(w, kv_warps_k, bn, d, 16)  # type: ignore[misc]
        ntv = dv // (8 * (w // kv_warps_k))
        # with equal key splits (reg_half) each warp's own 1/WQS of the P^T / dS^T operand is in registers
        a_ops = km * mtv * 2 * ((w // s_warps_k - 1) / (w // s_warps_k) if s_warps_k == kv_warps_k else 1)
        ldsm = kd * (mts + nts // 2) + kdv * (mts + nts // 2) + km * (ntv // 2 + ntk // 2) + a_ops
        stores = 2 * bn * bm * 2
    else:
        ldsm = kd * (mtk + bm // 16) + kdv * (mtk + bm // 16) + km * kdv + km * kd
        if split:
            ldsm += kd * (mtk + bm // 16)
        stores = bn * bm * 2 if atomic else 0
    mma = kn * (bm // 8) * (kd + kdv) + kn * km * (d // 8 + dv // 8)
    if split:
        mma += kn * (bm // 8) * kd
    if atomic:
        wqm, wqn = dq_warps  # type: ignore[misc]
        ldsm += kn * (bm // wqm // 16 + d // wqn // 16)
        mma += km * (d // 8) * kn
    return (w * ldsm * 512 + stores + bm * (d + dv) * 2) / mma


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
    score: tuple[float, ...] = ()
    layout: str = "1d"
    s_warps_k: int = 0
    kv_warps_k: int = 0
    smem_traffic: float = 0.0


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
    layout: str = "1d"
    s_warps_k: int = 0
    kv_warps_k: int = 0
    dq_red_vec: int = 4
    dq_defer: bool = False
    reg_half: bool = False
    dq_stage: int = 0

    def _config_lines(self) -> list[str]:
        lines = super()._config_lines()
        if self.layout == "2d":
            w = self.num_warps
            lines[0] = (f"  dK/dV kernel: BLOCK_N={self.block_n} keys per CTA x BLOCK_M={self.block_m} query rows per "
                        f"step; {w} warps, 2-D layout: S^T/dP^T {self.s_warps_k}x{w // self.s_warps_k}, dK/dV "
                        f"{self.kv_warps_k}x{w // self.kv_warps_k} (keys x columns), P^T and dS^T through smem")
        else:
            lines[0] = (f"  dK/dV kernel: BLOCK_N={self.block_n} keys per CTA x BLOCK_M={self.block_m} query rows per "
                        f"step; {self.num_warps} warps of MTK={self.mtk} key tiles"
                        f"{'; dV and dK in two launches' if self.split_dkv else ''}")
        lines.append(f"  dQ: {self.dq_mode}" + (
            f" (product split {self.dq_warps_m}x{self.dq_warps_n} warps, fp32 reds of {4 * self.dq_red_vec} B"
            f"{', deferred one step' if self.dq_defer and self.layout == '1d' else ''})"
            if self.dq_mode == "atomic" else
            f" (attn_bwd_dq: {self.dq_block_m} rows x {self.dq_block_n} keys, {self.dq_num_warps} warps, "
            f"{self.dq_smem_bytes} B smem)"))
        return lines


def _evaluate(bm: int, w: int, mtk: int, split: bool, dims: ProblemDims, t: Target, *, layout: str = "1d",
              s_warps_k: int = 0, kv_warps_k: int = 0, atomic: bool = True) -> BwdCandidate:
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    bn = 16 * mtk * w
    smem = kv_smem_bytes(bm, bn, d, dv, eb, split=split)
    grid = _dq_grid(w, bm, d)
    problems = []
    if layout == "2d":
        if split:
            problems.append("the 2-D layout has no dK/dV split")
        if _grid2d(w, s_warps_k, bn, bm, 16) is None:
            problems.append(f"S^T warp grid {s_warps_k}x{w // s_warps_k if w % s_warps_k == 0 else '?'} does not tile "
                            f"{bn} keys x {bm} queries in 16 x 16")
        if _grid2d(w, kv_warps_k, bn, d, 16) is None or _grid2d(w, kv_warps_k, bn, dv, 16) is None:
            problems.append(f"dK/dV warp grid {kv_warps_k}x{w // kv_warps_k if w % kv_warps_k == 0 else '?'} does not "
                            f"tile {bn} keys x D={d} / DV={dv} in 16 x 16")
    label = (f"2-D S^T {s_warps_k}x{w // s_warps_k if w % s_warps_k == 0 else '?'}, dK/dV "
             f"{kv_warps_k}x{w // kv_warps_k if w % kv_warps_k == 0 else '?'}" if layout == "2d" else "1-D")
    if problems:
        return BwdCandidate(block_m=bm, block_n=bn, num_warps=w, mtk=mtk, split_dkv=split, smem_bytes=smem,
                            est_registers_per_thread=0, dq_warps=grid, accepted=False,
                            reason=f"{label}: " + "; ".join(problems), layout=layout, s_warps_k=s_warps_k,
                            kv_warps_k=kv_warps_k)
    regs = kv_register_estimate(mtk, bm, d, dv, split, layout=layout, w=w, s_warps_k=s_warps_k,
                                kv_warps_k=kv_warps_k)
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
                            reason=f"{label}: " + "; ".join(problems), layout=layout, s_warps_k=s_warps_k,
                            kv_warps_k=kv_warps_k)
    traffic = kv_smem_traffic(layout, bm, w, mtk, d, dv, s_warps_k=s_warps_k, kv_warps_k=kv_warps_k,
                              dq_warps=grid if atomic else None, split=split)
    score = (int(not split), mtk, -abs(bn.bit_length() - 8), -abs(bm.bit_length() - 7), w, -round(traffic / 8),
             -regs["total"], kv_warps_k)
    return BwdCandidate(block_m=bm, block_n=bn, num_warps=w, mtk=mtk, split_dkv=split, smem_bytes=smem,
                        est_registers_per_thread=regs["total"], dq_warps=grid, accepted=True,
                        reason=f"{label}: feasible: smem {smem} B, ~{regs['total']} regs/thread, "
                               f"~{traffic:.0f} smem B/mma", score=score, layout=layout, s_warps_k=s_warps_k,
                        kv_warps_k=kv_warps_k, smem_traffic=traffic)


def _divisors(w: int) -> tuple[int, ...]:
    return tuple(x for x in range(1, w + 1) if w % x == 0)


def candidates_v2_bwd(ir_or_dims: Any, target: Target | str | None, *, block_m: int | None = None,
                      num_warps: int | None = None, mtk: int | None = None,
                      split_dkv: bool | None = None, layout: str | None = None, s_warps_k: int | None = None,
                      kv_warps_k: int | None = None, dq_mode: str = "atomic") -> list[BwdCandidate]:
    """Every dK/dV configuration considered (forced values restrict the search), best first."""
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    atomic = dq_mode == "atomic"
    cands = []
    for bm in ((block_m,) if block_m else KV_BLOCK_M):
        for w in ((num_warps,) if num_warps else KV_WARPS):
            for m in ((mtk,) if mtk else KV_MTK):
                for lay in ((layout,) if layout else KV_LAYOUTS):
                    if lay == "1d":
                        for sp in ((split_dkv,) if split_dkv is not None else (False, True)):
                            cands.append(_evaluate(bm, w, m, sp, dims, t, atomic=atomic))
                    elif not split_dkv:
                        for wks in ((s_warps_k,) if s_warps_k else _divisors(w)):
                            for wkv in ((kv_warps_k,) if kv_warps_k else _divisors(w)):
                                cands.append(_evaluate(bm, w, m, False, dims, t, layout="2d", s_warps_k=wks,
                                                       kv_warps_k=wkv, atomic=atomic))
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
                split_dkv: bool | None = None, layout: str | None = None, s_warps_k: int | None = None,
                kv_warps_k: int | None = None, dq_red_vec: int = 2, dq_defer: bool = True,
                reg_half: bool = True, dq_stage: int = 1) -> V2BwdPlan:
    """The backward plan for ``ir_or_dims`` on ``target`` (forced values override the search).

    ``dq_mode`` "atomic" or "separate" (deterministic).  ``layout`` "1d" / "2d" and the 2-D warp
    grids (``s_warps_k``, ``kv_warps_k``) are searched unless given; ``reg_half`` (2-D layout, equal
    key splits) takes each warp's own slice of the dK/dV reduction from registers; ``dq_red_vec``
    (4 or 2) and ``dq_defer`` (1-D layout) are knobs of the atomic dQ.  Raises PlanError with every rejection
    reason when nothing fits."""
    if dq_mode not in DQ_MODES:
        raise PlanError(f"dq_mode: expected one of {DQ_MODES}, got {dq_mode!r}")
    if layout is not None and layout not in KV_LAYOUTS:
        raise PlanError(f"layout: expected one of {KV_LAYOUTS}, got {layout!r}")
    if dq_red_vec not in (2, 4):  # 2 measured faster (H200, docs/backward.md)
        raise PlanError(f"dq_red_vec: expected 2 or 4, got {dq_red_vec!r}")
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    d, dv = dims.head_dim, dims.head_dim_v
    for label, x in (("D", d), ("DV", dv)):
        if x % 16 or x > 256:
            raise PlanError(f"v2 backward cannot tile {label}={x}: expected a multiple of 16, <= 256 (mma.sync m16n8k16)")
    cands = candidates_v2_bwd(dims, t, block_m=block_m, num_warps=num_warps, mtk=mtk, split_dkv=split_dkv,
                              layout=layout, s_warps_k=s_warps_k, kv_warps_k=kv_warps_k, dq_mode=dq_mode)
    accepted = [c for c in cands if c.accepted]
    if not accepted:
        why = "; ".join(f"BM={c.block_m} W={c.num_warps} MTK={c.mtk} split={c.split_dkv}: {c.reason}" for c in cands)
        raise PlanError(f"no feasible v2 backward plan on {t.name} (D={d}, DV={dv}): {why}")
    best = accepted[0]
    wqm, wqn = best.dq_warps  # type: ignore[misc]
    regs = kv_register_estimate(best.mtk, best.block_m, d, dv, best.split_dkv, layout=best.layout,
                                w=best.num_warps, s_warps_k=best.s_warps_k, kv_warps_k=best.kv_warps_k)
    dq_bm, dq_bn, dq_w, dq_smem, dq_reasons = _dq_kernel(dims, t)
    # staged dQ (2-D layout, atomic): each warp's (BM/WQM) x (D/WQN) tile in the staging area
    if int(dq_stage) not in (0, 1, 2):
        raise PlanError(f"dq_stage: expected 0, 1 or 2, got {dq_stage!r}")
    cq = d // wqn
    stage = bool(dq_stage) and dq_mode == "atomic" and best.layout == "2d" and not best.split_dkv and cq >= 32 \
        and 32 % (cq // 4) == 0 and (best.block_m // wqm * cq // 4) % 32 == 0 \
        and best.num_warps * (best.block_m // wqm) * (cq + 4) * 4 <= dq_stage_bytes(best.block_m, d)
    occ = occupancy(t, best.smem_bytes, best.est_registers_per_thread, best.num_warps * 32)
    reasons = [
        f"D={d}, DV={dv} ({dims.dtype}) on {t.name}: smem <= {t.max_smem_per_block_optin} B/block, "
        f"register budget {REG_BUDGET}/thread (of {t.max_registers_per_thread})",
        f"searched {len(cands)} dK/dV configs: {len(accepted)} feasible",
        f"chosen BLOCK_N = 16*MTK*W = 16*{best.mtk}*{best.num_warps} = {best.block_n} keys per CTA, BLOCK_M = "
        f"{best.block_m} query rows per step" + (" (dV and dK in separate launches)" if best.split_dkv else "")
        + (f"; 2-D warp layout (S^T {best.s_warps_k}x{best.num_warps // best.s_warps_k}, dK/dV "
           f"{best.kv_warps_k}x{best.num_warps // best.kv_warps_k})" if best.layout == "2d" else "; 1-D warp layout")
        + f", ~{best.smem_traffic:.0f} smem B/mma",
        f"registers ~ dK {regs['dk']} + dV {regs['dv']} + S^T {regs['s']} + dP^T {regs['dp']} + overhead "
        f"{REG_OVERHEAD} -> {regs['total']}" + (" (max over the two passes)" if best.split_dkv else ""),
        f"smem = (BN*(D+8) + BN*(DV+8) + 2*BM*(D+8) + 2*BM*(DV+8) + {1 if best.split_dkv else 2}*BN*(BM+8))*2 + 16*BM"
        + ("" if best.split_dkv or d % 128 else " + BM*(D+D/8)*4 (dQ staging)") + f" = {best.smem_bytes} B",
        occ.explain(t, best.smem_bytes, best.est_registers_per_thread, best.num_warps * 32),
        f"dQ product warp grid {wqm} x {wqn}: {best.block_m // wqm} rows x {d // wqn} columns per warp",
        f"dQ mode {dq_mode!r}: " + ("fp32 accumulator + red.global.add (not bit-reproducible)" if dq_mode == "atomic"
                                    else "separate attn_bwd_dq pass, no atomics (bit-identical run to run)"),
        *dq_reasons,
        f"ranking (higher first): {'; '.join(BWD_RANK_KEYS)}",
    ]
    for c in cands:
        if not c.accepted and "does not tile" not in c.reason and "has no dK/dV split" not in c.reason:
            reasons.append(f"rejected BM={c.block_m}, W={c.num_warps}, MTK={c.mtk}, split={c.split_dkv}: {c.reason}")
    return V2BwdPlan(
        schedule="v2_bwd", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype, block_m=best.block_m,
        block_n=best.block_n, num_warps=best.num_warps, num_threads=best.num_warps * 32, smem_bytes=best.smem_bytes,
        est_registers_per_thread=best.est_registers_per_thread, ctas_per_sm=occ.ctas_per_sm, reasons=tuple(reasons),
        mtk=best.mtk, split_dkv=best.split_dkv, dq_mode=dq_mode, dq_warps_m=wqm, dq_warps_n=wqn, dq_block_m=dq_bm,
        dq_block_n=dq_bn, dq_num_warps=dq_w, dq_smem_bytes=dq_smem if dq_mode == "separate" else 0,
        layout=best.layout, s_warps_k=best.s_warps_k, kv_warps_k=best.kv_warps_k, dq_red_vec=dq_red_vec,
        dq_defer=bool(dq_defer) and dq_mode == "atomic" and best.layout == "1d" and not best.split_dkv,
        reg_half=bool(reg_half) and best.layout == "2d" and best.s_warps_k == best.kv_warps_k,
        dq_stage=int(dq_stage) if stage else 0,
    )


def with_dq_mode(plan: V2BwdPlan, dq_mode: str) -> V2BwdPlan:
    """The same tiles with another dQ mode."""
    return dataclasses.replace(plan, dq_mode=dq_mode)
