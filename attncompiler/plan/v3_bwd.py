"""v3 backward planning: the Hopper dK/dV/dQ kernel (``templates/include/attncompiler/v3_bwd.cuh``).

Facts of the kernel as module constants:

* A CTA is one producer warpgroup (TMA copies) and ``consumers`` consumer warpgroups of 64 keys each
  (wgmma's M), so BLOCK_N = 64 * consumers keys per CTA; every step takes BLOCK_M = 64 query rows (the
  N of S^T / dP^T, the K of dV / dK, the M of dQ, one 128-byte row of the dS^T tile).
* Head dims are multiples of 16 (wgmma's k16 steps and n) and at most 128: each consumer thread keeps D/2 +
  DV/2 fp32 of dK and dV in registers for the whole walk.  Above 128 (multiples of 64 up to 256) both consumers
  own the CTA's same 64 keys: by default split by role (``dkv_roles``, ``plan/v3_bwd_roles.py``: every product once),
  else -- where that kernel does not fit (256 x 256), or when forced -- ``dkv_split``: split dK / dV by columns
  (D/4 + DV/4 fp32 each; D and DV rounded up to multiples of 128 so that each half is whole boxes: MLA's D = 192
  runs as 256, whose last box TMA fills with zeros and whose columns past D are computed and never stored);
  each computes S^T, dP^T and dS^T whole (7 GEMM units a step where 5 are needed) into its own dS^T tile, and
  takes its half of dQ's columns from it, so the warpgroups never wait for each other.  A row of Q, K, V or dO is
  ceil(d/64) 64-column TMA boxes (128 bytes, the 128-byte swizzle's row), zero-filled past d (d = 96 takes
  d = 128's shared memory).
* Registers per consumer thread: dK + dV, then either S^T + dP^T (32 + 32 fp32 while the elementwise
  code runs) or the P^T / dS^T fragments (2 * 16 registers) + the dQ accumulator (DQ_N/2 fp32), plus
  :data:`REG_OVERHEAD`; it must fit :data:`CONSUMER_REGS` (setmaxnreg; 24 for the producer).
* Shared memory: K and V of the CTA, ``stages`` x (Q, dO) tiles, two dS^T tiles (BLOCK_N x 64, double
  buffered, or one per warpgroup with ``dkv_split``), ``stages`` x (lse2, dsum) rows, each consumer warp's staged
  dQ rows (16 x (chunk + pad) fp32: ``dq_pad`` 4 spreads the rows over the banks, 0 swizzles them instead, where
  shared memory is short), mbarriers, and 1024 bytes of alignment slack.
* dQ: ``dq_split_n`` -- warpgroup w multiplies dS (all BLOCK_N keys) by its D/consumers columns of K (at
  D = 64: 32 columns, an MN-major B operand starting inside the 128-byte swizzled row; only where those
  columns are whole boxes or a part of one: D = 32, 64, 128)
  (one fp32 red per dQ element per CTA step); otherwise each warpgroup its own 64 keys by all D columns
  (``consumers`` reds per element).  Each warp stages its 16-row dQ chunk in shared memory and, by default
  (``dq_red`` 2), adds it with one bulk reduction into an fp32 accumulator tiled by 16 rows and dQ chunk;
  ``dq_red`` 1 adds it by 16-byte reds into the row-major accumulator the v2 backward's atomic mode uses.
  ``deterministic``: the CTAs adding into one query block take turns in the order of their key blocks
  (a counter per (b, h, query block), acquire / release), so dQ's fp32 sums are the same on every run; the
  warpgroups then add disjoint columns (dQ split by columns, or one consumer warpgroup) and the walk visits
  the query blocks in one fixed, descending order.

Pure Python: every rejection names the limit and the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .model import Plan, PlanError, resolve_dims, resolve_target
from .targets import Target
from .v2_bwd import PRE_ROWS, PRE_WARPS

__all__ = ["V3BwdPlan", "plan_v3_bwd", "v3_bwd_smem_bytes", "dq_chunk", "dq_chunks", "v3_bwd_register_estimate",
           "v3_bwd_refusal", "split_width", "dq_columns",
           "v3_bwd_auto_refusal", "AUTO_MIN_HEAD_DIM", "BLOCK_M", "CONSUMER_REGS", "PRODUCER_REGS", "REG_OVERHEAD",
           "STAGES", "V3_BWD_OPTIONS", "DQ_TILE_ROWS"]

BLOCK_M = 64           # query rows per step (see the module docstring)
WGMMA_M = 64           # keys per consumer warpgroup
BOX_COLS = 64          # 64 x 2 bytes: one TMA box row of the 128-byte swizzle
DQ_CHUNKS = (64, 32, 16)  # dQ columns per wgmma: the largest dividing the warpgroup's columns (no chunk
                          # straddles a 64-column box of K); one accumulator of chunk/2 fp32 live at a time
MAX_HEAD_DIM = 128     # dK and dV of a warpgroup's 64 keys stay in its registers
SPLIT_HEAD_DIM_STEP = 64   # dkv_split: head dims of whole 64-column boxes (TMA zero-fills the boxes past D)
SPLIT_WIDTH_STEP = 128     # dkv_split: the kernel's D and DV round up to this, so each warpgroup's dK / dV columns
                           # (half of it) are whole boxes; at D = 192 warpgroup 1 takes 128..255, of which 192..255
                           # are zero columns whose dK / dQ the kernel computes and never stores
MAX_HEAD_DIM_SPLIT = 256   # dkv_split: D/4 + DV/4 <= 128 fp32 of dK and dV per thread
MIN_HEAD_DIM_SPLIT = 128   # dkv_split: every warpgroup's half holds real columns (its first dQ chunk is inside D)
DQ_PADS = (4, 0)       # fp32 of padding per staged dQ row, preferred first (0: swizzled rows, dq_red 2 only)
HEAD_DIM_STEP = 16     # wgmma k16 steps (S^T, dP^T) and n multiples (dV, dK, dQ chunks)
AUTO_MIN_HEAD_DIM = 48  # schedule "auto" takes v3 from here (below, its n16 / n32 dQ chunks and tiny GEMMs lose)
AUTO_MIN_HEAD_DIM_WHY = ("H200, 2026-11-27, N = 16k backward TFLOP/s v3 / v2: d16 156 / 191, d32 252 / 273, "
                         "d32 causal 188 / 232; d48 268 / 224, d80 289 / 231, d96 343 / 256, d112 307 / 231")
AUTO_DKV_ROLES = True  # above D = 128 the consumers split by role by default (dkv_split where it does not fit):
                       # every product once
AUTO_DKV_ROLES_WHY = ("H200, 2026-12-01, N = 16k backward TFLOP/s dkv_roles / dkv_split / cuDNN: 192 x 128 369.5 / "
                      "282.7 / 297.2, causal 360.4 / 266.2 / 464.1, 192 x 192 417.8 / 284.3 / 306.3, 256 x 128 359.5 / "
                      "309.7; deterministic 192 x 128 227.6 / 210.0, causal 174.8 / 144.1")
AUTO_DKV_SPLIT = True  # schedule "auto" takes the dkv_split kernel above D = 128
AUTO_DKV_SPLIT_WHY = ("H200, 2026-11-28, N = 16k backward TFLOP/s v3 (dkv_split) / v2 / cuDNN: d256 327.6 / 192.1 / "
                      "357.9, causal 280.8 / 178.9 / 375.3")
CONSUMERS = (2, 1)     # consumer warpgroups, preferred first
STAGES = (4, 3, 2)     # Q / dO stages, preferred first: the most that fit (H200, 2026-11-28, 4 rounds, backward
                       # TFLOP/s for 2 / 3 / 4 stages: d64 382 / 391 / 400, d64 causal 341 / 347 / 346, d96 330 / 359;
                       # d128 fits only 2)
PRODUCER_REGS = 24     # setmaxnreg.dec target of the TMA warpgroup
CONSUMER_REGS = {1: 256, 2: 240}  # setmaxnreg.inc target: 24*128 + consumers*128*regs <= 65536
REG_OVERHEAD = 40      # descriptors, indices, loop state, the lse2 / dsum values in flight
V3_BWD_OPTIONS = ("consumers", "stages", "dq_split_n", "dq_red", "dq_defer", "dkv_split", "dq_chunk", "dq_pad",
                  "dq_wide", "dkv_roles", "dq_stages")
DQ_REDS = (0, 1, 2)  # 8-byte reds from registers; staged + 16-byte reds; staged + one bulk reduction per warp
DQ_RED_WHY = {  # docs/backward.md: d128 / d128 causal / d64 backward TFLOP/s
    0: "8-byte reds from registers (432 / 390 / 285 TFLOP/s at d128 / causal / d64, H100, 2026-11-27)",
    1: "staged per warp, 16-byte reds covering whole rows (461 / 403 / 311 TFLOP/s, H100, 2026-11-27; 450 / 420 / "
       "378 on an H200, 2026-11-28)",
    2: "staged per warp, one bulk TMA reduction per warp into a tiled accumulator (the fastest: 512 / 476 / 395 "
       "TFLOP/s, H200, 2026-11-28)",
}  # plan_v3_bwd's keyword options
DQ_TILE_ROWS = 16      # dq_red 2: accumulator tiles of one warp's 16 rows (V3BwdLayout::kDqTileFloats)
SMEM_LIMIT_SM90 = 232448  # 227 KB per block (opt-in) on sm_90
ALIGN_SLACK = 1024     # the dynamic shared memory base is only 16-byte aligned; tiles need 1024


@dataclass(frozen=True, kw_only=True)
class V3BwdPlan(Plan):
    """The v3 backward plan: Plan's fields (block_m = 64 query rows per step, block_n = keys per CTA)."""

    consumers: int
    stages: int
    producer_regs: int
    consumer_regs: int
    dq_split_n: bool
    dq_red: int = 1
    dq_defer: bool = True
    deterministic: bool = False
    pre_warps: int = PRE_WARPS
    pre_rows: int = PRE_ROWS
    dq_mode: str = "atomic"
    dkv_split: bool = False
    dq_chunk: int = 64
    dq_pad: int = 4
    dq_wide: bool = False
    dkv_roles: bool = False
    dq_stages: int = 1

    def _config_lines(self) -> list[str]:
        lines = super()._config_lines()
        owners = (f"{self.consumers} consumer warpgroups sharing them, dK/dV split by columns" if self.dkv_split else
                  f"{self.consumers} consumer warpgroups sharing them by role" if self.dkv_roles else
                  f"{self.consumers} consumer warpgroups of 64")
        lines[0] = (f"  dK/dV/dQ kernel: BLOCK_N={self.block_n} keys per CTA ({owners}) x BLOCK_M={self.block_m} query "
                    f"rows per step, {self.stages} Q/dO stages; {self.num_threads} threads")
        how = "staged, bulk reductions into 16-row fp32 tiles" if self.dq_red == 2 else "fp32 reds"
        if self.dkv_roles:
            owner = "all columns by warpgroup 1, one step behind"
        elif self.dq_split_n:
            width = dq_columns(split_width(self.head_dim, self.dkv_split), self.consumers, True)
            owner = f"columns split over the warpgroups ({width} each)"
        else:
            owner = "keys split over the warpgroups (all columns)"
        lines.append(f"  dQ: {how}, {owner}" + ("; deterministic: CTAs take turns per query block in key-block order"
                                                 if self.deterministic else ""))
        return lines


def split_width(x: int, dkv_split: bool) -> int:
    """The kernel's width of a head dim (V3BwdLayout::DKP / DVP): with ``dkv_split`` rounded up to
    :data:`SPLIT_WIDTH_STEP`, so that each warpgroup's half is whole 64-column boxes; else ``x``."""
    return -(-x // SPLIT_WIDTH_STEP) * SPLIT_WIDTH_STEP if dkv_split else x


def dq_columns(d: int, consumers: int, dq_split_n: bool) -> int:
    """One warpgroup's dQ columns (V3BwdLayout::DQ_N); ``d`` is the kernel's width (:func:`split_width`)."""
    return d // consumers if dq_split_n else d


def dq_chunk(d: int, consumers: int, dq_split_n: bool) -> int:
    """dQ columns per wgmma (V3BwdLayout::DQ_CHUNK)."""
    n = dq_columns(d, consumers, dq_split_n)
    return next(c for c in DQ_CHUNKS if n % c == 0)


def dq_chunks(d: int, consumers: int, dq_split_n: bool) -> tuple[int, ...]:
    """dQ chunk widths the kernel can take, widest first: :func:`dq_chunk` and the narrower ones dividing it."""
    top = dq_chunk(d, consumers, dq_split_n)
    return tuple(c for c in DQ_CHUNKS if c <= top)


def v3_bwd_smem_bytes(d: int, dv: int, consumers: int, stages: int, dq_red: int = 1, dq_split_n: bool = True, *,
                      dkv_split: bool = False, chunk: int | None = None, pad: int = 4, dkv_roles: bool = False,
                      dq_stages: int = 1) -> int:
    """Dynamic shared memory of the v3 backward kernel (V3BwdLayout::kSmemBytes); ``chunk`` defaults to
    :func:`dq_chunk`.  ``dkv_roles``: two P^T tiles and an fp32 dP^T tile more, and ``dq_stages`` staging buffers
    for each of one warpgroup's warps."""
    bn = WGMMA_M * (1 if dkv_split or dkv_roles else consumers)
    d, dv = split_width(d, dkv_split), split_width(dv, dkv_split)
    db, dvb = -(-d // BOX_COLS), -(-dv // BOX_COLS)
    kv = bn * (db + dvb) * 128
    stage = BLOCK_M * (db + dvb) * 128
    ds = 2 * bn * 128 + (2 * bn * 128 + bn * BLOCK_M * 4 if dkv_roles else 0)
    rows = stages * 2 * BLOCK_M * 4
    bars = 8 * (1 + 2 * stages)
    chunk = dq_chunk(d, consumers, dq_split_n) if chunk is None else chunk
    staging = (dq_stages if dkv_roles else consumers) * 4 * 16 * (chunk + pad) * 4 if dq_red else 0  # 16 rows a warp
    return ALIGN_SLACK + kv + stages * stage + ds + rows + staging + bars


def v3_bwd_register_estimate(d: int, dv: int, consumers: int, dq_split_n: bool, *, dkv_split: bool = False,
                             chunk: int | None = None, dq_wide: bool = False) -> dict[str, int]:
    """Registers per consumer thread (a ranking model, not ptxas): the peak of the elementwise phase and of
    the GEMM phase on top of dK and dV."""
    d, dv = split_width(d, dkv_split), split_width(dv, dkv_split)
    kv = (d // 2 + dv // 2) // (consumers if dkv_split else 1)
    elementwise = 2 * (BLOCK_M // 2)              # S^T and dP^T, fp32
    chunk = dq_chunk(d, consumers, dq_split_n) if chunk is None else chunk
    if dq_wide:  # the whole dQ columns in one accumulator, issued after the dV / dK fragments retired
        gemm = max(2 * (BLOCK_M // 16) * 4, dq_columns(d, consumers, dq_split_n) // 2)
    else:
        gemm = 2 * (BLOCK_M // 16) * 4 + chunk // 2  # A fragments + one dQ chunk
    return {"dk_dv": kv, "elementwise": elementwise, "gemm": gemm,
            "total": kv + max(elementwise, gemm) + REG_OVERHEAD}


def v3_bwd_refusal(ir_or_dims: Any, target: Target | str | None, *, deterministic: bool = False,
                   varlen: bool = False) -> str | None:
    """Why the v3 backward cannot run this problem (the v2 backward then does), or None.  ``deterministic`` and
    ``varlen`` are taken for the callers' symmetry with :func:`v3_bwd_auto_refusal`: v3 runs both (turn-taking dQ;
    one view per sequence)."""
    t = resolve_target(target)
    if (t.major, t.minor) != (9, 0):
        return f"v3 backward needs sm_90a, got {t.name} (TMA, wgmma and setmaxnreg are Hopper-only)"
    dims = resolve_dims(ir_or_dims)
    if _needs_dkv_split(dims.head_dim, dims.head_dim_v):
        for label, x in (("D", dims.head_dim), ("DV", dims.head_dim_v)):
            if x % SPLIT_HEAD_DIM_STEP or not MIN_HEAD_DIM_SPLIT <= x <= MAX_HEAD_DIM_SPLIT:
                return (f"v3 backward: expected {label} a multiple of {HEAD_DIM_STEP} and <= {MAX_HEAD_DIM}, or (dK/dV "
                        f"split by columns over the warpgroups) a multiple of {SPLIT_HEAD_DIM_STEP} in "
                        f"[{MIN_HEAD_DIM_SPLIT}, {MAX_HEAD_DIM_SPLIT}], got D={dims.head_dim}, DV={dims.head_dim_v}")
        return None
    for label, x in (("D", dims.head_dim), ("DV", dims.head_dim_v)):
        if x % HEAD_DIM_STEP:
            return (f"v3 backward: expected {label} a multiple of {HEAD_DIM_STEP} and <= {MAX_HEAD_DIM} (wgmma k16 "
                    f"steps, dK/dV in registers), got {x}")
    return None  # packed sequences (varlen) run it too: one view per sequence, TMA rows from the sequence start


def _needs_dkv_split(d: int, dv: int) -> bool:
    """Whether dK and dV of 64 keys exceed a warpgroup's registers (then the two consumers split their columns)."""
    return max(d, dv) > MAX_HEAD_DIM


def v3_bwd_auto_refusal(ir_or_dims: Any, target: Target | str | None, *, deterministic: bool = False,
                        varlen: bool = False) -> str | None:
    """Why ``schedule="auto"`` takes the v2 backward: :func:`v3_bwd_refusal`, or a head dim below
    :data:`AUTO_MIN_HEAD_DIM`, where v3 runs (``schedule="v3"``) but was measured slower than v2."""
    why = v3_bwd_refusal(ir_or_dims, target, deterministic=deterministic, varlen=varlen)
    if why is not None:
        return why
    dims = resolve_dims(ir_or_dims)
    if _needs_dkv_split(dims.head_dim, dims.head_dim_v) and not AUTO_DKV_SPLIT:
        return (f"v3 backward at D={dims.head_dim}, DV={dims.head_dim_v} (dK/dV split by columns): "
                f"{AUTO_DKV_SPLIT_WHY}")
    if min(dims.head_dim, dims.head_dim_v) < AUTO_MIN_HEAD_DIM:
        return (f"v3 backward at D={dims.head_dim}, DV={dims.head_dim_v} (< {AUTO_MIN_HEAD_DIM}) measured slower than "
                f"v2: {AUTO_MIN_HEAD_DIM_WHY}")
    return None


def plan_v3_bwd(ir_or_dims: Any, target: Target | str | None, *, consumers: int | None = None,
                stages: int | None = None, dq_split_n: bool | None = None, dq_red: int | None = None,
                dq_defer: bool | None = None, deterministic: bool = False, varlen: bool = False,
                dkv_split: bool | None = None, dq_chunk: int | None = None, dq_pad: int | None = None,
                dq_wide: bool | None = None, dkv_roles: bool | None = None,
                dq_stages: int | None = None) -> V3BwdPlan:
    """The v3 backward plan (forced values override the search); PlanError with every rejection's reason.
    ``dq_red`` defaults to 2 (bulk reductions into a tiled accumulator, which attn_bwd_dq_out converts into dQ).
    ``dkv_split`` defaults to whether D or DV exceeds 128 and the roles kernel does not take the problem (it may be
    forced at smaller multiples of 128 too);
    ``dq_chunk`` / ``dq_pad`` to the widest chunk, then the padded rows, then the most stages that fit.
    ``dq_wide``: the warpgroup's dQ columns in one wgmma, then added chunk by chunk (default: where they span
    several chunks, without dropout; H200, 2026-11-28, backward TFLOP/s wide / chunk by chunk: d256 334.9 / 324.1,
    causal 283.3 / 283.1, d96 388.4 / 363.3).
    ``dkv_roles``: the consumers own the CTA's 64 keys by role (warpgroup 0 S^T, the elementwise step and dK;
    warpgroup 1 dP^T, dV and dQ), every product once (``plan/v3_bwd_roles.py`` :func:`plan_roles`); by default
    wherever D or DV exceeds 128 and that plan exists (:data:`AUTO_DKV_ROLES`).  ``dq_stages``: its dQ staging
    buffers per warp.
    ``varlen`` (packed sequences) is taken for the callers' symmetry: every option, and the same defaults, run
    there."""
    t = resolve_target(target)
    why_not = v3_bwd_refusal(ir_or_dims, t)
    if why_not is not None:
        raise PlanError(why_not)
    dims = resolve_dims(ir_or_dims)
    d, dv = dims.head_dim, dims.head_dim_v
    if consumers is not None and consumers not in CONSUMERS:
        raise PlanError(f"v3 backward: expected consumers in {CONSUMERS}, got {consumers!r}")
    if dq_red is None:
        dq_red = 2
    if dq_red not in DQ_REDS:
        raise PlanError(f"v3 backward: expected dq_red in {DQ_REDS}, got {dq_red!r}")
    if stages is not None and stages not in STAGES:
        raise PlanError(f"v3 backward: expected stages in {STAGES}, got {stages!r}")
    needs_split = _needs_dkv_split(d, dv)
    if dkv_roles or (dkv_roles is None and needs_split and AUTO_DKV_ROLES and not dkv_split):
        from .v3_bwd_roles import plan_roles  # (that module imports this one)

        try:
            return plan_roles(t, dims, stages=stages, deterministic=deterministic, forced={
                "consumers": (consumers, 2), "dq_split_n": (dq_split_n, False), "dq_red": (dq_red, 2),
                "dq_defer": (dq_defer, False), "dkv_split": (dkv_split, False), "dq_chunk": (dq_chunk, 64)},
                dq_pad=dq_pad, dq_wide=dq_wide, dq_stages=dq_stages)
        except PlanError:
            if dkv_roles:
                raise
            # (by default: the column split where the roles kernel does not fit, e.g. 256 x 256's shared memory,
            # or where the caller forced one of its options)
    if dq_stages not in (None, 1):
        raise PlanError(f"v3 backward: dq_stages={dq_stages!r} needs dkv_roles (one staging buffer per warp "
                        f"otherwise)")
    if dkv_split is None:
        dkv_split = needs_split
    if dkv_split and any(x % SPLIT_HEAD_DIM_STEP or x < MIN_HEAD_DIM_SPLIT for x in (d, dv)):
        raise PlanError(f"v3 backward: dkv_split expected D and DV multiples of {SPLIT_HEAD_DIM_STEP} (whole 64-column "
                        f"boxes), at least {MIN_HEAD_DIM_SPLIT}, got D={d}, DV={dv}")
    if needs_split and not dkv_split:
        raise PlanError(f"v3 backward: D={d}, DV={dv} needs dkv_split (dK + dV of 64 keys exceed one warpgroup's "
                        f"registers above {MAX_HEAD_DIM})")
    if dq_defer is None:
        dq_defer = not dkv_split
    dw = split_width(d, dkv_split)  # the kernel's D: dQ and dK columns split over the warpgroups
    # dq_wide by default where a warpgroup's dQ spans several chunks, except with dropout (spills more at d = 256)
    # and except where D was rounded up: chunk by chunk skips the zero columns' chunk that one wide product computes
    # (H200, 2026-12-01, backward TFLOP/s chunk by chunk / wide: 192 x 128 278.0 / 265.3, causal 263.4 / 258.7,
    # 192 x 192 282.6 / 279.2)
    wide_default = getattr(ir_or_dims, "dropout_p", 0.0) == 0.0 and dw == d
    if dkv_split and dq_defer:
        raise PlanError("v3 backward: dkv_split expected dq_defer=False (each warpgroup's dQ reads its own dS^T in the "
                        "step), got True")
    if dq_chunk is not None and dq_chunk not in DQ_CHUNKS:
        raise PlanError(f"v3 backward: expected dq_chunk in {DQ_CHUNKS}, got {dq_chunk!r}")
    if dq_pad is not None and (dq_pad not in DQ_PADS or (dq_pad == 0 and dq_red != 2)):
        raise PlanError(f"v3 backward: expected dq_pad in {DQ_PADS} (0 only with dq_red=2), got {dq_pad!r} "
                        f"with dq_red={dq_red}")
    pads = (dq_pad,) if dq_pad is not None else (DQ_PADS if dq_red == 2 else (4,))
    limit = min(SMEM_LIMIT_SM90, t.max_smem_per_block_optin)
    rejected: list[str] = []
    for nc in ((consumers,) if consumers is not None else CONSUMERS):
        if dkv_split and nc != 2:
            rejected.append(f"consumers={nc}: dkv_split splits dK/dV over 2 consumer warpgroups")
            continue
        split_options = (dq_split_n,) if dq_split_n is not None else (True, False)
        for split in split_options:
            if dkv_split and not split:
                rejected.append(f"consumers={nc}, dq_split_n=False: dkv_split takes dQ split by columns")
                continue
            if deterministic and nc > 1 and not split:
                rejected.append(f"consumers={nc}, dq_split_n=False: deterministic dQ needs the warpgroups to add "
                                f"disjoint columns")
                continue
            if split and (dw % (16 * nc) or ((dw // nc) % BOX_COLS and BOX_COLS % (dw // nc))):
                rejected.append(f"consumers={nc}, dq_split_n: D={d} does not split into {nc} column blocks that are "
                                f"multiples of 16 and whole 64-column boxes or parts of one")
                continue
            chunks = dq_chunks(dw, nc, split)
            if dq_chunk is not None:
                if dq_chunk not in chunks:
                    rejected.append(f"consumers={nc}, dq_split_n={split}: dq_chunk={dq_chunk} does not divide the "
                                    f"warpgroup's {dq_columns(dw, nc, split)} dQ columns into whole boxes")
                    continue
                chunks = (dq_chunk,)
            for chunk in chunks:
                # (a forced narrower chunk keeps one product per chunk unless dq_wide is forced too)
                wide = (bool(dq_wide) if dq_wide is not None else
                        wide_default and dq_chunk is None and dq_columns(dw, nc, split) > chunk)
                regs = v3_bwd_register_estimate(d, dv, nc, split, dkv_split=dkv_split, chunk=chunk, dq_wide=wide)
                if regs["total"] > CONSUMER_REGS[nc]:
                    rejected.append(f"consumers={nc}, dq_split_n={split}: registers ~{regs['total']} > "
                                    f"{CONSUMER_REGS[nc]} (setmaxnreg of the consumers)")
                    continue
                for pad in pads:
                    for st in ((stages,) if stages is not None else STAGES):
                        smem = v3_bwd_smem_bytes(d, dv, nc, st, dq_red, split, dkv_split=dkv_split, chunk=chunk,
                                                 pad=pad)
                        if smem > limit:
                            rejected.append(f"consumers={nc}, dq_chunk={chunk}, dq_pad={pad}, stages={st}: smem {smem} "
                                            f"B > {limit} B limit")
                            continue
                        return _plan(t, dims, nc, st, split, dq_red, bool(dq_defer), bool(deterministic),
                                     bool(dkv_split), chunk, pad, wide, regs, smem, limit, rejected)
    raise PlanError(f"no feasible v3 backward plan on {t.name} (D={d}, DV={dv}): " + "; ".join(rejected))


def _plan(t: Target, dims: Any, nc: int, st: int, split: bool, dq_red: int, dq_defer: bool, deterministic: bool,
          dkv_split: bool, chunk: int, pad: int, dq_wide: bool, regs: dict[str, int], smem: int, limit: int,
          rejected: list[str]) -> V3BwdPlan:
    """The accepted candidate with the reasons that explain it."""
    d, dv = dims.head_dim, dims.head_dim_v
    dw, dvw = split_width(d, dkv_split), split_width(dv, dkv_split)
    bn = 64 if dkv_split else 64 * nc
    padded = (f" of D, DV rounded up to {dw}, {dvw} (zero columns past D / DV, computed and never stored)"
              if (dw, dvw) != (d, dv) else "")
    reasons = (
        f"D={d}, DV={dv} ({dims.dtype}) on {t.name}: v3 backward (TMA + wgmma), smem <= {limit} B/block",
        (f"BLOCK_N = 64 keys per CTA, owned by both consumer warpgroups: dK/dV split by columns ({dw // nc} + "
         f"{dvw // nc} each{padded}: D/2 + DV/2 > 128 fp32 per thread otherwise), S^T / dP^T / dS^T computed by each "
         f"(7 GEMM units a step for 5)" if dkv_split else
         f"BLOCK_N = 64 x {nc} consumer warpgroups = {bn} keys per CTA (wgmma M = 64 keys each)")
        + f"; BLOCK_M = {BLOCK_M} query rows per step",
        f"registers ~ dK+dV {regs['dk_dv']} + max(S^T+dP^T {regs['elementwise']}, fragments+dQ "
        f"{regs['gemm']}) + overhead {REG_OVERHEAD} = {regs['total']} <= {CONSUMER_REGS[nc]}",
        f"smem = 1024 + K,V {bn}x(D+DV) + {st} stages x 64x(D+DV) (x2 B) + 2 dS^T tiles + rows"
        + (f" + staged dQ {4 * nc} warps x 16 x {chunk + pad} fp32" + (" (rows swizzled, not padded)" if pad == 0
                                                                         else "")
           if dq_red else "") + f" = {smem} B",
        "dQ " + ("split by columns: one fp32 red per element per step" if split or nc == 1 else
                 f"split by keys: {nc} fp32 reds per element per step")
        + (f", one wgmma of {dq_columns(dw, nc, split)} columns added in chunks of {chunk}" if dq_wide and
           dq_columns(dw, nc, split) > chunk else f", chunks of {chunk} columns") + f"; {DQ_RED_WHY[dq_red]}"
        + ("; deferred one step (the warpgroups wait only for each other's previous dS^T half)"
           if dq_defer else "; in the same step" + (" (each warpgroup's own dS^T)" if dkv_split else
                                                    " (the warpgroups meet at every step's dS^T)")),
        *(("deterministic: the CTAs adding into a query block take turns in key-block order (a counter "
           "per (b, h, query block), acquire / release; the walk descends the query blocks)",)
          if deterministic else ()),
        *(f"rejected {r}" for r in rejected),
    )
    return V3BwdPlan(
        schedule="v3_bwd", target=t.name, head_dim=d, head_dim_v=dv, dtype=dims.dtype, block_m=BLOCK_M,
        block_n=bn, num_warps=4 * (nc + 1), num_threads=128 * (nc + 1), smem_bytes=smem,
        est_registers_per_thread=regs["total"], ctas_per_sm=1, reasons=reasons, consumers=nc, stages=st,
        producer_regs=PRODUCER_REGS, consumer_regs=CONSUMER_REGS[nc], dq_split_n=split, dq_red=dq_red,
        dq_defer=dq_defer, deterministic=deterministic, dkv_split=dkv_split, dq_chunk=chunk, dq_pad=pad,
        dq_wide=dq_wide,
    )
