"""CPU: the v3 score skip -- where the planner takes it and why (plan/v3.py), the per-call bound on |q . k|
(runtime/scoreskip.py), and the arithmetic of v3_skip_begin (v3_fwd.cuh) replayed in float64 against
brute force: every key it skips has exp2(x - m) <= 2^-136 for every row, m the lowest offset the lazy
rescale can leave (the row's largest x less kRescaleSlack)."""
from __future__ import annotations

import math

import pytest
import torch

from attncompiler.ir.build import build_ir
from attncompiler.plan import PlanError
from attncompiler.plan.v3 import SCORE_SKIP_MIN_KEYS, plan_v3
from attncompiler.runtime.scoreskip import BOUND_MARGIN, row_norms_grid, score_bound_reference
from attncompiler.spec import presets

SLOPES = torch.tensor([1.0, 0.25, 2.0**-5, 2.0**-8])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_planner_takes_the_skip_for_alibi(causal, d):
    p = plan_v3(build_ir(presets.alibi(SLOPES, d, causal=causal)), "sm_90")
    assert p.score_skip and p.kv_descending and p.options["score_skip"] is True
    text = p.describe()
    assert f"score skip: on when Nk >= {SCORE_SKIP_MIN_KEYS}" in text and "2^-136" in text
    assert plan_v3(build_ir(presets.alibi(SLOPES, d, causal=causal)), "sm_90", **p.options).options == p.options


@pytest.mark.parametrize("spec, why", [
    (presets.plain(128), "no separable score_mod with a column term linear in kv"),
    (presets.causal(128), "no separable score_mod"),
    (presets.softcap(30.0, 128), "no separable score_mod"),
    (presets.relative_bias(torch.randn(4, 33), 128), "no separable score_mod"),
])
def test_planner_explains_why_not(spec, why):
    p = plan_v3(build_ir(spec), "sm_90")
    assert not p.score_skip
    assert f"score skip: off ({why}" in p.describe()
    with pytest.raises(PlanError, match="score_skip=True needs a separable score_mod with a linear column term"):
        plan_v3(build_ir(spec), "sm_90", score_skip=True)


def test_forced_settings():
    ir = build_ir(presets.alibi(SLOPES, 128))
    p = plan_v3(ir, "sm_90", kv_descending=False)
    assert not p.score_skip and "the K/V walk is ascending" in p.describe()
    with pytest.raises(PlanError, match="got the K/V walk is ascending"):
        plan_v3(ir, "sm_90", kv_descending=False, score_skip=True)
    off = plan_v3(ir, "sm_90", score_skip=False)
    assert not off.score_skip and "score skip: off (forced)" in off.describe()
    with pytest.raises(PlanError, match="expected score_skip a bool, got 1"):
        plan_v3(ir, "sm_90", score_skip=1)


def test_rendered_kernel_carries_the_switch():
    import attncompiler as ac

    on = ac.compile(presets.alibi(SLOPES, 128), "v3", target="sm_90", build=False).kernel_source.source
    off = ac.compile(presets.plain(128), "v3", target="sm_90", build=False).kernel_source.source
    assert "static constexpr bool SCORE_SKIP = true;" in on and "static constexpr bool SCORE_SKIP = false;" in off


def _pairs_max(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """max over i, j of |q[b, h, i] . k[b, h_kv, j]| in float64, (B, H)."""
    g = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(g, dim=1)
    return (q.double() @ kk.transpose(-1, -2)).abs().amax(dim=(-2, -1))


@pytest.mark.parametrize("B, H, H_kv, Nq, Nk, d, dtype", [
    (2, 4, 4, 37, 53, 64, torch.bfloat16),
    (1, 6, 2, 64, 17, 128, torch.float16),
    (2, 2, 1, 5, 300, 32, torch.float32),
])
def test_bound_is_sound(B, H, H_kv, Nq, Nk, d, dtype):
    g = torch.Generator().manual_seed(B * 100 + H + Nq)
    q = (torch.randn(B, H, Nq, d, generator=g) * 3).to(dtype)
    k = torch.randn(B, H_kv, Nk, d, generator=g).to(dtype)
    k[:, :, 0] = q[:, 0, 0][:, None, :]  # pairs near the bound
    bound = score_bound_reference(q, k)
    assert bound.shape == (B, H) and bound.dtype == torch.float32
    assert bool((_pairs_max(q, k) <= bound.double()).all())
    qn = q.double().norm(dim=-1).amax(dim=-1)
    kn = k.double().norm(dim=-1).amax(dim=-1).repeat_interleave(H // H_kv, dim=1)
    assert torch.allclose(bound.double(), qn * kn * BOUND_MARGIN, rtol=1e-5)  # and not much looser
    # (B, N, H, d) storage viewed as (B, H, N, d): the same bound
    qt, kt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k))
    assert torch.equal(score_bound_reference(qt, kt), bound)


def test_bound_is_not_finite_where_inputs_are_not():
    q, k = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 11, 16)
    k[0, 0, 4, 1] = float("inf")
    q[0, 3, 2, 0] = float("nan")
    b = score_bound_reference(q, k)
    assert not torch.isfinite(b[0, :2]).any() and torch.isfinite(b[0, 2]) and torch.isnan(b[0, 3])


@pytest.mark.parametrize("d, group", [(16, 2), (64, 8), (80, 16), (96, 16), (128, 16), (192, 32), (256, 32)])
@pytest.mark.parametrize("Nq, Nk", [(1, 1), (255, 4097), (16384, 100), (333, 333), (5, 2**31 - 2000)])
def test_row_norms_grid_covers_every_row(d, group, Nq, Nk):
    gx, gy, gz = row_norms_grid(d, 2, 8, 2, Nq, Nk)
    rows_per_cta = 256 // group * 8  # RowNorms<D>: kThreads / kGroup rows per pass, kPasses passes
    chunks = -(-max(Nq, Nk) // rows_per_cta)
    assert (gx, gz) == (2 * 8 + 2 * 2, 1) and gy == min(chunks, 65535)  # CTAs loop over every gy-th chunk
    # one (b, h) per x, so B * H up to the launcher's 65535 (and as many k heads) fit: x goes to 2^31 - 1
    assert row_norms_grid(d, 1, 65535, 65535, 10, 10)[0] == 131070


def _skip_begin(kv_ref: int, j_begin: int, j_end: int, j_ref: int, bn: int, coef: float, slope: float,
                bound: float) -> int:
    """v3_skip_begin's arithmetic (fp32 there; float64 here, and the margin covers the difference)."""
    need = 2.0 * abs(coef) * bound + (8.0 + 136.0)
    dist = need / slope
    if not dist < 1e9:
        return j_begin
    keep = kv_ref - math.ceil(dist) + 1
    return min(max(j_begin, keep // bn), j_ref) if keep > 0 else j_begin


@pytest.mark.parametrize("seed", range(6))
def test_skipped_keys_underflow_bruteforce(seed):
    """ALiBi without a mask, the kernel's x = coef * s + slope * kv: for every row the keys below the
    returned block have x <= (the row's largest x) - 8 - 136, whatever the lazy offset did."""
    g = torch.Generator().manual_seed(seed)
    d = [16, 64, 128][seed % 3]
    Nq, Nk, bn = 50, 700 + 37 * seed, [32, 48, 64][seed % 3]
    scale = 1 / math.sqrt(d) * (1 + seed)
    q = (torch.randn(Nq, d, generator=g) * (1 + seed % 2)).to(torch.bfloat16).double()
    k = torch.randn(Nk, d, generator=g).to(torch.bfloat16).double()
    if seed % 2:  # rows aligned with the keys: |s| at the bound
        k[:] = q[0]
    s = q @ k.T
    bound = float(score_bound_reference(q.float()[None, None], k.float()[None, None])[0, 0])
    coef = math.log2(math.e) * scale
    for slope in (4.0, 1.0, 0.3, 0.05):
        x = coef * s + slope * torch.arange(Nk, dtype=torch.float64)  # + a row term that cancels in x - m
        j_end = -(-Nk // bn)
        jb = _skip_begin(Nk - 1, 0, j_end, j_end - 1, bn, coef, slope, bound)
        m_low = x.amax(dim=1, keepdim=True) - 8.0
        if jb > 0:
            assert float((x[:, : jb * bn] - m_low).max()) <= -136.0
        # and the skip is not needlessly timid: the block below the kept ones is within 2 blocks + the bound's
        # slack of the first key that could matter
        reach = (2 * coef * bound + 144) / slope
        assert jb * bn >= Nk - 1 - reach - 2 * bn or jb == 0
