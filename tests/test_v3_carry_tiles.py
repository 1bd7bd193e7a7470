"""A tile's first block in the previous tile's tail (plan option ``carry_tiles``, on top of ``q_prefetch``): the next
tile's S_0 in the turn of the last P V, its first softmax under both GEMMs, then the tile's O staged. The plan and its
errors, the rendered kernel, its machine code (nvcc) and (GPU) its results: the error-ratio rule, and O and LSE
bit-identical to the same plan without it."""
from __future__ import annotations

import functools
import shutil

import pytest
import torch

import attncompiler as ac
from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError
from attncompiler.plan.v3 import plan_v3
from attncompiler.spec import presets

from _nvcc import ptx_and_reports
from _v3 import GPU_PRESETS, needs_hopper, render_v3, v3_gpu_spec

#: the plan options carry_tiles builds on (the score skip's tile word does not travel with q_prefetch's Q copies)
AHEAD = {"persistent": True, "tma_store_o": True, "q_prefetch": True, "score_skip": False}
CARRY = {**AHEAD, "carry_tiles": True}


def test_plan_carry_tiles():
    """Forced on: the q_prefetch plan's tiles, stages, registers and shared memory, plus a reason line; off by
    default, and the options reproduce the plan."""
    ir = build_ir(presets.sliding_window(1024, 128))
    ahead = plan_v3(ir, "sm_90", **AHEAD)
    p = plan_v3(ir, "sm_90", **CARRY)
    assert p.carry_tiles and not ahead.carry_tiles and not plan_v3(ir, "sm_90").carry_tiles
    for field in ("block_m", "block_n", "stages", "smem_bytes", "producer_regs", "consumer_regs"):
        assert getattr(p, field) == getattr(ahead, field), field
    assert any(r.startswith("a tile's first block in the previous tile's tail (carry_tiles, forced)")
               for r in p.reasons)
    assert plan_v3(ir, "sm_90", **p.options) == p
    assert "a tile's first block in the previous tile's tail" in p.describe()
    off = plan_v3(ir, "sm_90", **{**AHEAD, "carry_tiles": False})
    assert not off.carry_tiles and "a tile's first block in the previous tile's tail: off (forced)" in off.reasons


@pytest.mark.parametrize("spec, opts, expected", [
    (presets.plain(128), {"carry_tiles": True}, "expected carry_tiles with q_prefetch=True .* got q_prefetch=False"),
    (presets.plain(128), {**CARRY, "carry_tiles": 1}, "expected carry_tiles a bool, got 1"),
    (presets.sliding_window(1024, 128), {**CARRY, "block_n": 64},
     "expected carry_tiles with BLOCK_N >= BLOCK_M under a mask .* got BLOCK_N 64 < BLOCK_M 128"),
    (presets.sliding_window(1024, 128), {**CARRY, "half_blocks": True}, "expected carry_tiles without half_blocks"),
    (presets.softcap(30.0, 128), {**CARRY, "q_prescale": True}, "expected carry_tiles without q_prescale"),
], ids=["no q_prefetch", "not a bool", "per-warpgroup walks", "half blocks", "q prescale"])
def test_carry_tiles_errors(spec, opts, expected):
    with pytest.raises(PlanError, match=expected):
        plan_v3(build_ir(spec), "sm_90", **opts)


def test_carry_tiles_without_a_mask_takes_narrow_blocks():
    """Without a mask every warpgroup runs every block whatever BLOCK_N: a narrow tile is allowed."""
    p = plan_v3(build_ir(presets.plain(128)), "sm_90", **CARRY, block_n=64)
    assert p.carry_tiles and p.block_n == 64


def test_render_carry_tiles():
    src = render_v3(presets.plain(128), **CARRY).source
    assert "static constexpr bool CARRY_TILES = true;" in src
    assert "static constexpr bool CARRY_TILES = false;" in render_v3(presets.plain(128), **AHEAD).source


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_nvcc_carry_tiles(head_dim):
    """Plain, softcap, causal, sliding window, ALiBi and dropout compile for sm_90a with the tail's own S and P V
    GEMMs (one S GEMM of D / 16 and one P V of BLOCK_N / 16 k16 steps more than without it), without serialized
    wgmmas; no spills but q_prefetch's own at d = 64 for the sliding window (its producer's K/V loop: known)."""
    specs = {"plain": presets.plain(head_dim), "softcap": presets.softcap(30.0, head_dim),
             "causal": presets.causal(head_dim), "sliding_window": presets.sliding_window(1024, head_dim),
             "alibi": presets.alibi(presets.alibi_slopes(8), head_dim),
             "dropout": ac.AttentionSpec(head_dim=head_dim, dropout_p=0.1, causal=True, name="dropout")}
    jobs = {}
    for name, spec in specs.items():
        jobs[name] = render_v3(spec, **CARRY).source
        jobs[name + "/ahead"] = render_v3(spec, **AHEAD).source
    ptx, reps = ptx_and_reports(jobs)
    for name in specs:
        rep = reps[name]
        assert "C7520" not in rep.log and "C7515" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        if not (name == "sliding_window" and head_dim == 64):
            assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
        n_ahead = ptx[name + "/ahead"].count("wgmma.mma_async")
        assert ptx[name].count("wgmma.mma_async") > n_ahead, name  # the tail's own GEMMs


# ---------------------------------------------------------------------------------------------------------------
# GPU

_spec = functools.partial(v3_gpu_spec, seqlen=1023, heads=12)


def _same(kern_a, kern_b, B: int, H: int, N: int, d: int, seed: int, dtype=torch.bfloat16, Nk: int | None = None,
          H_kv: int | None = None) -> bool:
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, N, d, device="cuda", generator=g).to(dtype)
    k, v = (torch.randn(B, H_kv or H, Nk or N, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    a, b = kern_a(q, k, v, return_lse=True), kern_b(q, k, v, return_lse=True)
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("name", GPU_PRESETS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_carry_tiles(name, head_dim):
    """Several tiles per CTA (4 x 12 x 8 query blocks > the SMs): the error-ratio rule, and (but dropout) O and LSE
    bit-identical to the q_prefetch plan without carrying (each tile's arithmetic is the same, in the same order)."""
    from attncompiler.testing import check_kernel

    spec = _spec(name, head_dim)
    kern = ac.compile(spec, "v3", **CARRY)
    assert kern.plan.carry_tiles
    res = check_kernel(kern, 4, 12, 1023)
    assert res.ok, f"{name} d={head_dim}: {res}"
    if name != "dropout":  # (each call draws a new dropout offset; check_kernel checks dropout against its mask)
        off = ac.compile(spec, "v3", **{**kern.plan.options, "carry_tiles": False})
        assert off.plan.q_prefetch and (off.plan.block_m, off.plan.block_n) == (kern.plan.block_m, kern.plan.block_n)
        assert _same(kern, off, 4, 12, 1023, head_dim, seed=head_dim), name


@pytest.mark.gpu
@needs_hopper
def test_gpu_carry_tiles_shapes():
    """Fewer tiles than CTAs (nothing to carry), exactly two per CTA, an odd count, a single key block per tile,
    fp16, GQA with cross lengths, (B, N, H, d) storage, three consumer warpgroups, and tiles without keys between
    tiles with keys (no carry into or out of them; their O is 0, LSE -inf)."""
    from attncompiler.testing import check_kernel

    plain = ac.compile(presets.plain(128), "v3", **CARRY)
    for B, H, N, Nk in ((1, 2, 113, None), (2, 132, 128, None), (3, 89, 200, None), (1, 16, 4096, None),
                        (2, 40, 1023, 100)):
        res = check_kernel(plain, B, H, N, Nk)
        assert res.ok, f"plain B={B} H={H} N={N} Nk={Nk}: {res}"
    assert _same(plain, ac.compile(presets.plain(128), "v3", **AHEAD), 2, 40, 1023, 128, 5, Nk=100)
    res = check_kernel(ac.compile(_spec("sliding_window", 128, "fp16"), "v3", **CARRY), 2, 12, 1023)
    assert res.ok, f"fp16: {res}"
    causal = ac.compile(presets.causal(128), "v3", **CARRY)
    for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
        res = check_kernel(causal, 4, 6, nq, nk, H_kv=hkv)
        assert res.ok, f"GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"
        assert _same(causal, ac.compile(presets.causal(128), "v3", **AHEAD), 4, 6, nq, 128, 11, Nk=nk, H_kv=hkv)
    res = check_kernel(causal, 4, 6, 1023, layout="bnhd")
    assert res.ok, f"bnhd: {res}"
    three = ac.compile(presets.plain(64), "v3", **CARRY, block_m=192)
    assert three.plan.consumers == 3
    res = check_kernel(three, 4, 12, 1023)
    assert res.ok, f"three consumers: {res}"

    def mask(b, h, q_idx, kv_idx):
        return ((q_idx < 300) | (q_idx >= 700)) & (kv_idx <= q_idx)

    holes = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", **CARRY)
    for n in (1023, 4096):
        res = check_kernel(holes, 4, 8, n)
        assert res.ok, f"tiles without keys N={n}: {res}"
    q, k, v = (torch.randn(4, 8, 1023, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = holes(q, k, v, return_lse=True)
    assert not torch.isnan(o).any() and (o[:, :, 384:640] == 0).all() and torch.isinf(lse[:, :, 384:640]).all()
    assert _same(holes, ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", **AHEAD), 4, 8, 4096, 128, 7)


def test_autotuner_tries_carry_tiles():
    """Where the model's plan has the O tile and every warpgroup runs every block, the autotuner's candidates include
    the q_prefetch plan with carried tiles (the same tile and stages)."""
    from attncompiler.plan.v3_candidates import candidates_v3

    ir = build_ir(presets.sliding_window(1024, 128))
    base = plan_v3(ir, "sm_90")
    carried = [o for o in candidates_v3(ir, "sm_90") if o["carry_tiles"]]
    assert len(carried) == 1 and carried[0]["q_prefetch"]
    assert {k: v for k, v in carried[0].items() if k not in ("q_prefetch", "carry_tiles")} == {
        k: v for k, v in base.options.items() if k not in ("q_prefetch", "carry_tiles")}
    assert not any(o["carry_tiles"] for o in candidates_v3(build_ir(presets.causal(128)), "sm_90"))
