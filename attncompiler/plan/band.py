"""Key-tile width for masks whose query blocks see a narrow band of keys (sliding windows, chunks).

The forward kernels visit, for each query block ``[q0, q0 + BLOCK_M)``, the K/V blocks of width BLOCK_N (aligned
at multiples of BLOCK_N from key 0) that meet the mask's K/V range (:func:`attncompiler.ir.ranges.kv_range`).
When that range is a band of W keys, the visited keys per query block depend on how the band's two ends fall on
the BLOCK_N grid: with BLOCK_M = 128 and a window of 1024 (``0 <= q - kv <= 1024``), BLOCK_N 128 visits exactly
9 blocks (1152 keys) per query block, BLOCK_N 192 visits 6 or 7 (1280 keys on average), 11 % more tensor work
for the same visible pairs. The per-head-dim preferred width (:data:`attncompiler.plan.v3.PREFERRED_BLOCK_N`)
was measured on full and causal attention, where this rounding is a small part of a long K/V loop.

:func:`visited_keys` counts the keys a plan visits over a representative sequence length, exactly as the kernel's
walk does (per query block, ``floor(lo / BN) .. floor(hi / BN)``), from the mask's range at batch 0, head 0.
:func:`band_block_n` compares the preferred width with every narrower multiple of 16 down to
:data:`BAND_MIN_BLOCK_N` and returns the widest one that visits the fewest keys when that saves at least
:data:`BAND_MIN_SAVING` of the preferred width's keys; a mask whose range is the whole key axis (buffer reads,
no derivable bound) or a long one (causal: the rounding is one partial block of a long loop) keeps the preferred
width.

Measured on an H200 (2026-11-28, ``benchmarks/v3_sweep.py``, N = 16k, bf16, H * d = 2048, 3 interleaved rounds,
TFLOP/s over the visible pairs), sliding window 1024:
- d = 64 (BLOCK_M 128): BN 192 (the preferred; 1280 keys per query block) 277, BN 128 (1152 keys) **299**,
  BN 96 267, BN 64 251;
- d = 256: BN 80 (the preferred; 1200 keys) 496, BN 64 (1152 keys, 4 % fewer) 492.
So a saving of 4 % does not pay for the narrower tile and one of 10 % does: the threshold sits between them.
With the rule in place (same GPU and date, same method, rule's width vs the preferred one): window 1024 d = 64
299 vs 278 (BN 128 vs 192), d = 192 stays at BN 112 (466; BN 64 448); window 256 d = 64 147 vs 121 (BN 128 vs 192),
d = 192 252 vs 237 (BN 64 vs 112), d = 256 268 vs 259 (BN 64 vs 80).

The query tile's height counts the same way: a band of W keys costs a BLOCK_M-row tile about BLOCK_M x (BLOCK_M + W)
scores, so BLOCK_M 64 (one consumer warpgroup, two CTAs per SM; plan option ``block_m=64``) computes less of the score
matrix than the two-consumer 128-row tile, 16.7 % less for W = 256 and 5.6 % for W = 1024. It gives up the in-CTA
ping-pong, which costs 10-15 % on long loops, but on short ones the second CTA runs under one CTA's start and drain.
:func:`band_block_m_64` takes it where the area shrinks by at least :data:`BAND_MIN_SAVING_BM64`. Same GPU and date,
3 rounds, TFLOP/s, BM 128 (the rule's BN) vs BM 64 (BN 64): window 256 d = 64 145.9 vs **162.6**, d = 128 227.4 vs
**247.5**; window 1024 d = 64 **298.6** vs 270.1, d = 128 **443.7** vs 379.3. The 12 % threshold lies between the two
windows' savings; a window of 512 (10 %) was not measured and keeps BLOCK_M 128. d >= 192 cannot take BLOCK_M 64 (O
and S exceed the 128 registers a thread gets under two CTAs per SM), so the planner keeps 128 there.
"""
from __future__ import annotations

import functools
from typing import Any

import sympy

__all__ = ["BAND_REP_LEN", "BAND_MIN_SAVING", "BAND_MIN_BLOCK_N", "BAND_MIN_SAVING_BM64", "visited_keys",
           "visited_keys_per_block", "band_block_n", "band_block_m_64"]

BAND_REP_LEN = 16384     # the sequence length (queries and keys) the counts are taken over
BAND_MIN_SAVING = 0.08   # a narrower BLOCK_N must save this fraction of the preferred width's visited keys
BAND_MIN_BLOCK_N = 64    # narrowest width considered (BN 64 runs 12-14 % slower per key than 128 at d = 128)
_STEP = 16               # BLOCK_N is a multiple of 16 (k16 steps of P V)
# BLOCK_M 64 (one consumer warpgroup, two CTAs per SM) must compute this fraction less of the score matrix than the
# two-consumer tile: it trades the in-CTA ping-pong for a second CTA that runs under a CTA's start and drain.
BAND_MIN_SAVING_BM64 = 0.12


@functools.lru_cache(maxsize=256)
def _range(mask: sympy.Basic) -> Any:
    from ..ir.ranges import kv_range  # lazy: keeps the planner importable without the IR's range solver loaded

    return kv_range(mask)


@functools.lru_cache(maxsize=256)
def _block_ranges(mask: sympy.Basic, block_m: int, n: int) -> tuple[tuple[int, int], ...] | None:
    """The mask's K/V range ``(lo, hi)`` of every query block of ``block_m`` rows over ``n`` queries and keys (empty
    ranges left out), or None where there is no derivable range. One evaluation per query block, shared by every
    BLOCK_N the planner compares."""
    rng = _range(mask)
    if rng.is_full():
        return None
    out = []
    for q0 in range(0, n, block_m):
        try:
            lo, hi = rng.evaluate(q0, min(q0 + block_m, n) - 1, q_len=n, kv_len=n)
        except ValueError:
            return None
        if lo <= hi:
            out.append((lo, hi))
    return tuple(out)


def visited_keys_per_block(mask: sympy.Basic | None, block_m: int, block_n: int,
                           n: int = BAND_REP_LEN) -> tuple[int, ...] | None:
    """Keys the forward visits for each query block (those that see any) over ``n`` queries and ``n`` keys at
    batch 0, head 0: the BLOCK_N-aligned blocks that meet the mask's K/V range, times BLOCK_N (the last block
    clipped at ``n``). None when the mask has no derivable range (every block is visited) or the range cannot be
    evaluated."""
    if mask is None or block_m <= 0 or block_n <= 0 or n <= 0:
        return None
    ranges = _block_ranges(mask, block_m, n)
    if ranges is None:
        return None
    return tuple(min((hi // block_n + 1) * block_n, n) - (lo // block_n) * block_n for lo, hi in ranges)


def visited_keys(mask: sympy.Basic | None, block_m: int, block_n: int, n: int = BAND_REP_LEN) -> int | None:
    """Keys the forward visits over ``n`` queries and ``n`` keys at batch 0, head 0 (:func:`visited_keys_per_block`
    summed), or None."""
    per_block = visited_keys_per_block(mask, block_m, block_n, n)
    return None if per_block is None else sum(per_block)


def band_block_n(ir_or_dims: Any, block_m: int, preferred: int) -> tuple[int, str] | None:
    """``(BLOCK_N, reason)`` when a narrower width than ``preferred`` visits at least :data:`BAND_MIN_SAVING`
    fewer keys under the IR's mask (the widest such width among those visiting the fewest); else None."""
    mask = getattr(ir_or_dims, "mask_expr", None)
    if not isinstance(mask, sympy.Basic) or preferred <= BAND_MIN_BLOCK_N:
        return None
    base = visited_keys(mask, block_m, preferred)
    if not base:
        return None
    counts = {bn: visited_keys(mask, block_m, bn) for bn in range(preferred - _STEP, BAND_MIN_BLOCK_N - 1, -_STEP)}
    counts = {bn: c for bn, c in counts.items() if c is not None}
    if not counts:
        return None
    fewest = min(counts.values())
    if fewest > base * (1.0 - BAND_MIN_SAVING):
        return None
    bn = max(b for b, c in counts.items() if c == fewest)
    return bn, (f"the mask's K/V range is a band: at N = {BAND_REP_LEN} and BLOCK_M = {block_m}, BLOCK_N = {bn} visits "
                f"{fewest} K/V rows per head (summed over its query blocks) against {base} at the preferred "
                f"{preferred} ({1 - fewest / base:.1%} fewer >= BAND_MIN_SAVING {BAND_MIN_SAVING:.0%}: plan/band.py)")


def band_block_m_64(mask: sympy.Basic | None, block_m: int, block_n: int, block_n_64: int) -> str | None:
    """The reason to take BLOCK_M = 64 at ``block_n_64`` over ``block_m`` x ``block_n`` under ``mask``: the score
    matrix area the forward computes (query rows x visited keys, :func:`visited_keys`) shrinks by at least
    :data:`BAND_MIN_SAVING_BM64`; else None."""
    if not isinstance(mask, sympy.Basic):
        return None
    wide, narrow = visited_keys(mask, block_m, block_n), visited_keys(mask, 64, block_n_64)
    if not wide or not narrow:
        return None
    area, area_64 = block_m * wide, 64 * narrow
    if area_64 > area * (1.0 - BAND_MIN_SAVING_BM64):
        return None
    return (f"the mask's K/V range is a band: at N = {BAND_REP_LEN} the forward computes {area_64} scores per head "
            f"with BLOCK_M 64 x BLOCK_N {block_n_64} against {area} with {block_m} x {block_n} "
            f"({1 - area_64 / area:.1%} fewer >= BAND_MIN_SAVING_BM64 {BAND_MIN_SAVING_BM64:.0%}: plan/band.py)")
