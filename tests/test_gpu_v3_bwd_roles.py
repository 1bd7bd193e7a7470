"""GPU: the Hopper backward with its consumers split by role (``dkv_roles``, ``v3_bwd_roles.cuh``).

Warpgroup 0 computes S^T, the elementwise step and dK; warpgroup 1 dP^T, dV and dQ one step behind; dP^T and P^T /
dS^T go through shared memory.  Every preset and dropout at MLA's 192 x 128 and at the other head dims above 128 the
plan takes, by the error-ratio rule against float64, at sequence lengths that are not multiples of any block,
cross lengths (CTAs whose walk has no step), GQA, the ``bnhd`` layout, fp16 and packed sequences.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel_grads

pytestmark = pytest.mark.gpu

H = 3
PRESET_NAMES = ("plain", "causal", "sliding_window", "alibi", "softcap", "prefix_lm", "document", "dropout")
ROLE_DIMS = ((192, 128), (192, 192), (256, 128), (128, 192))


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the v3 backward needs an sm_90 GPU")


def _spec(name: str, d: int, dv: int, dtype: str = "bf16") -> ac.AttentionSpec:
    if name == "dropout":
        spec = ac.AttentionSpec(head_dim=d, dtype=dtype, dropout_p=0.2, name="dropout")
    else:
        spec = presets.get_preset(name, head_dim=d, dtype=dtype, num_heads=H, seqlen=1023)
    return dataclasses.replace(spec, head_dim_v=dv)


def _kernel(spec: ac.AttentionSpec, **backward_options):
    kern = ac.compile(spec)
    kern.backward_options = {"schedule": "v3", "dkv_roles": True, **backward_options}
    return kern


@pytest.fixture(scope="module", autouse=True)
def _precompile():
    """Every backward source these tests use, compiled in parallel processes into the disk cache."""
    if not torch.cuda.is_available():
        yield
        return
    from attncompiler.ir.build import build_ir
    from attncompiler.plan.targets import detect_target
    from attncompiler.runtime.backward import bwd_source
    from attncompiler.runtime.compiler import precompile_to_disk

    tgt = detect_target()
    jobs = []
    for name in PRESET_NAMES:
        for d, dv in ROLE_DIMS:
            ir = build_ir(_spec(name, d, dv))
            jobs.append((bwd_source(ir, tgt, options={"schedule": "v3", "dkv_roles": True}).source, tgt.nvrtc_arch))
    for name in ("causal", "document", "dropout"):
        ir = build_ir(_spec(name, 192, 128))
        jobs.append((bwd_source(ir, tgt, deterministic=True, options={"schedule": "v3", "dkv_roles": True}).source,
                     tgt.nvrtc_arch))
    precompile_to_disk(jobs, workers=min(16, os.cpu_count() or 1))
    yield


@needs_hopper
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_roles_every_preset(name):
    for d, dv in ROLE_DIMS:
        kern = _kernel(_spec(name, d, dv))
        src = kern.backward_source()
        assert "DKV_ROLES = true" in src and "DKV_SPLIT = false" in src, (d, dv)
        for nq, nk in ((113, 113), (1023, 1023), (300, 77)):
            assert (r := check_kernel_grads(kern, 2, H, nq, nk)).ok, f"{name} {d}x{dv} {nq}x{nk}: {r}"


@needs_hopper
def test_roles_cross_lengths_gqa_layout_fp16():
    kern = _kernel(_spec("causal", 192, 128))
    for nq, nk in ((113, 1023), (1023, 113), (64, 128), (1, 5000)):
        assert (r := check_kernel_grads(kern, 2, 3, nq, nk)).ok, f"{nq}x{nk}: {r}"
    # the window is aligned at the top left: keys past 113 are seen by no query, so those CTAs' walks have no step and
    # write dK = dV = 0 (warpgroup 0 zeroes dK after the loop)
    window = _kernel(_spec("sliding_window", 192, 128))
    assert (r := check_kernel_grads(window, 1, 2, 113, 3000)).ok, f"113x3000: {r}"
    assert (r := check_kernel_grads(kern, 2, 4, 300, H_kv=2, use_lse=True)).ok, str(r)
    assert (r := check_kernel_grads(kern, 1, 2, 257, layout="bnhd")).ok, str(r)
    fp16 = _kernel(_spec("causal", 192, 128, "fp16"))
    assert (r := check_kernel_grads(fp16, 1, 2, 1023)).ok, f"fp16: {r}"
    plain = _kernel(_spec("plain", 192, 128))
    assert (r := check_kernel_grads(plain, 1, 2, 4096, H_kv=1)).ok, str(r)


@needs_hopper
def test_roles_default_and_options():
    """schedule "auto" takes the roles kernel above 128, deterministic dQ too; its options run."""
    mla = _spec("causal", 192, 128)
    auto = ac.compile(mla)
    assert "DKV_ROLES = true" in auto.backward_source() and "DQ_STAGES = 3" in auto.backward_source()
    assert "DKV_ROLES = true" in auto.backward_source(deterministic=True)
    assert (r := check_kernel_grads(auto, 2, H, 300, 77)).ok, f"auto: {r}"
    for opts in ({"dq_wide": False}, {"dq_stages": 1}, {"dq_stages": 2, "dq_pad": 0}, {"stages": 3, "dq_stages": 1}):
        kern = _kernel(mla, **opts)
        assert "DKV_ROLES = true" in kern.backward_source(), opts
        for nq, nk in ((113, 113), (300, 77)):
            assert (r := check_kernel_grads(kern, 2, H, nq, nk)).ok, f"{opts} {nq}x{nk}: {r}"


@needs_hopper
def test_roles_packed_sequences():
    from attncompiler.testing_varlen import check_varlen_grads

    for d, dv in ((192, 128), (256, 128)):
        kern = _kernel(_spec("causal", d, dv))
        for det in (False, True):
            res = check_varlen_grads(kern, (0, 1, 113, 1023, 7, 256), (5, 0, 200, 1023, 64, 300), H=2,
                                     deterministic=det)
            assert res.ok, f"{d}x{dv} deterministic={det}: {res}"


def _grads(kern, q, k, v, dout, **kw):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(kern(*leaves, **kw), leaves, dout)


@needs_hopper
@pytest.mark.parametrize("name", ["causal", "document", "dropout"])
def test_roles_deterministic_is_bitwise_repeatable_and_correct(name):
    """deterministic=True with the roles kernel: warpgroup 1, the only one adding dQ, takes each query block's turn
    (key-block order) before its reductions and passes it on once they completed; dq is bitwise the same on every
    run, and every gradient passes the error-ratio rule."""
    from attncompiler.testing import random_qkv

    kern = _kernel(_spec(name, 192, 128))
    src = kern.backward_source(deterministic=True)
    assert "DKV_ROLES = true" in src and "DETERMINISTIC = true" in src
    for nq, nk, hkv in ((1023, 1023, None), (300, 77, None), (113, 700, 1)):
        assert (r := check_kernel_grads(kern, 2, H, nq, nk, H_kv=hkv, deterministic=True)).ok, f"{nq}x{nk}: {r}"
    q, k, v = random_qkv(2, H, 1023, 1023, 192, 128, torch.bfloat16)
    dout = torch.randn(2, H, 1023, 128, device="cuda", dtype=torch.bfloat16)
    runs = [_grads(kern, q, k, v, dout, seed=7, deterministic=True) for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
