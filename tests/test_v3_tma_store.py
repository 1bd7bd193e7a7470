"""The v3 persistent grid's epilogue with TMA stores of O (plan option ``tma_store_o``): the plan and its errors,
the rendered kernel, its machine code (nvcc), the o map, the output fallback, and (GPU) its results."""
from __future__ import annotations

import shutil

import pytest
import torch

import attncompiler as ac
from attncompiler.codegen.schedule import get_schedule
from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError
from attncompiler.plan.targets import get_target
from attncompiler.plan.v3 import plan_v3, v3_smem_bytes
from attncompiler.runtime.launch import InputError
from attncompiler.spec import presets

from _nvcc import ptx_and_reports, ptx_sm90a  # shared with the other v3 nvcc tests
from _v3 import GPU_PRESETS, needs_hopper, render_v3, v3_gpu_spec

TMA_STORE_PTX = "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"


_render = render_v3


def test_plan_tma_store_o():
    """Opt-in, persistent only; the O tile counts in shared memory (d = 128: 2 stages instead of 3), the options
    reproduce the plan, the reasons say what it does, and wrong values are refused naming what was got."""
    ir = build_ir(presets.sliding_window(1024, 128))
    base = plan_v3(ir, "sm_90", persistent=True)
    assert not base.tma_store_o and base.options["tma_store_o"] is False and base.stages == 3
    p = plan_v3(ir, "sm_90", persistent=True, tma_store_o=True, q_prefetch=False)
    assert p.tma_store_o and p.options["tma_store_o"] is True and p.stages == 2 and p.block_n == 128
    assert p.smem_bytes == v3_smem_bytes(128, 128, 128, 128, 2, o_tile=True)
    assert p.smem_bytes - v3_smem_bytes(128, 128, 128, 128, 2) == 128 * 128 * 2  # BLOCK_M x DV bf16
    assert plan_v3(ir, "sm_90", **p.options) == p
    text = p.describe()
    assert "O written by TMA stores" in text and "(the O tile)" in text
    assert "rejected STAGES=3 at BLOCK_N=128" in text  # the tile costs the third stage
    with pytest.raises(PlanError, match=r"expected tma_store_o with persistent=True .*got persistent=None"):
        plan_v3(ir, "sm_90", tma_store_o=True)
    with pytest.raises(PlanError, match=r"got persistent=False"):
        plan_v3(ir, "sm_90", tma_store_o=True, persistent=False)
    with pytest.raises(PlanError, match="expected tma_store_o a bool, got 1"):
        plan_v3(ir, "sm_90", persistent=True, tma_store_o=1)
    # through the public API: an unknown value is a plan error, not a crash
    with pytest.raises(PlanError, match="expected tma_store_o with persistent=True"):
        ac.compile(presets.causal(64), "v3", target="sm_90", build=False, tma_store_o=True)


@pytest.mark.parametrize("spec, chosen, why", [
    (presets.plain(128), True, "no mask: every tile visits the same K/V blocks"),
    (presets.plain(64), True, "no mask"),
    (presets.softcap(30.0, 128), True, "no mask"),
    (presets.sliding_window(1024, 128), True, "1.03x the mean K/V rows"),
    (presets.sliding_window(1024, 64), True, "1.03x the mean K/V rows"),
    (presets.causal(128), False, "1.98x the mean K/V rows at N = 16384 (> PERSISTENT_MAX_IMBALANCE 1.1)"),
    (presets.document(presets.document_ids(1000, 3), 128), False, "no derivable K/V range"),
    (presets.plain(256), False, "would not keep BLOCK_N 80"),
])
def test_default_grid(spec, chosen, why):
    """Unless the caller chose, balanced tiles whose O tile keeps BLOCK_N take the persistent grid with TMA stores
    (plan/v3_grid.py); the reasons say which and why; ``persistent`` given keeps the caller's grid."""
    ir = build_ir(spec)
    p = plan_v3(ir, "sm_90")
    assert p.persistent == p.tma_store_o == chosen
    line = next(r for r in p.reasons if r.startswith(("the persistent grid with TMA", "one CTA per tile (plan")))
    assert why in line and line.startswith("the persistent grid" if chosen else "one CTA per tile"), line
    assert plan_v3(ir, "sm_90", **p.options) == p
    one = plan_v3(ir, "sm_90", persistent=False)
    assert not one.persistent and not one.tma_store_o and not any("plan/v3_grid.py" in r for r in one.reasons)
    if chosen:  # the stage count's reason says why it is lower
        assert any(r.startswith("STAGES = ") and "beside the O tile" in r for r in p.reasons)
    assert not plan_v3(ir, "sm_90", persistent=True).tma_store_o  # persistent alone: direct stores, as before


def test_tiles_by_head():
    """The persistent grid's tile order (plan/v3_grid.py tiles_by_head_choice): by head where the tiles are balanced
    (no mask, a band), heaviest first elsewhere (a forced persistent causal grid); forced either way, it reaches the
    kernel and the reasons; refused without the persistent grid and for anything but a bool; the autotuner tries
    the other order."""
    from attncompiler.plan.v3_candidates import candidates_v3

    for spec, by_head in ((presets.plain(128), True), (presets.sliding_window(1024, 128), True),
                          (presets.sliding_window(1024, 64), True), (presets.causal(128), False)):
        ir = build_ir(spec)
        p = plan_v3(ir, "sm_90", persistent=True)
        assert p.tiles_by_head == by_head and p.options["tiles_by_head"] == by_head
        line = next(r for r in p.reasons if r.startswith("persistent grid:"))
        assert ("of one batch*head together" if by_head else "heaviest query blocks first") in line, line
        assert f"static constexpr bool TILES_BY_HEAD = {'true' if by_head else 'false'};" in _render(
            spec, persistent=True).source
        other = plan_v3(ir, "sm_90", persistent=True, tiles_by_head=not by_head)
        assert other.tiles_by_head == (not by_head) and "(tiles_by_head: forced)" in " ".join(other.reasons)
        assert not plan_v3(ir, "sm_90", persistent=False).tiles_by_head
        if plan_v3(ir, "sm_90").persistent:
            assert {"tiles_by_head": not by_head} .items() <= next(
                o for o in candidates_v3(ir, "sm_90") if o["tiles_by_head"] != by_head).items()
    with pytest.raises(PlanError, match="expected tiles_by_head with persistent=True .*, got persistent=False"):
        plan_v3(build_ir(presets.causal(128)), "sm_90", tiles_by_head=True)
    with pytest.raises(PlanError, match="expected tiles_by_head a bool, got 1"):
        plan_v3(build_ir(presets.plain(128)), "sm_90", tiles_by_head=1)


def test_varlen_plan_drops_the_o_tile():
    """The packed-sequence kernel (one tile per CTA) takes a persistent TMA-store plan without its grid, its O tile
    and the score skip; tiles and stages stay the plan's."""
    from attncompiler.plan.v3_grid import without_persistent_grid

    tgt = get_target("sm_90")
    ir = build_ir(presets.plain(128))
    p = plan_v3(ir, tgt)
    assert p.tma_store_o
    one = without_persistent_grid(p)
    assert (one.persistent, one.tma_store_o, one.score_skip, one.tiles_by_head) == (False, False, False, False)
    assert (one.block_m, one.block_n, one.stages) == (p.block_m, p.block_n, p.stages)
    assert one.smem_bytes == v3_smem_bytes(128, p.block_n, 128, 128, p.stages)
    src = get_schedule("v3").render(ir, one, tgt, varlen=True).source
    assert "static constexpr bool TMA_STORE_O = false;" in src and f"== {one.smem_bytes}, " in src
    skip = plan_v3(build_ir(presets.alibi(presets.alibi_slopes(16), 128)), tgt)
    assert skip.score_skip and skip.tma_store_o and not without_persistent_grid(skip).score_skip


def test_render_tma_store_o():
    src = _render(presets.causal(128), persistent=True, tma_store_o=True).source
    assert "static constexpr bool TMA_STORE_O = true;" in src
    assert "const __grid_constant__ ac::V3MapsO maps" in src
    default = _render(presets.causal(128), persistent=True).source
    assert "static constexpr bool TMA_STORE_O = false;" in default
    assert "const __grid_constant__ ac::V3Maps maps" in default


def test_attn_maps_with_o(monkeypatch):
    """``with_o`` appends o's map: (B, H, Nq, DV) with o's strides and boxes of 64 rows (one warpgroup's)."""
    from attncompiler.runtime import tma
    from attncompiler.runtime.launch import AttnInputs

    seen = []

    def fake_encode(name, ptr, shape, strides, dtype, box):
        seen.append((name, ptr, shape, strides, box))
        return bytes([len(seen)]) * 128

    monkeypatch.setattr(tma, "encode_attn_map", fake_encode)
    monkeypatch.setattr(tma, "_struct_cache", {})

    class P:  # packed AttnParams: pointers and element strides
        q, k, v, o = 0x1000, 0x2000, 0x3000, 0x4000
        q_sb, q_sh, q_sn = 3 * 200 * 64, 200 * 64, 64
        k_sb, k_sh, k_sn = 300 * 64, 300 * 64, 64
        v_sb, v_sh, v_sn = 300 * 96, 300 * 96, 96
        o_sb, o_sh, o_sn = 200 * 3 * 96, 96, 3 * 96  # (B, N, H, DV) storage

    dims = AttnInputs(B=2, H=3, H_kv=1, Nq=200, Nk=300, D=64, DV=96)
    s = tma.attn_maps(P, dims, "bf16", 128, 64, with_o=True)
    assert len(bytes(s)) == 4 * 128
    assert seen[-1] == ("o", 0x4000, (2, 3, 200, 96), (P.o_sb, P.o_sh, P.o_sn), tma.O_BOX_ROWS)
    assert tma.O_BOX_ROWS == 64
    assert len(bytes(tma.attn_maps(P, dims, "bf16", 128, 64))) == 3 * 128


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_nvcc_tma_store_o(head_dim):
    """Plain, causal, sliding window and dropout compile for sm_90a (nvcc and NVRTC) with the TMA stores, the
    wait for their reads and the final wait, without spills or serialized wgmmas; the default persistent kernel
    has no TMA store."""
    specs = {"plain": presets.plain(head_dim), "causal": presets.causal(head_dim),
             "sliding_window": presets.sliding_window(256, head_dim),
             "dropout": ac.AttentionSpec(head_dim=head_dim, dropout_p=0.1, causal=True, name="dropout")}
    jobs = {name: _render(spec, persistent=True, tma_store_o=True).source for name, spec in specs.items()}
    ptx, reps = ptx_and_reports(jobs)
    for name, rep in reps.items():
        assert TMA_STORE_PTX in ptx[name], name
        assert "cp.async.bulk.wait_group.read 0" in ptx[name] and "cp.async.bulk.wait_group 0" in ptx[name], name
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
    assert TMA_STORE_PTX not in ptx_sm90a(_render(presets.causal(head_dim), persistent=True).source)


# ---------------------------------------------------------------------------------------------------------------
# GPU

_spec = v3_gpu_spec


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("name", GPU_PRESETS)
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_gpu_tma_store_o(name, head_dim):
    """Every preset at seqlens that are not multiples of a tile (the stores clip rows >= Nq) and at 4096 (CTAs
    loop over several tiles: the O tile is rewritten only after the previous tile's stores read it), by the
    error-ratio rule; and bit-identical to the persistent kernel with direct stores (same main loop)."""
    from attncompiler.testing import check_kernel

    for n in (113, 1023, 4096):
        spec = _spec(name, head_dim, seqlen=n)
        kern = ac.compile(spec, "v3", persistent=True, tma_store_o=True)
        assert kern.plan.tma_store_o
        res = check_kernel(kern, 2, 3, n)
        assert res.ok, f"{name} tma_store_o d={head_dim} N={n}: {res}"
        if name != "dropout" or n == 113:
            direct = ac.compile(spec, "v3", persistent=True)
            g = torch.Generator(device="cuda").manual_seed(n)
            q, k, v = (torch.randn(2, 3, n, head_dim, device="cuda", generator=g).bfloat16() for _ in range(3))
            a, la = kern(q, k, v, return_lse=True, seed=7)
            b, lb = direct(q, k, v, return_lse=True, seed=7)
            assert torch.equal(a, b) and torch.equal(la, lb), f"{name} d={head_dim} N={n}: differs from direct stores"


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("name", ("sliding_window", "causal", "plain"))
def test_gpu_tiles_by_head(name):
    """Both tile orders of the persistent grid with several tiles per CTA (B * H * query blocks > the SMs), at d 64 /
    128: the error-ratio rule, and O and LSE bit-identical between the orders (each tile's arithmetic is the same)."""
    from attncompiler.testing import check_kernel

    for d in (64, 128):
        spec = _spec(name, d, seqlen=1023)
        outs = []
        for by_head in (True, False):
            kern = ac.compile(spec, "v3", persistent=True, tma_store_o=True, tiles_by_head=by_head)
            assert kern.plan.tiles_by_head == by_head
            res = check_kernel(kern, 4, 12, 1023)
            assert res.ok, f"{name} d={d} tiles_by_head={by_head}: {res}"
            g = torch.Generator(device="cuda").manual_seed(d)
            q, k, v = (torch.randn(4, 12, 1023, d, device="cuda", generator=g).bfloat16() for _ in range(3))
            outs.append(kern(q, k, v, return_lse=True))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), f"{name} d={d}"


@pytest.mark.gpu
@needs_hopper
def test_gpu_tma_store_o_shapes_and_outputs():
    """fp16, d = 256, GQA with cross lengths, tiles without keys between tiles with keys, (B, N, H, d) storage, and
    an ``out=`` the copy engine cannot address (written through a contiguous copy)."""
    from attncompiler.testing import check_kernel

    res = check_kernel(ac.compile(_spec("causal", 128, "fp16"), "v3", persistent=True, tma_store_o=True), 2, 3, 1023)
    assert res.ok, f"fp16: {res}"
    res = check_kernel(ac.compile(presets.causal(256), "v3", persistent=True, tma_store_o=True), 2, 3, 1023)
    assert res.ok, f"d=256: {res}"
    kern = ac.compile(presets.causal(128), "v3", persistent=True, tma_store_o=True)
    for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
        res = check_kernel(kern, 2, 3, nq, nk, H_kv=hkv)
        assert res.ok, f"GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"
    res = check_kernel(kern, 2, 3, 1023, layout="bnhd")
    assert res.ok, f"bnhd: {res}"
    plain = ac.compile(presets.plain(128), "v3", persistent=True, tma_store_o=True)
    res = check_kernel(plain, 8, 6, 1100, H_kv=2)  # head-by-head tile order, more tiles than SMs
    assert res.ok, f"plain GQA: {res}"

    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 700) & (kv_idx <= q_idx)

    holes = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", persistent=True, tma_store_o=True)
    for n in (1023, 4096):
        res = check_kernel(holes, 2, 3, n)
        assert res.ok, f"tiles without keys N={n}: {res}"
    q, k, v = (torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = holes(q, k, v)
    assert not torch.isnan(o).any() and (o[:, :, :300] == 0).all()  # rows < 700 see nothing
    # out= as check_out accepts it (16-byte aligned rows) is written in place; one the copy engine cannot address
    # (a batch stride of 0: every batch's rows on the same memory) is refused naming the tensor, never launched
    q, k, v = (torch.randn(2, 3, 1023, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k64 = ac.compile(presets.causal(64), "v3", persistent=True, tma_store_o=True)
    big = torch.full((2, 3, 1023, 72), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[..., :64]  # 144-byte rows
    r = k64(q, k, v, out=out)
    assert r.data_ptr() == out.data_ptr()
    assert torch.equal(out, ac.compile(presets.causal(64), "v3", persistent=True)(q, k, v))
    assert torch.isnan(big[..., 64:]).all()  # the columns past the view are untouched
    shared = torch.empty(1, 3, 1023, 64, device="cuda", dtype=torch.bfloat16).expand(2, 3, 1023, 64)
    with pytest.raises(InputError, match=r"o: expected a batch stride the copy engine can address"):
        k64(q, k, v, out=shared)
