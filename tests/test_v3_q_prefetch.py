"""The persistent grid's Q a tile ahead (plan option ``q_prefetch``): the Q tile and the O tile take turns, a producer
warp stores O and loads the next Q. The plan and its errors, the rendered kernel, its machine code (nvcc) and (GPU)
its results: the error-ratio rule, and O and LSE bit-identical to the same plan without it."""
from __future__ import annotations

import functools
import shutil

import pytest
import torch

import attncompiler as ac
from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError
from attncompiler.plan.v3 import (PRODUCER_REGS, PRODUCER_REGS_Q_PREFETCH, PRODUCER_REGS_Q_PREFETCH_MIN, plan_v3,
                                  register_pool, v3_smem_bytes)
from attncompiler.spec import presets

from _nvcc import ptx_and_reports
from _v3 import GPU_PRESETS, needs_hopper, render_v3, same_outputs, v3_gpu_spec

TMA_STORE_PTX = "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
GRID = {"persistent": True, "tma_store_o": True}


_render = render_v3


def test_plan_q_prefetch(monkeypatch):
    """Forced on: the same tiles and stages as the O tile's plan, two more mbarriers (16 B), the producer's wider
    register budget, and a reason line; with Q_PREFETCH_BANDS on by default for a band on the persistent grid at
    d = 64 / 128 (not at d = 96, not with BLOCK_N < BLOCK_M), off without a mask; the options reproduce the plan."""
    from attncompiler.plan import v3_grid

    ir = build_ir(presets.sliding_window(1024, 128))
    base = plan_v3(ir, "sm_90", q_prefetch=False)
    assert base.persistent and base.tma_store_o and not base.q_prefetch
    assert plan_v3(ir, "sm_90").q_prefetch == v3_grid.Q_PREFETCH_BANDS
    monkeypatch.setattr(v3_grid, "Q_PREFETCH_BANDS", True)
    default = plan_v3(ir, "sm_90")
    assert default.q_prefetch and any(r.startswith("Q a tile ahead (q_prefetch): a band mask") for r in default.reasons)
    assert plan_v3(build_ir(presets.sliding_window(1024, 64)), "sm_90").q_prefetch
    assert not plan_v3(build_ir(presets.sliding_window(1024, 96)), "sm_90").q_prefetch
    narrow = plan_v3(build_ir(presets.sliding_window(1024, 160)), "sm_90")
    assert narrow.block_n < narrow.block_m and narrow.tma_store_o and not narrow.q_prefetch
    assert default.options == plan_v3(ir, "sm_90", q_prefetch=True).options
    assert default.smem_bytes == base.smem_bytes + 16
    plain = plan_v3(build_ir(presets.plain(128)), "sm_90")
    assert plain.tma_store_o and not plain.q_prefetch
    p = plan_v3(ir, "sm_90", q_prefetch=True)
    assert p.q_prefetch and (p.block_n, p.stages, p.block_m) == (base.block_n, base.stages, base.block_m)
    assert p.smem_bytes == base.smem_bytes + 16 == v3_smem_bytes(128, p.block_n, 128, 128, p.stages, o_tile=True,
                                                                   q_prefetch=True)
    assert (base.producer_regs, p.producer_regs) == (PRODUCER_REGS, PRODUCER_REGS_Q_PREFETCH)
    assert (base.consumer_regs, p.consumer_regs) == (240, 232)  # the CTA's pool: 168 x 384 = 64512
    assert p.producer_regs * 128 + p.consumer_regs * 128 * p.consumers <= register_pool(12, 1) == 64512
    assert any("40*128 + 232*256 <= 64512, the CTA's registers" in r for r in p.reasons)
    three = plan_v3(build_ir(presets.plain(64)), "sm_90", q_prefetch=True, **GRID)  # 40 would leave them 152 < 156
    assert (three.consumers, three.producer_regs, three.consumer_regs) == (3, PRODUCER_REGS_Q_PREFETCH_MIN, 160)
    assert any(r.startswith("Q a tile ahead (q_prefetch, forced)") for r in p.reasons)
    assert plan_v3(ir, "sm_90", **p.options) == p
    assert "by a producer warp" in p.describe()
    off = plan_v3(ir, "sm_90", q_prefetch=False)
    assert not off.q_prefetch and "Q a tile ahead: off (forced)" in off.reasons


@pytest.mark.parametrize("spec", [presets.plain(64), presets.plain(128), presets.sliding_window(1024, 128),
                                  presets.causal(128), presets.softcap(30.0, 128)], ids=lambda s: s.name)
@pytest.mark.parametrize("opts", [{}, {"q_prefetch": True, **GRID}, {"block_m": 64}, {"block_m": 192},
                                  {"block_m": 192, "q_prefetch": True, **GRID}], ids=str)
def test_setmaxnreg_within_the_register_pool(spec, opts):
    """The producer's and the consumers' setmaxnreg targets fit the registers the CTA holds (more would make the
    consumers' setmaxnreg.inc wait forever: q_prefetch's first form, producer 32 beside consumers at 240, hung)."""
    try:
        p = plan_v3(build_ir(spec), "sm_90", **opts)
    except PlanError:
        pytest.skip("no such plan")
    assert p.producer_regs * 128 + p.consumer_regs * 128 * p.consumers <= register_pool(p.num_warps, p.ctas_per_sm)
    assert p.producer_regs % 8 == 0 and p.consumer_regs % 8 == 0


@pytest.mark.parametrize("opts, expected", [
    ({"persistent": False}, "expected q_prefetch with the persistent grid's TMA stores of O"),
    ({"persistent": True, "tma_store_o": False}, "expected q_prefetch with the persistent grid's TMA stores of O"),
    ({**GRID, "kv_descending": True, "score_skip": True}, "expected q_prefetch without score_skip"),
    ({"q_prefetch": 1}, "expected q_prefetch a bool, got 1"),
    ({**GRID, "block_m": 64}, "expected q_prefetch with one CTA per SM .* got 2 CTAs per SM"),
])
def test_q_prefetch_errors(opts, expected):
    spec = presets.alibi(presets.alibi_slopes(4), 128) if opts.get("score_skip") else presets.plain(128)
    with pytest.raises(PlanError, match=expected):
        plan_v3(build_ir(spec), "sm_90", **{"q_prefetch": True, **opts})


def test_q_prefetch_needs_one_tile_width():
    spec = ac.AttentionSpec(head_dim=128, head_dim_v=64)
    with pytest.raises(PlanError, match="Q and O tiles of one width.*D padded to 128 and DV to 64"):
        plan_v3(build_ir(spec), "sm_90", q_prefetch=True, **GRID)


def test_q_prefetch_turns_off_the_default_score_skip():
    spec = presets.alibi(presets.alibi_slopes(4), 128)
    p = plan_v3(build_ir(spec), "sm_90", q_prefetch=True, kv_descending=True, **GRID)
    assert p.q_prefetch and not p.score_skip
    assert any("score skip: off (q_prefetch" in r for r in p.reasons)


def test_render_q_prefetch():
    src = _render(presets.plain(128), q_prefetch=True).source
    assert "static constexpr bool Q_PREFETCH = true;" in src
    assert "static constexpr int PRODUCER_REGS = 40;" in src
    assert "static constexpr bool Q_PREFETCH = false;" in _render(presets.plain(128)).source


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_nvcc_q_prefetch(head_dim):
    """Plain, softcap, causal, sliding window and dropout compile for sm_90a with the producer warp's TMA stores
    and Q copies, without serialized wgmmas and without spills (the producer's 40 registers; at 32 the window at
    d = 64 spilled in the producer's K/V loop). With tile_list as well (the default for masks on this grid) causal
    dropout at d = 64 (BLOCK_N 176) spills 8 B: known, q_prefetch is not its default."""
    specs = {"plain": presets.plain(head_dim), "softcap": presets.softcap(30.0, head_dim),
             "causal": presets.causal(head_dim), "sliding_window": presets.sliding_window(1024, head_dim),
             "dropout": ac.AttentionSpec(head_dim=head_dim, dropout_p=0.1, causal=True, name="dropout")}
    jobs = {name: _render(spec, q_prefetch=True, **GRID).source for name, spec in specs.items()}
    ptx, reps = ptx_and_reports(jobs)
    for name, rep in reps.items():
        assert TMA_STORE_PTX in ptx[name], name
        assert "cp.async.bulk.wait_group.read 0" in ptx[name] and "cp.async.bulk.wait_group 0" in ptx[name], name
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        if not (name == "dropout" and head_dim == 64):
            assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
        else:
            assert rep.spill_stores <= 8, f"{name}: spills\n{rep.log}"


# ---------------------------------------------------------------------------------------------------------------
# GPU

_spec = functools.partial(v3_gpu_spec, seqlen=1023, heads=12)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("name", GPU_PRESETS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_q_prefetch(name, head_dim):
    """Several tiles per CTA (4 x 12 x 8 query blocks > the SMs): the error-ratio rule, and O and LSE bit-identical
    to the O tile's plan without the option (each tile's arithmetic is the same; only the buffers differ)."""
    from attncompiler.testing import check_kernel

    spec = _spec(name, head_dim)
    opts = {**GRID, "score_skip": False} if name == "alibi_causal" else GRID
    kern = ac.compile(spec, "v3", q_prefetch=True, **opts)
    assert kern.plan.q_prefetch
    res = check_kernel(kern, 4, 12, 1023)
    assert res.ok, f"{name} d={head_dim}: {res}"
    if name != "dropout":  # (dropout: the same mask either way, but check_kernel already covers it)
        # the same plan without it (not the model's plan for these options: a narrow band takes 64-row tiles on two
        # CTAs per SM, which q_prefetch refuses)
        off = ac.compile(spec, "v3", **{**kern.plan.options, "q_prefetch": False})
        assert (off.plan.block_m, off.plan.block_n) == (kern.plan.block_m, kern.plan.block_n)
        assert same_outputs(kern, off, 4, 12, 1023, head_dim, seed=head_dim), name


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("window, head_dim", [(1024, 160), (256, 192), (1024, 96)])
def test_gpu_q_prefetch_other_head_dims(window, head_dim):
    """Forced where it is not the default: key tiles narrower than the query tile (d = 160 / 192, BLOCK_N 80 / 64:
    each consumer warpgroup walks its own rows' blocks and takes empty GEMM turns for the others) and d = 96; the
    error-ratio rule over several tiles per CTA, O and LSE bit-identical to the same plan without the option."""
    from attncompiler.testing import check_kernel

    spec = presets.sliding_window(window, head_dim)
    kern = ac.compile(spec, "v3", q_prefetch=True, **GRID)
    assert kern.plan.q_prefetch and (head_dim == 96 or kern.plan.block_n < kern.plan.block_m)
    res = check_kernel(kern, 4, 12, 1023)
    assert res.ok, f"window {window} d={head_dim}: {res}"
    off = ac.compile(spec, "v3", **{**kern.plan.options, "q_prefetch": False})
    assert same_outputs(kern, off, 4, 12, 1023, head_dim, seed=head_dim)


@pytest.mark.gpu
@needs_hopper
def test_gpu_q_prefetch_shapes():
    """Fewer tiles than CTAs (one tile each: no Q a tile ahead), exactly two per CTA, an odd count, fp16, GQA with
    cross lengths, (B, N, H, d) storage, rows past Nq in a tile's second warpgroup, and tiles without keys between
    tiles with keys (their O is 0, LSE -inf)."""
    from attncompiler.testing import check_kernel

    plain = ac.compile(presets.plain(128), "v3", q_prefetch=True, **GRID)
    for B, H, N in ((1, 2, 113), (2, 132, 128), (3, 89, 200), (1, 16, 4096)):
        res = check_kernel(plain, B, H, N)
        assert res.ok, f"plain B={B} H={H} N={N}: {res}"
    res = check_kernel(ac.compile(_spec("sliding_window", 128, "fp16"), "v3", q_prefetch=True, **GRID), 2, 12, 1023)
    assert res.ok, f"fp16: {res}"
    causal = ac.compile(presets.causal(128), "v3", q_prefetch=True, **GRID)
    for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
        res = check_kernel(causal, 4, 6, nq, nk, H_kv=hkv)
        assert res.ok, f"GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"
    res = check_kernel(causal, 4, 6, 1023, layout="bnhd")
    assert res.ok, f"bnhd: {res}"

    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 700) & (kv_idx <= q_idx)

    holes = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", q_prefetch=True, **GRID)
    for n in (1023, 4096):
        res = check_kernel(holes, 4, 8, n)
        assert res.ok, f"tiles without keys N={n}: {res}"
    q, k, v = (torch.randn(4, 8, 1023, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = holes(q, k, v, return_lse=True)
    assert not torch.isnan(o).any() and (o[:, :, :700] == 0).all() and torch.isinf(lse[:, :, :700]).all()
    off = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", **GRID)
    assert same_outputs(holes, off, 4, 8, 4096, 128, 7)


def test_autotuner_tries_q_prefetch():
    """Where the model's plan has the O tile, the autotuner's candidates include it with the next Q a tile ahead
    (the same tile and stages); where it has none (causal: one CTA per tile), none with it."""
    from attncompiler.plan.v3_candidates import candidates_v3

    ir = build_ir(presets.plain(128))
    base = plan_v3(ir, "sm_90")
    ahead = [o for o in candidates_v3(ir, "sm_90") if o["q_prefetch"]]
    assert len(ahead) == 1 and {k: v for k, v in ahead[0].items() if k != "q_prefetch"} == {
        k: v for k, v in base.options.items() if k != "q_prefetch"}
    assert not any(o["q_prefetch"] for o in candidates_v3(build_ir(presets.causal(128)), "sm_90"))
    band = build_ir(presets.sliding_window(1024, 128))  # on by default there: the candidate without it
    assert {**plan_v3(band, "sm_90").options, "q_prefetch": False} in candidates_v3(band, "sm_90")
