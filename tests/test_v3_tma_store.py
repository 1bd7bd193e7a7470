"""The v3 persistent grid's epilogue with TMA stores of O (plan option ``tma_store_o``): the plan and its errors,
the rendered kernel, its machine code (nvcc), the o map, the output fallback, and (GPU) its results."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import attncompiler as ac
from attncompiler.codegen.schedule import get_schedule
from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError
from attncompiler.plan.targets import get_target
from attncompiler.plan.v3 import plan_v3, v3_smem_bytes
from attncompiler.runtime.compiler import compile_with_nvcc
from attncompiler.spec import presets

TMA_STORE_PTX = "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"


def _render(spec: ac.AttentionSpec, **opts):
    tgt = get_target("sm_90")
    ir = build_ir(spec)
    sched = get_schedule("v3")
    return sched.render(ir, sched.make_plan(ir, tgt, **opts), tgt)


def test_plan_tma_store_o():
    """Opt-in, persistent only; the O tile counts in shared memory (d = 128: 2 stages instead of 3), the options
    reproduce the plan, the reasons say what it does, and wrong values are refused naming what was got."""
    ir = build_ir(presets.sliding_window(1024, 128))
    base = plan_v3(ir, "sm_90", persistent=True)
    assert not base.tma_store_o and base.options["tma_store_o"] is False and base.stages == 3
    p = plan_v3(ir, "sm_90", persistent=True, tma_store_o=True)
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


def test_output_fallback_decision():
    """An output the copy engine cannot address (odd row stride, misaligned base) is written through a contiguous
    copy; the layouts the API allocates (either storage order) are written in place."""
    from attncompiler.api import _tma_store_error

    assert not _tma_store_error(torch.empty(2, 3, 100, 64, dtype=torch.bfloat16))
    assert not _tma_store_error(torch.empty(2, 100, 3, 64, dtype=torch.bfloat16).transpose(1, 2))
    assert _tma_store_error(torch.empty(2, 3, 100, 65, dtype=torch.bfloat16)[..., :64])  # 130-byte rows
    assert _tma_store_error(torch.empty(2 * 3 * 100 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 3, 100, 64))


def _ptx(source: str) -> str:
    with tempfile.TemporaryDirectory(prefix="ac-v3-ptx-") as d:
        src, out = Path(d) / "k.cu", Path(d) / "k.ptx"
        src.write_text(source)
        subprocess.run(["nvcc", "-ptx", "-std=c++17", "-DNDEBUG", "-gencode=arch=compute_90a,code=compute_90a",
                        "-o", str(out), str(src)], check=True, capture_output=True, text=True)
        return out.read_text()


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
    with ThreadPoolExecutor(max_workers=2) as pool:
        ptx = dict(zip(jobs, pool.map(_ptx, jobs.values())))
        reps = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reps.items():
        assert TMA_STORE_PTX in ptx[name], name
        assert "cp.async.bulk.wait_group.read 0" in ptx[name] and "cp.async.bulk.wait_group 0" in ptx[name], name
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
    assert TMA_STORE_PTX not in _ptx(_render(presets.causal(head_dim), persistent=True).source)


# ---------------------------------------------------------------------------------------------------------------
# GPU

def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")
GPU_PRESETS = ("plain", "causal", "sliding_window", "document", "dropout", "alibi_causal", "softcap")


def _spec(name: str, head_dim: int, dtype: str = "bf16", seqlen: int = 1024, heads: int = 3) -> ac.AttentionSpec:
    if name == "dropout":
        return ac.AttentionSpec(head_dim=head_dim, dtype=dtype, dropout_p=0.2, name="dropout")
    if name == "alibi_causal":
        return presets.alibi(presets.alibi_slopes(heads), head_dim, dtype=dtype, causal=True)
    return presets.get_preset(name, head_dim=head_dim, dtype=dtype, num_heads=heads, seqlen=seqlen)


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
    # an out= with 130-byte rows: the kernel writes a contiguous copy, the caller's tensor gets the result
    big = torch.full((2, 3, 1023, 65), float("nan"), device="cuda", dtype=torch.bfloat16)
    spec64 = presets.causal(64)
    k64 = ac.compile(spec64, "v3", persistent=True, tma_store_o=True)
    q, k, v = (torch.randn(2, 3, 1023, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = big[..., :64]
    r = k64(q, k, v, out=out)
    assert r.data_ptr() == out.data_ptr()
    assert torch.equal(out, ac.compile(spec64, "v3", persistent=True)(q, k, v))
    assert torch.isnan(big[..., 64]).all()  # the column past the view is untouched
