"""plan/band.py: the keys a plan visits under a band mask, and the narrower BLOCK_N the v3 planner takes for it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attncompiler.ir.build import build_ir
from attncompiler.plan.band import BAND_MIN_SAVING, BAND_MIN_SAVING_BM64, band_block_m_64, band_block_n, visited_keys
from attncompiler.plan.v3 import PREFERRED_BLOCK_N, plan_v3
from attncompiler.spec import presets

from _bruteforce import causal, sliding


def brute_visited(fn, bm: int, bn: int, n: int) -> int:
    """Keys of the BLOCK_N blocks from the first to the last one holding a visible key, per query block, from the
    mask's predicate alone."""
    total = 0
    for q0 in range(0, n, bm):
        cols = [kv for kv in range(n) if any(fn(0, 0, q, kv, n, n) for q in range(q0, min(q0 + bm, n)))]
        if cols:
            first, last = cols[0] // bn, cols[-1] // bn
            total += min((last + 1) * bn, n) - first * bn
    return total


@settings(max_examples=25, deadline=None)
@given(w=st.integers(0, 300), bm=st.sampled_from([64, 128, 192]), bn=st.sampled_from([16, 48, 64, 80, 128, 192]),
       n=st.integers(1, 420))
def test_visited_keys_match_brute_force_for_windows(w: int, bm: int, bn: int, n: int) -> None:
    m = sliding(w)
    assert visited_keys(m.expr, bm, bn, n) == brute_visited(m.fn, bm, bn, n)


@pytest.mark.parametrize("bn", [64, 112, 128, 192])
def test_visited_keys_causal(bn: int) -> None:
    m = causal()
    assert visited_keys(m.expr, 128, bn, 1000) == brute_visited(m.fn, 128, bn, 1000)


def test_no_mask_or_buffer_mask_has_no_count() -> None:
    assert visited_keys(None, 128, 128) is None
    doc = build_ir(presets.document(torch.zeros(64, dtype=torch.int32), 64))
    assert visited_keys(doc.mask_expr, 128, 128) is None  # buffer reads: every block is visited
    assert band_block_n(doc, 128, 192) is None


def test_window_1024_blocks() -> None:
    # BLOCK_M 128 and a window of 1024: BN 128 visits 9 blocks (1152 keys) per full query block, BN 192 six or seven
    m = sliding(1024).expr
    n = 16384
    first_rows = sum(128 * (8 - q0 // 128) for q0 in range(0, 1024, 128))  # query blocks whose window starts at 0
    assert visited_keys(m, 128, 128, n) == 9 * 128 * (n // 128) - first_rows
    assert visited_keys(m, 128, 192, n) > 1.09 * visited_keys(m, 128, 128, n)


def _plan(spec, **kw):
    return plan_v3(build_ir(spec), "sm_90", **kw)


def test_planner_takes_the_narrower_width_for_a_band() -> None:
    p = _plan(presets.sliding_window(1024, 64))
    assert PREFERRED_BLOCK_N[64] == 192 and p.block_n == 128
    line = next(r for r in p.reasons if r.startswith("BLOCK_N"))
    assert "band" in line and "was 192" in line and f"{BAND_MIN_SAVING:.0%}" in line
    assert _plan(presets.sliding_window(256, 192)).block_n == 64  # 384-key band: 64 divides it, 112 does not


@pytest.mark.parametrize("spec, bn", [
    (lambda: presets.sliding_window(1024, 128), 128),   # the preferred width already visits the fewest keys
    (lambda: presets.sliding_window(1024, 256), 80),    # BN 64 would save 4 %: under the threshold
    (lambda: presets.causal(64), 192),                  # a long loop: rounding is a fraction of a block
    (lambda: presets.prefix_lm(512, 64), 192),
    (lambda: presets.plain(64), 112),                   # no mask (three consumers' plan)
])
def test_planner_keeps_the_preferred_width(spec, bn: int) -> None:
    p = _plan(spec())
    assert p.block_n == bn
    line = next(r for r in p.reasons if r.startswith("BLOCK_N"))
    assert "band" not in line and "was " not in line


def test_forced_block_n_is_kept() -> None:
    assert _plan(presets.sliding_window(1024, 64), block_n=192).block_n == 192


@pytest.mark.parametrize("d", [64, 128])
def test_planner_takes_one_consumer_for_a_narrow_band(d: int) -> None:
    p = _plan(presets.sliding_window(256, d))
    assert (p.block_m, p.block_n, p.num_warps, p.ctas_per_sm) == (64, 64, 8, 2)
    line = next(r for r in p.reasons if r.startswith("BLOCK_M"))
    assert "band" in line and f"{BAND_MIN_SAVING_BM64:.0%}" in line and "(forced)" not in line
    # the same plan when asked for by its options
    assert plan_v3(build_ir(presets.sliding_window(256, d)), "sm_90", **p.options).options == p.options


@pytest.mark.parametrize("spec", [
    lambda: presets.sliding_window(1024, 64),   # BM 64 saves 5.6 % of the area: under the threshold
    lambda: presets.sliding_window(1024, 128),
    lambda: presets.sliding_window(256, 256),   # one consumer cannot hold d = 256 under two CTAs per SM
    lambda: presets.causal(128),
])
def test_planner_keeps_two_consumers(spec) -> None:
    assert _plan(spec()).block_m == 128


def test_forced_block_m_is_kept_for_a_narrow_band() -> None:
    assert _plan(presets.sliding_window(256, 64), block_m=128).block_m == 128
    assert _plan(presets.sliding_window(256, 64), num_warps=12).block_m == 128


def test_block_m_64_saving() -> None:
    m = sliding(256).expr
    assert band_block_m_64(m, 128, 128, 64) is not None   # 2 x 64 x 320 vs 128 x 384 keys per query block
    assert band_block_m_64(sliding(1024).expr, 128, 128, 64) is None
    assert band_block_m_64(causal().expr, 128, 128, 64) is None
    assert band_block_m_64(None, 128, 128, 64) is None
