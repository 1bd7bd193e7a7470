"""Decode planning: the split-KV (flash-decoding) forward for few query rows against a long K/V.

Facts of the kernels (``templates/decode_fwd.cu.j2``, ``include/attncompiler/decode.cuh``):

* the split kernel's grid is (num_splits * row_blocks, H_kv, B); a CTA owns DECODE_ROWS = 16 rows (one
  m16 mma tile) of one K/V head's group -- row = (query head of the group, query), H/H_kv * Nq rows,
  so ``row_blocks = ceil(H/H_kv * Nq / 16)`` -- and one contiguous chunk of whole BLOCK_N-key tiles;
* NUM_WARPS warps each take BLOCK_N / NUM_WARPS keys of every tile, so the tile width is
  16 * NUM_WARPS (one k16 step of P V per warp and tile) and the warps merge (m, l, O) at the end;
* K/V stream through a STAGES-deep ring: STAGES - 1 tiles are in flight while one is computed.
  The kernel is bound by HBM bandwidth (each key's K and V bytes are used by <= 16 rows), so the
  plan maximizes bytes in flight per SM: as many stages as keep DECODE_CTAS_PER_SM CTAs resident
  (:data:`DECODE_STAGES_MIN` .. :data:`DECODE_STAGES_MAX`).  ``loader`` fills the ring:
  ``"cp_async"`` (16-byte cp.async from every thread, the default), ``"bulk"`` (sm_90+: one
  ``cp.async.bulk`` per K / V row, issued by one warp, completing on one mbarrier per stage) or
  ``"tma"`` (sm_90+: tensor-map copies of 64-column boxes, 128-byte swizzle, from one thread);
* shared memory: ``(16*(D+8) + STAGES*BLOCK_N*((D+8) + (DV+8))) * 2`` bytes, plus
  ``ceil(8*STAGES / 16) * 16`` bytes of mbarriers with the bulk loader (tma: :func:`decode_smem_bytes`);
* with more than one split the partial (O, LSE) go to a workspace, merged by a combine kernel, or,
  with ``fold_combine``, by the last split CTA of each (batch, K/V head, row block) (an atomic
  counter per unit in the workspace, zeroed by the launcher): one launch instead of two.

The split count is a run-time choice (:func:`choose_splits`): it depends on B, H_kv, Nq and Nk.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .model import Plan, PlanError, occupancy, resolve_dims, resolve_target
from .resources import SMEM_ROW_PAD
from .targets import Target

__all__ = [
    "DecodePlan", "SplitChoice", "plan_decode", "choose_splits", "decode_applies", "decode_smem_bytes",
    "DECODE_MAX_NQ", "DECODE_MIN_KV", "DECODE_ROWS", "DECODE_NUM_WARPS", "DECODE_BLOCK_N", "DECODE_CTAS_PER_SM",
    "DECODE_STAGES_MIN", "DECODE_STAGES_MAX", "DECODE_MIN_TILES_PER_SPLIT", "DECODE_MAX_SPLITS",
    "DECODE_SPLIT_EFFICIENCY", "DECODE_ONE_WAVE_FILL", "DECODE_COMBINE_WARPS", "DECODE_Q_IN_REGS_MAX", "DECODE_L2_HINT",
    "DECODE_LOADERS", "DECODE_LOADER", "DECODE_FOLD_COMBINE",
]

#: ``schedule="auto"`` runs decode when Nq <= DECODE_MAX_NQ ...
DECODE_MAX_NQ = 16
#: ... and Nk >= DECODE_MIN_KV: below, K/V is a few tiles and one CTA per head (v2) is as good.
DECODE_MIN_KV = 512
#: rows of a CTA: one m16 mma tile of (query head, query) pairs
DECODE_ROWS = 16
#: warps of the split kernel (each takes BLOCK_N / NUM_WARPS keys of a tile)
DECODE_NUM_WARPS = 4
#: keys per tile = 16 keys per warp (one k16 step of P V): a small tile keeps the ring's stages small
DECODE_BLOCK_N = 16 * DECODE_NUM_WARPS
#: resident split CTAs per SM the stage count is chosen for (two CTAs: one's merge / prologue overlaps
#: the other's streaming)
DECODE_CTAS_PER_SM = 2
DECODE_STAGES_MIN = 2
DECODE_STAGES_MAX = 4
#: a split streams at least this many tiles (else its prologue and merge dominate)
DECODE_MIN_TILES_PER_SPLIT = 4
#: at most this many splits (workspace size and combine reads grow with it)
DECODE_MAX_SPLITS = 128
#: among split counts, the fewest whose wave efficiency is within this factor of the best
DECODE_SPLIT_EFFICIENCY = 0.95
#: one CTA per SM first: the split count whose CTAs fill at least this fraction of the SMs without
#: exceeding them wins over filling every resident slot.  Measured on an H100 (2026-11-21, B=1, H=32,
#: H_kv=8, bf16, d=128, per-call times of 20-call CUDA graphs, benchmarks/decode_sweep.py --splits):
#: 32k keys: 16 splits (128 CTAs) 54.6 us vs 31 splits (248 CTAs, two per SM) 58.7 us; 128k keys: 190.4
#: vs 195.7 us, with every tile shape tried -- half the concurrent K/V streams, half the partials.
DECODE_ONE_WAVE_FILL = 0.9
#: L2 prefetch size hint (bytes) of the K/V cp.async copies (`.L2::256B`): each warp's copies cover 512
#: contiguous bytes, so whole 256-byte lines are fetched from DRAM
DECODE_L2_HINT = 256
#: warps (= output rows) per CTA of the combine kernel
DECODE_COMBINE_WARPS = 4
#: Q's A fragments stay in registers up to this head dim (D/16 * 4 registers)
DECODE_Q_IN_REGS_MAX = 128
#: K/V loaders of the ring: 16-byte cp.async from every thread, or (sm_90+) one cp.async.bulk per K / V row,
#: or (sm_90+) tensor-map copies of whole 64-column boxes (128-byte swizzle, head dims multiples of 64)
DECODE_LOADERS = ("cp_async", "bulk", "tma")
#: the TMA loader's shared-memory alignment slack and swizzle atom (bytes)
TMA_ALIGN = 1024
#: the default loader where it applies (sm_90+, head dims multiples of 64; else "cp_async").  Measured on an
#: H100 (2026-11-21, bf16, d=128, Nq=1, per-call times of 20-call CUDA graphs, decode_sweep.py --splits):
#: tma streams at 3.12 TB/s against cp.async's 2.99 at (8, 32, 32, 32k) (SDPA-cuDNN 1380.8 us: 1.00x vs
#: 0.96x), 2.95 vs 2.83 TB/s at (1, 32, 8, 128k), 52.7 vs 54.9 us at (1, 32, 8, 32k).  The bulk loader (one
#: 256-byte cp.async.bulk per K / V row) streamed at 0.66-0.77x of cp.async: per-row requests are too small.
DECODE_LOADER = "tma"
#: the default for merging the splits inside the split kernel (the last split CTA of a unit merges: one
#: launch, no combine kernel).  Measured on an H100 (same run): (1, 32, 8, 32k), 31 splits: 71.1 -> 68.5 us
#: (SDPA 63.8); (4, 32, 8, 64k), 8 splits: 383.6 -> 382.8; one-split shapes unchanged
DECODE_FOLD_COMBINE = True
#: registers besides O, Q and S fragments (addresses, row statistics, loop state): ptxas reported 181-183 at
#: D = DV = 128 and 118 at 64 (sm_80 and sm_90a, nvcc 13.0), which this bounds from above
_REG_OVERHEAD = 80


def decode_smem_bytes(head_dim: int, head_dim_v: int, block_n: int, stages: int, loader: str = "cp_async") -> int:
    """Shared memory of one split CTA (bytes), as the kernel's DecodeLayout computes it: Q, the
    stages, and with the bulk / tma loaders one 8-byte mbarrier per stage (rounded up to 16 bytes); tma:
    1024 bytes of alignment slack, Q's padded rows rounded up to 1024, unpadded (swizzled) stages."""
    bars = -(-8 * stages // 16) * 16 if loader in ("bulk", "tma") else 0
    if loader == "tma":
        q = -(-DECODE_ROWS * (head_dim + SMEM_ROW_PAD) * 2 // TMA_ALIGN) * TMA_ALIGN
        return TMA_ALIGN + q + stages * block_n * (head_dim + head_dim_v) * 2 + bars
    return (DECODE_ROWS * (head_dim + SMEM_ROW_PAD) + stages * block_n * ((head_dim + SMEM_ROW_PAD)
                                                                         + (head_dim_v + SMEM_ROW_PAD))) * 2 + bars


@dataclass(frozen=True, kw_only=True)
class DecodePlan(Plan):
    """The decode kernels' static configuration (the split count is chosen per call)."""

    stages: int
    q_in_regs: bool
    min_ctas: int
    sm_count: int  # of the planned device (the run-time split choice fills its CTA slots)
    l2_hint: int = 256  # L2 prefetch size (bytes) of the K/V cp.async copies: 0, 128 or 256 (0 with bulk)
    combine_warps: int = DECODE_COMBINE_WARPS
    #: merge the splits in the split kernel (last CTA per (b, h_kv, row block), atomic counter): one launch
    fold_combine: bool = DECODE_FOLD_COMBINE
    #: K/V ring loader: "cp_async", "bulk" (sm_90+ cp.async.bulk per row, mbarrier per stage) or "tma"
    #: (sm_90+ tensor-map copies of 64-column boxes, mbarrier per stage)
    loader: str = DECODE_LOADER

    def _config_lines(self) -> list[str]:
        if self.loader == "tma":
            ld = (f"{self.stages}-stage TMA ring ({self.stages - 1} tiles in flight; thread 0 issues tensor-map copies "
                  f"of 64-column boxes, 128-byte swizzle, one mbarrier per stage)")
        elif self.loader == "bulk":
            ld = (f"{self.stages}-stage cp.async.bulk ring ({self.stages - 1} tiles in flight; warp 0 issues one "
                  f"bulk copy per K / V row, one mbarrier per stage)")
        else:
            hint = f"L2::{self.l2_hint}B hint" if self.l2_hint else "no L2 hint"
            ld = f"{self.stages}-stage cp.async ring ({self.stages - 1} tiles in flight; 16-byte copies, {hint})"
        comb = ("combine: folded into the split kernel (the last split CTA of each (b, h_kv, row block) merges)"
                if self.fold_combine else f"combine: separate kernel, {self.combine_warps} rows per CTA")
        return super()._config_lines() + [
            f"  rows: {DECODE_ROWS} (query head, query) pairs per CTA; {self.block_n // self.num_warps} keys per "
            f"warp and tile; Q in registers: {self.q_in_regs}",
            f"  K/V loader: {self.loader}: {ld}",
            f"  {comb}",
        ]


def plan_decode(ir_or_dims: Any, target: Target | str | None = None, *, num_warps: int | None = None,
                stages: int | None = None, block_n: int | None = None, l2_hint: int | None = None,
                fold_combine: bool | None = None, loader: str | None = None) -> DecodePlan:
    """Plan the decode kernels for ``ir_or_dims`` on ``target`` (options override the choice).

    ``fold_combine`` (default :data:`DECODE_FOLD_COMBINE`): with several splits, the last split CTA of
    each unit merges the partials instead of a second (combine) launch.  ``loader`` (default
    :data:`DECODE_LOADER`): ``"cp_async"``, ``"bulk"`` or ``"tma"`` (sm_90+)."""
    dims = resolve_dims(ir_or_dims)
    t = resolve_target(target)
    D, DV = dims.head_dim, dims.head_dim_v
    reasons: list[str] = []
    for label, d in (("head_dim", D), ("head_dim_v", DV)):
        if d % 16 or d > 256:
            raise PlanError(f"decode: expected {label} a multiple of 16 and <= 256 (mma k16 steps), got {d}")
    if not t.supports_cp_async:
        raise PlanError(f"decode: expected a target with cp.async (sm_80+), got {t.name}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8):
        raise PlanError(f"decode: expected num_warps in (1, 2, 4, 8), got {num_warps!r}")
    if l2_hint is not None and l2_hint not in (0, 128, 256):
        raise PlanError(f"decode: expected l2_hint in (0, 128, 256), got {l2_hint!r}")
    if stages is not None and not DECODE_STAGES_MIN <= stages <= 6:
        raise PlanError(f"decode: expected stages in {DECODE_STAGES_MIN}..6, got {stages!r}")
    if fold_combine is not None and not isinstance(fold_combine, bool):
        raise PlanError(f"decode: expected fold_combine True or False, got {fold_combine!r}")
    if loader is not None and loader not in DECODE_LOADERS:
        raise PlanError(f"decode: expected loader in {DECODE_LOADERS}, got {loader!r}")
    ld = DECODE_LOADER if loader is None else loader
    if loader is None and ld in ("bulk", "tma") and (t.major < 9 or (ld == "tma" and (D % 64 or DV % 64))):
        ld = "cp_async"  # the default where the copy engine's loaders do not apply
    fold = DECODE_FOLD_COMBINE if fold_combine is None else fold_combine
    if ld in ("bulk", "tma"):
        if t.major < 9:
            raise PlanError(f"decode: loader {ld!r} needs sm_90+ (cp.async.bulk), got {t.name}")
        if l2_hint:
            raise PlanError(f"decode: l2_hint applies to the cp_async loader (bulk copies take no prefetch-size "
                            f"hint), got l2_hint={l2_hint!r} with loader {ld!r}")
    if ld == "tma" and (D % 64 or DV % 64):
        raise PlanError(f"decode: loader 'tma' copies 64-column boxes (128-byte swizzle): expected head dims that are "
                        f"multiples of 64, got D={D}, DV={DV}; use loader='cp_async'")
    warps = DECODE_NUM_WARPS if num_warps is None else num_warps
    if num_warps is None:  # a narrower tile where DECODE_STAGES_MIN stages of 64 keys exceed the block limit
        while warps > 1 and decode_smem_bytes(D, DV, 16 * warps, DECODE_STAGES_MIN, ld) > t.max_smem_per_block_optin:
            warps //= 2
        if warps != DECODE_NUM_WARPS:
            reasons.append(f"{DECODE_NUM_WARPS} warps x 16 keys x {DECODE_STAGES_MIN} stages exceed "
                           f"{t.max_smem_per_block_optin} B smem per block on {t.name}: {warps} warp(s)")
    if block_n is None:
        block_n = 16 * warps
        reasons.append(f"{warps} warps x 16 keys = BLOCK_N {block_n}: each warp runs one k16 step of P V per "
                       f"tile on its own keys; the {DECODE_ROWS} rows of one m16 tile are (query head, query) "
                       f"pairs of one K/V head's group, so K/V is read once per group")
    else:
        if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n <= 0 or block_n % (16 * warps):
            raise PlanError(f"decode: expected block_n a positive multiple of 16 * num_warps = {16 * warps}, "
                            f"got {block_n!r}")
        reasons.append(f"BLOCK_N {block_n} (requested): {block_n // warps} keys per warp and tile")
    q_in_regs = D <= DECODE_Q_IN_REGS_MAX
    reasons.append(f"Q in registers: {q_in_regs} (D={D} {'<=' if q_in_regs else '>'} {DECODE_Q_IN_REGS_MAX}: "
                   f"{D // 16 * 4} registers of A fragments)")

    def smem(s: int) -> int:
        return decode_smem_bytes(D, DV, block_n, s, ld)

    def fits(s: int, ctas: int) -> bool:
        return smem(s) <= t.max_smem_per_block_optin and ctas * (smem(s) + t.smem_reserved_per_block) <= t.smem_per_sm

    if stages is None:
        st = max((s for s in range(DECODE_STAGES_MIN, DECODE_STAGES_MAX + 1) if fits(s, DECODE_CTAS_PER_SM)),
                 default=None)
        if st is not None:
            reasons.append(f"stages {st}: the most in {DECODE_STAGES_MIN}..{DECODE_STAGES_MAX} with "
                           f"{DECODE_CTAS_PER_SM} CTAs/SM ({DECODE_CTAS_PER_SM} x ({smem(st)} + "
                           f"{t.smem_reserved_per_block}) B <= {t.smem_per_sm} B smem/SM): {st - 1} tiles of "
                           f"{block_n * (D + DV) * 2} B in flight per CTA (the kernel is bandwidth-bound)")
        elif fits(DECODE_STAGES_MIN, 1):
            st = DECODE_STAGES_MIN
            reasons.append(f"stages {st} at 1 CTA/SM: {DECODE_CTAS_PER_SM} CTAs of {smem(st)} B do not fit "
                           f"{t.smem_per_sm} B smem/SM")
        else:
            raise PlanError(f"decode: {smem(DECODE_STAGES_MIN)} B smem for {DECODE_STAGES_MIN} stages at "
                            f"D={D}, DV={DV} exceeds {t.max_smem_per_block_optin} B per block on {t.name}")
    else:
        st = stages
        if not fits(st, 1):
            raise PlanError(f"decode: stages={st} needs {smem(st)} B smem, got a limit of "
                            f"{t.max_smem_per_block_optin} B per block on {t.name}")
        reasons.append(f"stages {st} (requested)")
    if ld == "tma":
        reasons.append(f"loader tma{' (requested)' if loader is not None else ''}: thread 0 issues {D // 64 + DV // 64} "
                       f"tensor-map copies per tile (64-column boxes of {block_n} rows, 128-byte swizzle, rows past Nk "
                       f"zero-filled) completing on the stage's mbarrier ({block_n * (D + DV) * 2} B per phase)")
    elif ld == "bulk":
        reasons.append(f"loader bulk{' (requested)' if loader is not None else ''}: warp 0 issues {2 * block_n} "
                       f"cp.async.bulk copies per tile (one per K row of {D * 2} B and V row of {DV * 2} B) "
                       f"completing on the stage's mbarrier "
                       f"({block_n * (D + DV) * 2} B per phase; {-(-8 * st // 16) * 16} B of mbarriers); rows past "
                       f"Nk copy row Nk-1 (masked to -inf)")
    else:
        reasons.append(f"loader cp_async{' (requested)' if loader is not None else ''}: 16-byte cp.async from all "
                       f"{32 * warps} threads, one commit group per tile (rows past Nk zero-filled)")
    if fold:
        reasons.append(f"fold_combine{' (requested)' if fold_combine is not None else ''}: with more than one "
                       "split, each split CTA counts itself in by an atomic counter per (b, h_kv, row block) after "
                       "writing its partial (O, LSE); the last one merges and resets the counter: one launch, no "
                       "combine kernel")
    else:
        reasons.append(f"combine kernel{' (requested)' if fold_combine is not None else ''}: with more than one "
                       f"split a second launch merges the partials ({DECODE_COMBINE_WARPS} rows per CTA)")
    regs = DV // 8 * 4 + (D // 16 * 4 if q_in_regs else 4) + (block_n // warps) // 8 * 4 + _REG_OVERHEAD
    threads = 32 * warps
    occ = occupancy(t, smem(st), regs, threads)
    reasons.append(occ.explain(t, smem(st), regs, threads))
    return DecodePlan(
        schedule="decode", target=t.name, head_dim=D, head_dim_v=DV, dtype=dims.dtype, block_m=DECODE_ROWS,
        block_n=block_n, num_warps=warps, num_threads=threads, smem_bytes=smem(st), est_registers_per_thread=regs,
        ctas_per_sm=occ.ctas_per_sm, reasons=tuple(reasons), stages=st, q_in_regs=q_in_regs,
        min_ctas=max(1, min(occ.ctas_per_sm, DECODE_CTAS_PER_SM)), sm_count=t.sm_count,
        l2_hint=(0 if ld in ("bulk", "tma") else DECODE_L2_HINT) if l2_hint is None else l2_hint,
        fold_combine=fold, loader=ld,
    )


@dataclass(frozen=True)
class SplitChoice:
    """How one call's K/V is split: ``num_splits`` chunks of ``tiles_per_split`` BLOCK_N tiles."""

    num_splits: int
    row_blocks: int
    tiles: int
    tiles_per_split: int
    ctas: int
    slots: int
    reasons: tuple[str, ...]


@functools.lru_cache(maxsize=4096)  # per call on the launch path: a cache hit costs ~1 us, the search ~100 us
def choose_splits(plan: DecodePlan, *, B: int, H: int, H_kv: int, Nq: int, Nk: int,
                  num_splits: int | None = None) -> SplitChoice:
    """The split count for one call: enough CTAs to fill the GPU's SMs once, else its resident slots in
    whole waves.

    Work units are (batch, K/V head, row block).  A split count s gives ``units * s`` CTAs.  Candidates:
    1 .. min(DECODE_MAX_SPLITS, tiles // DECODE_MIN_TILES_PER_SPLIT).  First choice: the most CTAs that
    do not exceed the SM count, if they fill at least DECODE_ONE_WAVE_FILL of the SMs (one CTA per SM;
    the fewest splits giving that count).  Otherwise ``slots = SMs x CTAs/SM`` (the plan's device): the
    wave efficiency of s is ``(units*s / slots) / ceil(units*s / slots)`` (1: the last wave is full) and
    the fewest splits whose efficiency is within DECODE_SPLIT_EFFICIENCY of the best win (fewer splits:
    less workspace traffic and a cheaper combine).  ``num_splits`` forces a count (tests).
    """
    group = H // H_kv
    rows = group * Nq
    row_blocks = -(-rows // DECODE_ROWS)
    tiles = max(1, -(-Nk // plan.block_n))
    units = B * H_kv * row_blocks
    slots = max(1, plan.sm_count * max(1, plan.ctas_per_sm))
    reasons = [f"{units} work units (B={B} x H_kv={H_kv} x {row_blocks} row block(s) of {DECODE_ROWS} of "
               f"{group} heads x Nq={Nq}), {tiles} K/V tiles of {plan.block_n}, {slots} CTA slots "
               f"({plan.sm_count} SMs x {max(1, plan.ctas_per_sm)})"]

    def actual(s: int) -> tuple[int, int]:
        per = -(-tiles // s)
        return -(-tiles // per), per

    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
            raise PlanError(f"num_splits: expected a positive int, got {num_splits!r}")
        s, per = actual(min(num_splits, tiles, DECODE_MAX_SPLITS))
        reasons.append(f"num_splits {num_splits} requested -> {s} split(s) of {per} tile(s) "
                       f"(<= {DECODE_MAX_SPLITS} and <= the {tiles} tiles)")
    else:
        hi = max(1, min(DECODE_MAX_SPLITS, tiles // DECODE_MIN_TILES_PER_SPLIT))
        sms = max(1, plan.sm_count)
        one_wave = {units * actual(s)[0]: actual(s)[0] for s in range(hi, 0, -1) if units * actual(s)[0] <= sms}

        def eff(s: int) -> float:
            n = units * s / slots
            return n / -(-n // 1)

        ctas1 = max(one_wave, default=0)
        if ctas1 >= DECODE_ONE_WAVE_FILL * sms:
            s, per = actual(one_wave[ctas1])
            reasons.append(f"splits <= {hi} (each >= {DECODE_MIN_TILES_PER_SPLIT} tiles, <= {DECODE_MAX_SPLITS}); "
                           f"one CTA per SM: {s} split(s) of {per} tile(s) -> {ctas1} CTAs <= {sms} SMs "
                           f"(>= {DECODE_ONE_WAVE_FILL} of them; fewer concurrent K/V streams than two per SM)")
        else:
            effs = {s: eff(actual(s)[0]) for s in range(1, hi + 1)}
            best = max(effs.values())
            s0 = min(s for s, e in effs.items() if e >= DECODE_SPLIT_EFFICIENCY * best)
            s, per = actual(s0)
            reasons.append(f"splits <= {hi} (each >= {DECODE_MIN_TILES_PER_SPLIT} tiles, <= {DECODE_MAX_SPLITS}); "
                           f"best wave efficiency {best:.2f} over {slots} slots; the fewest within "
                           f"{DECODE_SPLIT_EFFICIENCY} of it: {s} split(s) of {per} tile(s) -> {units * s} CTAs, "
                           f"efficiency {effs[s0]:.2f}")
    if s == 1:
        reasons.append("one split: the split kernel writes O and LSE directly (no combine)")
    elif plan.fold_combine:
        reasons.append(f"{s} splits: partial O (fp32) and LSE to the workspace, merged by the last split CTA of each "
                       f"of the {units} units (fold_combine: one launch)")
    else:
        reasons.append(f"{s} splits: partial O (fp32) and LSE to the workspace, merged by the combine kernel")
    return SplitChoice(s, row_blocks, tiles, per, units * s, slots, tuple(reasons))


def decode_applies(ir: Any, Nq: int, Nk: int) -> tuple[bool, str]:
    """Whether ``schedule="auto"`` runs the decode kernels for this call instead of its prefill schedule
    (v2, or v3 on sm_90: :func:`attncompiler.plan.planner.choose_auto`), and why."""
    if Nq > DECODE_MAX_NQ:
        return False, f"Nq={Nq} > {DECODE_MAX_NQ}: the prefill schedule (query tiles fill the GPU)"
    if Nk < DECODE_MIN_KV:
        return False, f"Nk={Nk} < {DECODE_MIN_KV}: the prefill schedule (a short K/V gains nothing from splitting)"
    for label, d in (("head_dim", ir.head_dim), ("head_dim_v", ir.head_dim_v)):
        if d % 16 or d > 256:
            return False, f"{label}={d} is not planned by decode: the prefill schedule"
    return True, f"Nq={Nq} <= {DECODE_MAX_NQ} and Nk={Nk} >= {DECODE_MIN_KV}: decode (split-KV)"
