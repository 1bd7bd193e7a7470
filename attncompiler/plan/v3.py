"""v3 planning: tiles of the Hopper forward (TMA + wgmma + warp specialization, sm_90a only).

Facts of the v3 kernel (``templates/v3_fwd.cu.j2``, ``include/attncompiler/v3_fwd.cuh``):

* a CTA is one producer warpgroup (TMA) plus :data:`CONSUMER_WGS` consumer warpgroups, each
  owning :data:`WGMMA_M` = 64 query rows (the M of every wgmma), so BLOCK_M = 64 * consumers;
* K/V stream through STAGES shared-memory stages; Q, K and V tiles are made of 64-column TMA boxes
  (128-byte swizzle: :data:`SWIZZLE_BYTES` per row); D and DV must be multiples of
  :data:`HEAD_DIM_MULTIPLE` (the k16 steps of Q K^T), and a head dim that is not a multiple of 64
  (96) takes ceil(D/64) boxes, the last one zero-filled by TMA beyond D (:func:`v3_padded`);
* BLOCK_N is the N of the Q K^T wgmma (a multiple of 16 for the k16 steps of P V, <= 256) and
  DV the N of the P V wgmma;
* per consumer thread the accumulators take O: DV/2 and S: BLOCK_N/2 fp32 registers and P
  BLOCK_N/4 packed 16-bit pairs, under the ``setmaxnreg`` budget :data:`CONSUMER_REGS`.

Choice: the widest BLOCK_N <= the per-head-dim preference (:data:`PREFERRED_BLOCK_N`) whose
registers fit, with the most K/V stages (:data:`MIN_STAGES`..:data:`MAX_STAGES`) whose shared memory
fits (a forced ``stages`` may go down to 1).  A mask whose query blocks see a narrow band of keys may take a
narrower preference, where fewer keys are visited (:mod:`attncompiler.plan.band`).  Every rejected
BLOCK_N is listed in the reasons with the number that ruled it out.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import sympy

from .model import Plan, PlanError, resolve_dims, resolve_target, elem_bytes
from .band import band_block_m_64, band_block_n
from .qscale import q_prescale_choice
from .scoreskip import SCORE_SKIP_MIN_KEYS, score_skip_choice
from .targets import Target
from .v3_grid import (MIN_STAGES_WITH_O_TILE, balanced_tiles, q_prefetch_choice, q_prefetch_default,
                      tile_list_choice, tiles_by_head_choice)
from .v3_softmax import (LATE_PV_WAIT_MIN_DV, LATE_PV_WAIT_MIN_DV_SEPARABLE,  # noqa: F401 (re-exported)
                         HALF_BLOCKS_DEFAULT, half_blocks_choice, softmax_layout)

__all__ = [
    "V3Plan", "plan_v3", "register_pool", "v3_smem_bytes", "v3_register_estimate", "WGMMA_M", "CONSUMER_WGS",
    "PRODUCER_REGS", "PRODUCER_REGS_Q_PREFETCH", "PRODUCER_REGS_Q_PREFETCH_MIN", "CONSUMER_REGS", "CONSUMER_REGS_BY_WGS",
    "SWIZZLE_BYTES", "SMEM_ALIGN_SLACK", "PREFERRED_BLOCK_M",
    "PREFERRED_BLOCK_N", "PREFERRED_BLOCK_N_DROPOUT", "CTAS_PER_SM_BY_WGS", "v3_smem_limit", "REG_SLACK_MULTI_CTA",
    "PREFERRED_BLOCK_N_SEPARABLE",
    "MIN_STAGES", "MAX_STAGES",
    "BLOCK_N_CHOICES", "REG_OVERHEAD_V3", "V3_OPTIONS",
    "EXP2_POLY_DEFAULT", "KV_DESCENDING_DEFAULT", "KV_DESCENDING_SEPARABLE", "SCORE_SKIP_MIN_KEYS",
    "TILE_WORD_BYTES", "HEAD_DIM_MULTIPLE", "HEAD_DIM_MAX_V3", "v3_padded", "v3_head_dim_error",
]

WGMMA_M = 64                 # rows of one wgmma (m64nNk16): the rows a consumer warpgroup owns
CONSUMER_WGS = 2             # two consumers: ping-pong (one softmax under the other's GEMMs)
PRODUCER_REGS = 24           # setmaxnreg.dec: the TMA warpgroup needs only addresses and counters
#: with q_prefetch the producer warpgroup's second warp runs the O stores and Q copies: at 24 registers ptxas
#: spilled in the K/V loop of band masks (sliding window d128: 8 loads, 6 stores), at 32 still 16 B for the window at
#: d = 64 with tile_list (its list pointer and slot bounds). The consumers give up what the producer takes
#: (:func:`register_pool`): 40*128 + 232*256 = 64512, the whole pool of two consumers' CTA.
PRODUCER_REGS_Q_PREFETCH = 40
#: ... or this many where 40 would leave the consumers fewer registers than their estimate (three consumers at
#: d = 64: (65536 - 40*128) / 384 -> 152 < the estimate 156; at 32 they keep 160)
PRODUCER_REGS_Q_PREFETCH_MIN = 32
CONSUMER_REGS = 240          # setmaxnreg.inc: 24*128 + 240*256 = 64512 <= 65536 registers per SM
# block_m = 192 (plan option): three consumer warpgroups taking GEMM turns round robin, as FlashAttention-3
# tiles d = 64; 24*128 + 160*384 = 64512 <= 65536, so each consumer gets 160 registers.
# block_m = 64 (plan option): one consumer warpgroup (no ping-pong inside the CTA) and two CTAs per SM:
# 24*128 + 232*128 = 32768 registers, half the file, and at most half the SM's shared memory less the per-block
# reserve each (:data:`CTAS_PER_SM_BY_WGS`), so one CTA's start (Q and first K/V copies, the first S GEMM) and drain
# (O store) run under the other CTA's loop.  Meant for short K/V loops (sliding windows, short sequences).
CONSUMER_REGS_BY_WGS = {1: 232, 2: CONSUMER_REGS, 3: 160}
CTAS_PER_SM_BY_WGS = {1: 2, 2: 1, 3: 1}
# With two CTAs per SM, __launch_bounds__(256, 2) makes ptxas compile every thread for at most 65536 / 512 = 128
# registers, and setmaxnreg cannot lift what ptxas allocated.  O and S must fit under that cap with this slack (P
# reuses S's registers once converted).  nvcc 13.0, sm_90a: d = 128 BN 80 / 64 and d = 64 BN 192 compile at 128
# registers without spills; d = 256 (O alone is 128 registers) fails with C7602 "insufficient registers".
REG_SLACK_MULTI_CTA = 8
# BLOCK_M by max(D, DV) for kernels without a mask, dropout or a score_mod other than a separable one (ALiBi)
# (elsewhere 128).  At d = 64
# the GEMMs are short beside the softmax, and a third consumer warpgroup keeps the tensor cores fed.  Measured on
# an H100 (2026-11-22, N = 16k, bf16, medians of 3 interleaved rounds, TFLOP/s, BLOCK_M 128 -> 192 at BN 96 /
# 112): plain 451 -> 486 / 478 and 449 -> 494 / 506; ALiBi 423 -> 428 / 438 and 410 -> 442 (BN 112).  Not taken
# where it measured slower or equal: causal d64 433 -> 422-432, document d64 923 -> 726, softcap d64 375 ->
# 332-362, plain d128 (BN 64) 642 -> 597, causal d128 581 -> 509; sliding windows also pay a higher tiling floor.
# The head dims below 128 that are not multiples of 64 (zero-padded boxes) measured the same way (H100, 2026-11-22,
# plain, 3 interleaved rounds, BLOCK_M 128 -> 192): d96 577 -> 600, d80 485 -> 540, d32 276 -> 328 TFLOP/s; so
# every head dim up to 96 takes it (16 and 48 by interpolation).
PREFERRED_BLOCK_M = {m: 192 for m in range(16, 97, 16)}
SWIZZLE_BYTES = 128          # TMA SWIZZLE_128B: inner box dim <= 128 bytes = 64 16-bit elements
HEAD_DIM_MULTIPLE = 16       # D: k16 steps of the Q K^T wgmma; DV: the P V wgmma's N (a multiple of 8) and
                             # 16-byte chunks of the O copy; both padded to whole 64-column boxes in smem
HEAD_DIM_MAX_V3 = 256        # wgmma N (DV) and TMA box rows are at most 256
SMEM_ALIGN_SLACK = 1024      # the 128-byte swizzle needs 1024-byte aligned tiles; dynamic smem is 16
MBARRIER_BYTES = 8
TILE_WORD_BYTES = 8          # after the mbarriers: the walk's first block, producer -> consumers (score skip)
REG_OVERHEAD_V3 = 40         # indices, row statistics, descriptors, loop state (estimate)
MIN_STAGES = 2               # at least double-buffered K/V: the next block's copies land under this one's GEMMs
MAX_STAGES = 4               # deepest ring searched (more stages: more smem, more latency hidden)
# Preferred key-tile width by max(D, DV): wider tiles amortize the per-tile softmax bookkeeping; at
# 256 the O accumulator (128 registers) leaves room for an 80-wide S only (FlashAttention-3's choice).
# Measured on an H200, N = 16k (docs/perf-notes.md, v3): d=64 BN=192 457 vs BN=128 437 TFLOP/s.
PREFERRED_BLOCK_N = {64: 192, 128: 128, 192: 112, 256: 80}
# Dropout's Philox words and the FMA-pipe polynomial's temporaries need registers: at d=64 BN=192 ptxas
# spills with them (dropout 8 B, softcap with EXP2_POLY 4; nvcc 13.0), at BN=176 nothing, so such variants
# prefer this width when it is narrower.  Masks and captured buffers used to be capped here too; since the
# masked softmax is one copy with a branch around the mask pass (2026-11-21) d=64 BN=192 spills nothing in
# causal, sliding window, document, ALiBi-causal, prefix-LM or relative bias, and is as fast or faster
# (H200, N = 16k, 3 interleaved rounds, BN=176 vs 192: sliding window 272 vs 286, document 868 vs 907,
# ALiBi-causal 404 vs 409, causal 445 vs 445 TFLOP/s).
PREFERRED_BLOCK_N_DROPOUT = 176
# A mask that reads buffers (document ids) takes the same cap: since the masked pass drops the kv < Nk test on
# blocks inside the sequence (two copies of the pass, v3_consumer.cuh), d=64 BN=192 spills 128 B there, BN=176
# nothing.  H100, N = 16k, 7 interleaved rounds, document d=64, ms: old pass BN=192 2.41 / 176 2.55; new pass
# BN=192 2.23 (with the spills), 176 2.29, 160 2.36.  176 keeps the machine code spill-free for 5 % over the old.
# A separable score_mod (ALiBi-like: coef * score + column term + row term, ir/scoreform.py) prefers these
# widths (its column terms cost per tile column, its rows' terms nothing).  Measured on an H100 (2026-11-21,
# N = 16k, bf16, medians of 3 interleaved rounds): ALiBi d=64 BN=176 412, BN=160 433 (plain 460);
# d=128 BN=128 545, BN=144 580, BN=160 576 (plain 631) TFLOP/s.
PREFERRED_BLOCK_N_SEPARABLE = {64: 160, 128: 144}
# A bounded score_mod softmaxed with a fixed offset (softcap; ir/scorerange.py: no row maximum, no O rescale)
# at d=64 is bound by its two MUFU ops per score (tanh, ex2): a narrower tile with half of the exponentials
# on the FMA pipes (EXP2_POLY_STATIC) measured best.  H200, N = 16k, bf16, 2 interleaved rounds, softcap
# d=64, TFLOP/s (plain 460): BN=192 poly 0 325; BN=128 poly 0/3/4 341/378/377; BN=144 poly 3/4/5
# 365/385/370; BN=160 poly 4 337; BN=176 poly 3/5 330/341.  At d=128 BN=128 poly 0 stays best (592; poly 1
# 572, 2 561; BN=144 597, 160 559).
PREFERRED_BLOCK_N_STATIC = {64: 144}
EXP2_POLY_STATIC = {64: 4}
BLOCK_N_CHOICES = tuple(range(256, 15, -16))
#: the plan options :func:`plan_v3` takes (block_m 128 or 192; num_warps only at block_m's value)
V3_OPTIONS = ("block_n", "stages", "persistent", "block_m", "num_warps", "exp2_poly", "kv_descending", "score_skip",
              "q_prescale", "late_pv_wait", "tma_store_o", "softmax_copies", "half_blocks", "tiles_by_head",
              "q_prefetch", "tile_list")
#: ``softmax_copies`` / ``late_pv_wait``: the main loop's softmax layout (:mod:`attncompiler.plan.v3_softmax`)
#: EXP2_POLY default: of every 8 n8 tiles of S, how many take the FMA-pipe exponential (ac_exp2_poly)
#: instead of MUFU ex2.  None by default: measured on an H100 (2026-11-21, N = 16k, bf16), moving 1/8 .. 6/8
#: of the exponentials made plain and softcap (ex2 + tanh: 2 MUFU ops per score) slower or equal at
#: d = 64 / 128 / 256 (softcap d=128: 4.14 ms at 0, 4.18 at 2/8, 4.43 at 4/8, 4.62 at 5/8), so MUFU
#: throughput is not what bounds them; the option stays for the autotuner and for other GPUs.
EXP2_POLY_DEFAULT = 0
#: the K/V walk's order (plan option ``kv_descending``): ascending by default; from the last block down for a
#: separable score_mod, whose column term (ALiBi: slope[h] * kv with slopes > 0) is then largest in the first
#: visited block, so the lazy rescale (v3_consumer.cuh) seldom moves the offset afterwards.  Measured on an H100
#: (2026-11-22, N = 16k, bf16, medians of 3 interleaved rounds, ascending -> descending, TFLOP/s): ALiBi d64 441
#: -> 474, d128 584 -> 602, d256 659 -> 755, ALiBi-causal d128 529 -> 555; plain d128 660 -> 653, causal 598 ->
#: 593, sliding window 435 -> 442 (within noise, so they keep the ascending walk).
KV_DESCENDING_DEFAULT = False
KV_DESCENDING_SEPARABLE = True


@dataclass(frozen=True, kw_only=True)
class V3Plan(Plan):
    stages: int
    consumers: int
    producer_regs: int
    consumer_regs: int
    persistent: bool = False
    sm_count: int = 132
    exp2_poly: int = 0
    kv_descending: bool = False
    score_skip: bool = False
    q_prescale: bool = False
    late_pv_wait: bool = False
    tma_store_o: bool = False
    softmax_copies: int = 2
    half_blocks: bool = False
    tiles_by_head: bool = False
    q_prefetch: bool = False
    tile_list: bool = False

    @property
    def options(self) -> dict[str, Any]:
        """The plan options that reproduce this plan (``plan_v3(ir, target, **p.options)``)."""
        return {"block_n": self.block_n, "stages": self.stages, "persistent": self.persistent,
                "exp2_poly": self.exp2_poly, "block_m": self.block_m, "kv_descending": self.kv_descending,
                "score_skip": self.score_skip, "q_prescale": self.q_prescale, "late_pv_wait": self.late_pv_wait,
                "tma_store_o": self.tma_store_o, "softmax_copies": self.softmax_copies,
                "half_blocks": self.half_blocks, "tiles_by_head": self.tiles_by_head, "q_prefetch": self.q_prefetch,
                "tile_list": self.tile_list}

    def _config_lines(self) -> list[str]:
        dealt = "; tiles dealt to the CTAs by a host list" if self.tile_list else ""
        return super()._config_lines() + [
            f"  warp specialization: 1 producer warpgroup (TMA, setmaxnreg {self.producer_regs}) + "
            f"{self.consumers} consumer warpgroup{'s' if self.consumers > 1 else ''} (wgmma, setmaxnreg "
            f"{self.consumer_regs}); "
            f"{self.stages} K/V stages; "
            f"{f'persistent grid ({self.ctas_per_sm} CTA(s) per SM)' if self.persistent else 'one CTA per tile'}"
            f"{'; O written by TMA stores from an O tile' if self.tma_store_o else ''}"
            f"{' (by a producer warp; the next Q loaded a tile ahead into the other tile)' if self.q_prefetch else ''}"
            f"{dealt}",
            f"  softmax exponentials: {self.exp2_poly}/8 on the FMA pipes (polynomial), the rest on MUFU",
        ]


def v3_padded(x: int, eb: int = 2) -> int:
    """A head dim rounded up to whole TMA boxes of SWIZZLE_BYTES (64 columns of 16-bit elements): its width in
    shared memory (96 -> 128)."""
    cols = SWIZZLE_BYTES // eb
    return -(-x // cols) * cols


def v3_head_dim_error(d: int, dv: int) -> str | None:
    """Why v3 cannot tile these head dims (None: it can)."""
    bad = [f"{label}={x}" for label, x in (("head_dim", d), ("head_dim_v", dv))
           if x % HEAD_DIM_MULTIPLE or not 0 < x <= HEAD_DIM_MAX_V3]
    if not bad:
        return None
    return (f"v3 needs head dims that are multiples of {HEAD_DIM_MULTIPLE} and <= {HEAD_DIM_MAX_V3} (k16 steps of "
            f"Q K^T, wgmma N), got {', '.join(bad)}")


def v3_smem_bytes(block_m: int, block_n: int, d: int, dv: int, stages: int, eb: int = 2,
                  o_tile: bool = False, q_prefetch: bool = False) -> int:
    """Q tile + STAGES x (K + V) tiles [+ the O tile of ``tma_store_o``] + mbarriers (two more with
    ``q_prefetch``) + the tile word + the 1024-byte alignment slack (as V3Layout); head dims count whole
    64-column boxes (:func:`v3_padded`)."""
    n_bars = 2 + 4 * stages + (2 if q_prefetch else 0)
    dp, dvp = v3_padded(d, eb), v3_padded(dv, eb)
    return (SMEM_ALIGN_SLACK + eb * (block_m * dp + stages * block_n * (dp + dvp) + (block_m * dvp if o_tile else 0))
            + MBARRIER_BYTES * n_bars + TILE_WORD_BYTES)


def register_pool(num_warps: int, ctas_per_sm: int) -> int:
    """Registers a CTA holds, which its warpgroups' setmaxnreg targets must not exceed (setmaxnreg.inc waits until
    the CTA's pool has them): ptxas compiles every thread for 65536 / (threads x CTAs per SM) registers rounded down
    to a multiple of 8 (__launch_bounds__), and the CTA is given that many per thread. 384 threads: 168 x 384 =
    64512; 512: 128 x 512 = 65536."""
    per_thread = 65536 // (32 * num_warps * ctas_per_sm) // 8 * 8
    return per_thread * 32 * num_warps


def v3_smem_limit(target: Target, ctas_per_sm: int) -> int:
    """Dynamic shared memory one CTA may take when ``ctas_per_sm`` of them share an SM."""
    if ctas_per_sm <= 1:
        return target.max_smem_per_block_optin
    return min(target.max_smem_per_block_optin, target.smem_per_sm // ctas_per_sm - target.smem_reserved_per_block)


def v3_register_estimate(block_n: int, dv: int) -> dict[str, int]:
    """Registers per consumer thread: O DV/2 + S BLOCK_N/2 + P BLOCK_N/4 + overhead."""
    r = {"o": dv // 2, "s": block_n // 2, "p": block_n // 4, "overhead": REG_OVERHEAD_V3}
    r["total"] = sum(r.values())
    return r


def _preferred(d: int, dv: int, narrow: bool, separable: bool = False, static: bool = False) -> int:
    m = max(d, dv)
    if separable and m in PREFERRED_BLOCK_N_SEPARABLE:
        return PREFERRED_BLOCK_N_SEPARABLE[m]
    if static and m in PREFERRED_BLOCK_N_STATIC:
        return min(PREFERRED_BLOCK_N_STATIC[m], PREFERRED_BLOCK_N_DROPOUT) if narrow else PREFERRED_BLOCK_N_STATIC[m]
    pref = PREFERRED_BLOCK_N.get(m, 128 if m <= 128 else 80)
    return min(pref, PREFERRED_BLOCK_N_DROPOUT) if narrow else pref


def _why_preferred(d: int, dv: int, narrow: bool, separable: bool, static: bool = False) -> str:
    if separable and max(d, dv) in PREFERRED_BLOCK_N_SEPARABLE:
        return " for a separable score_mod (PREFERRED_BLOCK_N_SEPARABLE)"
    if static and max(d, dv) in PREFERRED_BLOCK_N_STATIC:
        return " for a bounded score_mod with a fixed softmax offset (PREFERRED_BLOCK_N_STATIC)"
    return " with dropout, polynomial exponentials or a mask that reads buffers" if narrow else ""


def _mask_reads_buffers(ir_or_dims: Any) -> bool:
    """Whether the IR's mask reads a buffer (``doc[q_idx] == doc[kv_idx]``): its masked pass loads per element."""
    mask = getattr(ir_or_dims, "mask_expr", None)
    return isinstance(mask, sympy.Basic) and mask.has(sympy.Indexed)


def _separable_score_mod(ir_or_dims: Any, *, with_mask: bool = False) -> bool:
    """Whether the IR's score_mod has the separable form (and, unless ``with_mask``, no mask: masks keep
    their own widths)."""
    if getattr(ir_or_dims, "score_expr", None) is None:
        return False
    if not with_mask and getattr(ir_or_dims, "mask_expr", None) is not None:
        return False
    from ..codegen.hooks import score_form_of  # lazy: codegen imports the planner

    return score_form_of(ir_or_dims).separable


def _static_offset(ir_or_dims: Any) -> bool:
    """Whether the IR's score_mod is bounded enough for a fixed softmax offset (ir/scorerange.py)."""
    if getattr(ir_or_dims, "score_expr", None) is None:
        return False
    from ..codegen.hooks import static_offset_of  # lazy: codegen imports the planner

    return static_offset_of(ir_or_dims) is not None


def plan_v3(ir_or_dims: Any, target: Target | str | None, *, block_n: int | None = None,
            stages: int | None = None, block_m: int | None = None, num_warps: int | None = None,
            persistent: bool | None = None, exp2_poly: int | None = None,
            kv_descending: bool | None = None, score_skip: bool | None = None,
            q_prescale: bool | None = None, late_pv_wait: bool | None = None,
            tma_store_o: bool | None = None, softmax_copies: int | None = None,
            half_blocks: bool | None = None, tiles_by_head: bool | None = None,
            q_prefetch: bool | None = None, tile_list: bool | None = None) -> V3Plan:
    """The v3 configuration on ``target`` (sm_90 only), or the forced ``block_n`` / ``stages``.

    Without a forced ``block_m`` / ``num_warps``, a mask whose query blocks see a narrow band of keys may take
    BLOCK_M = 64 (one consumer warpgroup, two CTAs per SM) where that computes ``BAND_MIN_SAVING_BM64`` less
    of the score matrix than the two-consumer tile (:func:`attncompiler.plan.band.band_block_m_64`)."""
    kw: dict[str, Any] = dict(block_n=block_n, stages=stages, persistent=persistent, exp2_poly=exp2_poly,
                              kv_descending=kv_descending, score_skip=score_skip, q_prescale=q_prescale,
                              late_pv_wait=late_pv_wait, tma_store_o=tma_store_o, softmax_copies=softmax_copies,
                              half_blocks=half_blocks, tiles_by_head=tiles_by_head, q_prefetch=q_prefetch,
                              tile_list=tile_list)
    base = _plan_v3(ir_or_dims, target, block_m=block_m, num_warps=num_warps, **kw)
    mask = getattr(ir_or_dims, "mask_expr", None)
    if block_m is not None or num_warps is not None or base.block_m != WGMMA_M * CONSUMER_WGS or mask is None:
        return base
    try:
        plan_64 = _plan_v3(ir_or_dims, target, block_m=WGMMA_M, **kw)
    except PlanError:
        return base  # one consumer warpgroup does not fit this head dim (registers under two CTAs per SM)
    why = band_block_m_64(mask, base.block_m, base.block_n, plan_64.block_n)
    if why is None:
        return base
    reasons = tuple(f"BLOCK_M = {WGMMA_M} rows (wgmma M) x 1 consumer warpgroup = {WGMMA_M}: {why}; one producer "
                    f"warpgroup -> {plan_64.num_warps} warps ({plan_64.num_threads} threads)"
                    if r.startswith("BLOCK_M =") else r for r in plan_64.reasons)
    return dataclasses.replace(plan_64, reasons=reasons)


def _plan_v3(ir_or_dims: Any, target: Target | str | None, *, block_n: int | None = None,
             stages: int | None = None, block_m: int | None = None, num_warps: int | None = None,
             persistent: bool | None = None, exp2_poly: int | None = None,
             kv_descending: bool | None = None, score_skip: bool | None = None,
             q_prescale: bool | None = None, late_pv_wait: bool | None = None,
             tma_store_o: bool | None = None, softmax_copies: int | None = None,
             half_blocks: bool | None = None, tiles_by_head: bool | None = None,
             q_prefetch: bool | None = None, tile_list: bool | None = None) -> V3Plan:
    """:func:`plan_v3` for one BLOCK_M (the model's two-consumer default unless forced)."""
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    if (t.major, t.minor) != (9, 0):
        raise PlanError(f"v3 needs sm_90a, got {t.name} (TMA, wgmma and setmaxnreg are Hopper-only); "
                        f"use schedule='v2' there")
    d, dv, eb = dims.head_dim, dims.head_dim_v, elem_bytes(dims.dtype)
    bms = tuple(WGMMA_M * n for n in CONSUMER_REGS_BY_WGS)
    if block_m is not None and block_m not in bms:
        raise PlanError(f"v3: expected block_m in {bms} (64 rows per consumer warpgroup x "
                        f"{' or '.join(map(str, CONSUMER_REGS_BY_WGS))}), got {block_m}")
    static = _static_offset(ir_or_dims)
    sep_any = _separable_score_mod(ir_or_dims, with_mask=True)  # a separable score_mod (ALiBi), masked or not
    separable = sep_any and getattr(ir_or_dims, "mask_expr", None) is None  # masks keep their own tile widths
    # no mask, no dropout, no score_mod beyond a separable one (ALiBi), no polynomial exponentials
    plain_softmax = (getattr(ir_or_dims, "mask_expr", None) is None and getattr(ir_or_dims, "dropout_p", 0.0) == 0.0
                     and (getattr(ir_or_dims, "score_expr", None) is None or separable)
                     and not static and not exp2_poly)
    if block_m is None and num_warps is not None and num_warps % 4 == 0 and num_warps // 4 - 1 in CONSUMER_REGS_BY_WGS:
        block_m = WGMMA_M * (num_warps // 4 - 1)  # the warps name the consumer warpgroups
    bm = block_m if block_m is not None else WGMMA_M * CONSUMER_WGS
    bm_why = " (forced)" if block_m is not None else ""
    pref_bm = PREFERRED_BLOCK_M.get(max(d, dv))
    if block_m is None and plain_softmax and pref_bm is not None:
        fits_n = block_n is None or v3_register_estimate(block_n, dv)["total"] <= CONSUMER_REGS_BY_WGS[pref_bm // WGMMA_M]
        if fits_n:
            bm = pref_bm
            bm_why = (f" (PREFERRED_BLOCK_M for max(D, DV) = {max(d, dv)} without a mask, dropout or a score_mod "
                      f"other than a separable one: measured faster)")
    nc = bm // WGMMA_M
    consumer_regs = CONSUMER_REGS_BY_WGS[nc]
    ctas = CTAS_PER_SM_BY_WGS[nc]
    reg_cap = 65536 // (32 * 4 * (nc + 1) * ctas)  # what ptxas may give each thread under __launch_bounds__
    nw = 4 * (nc + 1)
    if num_warps is not None and num_warps != nw:
        raise PlanError(f"v3: expected num_warps={nw} (1 producer + {nc} consumer warpgroups), "
                        f"got {num_warps}")
    cols = SWIZZLE_BYTES // eb
    bad = v3_head_dim_error(d, dv)
    if bad:
        raise PlanError(f"{bad}; use schedule='v2' for this head dim")
    if exp2_poly is not None and (isinstance(exp2_poly, bool) or not isinstance(exp2_poly, int)
                                  or not 0 <= exp2_poly <= 8):
        raise PlanError(f"v3: expected exp2_poly an int in 0..8 (n8 tiles of every 8), got {exp2_poly!r}")
    if stages is not None and not 1 <= int(stages) <= MAX_STAGES:
        raise PlanError(f"v3: expected stages in 1..{MAX_STAGES}, got {stages}")
    stage_choices = (int(stages),) if stages is not None else tuple(range(MAX_STAGES, MIN_STAGES - 1, -1))
    if tma_store_o is not None and not isinstance(tma_store_o, bool):
        raise PlanError(f"v3: expected tma_store_o a bool, got {tma_store_o!r}")
    if tma_store_o and not persistent:
        raise PlanError(f"v3: expected tma_store_o with persistent=True (the persistent grid's epilogue), got "
                        f"persistent={persistent!r}")
    o_tile = bool(tma_store_o)
    # q_prefetch's two mbarriers are counted wherever the O tile is (checked against the grid below); on by default for
    # a band mask's short tiles (plan/v3_grid.py Q_PREFETCH_BANDS)
    qpf_default = q_prefetch is None and q_prefetch_default(ir_or_dims, head_dim=d, head_dim_v=dv, ctas_per_sm=ctas,
                                                            score_skip_asked=score_skip)
    qpf = q_prefetch is True or qpf_default
    static_poly = EXP2_POLY_STATIC.get(max(d, dv)) if static else None
    poly = exp2_poly if exp2_poly is not None else (static_poly if static_poly is not None else EXP2_POLY_DEFAULT)
    # dropout, the polynomial exponentials or a mask reading buffers: at most PREFERRED_BLOCK_N_DROPOUT (d=64
    # BN=192 spills)
    narrow = getattr(ir_or_dims, "dropout_p", 0.0) > 0.0 or poly > 0 or _mask_reads_buffers(ir_or_dims)
    pref = _preferred(d, dv, narrow, separable, static)
    band = band_block_n(ir_or_dims, bm, pref) if block_n is None else None
    pref_why = _why_preferred(d, dv, narrow, separable, static)
    if band is not None:
        pref_why = f" for max(D, DV) = {max(d, dv)}{pref_why} was {pref}; {band[1]}"
        pref = band[0]
    limit = v3_smem_limit(t, ctas)
    per_block = "per block" if ctas == 1 else f"per block ({ctas} CTAs per SM)"
    # half blocks asked for (or on by default with a mask): BLOCK_N a multiple of 32, the half S registers counted
    halves_wanted = bool(half_blocks) if half_blocks is not None else (
        HALF_BLOCKS_DEFAULT and getattr(ir_or_dims, "mask_expr", None) is not None)

    def search(o_tile: bool) -> tuple[tuple | None, list[str]]:
        """(BLOCK_N, smem, registers, stages) of the widest BLOCK_N that fits, and the rejected candidates."""
        rejected: list[str] = []
        for bn in ((block_n,) if block_n is not None else BLOCK_N_CHOICES):
            if bn % 16 or not 16 <= bn <= 256:
                rejected.append(f"BLOCK_N={bn}: expected a multiple of 16 in [16, 256] (k16 steps of P V, wgmma N)")
                continue
            if block_n is None and bn > pref:
                continue  # wider than preferred: not considered (listed once below)
            if block_n is None and halves_wanted and bn % 32:
                rejected.append(f"BLOCK_N={bn}: half_blocks takes a multiple of 32 (two halves of whole k16 steps)")
                continue
            regs = v3_register_estimate(bn, dv)
            if halves_wanted:  # the half S GEMMs' own accumulators (V3Consumer::acc_h)
                regs = {**regs, "half S": bn // 4, "total": regs["total"] + bn // 4}
            if ctas == 1 and regs["total"] > consumer_regs:
                rejected.append(f"BLOCK_N={bn}: ~{regs['total']} registers per consumer thread > {consumer_regs}")
                continue
            if ctas > 1 and regs["o"] + regs["s"] + regs.get("half S", 0) + REG_SLACK_MULTI_CTA > reg_cap:
                half = f" + half S {regs['half S']}" if "half S" in regs else ""
                rejected.append(f"BLOCK_N={bn}: O {regs['o']} + S {regs['s']}{half} + {REG_SLACK_MULTI_CTA} registers "
                                f"per thread > {reg_cap} ({ctas} CTAs of {32 * nw} threads per SM)")
                continue
            def smem_at(st: int, bn: int = bn) -> int:
                return v3_smem_bytes(bm, bn, d, dv, st, eb, o_tile, qpf and o_tile)

            fits = [st for st in stage_choices if smem_at(st) <= limit]
            if not fits:
                st = stage_choices[-1]
                rejected.append(f"BLOCK_N={bn}: smem {smem_at(st)} B with {st} stage(s) > {limit} B {per_block}")
                continue
            st = fits[0]
            if stages is None and st < MAX_STAGES:
                rejected.append(f"STAGES={st + 1} at BLOCK_N={bn}: smem {smem_at(st + 1)} B > {limit} B {per_block}")
            return (bn, smem_at(st), regs, st), rejected
        return None, rejected

    chosen, rejected = search(o_tile)
    if chosen is None:
        raise PlanError(f"no feasible v3 plan on {t.name} (D={d}, DV={dv}, stages={stages}): " + "; ".join(rejected))
    # The grid and epilogue (plan/v3_grid.py): unless the caller chose, the persistent grid with TMA stores of O
    # where the tiles are balanced and the O tile keeps this BLOCK_N and enough stages.
    grid_why = None
    if persistent is None and tma_store_o is None and ctas == 1:
        balanced, why_bal = balanced_tiles(ir_or_dims, bm, chosen[0])
        with_o, rejected_o = search(True) if balanced else (None, [])
        if with_o is not None and with_o[0] == chosen[0] and with_o[3] >= MIN_STAGES_WITH_O_TILE:
            chosen, rejected, persistent, o_tile = with_o, rejected_o, True, True
            grid_why = (f"the persistent grid with TMA stores of O (plan/v3_grid.py): {why_bal}; the O tile leaves "
                        f"BLOCK_N {with_o[0]} and {with_o[3]} K/V stages")
        else:
            grid_why = ("one CTA per tile (plan/v3_grid.py): " + (
                why_bal if not balanced else f"the O tile of the TMA stores would not keep BLOCK_N {chosen[0]} with "
                                             f">= MIN_STAGES_WITH_O_TILE {MIN_STAGES_WITH_O_TILE} stages"))
    if qpf_default and (chosen[0] < bm or not o_tile):
        # q_prefetch's default only where every warpgroup runs every block (the GPU-tested kernels): not with the
        # per-warpgroup walks of BLOCK_N < BLOCK_M; nor without the O tile (its mbarriers were counted)
        qpf = qpf_default = False
        chosen, rejected = search(o_tile)
        assert chosen is not None  # the same search with 16 bytes less shared memory
    bn, smem, regs, st = chosen
    qpf, why_qpf = q_prefetch_choice(q_prefetch, o_tile, score_skip_asked=score_skip, d_padded=v3_padded(d, eb),
                                     dv_padded=v3_padded(dv, eb), ctas_per_sm=ctas, default_on=qpf_default)
    pool = register_pool(nw, ctas)
    producer_regs = PRODUCER_REGS
    if qpf and ctas == 1:
        producer_regs = PRODUCER_REGS_Q_PREFETCH
        if (pool - producer_regs * 128) // (128 * nc) // 8 * 8 < regs["total"]:
            producer_regs = PRODUCER_REGS_Q_PREFETCH_MIN
    if producer_regs * 128 + consumer_regs * 128 * nc > pool:  # setmaxnreg.inc would wait forever
        consumer_regs = (pool - producer_regs * 128) // (128 * nc) // 8 * 8
        if regs["total"] > consumer_regs:
            raise PlanError(f"v3: q_prefetch leaves {consumer_regs} registers per consumer thread, got an estimate "
                            f"of {regs['total']} at BLOCK_N {bn}")
    by_head, why_order = tiles_by_head_choice(ir_or_dims, bool(persistent), bm, bn, tiles_by_head)
    dp, dvp = v3_padded(d, eb), v3_padded(dv, eb)
    half_s = regs.get("half S", 0)
    half_txt = f" + half S BLOCK_N/4 = {half_s}" if half_s else ""
    reg_line = (
        f"registers per consumer thread ~ O DV/2 = {regs['o']} + S BLOCK_N/2 = {regs['s']} + P BLOCK_N/4 = "
        f"{regs['p']}{half_txt} + overhead {regs['overhead']} = {regs['total']} <= setmaxnreg {consumer_regs} "
        f"({producer_regs}*128 + {consumer_regs}*{128 * nc} <= {pool}, the CTA's registers)" if ctas == 1 else
        f"registers per thread: O DV/2 = {regs['o']} + S BLOCK_N/2 = {regs['s']}{half_txt} + slack {REG_SLACK_MULTI_CTA} "
        f"<= {reg_cap}, what ptxas gives each of {ctas} CTAs x {32 * nw} threads per SM (P reuses S's registers)")
    reasons = [
        (f"D={d}, DV={dv} ({dims.dtype}): multiples of {HEAD_DIM_MULTIPLE} (k16 steps) and <= {HEAD_DIM_MAX_V3}, "
         f"in TMA boxes of {cols} columns ({SWIZZLE_BYTES} bytes, 128-byte swizzle)"
         + ("" if (d % cols, dv % cols) == (0, 0) else
            f"; smem rows padded to {dp} / {dvp} columns (TMA zero-fills the rest)")),
        f"BLOCK_M = {WGMMA_M} rows (wgmma M) x {nc} consumer warpgroup{'s' if nc > 1 else ''} = {bm}{bm_why}; one "
        f"producer warpgroup "
        f"-> {nw} warps ({32 * nw} threads)",
        (f"BLOCK_N = {bn} forced by the caller" if block_n is not None else
         f"BLOCK_N = {bn}: the widest multiple of 16 <= {pref} that fits (the preferred width{pref_why})"
         if band is not None else
         f"BLOCK_N = {bn}: the widest multiple of 16 <= the preferred {pref} for max(D, DV) = {max(d, dv)}"
          f"{pref_why} that fits"),
        reg_line,
        f"smem = {SMEM_ALIGN_SLACK} (alignment) + {eb}*({bm}*{dp} + {st}*{bn}*({dp}+{dvp})"
        f"{f' + {bm}*{dvp} (the O tile)' if o_tile else ''}) + {MBARRIER_BYTES}*"
        f"{2 + 4 * st + (2 if qpf else 0)} (mbarriers) + {TILE_WORD_BYTES} (tile word) = {smem} B <= {limit} B {per_block}",
        f"STAGES = {st}" + (" (forced)" if stages is not None else
                            f": the most K/V stages (<= {MAX_STAGES}) that fit beside the O tile (the persistent "
                            f"grid with TMA stores measured faster at 2 stages than one CTA per tile at 3: "
                            f"plan/v3_grid.py)" if o_tile else
                            f": the most K/V stages (<= {MAX_STAGES}) that fit; measured on an H200 at d=128, "
                            f"N=16k: 3 stages 630 vs 2 stages 510 TFLOP/s (the copies of block i+2 wait for "
                            f"block i's slot, so deeper rings hide more of the load latency)"),
        ("1 CTA per SM (the tiles use most of shared memory; the warpgroups hide latency instead)" if ctas == 1 else
         f"{ctas} CTAs per SM (one consumer warpgroup each: a CTA's start and drain run under the other's loop; "
         f"measured slower than the two-consumer ping-pong on an H200 except plain d = 64 at N = 1024 and narrow band "
         f"masks: docs/perf-notes.md, fifteenth and twenty-sixth sessions)"),
        (f"persistent grid: min(tiles, {ctas} x SMs) CTAs loop over the tiles, "
         + ("the query blocks of one batch*head together (their K/V shared in L2)" if by_head else
            "every head's heaviest query blocks first") + f" (tiles_by_head: {why_order})"
         if persistent else
         "grid = (query blocks, H, B), heaviest query blocks first" + (" (persistent=False forced)" if persistent
                                                                       is not None else "")),
    ]
    if exp2_poly is None and static_poly is not None:
        reasons.append(f"EXP2_POLY = {poly}: {poly}/8 of the softmax exponentials on the FMA pipes, the rest on "
                       f"MUFU beside the score_mod's own MUFU op (bounded score_mod, fixed softmax offset: "
                       f"EXP2_POLY_STATIC)")
    elif exp2_poly is None:
        reasons.append(f"EXP2_POLY = {poly}: every softmax exponential on MUFU ex2 (the FMA-pipe polynomial "
                       f"did not pay on the H100: EXP2_POLY_DEFAULT)")
    else:
        reasons.append(f"EXP2_POLY = {poly} (forced): {poly}/8 of the softmax exponentials on the FMA pipes")
    if kv_descending is not None and not isinstance(kv_descending, bool):
        raise PlanError(f"v3: expected kv_descending a bool, got {kv_descending!r}")
    desc = bool(kv_descending) if kv_descending is not None else (KV_DESCENDING_SEPARABLE if sep_any
                                                                   else KV_DESCENDING_DEFAULT)
    why_desc = (" (forced)" if kv_descending is not None else
                " (KV_DESCENDING_SEPARABLE: a separable score_mod's column term, ALiBi's slope * kv, peaks at the "
                "last block, so the lazy rescale rarely moves the offset after it)" if sep_any else "")
    reasons.append(f"K/V blocks visited {'from the last down' if desc else 'in ascending order'}{why_desc}")
    if getattr(ir_or_dims, "mask_expr", None) is not None and nc >= 2 and bn < bm:
        # templates/include/attncompiler/v3_fwd.cuh kWgWalk (the same condition)
        reasons.append(f"each consumer warpgroup multiplies only the K/V blocks its own 64 rows can see (a mask and "
                       f"BLOCK_N {bn} < BLOCK_M {bm}: a warpgroup's rows may miss whole blocks of the CTA's walk; for "
                       f"those it takes an empty GEMM turn)")
    why_not = "" if desc else "the K/V walk is ascending (the skip needs the largest column term visited first)"
    skip, why_skip = score_skip_choice(ir_or_dims, "v3", score_skip, why_not if not qpf else
                                       "q_prefetch: the producer's tile word is not published with the Q copy")
    reasons.append(why_skip)
    qpre, why_qpre = q_prescale_choice(ir_or_dims, q_prescale)
    reasons.append(why_qpre)
    copies, late, why_softmax = softmax_layout(
        masked=getattr(ir_or_dims, "mask_expr", None) is not None, separable=sep_any, static=static, block_n=bn,
        dv=dv, softmax_copies=softmax_copies, late_pv_wait=late_pv_wait)
    reasons += why_softmax
    halves, why_halves = half_blocks_choice(masked=getattr(ir_or_dims, "mask_expr", None) is not None, block_n=bn,
                                            half_blocks=half_blocks)
    if why_halves is not None:
        reasons.append(why_halves)
    if grid_why is not None:
        reasons.append(grid_why)
    if o_tile:
        reasons.append("O written by TMA stores (tma_store_o): each consumer warpgroup stages its rows of O in an O "
                       "tile of its own and one thread stores them per 64-column box; the next tile's Q lands "
                       "meanwhile, and only the next staging waits for the stores to have read the tile")
    if why_qpf is not None:
        reasons.append(why_qpf)
    dealt, why_dealt = tile_list_choice(ir_or_dims, tile_list, bool(persistent), bm, bn)
    if why_dealt is not None:
        reasons.append(why_dealt)
    if block_n is None and pref < BLOCK_N_CHOICES[0]:
        reasons.append(f"not considered: BLOCK_N > {pref} " + ("(the band mask's width, above)" if band is not None else
                       "(S and P registers beside O; FlashAttention-3's tile widths for this head dim)"))
    reasons += [f"rejected {r}" for r in rejected]
    return V3Plan(
        schedule="v3", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype, block_m=bm, block_n=bn,
        num_warps=nw, num_threads=32 * nw, smem_bytes=smem,
        est_registers_per_thread=consumer_regs if ctas == 1 else reg_cap,
        ctas_per_sm=ctas, reasons=tuple(reasons), stages=st, consumers=nc, producer_regs=producer_regs,
        consumer_regs=consumer_regs, persistent=bool(persistent), sm_count=t.sm_count, exp2_poly=poly,
        kv_descending=desc, score_skip=skip, q_prescale=qpre, late_pv_wait=late, tma_store_o=o_tile,
        softmax_copies=copies, half_blocks=halves, tiles_by_head=by_head, q_prefetch=qpf,
        tile_list=dealt,
    )
