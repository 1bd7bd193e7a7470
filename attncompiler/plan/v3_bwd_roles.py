"""The v3 backward with its consumers split by role (``dkv_roles``; the kernel:
``templates/include/attncompiler/v3_bwd_roles.cuh``).

Both consumer warpgroups own the CTA's 64 keys: warpgroup 0 computes S^T, the elementwise step and dK (all D columns),
warpgroup 1 dP^T, dV (all DV columns) and, one step behind, dQ; dP^T (fp32) and P^T / dS^T (tiles) go through shared
memory.  Every product runs once (``dkv_split`` computes S^T and dP^T in both warpgroups: 19 GEMM units of 64 x 64 x
64 a step at D = 192, DV = 128 where 13 are needed).  Pure Python, every rejection with its numbers.
"""
from __future__ import annotations

from typing import Any

from .model import PlanError
from .targets import Target
from .v3_bwd import (BLOCK_M, CONSUMER_REGS, DQ_PADS, DQ_RED_WHY, MAX_HEAD_DIM_SPLIT, PRODUCER_REGS, REG_OVERHEAD,
                     SMEM_LIMIT_SM90, SPLIT_HEAD_DIM_STEP, STAGES, V3BwdPlan, v3_bwd_smem_bytes)

__all__ = ["plan_roles", "v3_bwd_roles_register_estimate"]


def v3_bwd_roles_register_estimate(d: int, dv: int, dq_wide: bool = False) -> dict[str, int]:
    """Registers per consumer thread with ``dkv_roles`` (a ranking model): warpgroup 0 holds dK (D/2 fp32), S^T and
    dP^T (the elementwise step; dS^T's A fragments replace them as they are packed); warpgroup 1 dV (DV/2), dP^T and
    one 64-column dQ chunk, or with ``dq_wide`` all D columns of dQ while dP^T is in flight.  (nvcc 13.0: 256 x 128
    fits 240 without spills.)"""
    s_role = d // 2 + 2 * (BLOCK_M // 2)
    dp_role = dv // 2 + BLOCK_M // 2 + (d if dq_wide else 64) // 2
    return {"s_role": s_role, "dp_role": dp_role, "total": max(s_role, dp_role) + REG_OVERHEAD}


def plan_roles(t: Target, dims: Any, *, stages: int | None, deterministic: bool,
                forced: dict[str, tuple[Any, Any]], dq_pad: int | None, dq_wide: bool | None,
                dq_stages: int | None) -> V3BwdPlan:
    """The ``dkv_roles`` plan: BLOCK_N = 64 keys owned by both consumers by role; ``forced`` maps each option to
    (the caller's value, the one this kernel takes): any other value is refused.  ``dq_wide`` (warpgroup 1's dQ in
    one product, issued behind the next block's dP^T) defaults to whether its registers fit; ``dq_stages`` (dQ
    staging buffers per warp, a ring) to the most that fit, up to one per 64-column chunk of a step, then the most Q /
    dO stages."""
    d, dv = dims.head_dim, dims.head_dim_v
    for name, (given, needed) in forced.items():
        if given is not None and given != needed:
            raise PlanError(f"v3 backward: dkv_roles expected {name}={needed!r}, got {given!r}")
    if any(x % SPLIT_HEAD_DIM_STEP or not SPLIT_HEAD_DIM_STEP <= x <= MAX_HEAD_DIM_SPLIT for x in (d, dv)):
        raise PlanError(f"v3 backward: dkv_roles expected D and DV multiples of {SPLIT_HEAD_DIM_STEP} in "
                        f"[{SPLIT_HEAD_DIM_STEP}, {MAX_HEAD_DIM_SPLIT}], got D={d}, DV={dv}")
    if dq_pad is not None and dq_pad not in DQ_PADS:
        raise PlanError(f"v3 backward: expected dq_pad in {DQ_PADS}, got {dq_pad!r}")
    if dq_wide is None:
        dq_wide = v3_bwd_roles_register_estimate(d, dv, True)["total"] <= CONSUMER_REGS[2]
    regs = v3_bwd_roles_register_estimate(d, dv, bool(dq_wide))
    if regs["total"] > CONSUMER_REGS[2]:
        raise PlanError(f"v3 backward: dkv_roles at D={d}, DV={dv}" + (", dq_wide" if dq_wide else "") +
                        f": registers ~{regs['total']} > {CONSUMER_REGS[2]} (setmaxnreg of the consumers)")
    chunks = d // 64
    if dq_stages is not None and not 1 <= dq_stages <= chunks:
        raise PlanError(f"v3 backward: dkv_roles expected dq_stages in [1, {chunks}] (D / 64 chunks a step), got "
                        f"{dq_stages!r}")
    limit = min(SMEM_LIMIT_SM90, t.max_smem_per_block_optin)
    rejected: list[str] = []
    # the most staging buffers first, then the most Q / dO stages (H200, 2026-12-01, backward TFLOP/s at 192 x 128:
    # 2 stages and 3 buffers 369.5, 3 stages and 1 buffer 345.4, 2 and 1 348.6)
    candidates = [(st, n, pad) for n in ((dq_stages,) if dq_stages is not None else range(chunks, 0, -1))
                  for st in ((stages,) if stages is not None else STAGES)
                  for pad in ((dq_pad,) if dq_pad is not None else DQ_PADS)]
    for st, nstg, pad in candidates:
        smem = v3_bwd_smem_bytes(d, dv, 2, st, 2, False, chunk=64, pad=pad, dkv_roles=True, dq_stages=nstg)
        if smem > limit:
            rejected.append(f"dkv_roles, stages={st}, dq_stages={nstg}, dq_pad={pad}: smem {smem} B > {limit} B "
                            f"limit")
            continue
        reasons = (
            f"D={d}, DV={dv} ({dims.dtype}) on {t.name}: v3 backward (TMA + wgmma), smem <= {limit} B/block",
            "BLOCK_N = 64 keys per CTA, owned by both consumer warpgroups by role: warpgroup 0 S^T, the "
            "elementwise step and dK, warpgroup 1 dP^T, dV and dQ (one step behind), dP^T and P^T / dS^T "
            f"exchanged through shared memory (every product once); BLOCK_M = {BLOCK_M} query rows per step",
            f"registers ~ max(warpgroup 0 {regs['s_role']}, warpgroup 1 {regs['dp_role']}) + overhead "
            f"{REG_OVERHEAD} = {regs['total']} <= {CONSUMER_REGS[2]}",
            f"smem = 1024 + K,V 64x(D+DV) + {st} stages x 64x(D+DV) (x2 B) + 2 dS^T + 2 P^T tiles + dP^T "
            f"(fp32) + rows + staged dQ 4 warps x {nstg} x 16 x {64 + pad} fp32" +
            (" (rows swizzled, not padded)" if pad == 0 else "") + f" = {smem} B",
            ("dQ by warpgroup 1 in one product behind the next block's dP^T, added in chunks of 64 columns"
             if dq_wide else "dQ by warpgroup 1, chunks of 64 columns") + f"; {DQ_RED_WHY[2]}",
            *(("deterministic: the CTAs adding into a query block take turns in key-block order (warpgroup 1 "
               "takes and passes the turn; the walk descends the query blocks)",) if deterministic else ()),
            *(f"rejected {r}" for r in rejected),
        )
        return V3BwdPlan(
            schedule="v3_bwd", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype, block_m=BLOCK_M,
            block_n=64, num_warps=12, num_threads=384, smem_bytes=smem,
            est_registers_per_thread=regs["total"], ctas_per_sm=1, reasons=reasons, consumers=2, stages=st,
            producer_regs=PRODUCER_REGS, consumer_regs=CONSUMER_REGS[2], dq_split_n=False, dq_red=2,
            dq_defer=False, deterministic=deterministic, dkv_split=False, dq_chunk=64, dq_pad=pad,
            dq_wide=bool(dq_wide),
            dkv_roles=True, dq_stages=nstg,
        )
    raise PlanError(f"no feasible v3 backward plan on {t.name} (D={d}, DV={dv}, dkv_roles): " + "; ".join(rejected))
