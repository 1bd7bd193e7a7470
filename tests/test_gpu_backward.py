"""GPU: gradients (dq, dk, dv) of every preset and example against float64 autograd (error-ratio rule).

Run on a GPU machine with ``python3 -m pytest -m gpu tests/test_gpu_backward.py``.  The module
fixture compiles every kernel these tests use in parallel processes first (NVRTC into the disk
cache), so the tests themselves only load cubins.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import TransformerBlock, check_kernel_grads, random_qkv

pytestmark = pytest.mark.gpu

H = 3
B = 2
SEQLENS = (113, 1023, 4096)
ROOT = Path(__file__).parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_"))
PRESET_NAMES = ("plain", "causal", "sliding_window", "alibi", "alibi_causal", "softcap", "prefix_lm", "document",
                "dropout")
OTHER_HEAD_DIMS = (32, 96, 256)


def spec_for(name: str, head_dim: int, dtype: str, seqlen: int) -> ac.AttentionSpec:
    if name == "dropout":
        return ac.AttentionSpec(head_dim=head_dim, dtype=dtype, dropout_p=0.2, name="dropout")
    if name == "alibi_causal":
        return presets.alibi(presets.alibi_slopes(H), head_dim, dtype=dtype, causal=True)
    return presets.get_preset(name, head_dim=head_dim, dtype=dtype, num_heads=H, seqlen=seqlen)


def _example_spec(name: str, head_dim: int = 128) -> ac.AttentionSpec:
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_bwd_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_spec(head_dim=head_dim)


def _all_specs() -> list[ac.AttentionSpec]:
    out = []
    for name in PRESET_NAMES:
        for d in (64, 128):
            for dt in ("bf16", "fp16"):
                out += [spec_for(name, d, dt, n) for n in SEQLENS]
    out += [_example_spec(e) for e in EXAMPLES]
    for d in OTHER_HEAD_DIMS:
        out += [spec_for(n, d, "bf16", s) for n in ("plain", "causal", "softcap") for s in (113, 1023)]
    return out


@pytest.fixture(scope="module", autouse=True)
def _precompile():
    """Forward and backward sources of every spec here, compiled in parallel into the disk cache."""
    from attncompiler.ir.build import build_ir
    from attncompiler.plan.targets import detect_target
    from attncompiler.runtime.backward import bwd_source
    from attncompiler.runtime.compiler import precompile_to_disk

    tgt = detect_target()
    jobs = []
    for spec in _all_specs():
        ir = build_ir(spec)
        # the forward ac.compile(spec) ("auto") renders: v3 on an H100 / H200 where v3 supports the head dims
        ks = ac.compile(spec, target=tgt, build=False).kernel_source
        jobs.append((ks.source, ks.arch))
        jobs.append((bwd_source(ir, tgt).source, tgt.nvrtc_arch))
    ir = build_ir(presets.causal(128))
    jobs.append((bwd_source(ir, tgt, deterministic=True).source, tgt.nvrtc_arch))
    precompile_to_disk(jobs, workers=min(16, os.cpu_count() or 1))
    yield


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_preset_grads(name, head_dim, dtype):
    for n in SEQLENS:
        kern = ac.compile(spec_for(name, head_dim, dtype, n))
        res = check_kernel_grads(kern, B, H, n)
        assert res.ok, f"{name} {dtype} d={head_dim}: {res}"


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_grads(example):
    kern = ac.compile(_example_spec(example))
    for n in (113, 1023):
        res = check_kernel_grads(kern, 2, 4, n)
        assert res.ok, f"example {example}: {res}"


@pytest.mark.parametrize("head_dim", OTHER_HEAD_DIMS)
@pytest.mark.parametrize("name", ["plain", "causal", "softcap"])
def test_other_head_dims(name, head_dim):
    for n in (113, 1023):
        kern = ac.compile(spec_for(name, head_dim, "bf16", n))
        res = check_kernel_grads(kern, B, H, n)
        assert res.ok, f"{name} d={head_dim}: {res}"


def test_gqa_cross_lengths_layout_and_lse_grad():
    kern = ac.compile(presets.causal(128))
    assert (r := check_kernel_grads(kern, 2, 4, 300, H_kv=2)).ok, str(r)
    assert (r := check_kernel_grads(kern, 2, 3, 300, layout="bnhd")).ok, str(r)
    assert (r := check_kernel_grads(kern, 2, 3, 257, use_lse=True)).ok, str(r)
    for nq, nk in ((113, 1023), (1023, 113)):
        assert (r := check_kernel_grads(kern, 2, 3, nq, nk)).ok, str(r)


def test_deterministic_bit_identical_and_correct():
    for spec in (presets.causal(128), ac.AttentionSpec(head_dim=64, dropout_p=0.1), presets.softcap(30.0, 128)):
        kern = ac.compile(spec)
        assert (r := check_kernel_grads(kern, 2, 3, 1023, deterministic=True)).ok, f"{spec.name}: {r}"
        q, k, v = random_qkv(2, 4, 1500, 1500, spec.head_dim, spec.head_dim, torch.bfloat16)
        dout = torch.randn_like(q)
        runs = []
        for _ in range(2):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = kern(*leaves, seed=7, deterministic=True)
            runs.append(torch.autograd.grad(out, leaves, dout))
        for a, b in zip(*runs):
            assert torch.equal(a, b)


def test_fully_masked_rows_get_zero_grads():
    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 64) & (kv_idx <= q_idx)

    from attncompiler.reference import reference_attention

    kern = ac.compile(ac.AttentionSpec(head_dim=64, mask_mod=mask))
    q, k, v = random_qkv(1, 2, 200, 200, 64, 64, torch.bfloat16)
    dout = torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(reference_attention(*ref_leaves, kern.ir), ref_leaves, dout.double())
    for det in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = kern(*leaves, deterministic=det)
        grads = torch.autograd.grad(out, leaves, dout)
        for g, r in zip(grads, ref):
            assert not torch.isnan(g).any()
            torch.testing.assert_close(g.double(), r, atol=5e-2, rtol=5e-2)
        assert (grads[0][:, :, :64] == 0).all()


def test_dropout_grads_replay_forward_mask():
    kern = ac.compile(ac.AttentionSpec(head_dim=64, dropout_p=0.3, causal=True))
    for seed in (1, 2**40 + 3):
        assert (r := check_kernel_grads(kern, 2, 3, 517, seed=seed)).ok, str(r)


def test_learnable_buffer_grads():
    slopes = presets.alibi_slopes(H)
    kern = ac.compile(presets.alibi(slopes, 64, causal=True))
    assert (r := check_kernel_grads(kern, 2, H, 300, buffer_grads=("slopes",))).ok, str(r)


def test_v1_forward_uses_v2_backward():
    kern = ac.compile(presets.softcap(30.0, 64), "v1")
    assert (r := check_kernel_grads(kern, 2, 3, 300)).ok, str(r)


def test_functional_api_grads():
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 3, 200, 200, 64, 64, torch.bfloat16))
    out = ac.attention(q, k, v, causal=True)
    out.float().sum().backward()
    assert q.grad is not None and not torch.isnan(q.grad).any()


@pytest.mark.parametrize("functional", [False, True])
def test_torch_compile_fullgraph_block(functional):
    torch.manual_seed(0)
    kern = ac.compile(ac.AttentionSpec(head_dim=64, causal=True, dropout_p=0.1))
    if functional:
        def attend(q, k, v):
            return ac.attention(q, k, v, causal=True, dropout_p=0.1, seed=11)
    else:
        def attend(q, k, v):
            return kern(q, k, v, seed=11)
    blk = TransformerBlock(256, 4, attend)
    blk = blk.cuda().to(torch.bfloat16)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    comp = torch.compile(blk, fullgraph=True)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye = blk(xe)
    ye.float().square().mean().backward()
    ge = [p.grad.clone() for p in blk.parameters()]
    blk.zero_grad()
    yc = comp(xc)
    yc.float().square().mean().backward()
    gc = [p.grad.clone() for p in blk.parameters()]
    torch.testing.assert_close(yc, ye, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(xc.grad, xe.grad, atol=3e-2, rtol=3e-2)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
