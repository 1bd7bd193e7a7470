"""GPU: shapes and variants -- relative position bias (and its table's gradient), GQA / MQA,
cross-attention with bottom-right causal alignment, the LSE layout of every schedule, and head dims
32 / 96 / 192 with dv != dqk (docs/shapes.md).

Run on a GPU machine with ``python3 -m pytest -m gpu tests/test_gpu_variants.py``.  Numerical
checks use the error-ratio rule against the float64 reference (``attncompiler.testing``); a head
dim the planner refuses on this GPU must be refused with a message that says why.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

import attncompiler as ac
from attncompiler.codegen.schedule import get_schedule
from attncompiler.codegen.v2_bwd import make_bwd_plan
from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError
from attncompiler.reference import eager_attention, error_ratio_check, reference_attention
from attncompiler.spec import presets
from attncompiler.testing import check_kernel, check_kernel_grads, random_qkv

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
HEAD_DIMS = ((32, 32), (96, 96), (192, 192), (192, 128), (128, 64))
CROSS = ((64, 300), (300, 64), (1, 513), (257, 1), (100, 300), (300, 100))


def _table(heads: int, radius: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(heads, 2 * radius + 1, generator=g)


def _rel(causal: bool = False, d: int = 64) -> ac.AttentionSpec:
    return presets.relative_bias(_table(4, 16), d, causal=causal)


def _specs() -> list[ac.AttentionSpec]:
    out = [_rel(False), _rel(True), presets.plain(64), presets.causal(64)]
    out += [presets.causal(d, head_dim_v=dv) for d, dv in HEAD_DIMS]
    return out


@pytest.fixture(scope="module", autouse=True)
def _precompile():
    """Forward (v1, v2, and what "auto" picks: v3 on sm_90 where it applies) and backward sources of every
    spec here, compiled in parallel into the disk cache."""
    from attncompiler.plan.targets import detect_target
    from attncompiler.runtime.backward import bwd_source
    from attncompiler.runtime.compiler import precompile_to_disk

    tgt = detect_target()
    jobs = []
    for spec in _specs():
        ir = build_ir(spec)
        for name in ("v2", "v1"):
            sched = get_schedule(name)
            try:
                jobs.append((sched.render(ir, sched.make_plan(ir, tgt), tgt).source, tgt.nvrtc_arch))
            except PlanError:
                pass  # the head-dim test asserts the refusal
        try:  # ac.compile(spec) ("auto"): its plan carries the choice's reason, so its own source
            ks = ac.compile(spec, target=tgt, build=False).kernel_source
            jobs.append((ks.source, ks.arch))
        except PlanError:
            pass
        try:
            jobs.append((bwd_source(ir, tgt).source, tgt.nvrtc_arch))
        except PlanError:
            pass
    precompile_to_disk(jobs, workers=min(16, os.cpu_count() or 1))
    yield


def _ok(res) -> None:
    assert res.ok, str(res)


def _maxabs(x: torch.Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


# ----------------------------------------------------------------------------------- relative bias
@pytest.mark.parametrize("schedule", ["v2", "v1"])
@pytest.mark.parametrize("causal", [False, True])
def test_relative_bias_forward(schedule: str, causal: bool) -> None:
    kern = ac.compile(_rel(causal), schedule)
    for nq, nk in ((113, 113), (300, 77), (77, 300), (1, 40)):
        _ok(check_kernel(kern, 2, 4, nq, nk, seed=nq + nk))


@pytest.mark.parametrize("causal", [False, True])
def test_relative_bias_grads_q_k_v_and_table(causal: bool) -> None:
    """dq, dk, dv and d(table) against float64 autograd of the reference; |kv - q| exceeds R = 16,
    so the clamped edge columns collect the gradient of every longer distance."""
    kern = ac.compile(_rel(causal))
    for nq, nk, hkv in ((300, 300, 4), (200, 333, 2), (333, 200, 1)):
        _ok(check_kernel_grads(kern, 2, 4, nq, nk, H_kv=hkv, buffer_grads=("bias_table",), seed=nq * nk))


def test_relative_bias_learnable_captured_table() -> None:
    """A captured table with requires_grad gets .grad from out.backward(), as an nn.Parameter would."""
    table = _table(4, 16, seed=3).requires_grad_()
    kern = ac.compile(presets.relative_bias(table, 64, causal=True))
    q, k, v = random_qkv(2, 4, 250, 250, 64, 64, BF16)
    dout = torch.randn(2, 4, 250, 64, device="cuda").to(BF16)
    kern(q, k, v).backward(dout)
    t64 = table.detach().double().requires_grad_()
    ref = reference_attention(q.double(), k.double(), v.double(), kern.ir, buffers={"bias_table": t64})
    (g_ref,) = torch.autograd.grad(ref, [t64], dout.double())
    te = table.detach().clone().requires_grad_()
    eag = eager_attention(q, k, v, kern.ir, buffers={"bias_table": te})
    (g_eag,) = torch.autograd.grad(eag, [te], dout)
    ok, msg = error_ratio_check(table.grad, g_ref.cpu(), g_eag.cpu())
    assert ok, msg


# ----------------------------------------------------------------------------------- GQA / MQA
@pytest.mark.parametrize("h_kv", [2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_mqa_forward_and_backward(h_kv: int, causal: bool) -> None:
    spec = presets.causal(64) if causal else presets.plain(64)
    for schedule in ("v2", "v1"):
        kern = ac.compile(spec, schedule)
        for nq, nk in ((257, 257), (100, 300)):
            _ok(check_kernel(kern, 2, 8, nq, nk, H_kv=h_kv, seed=nq))
    kern = ac.compile(spec)
    for nq, nk in ((257, 257), (300, 100)):
        _ok(check_kernel_grads(kern, 2, 8, nq, nk, H_kv=h_kv, seed=nq))


@pytest.mark.parametrize("h_kv", [2, 1])
def test_gqa_equals_repeated_kv_and_reduces_dk_dv_over_the_group(h_kv: int) -> None:
    """K/V are read per group (never repeated in memory); dK, dV have H_kv heads and equal the
    group sums of the gradients of the same attention with K/V repeated to H heads."""
    kern = ac.compile(presets.causal(64))
    H, G = 8, 8 // h_kv
    q, k, v = random_qkv(2, H, 200, 200, 64, 64, BF16, H_kv=h_kv)
    dout = torch.randn(2, H, 200, 64, device="cuda").to(BF16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = kern(*leaves)
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    assert dk.shape == (2, h_kv, 200, 64) and dv.shape == (2, h_kv, 200, 64)
    rep = [q.clone().requires_grad_(), k.repeat_interleave(G, 1).requires_grad_(),
           v.repeat_interleave(G, 1).requires_grad_()]
    out_rep = kern(*rep)
    torch.testing.assert_close(out, out_rep)
    dq_r, dk_r, dv_r = torch.autograd.grad(out_rep, rep, dout)
    torch.testing.assert_close(dq, dq_r, atol=2e-2, rtol=2e-2)
    for got, full in ((dk, dk_r), (dv, dv_r)):
        want = full.float().view(2, h_kv, G, 200, 64).sum(2)
        err = float((got.float() - want).abs().max())
        assert err <= 0.02 * float(want.abs().max()) + 1e-3, f"group sum differs by {err}"


# ----------------------------------------------------------------------------------- cross-attention
def _explicit_bottom_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool):
    """Float64 attention with the causal mask written out: key j visible from query i iff
    j <= i + (Nk - Nq) (bottom-right, FlashAttention >= 2.1); rows with no key give 0, lse -inf."""
    nq, nk = q.shape[2], k.shape[2]
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(nq, device=q.device).view(nq, 1)
        j = torch.arange(nk, device=q.device).view(1, nk)
        s = s.masked_fill(j > i + (nk - nq), -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
    return p @ v.double(), lse


@pytest.mark.parametrize("schedule", ["v2", "v1"])
@pytest.mark.parametrize("causal", [False, True])
def test_cross_attention_alignment(schedule: str, causal: bool) -> None:
    kern = ac.compile(presets.causal(64) if causal else presets.plain(64), schedule)
    for nq, nk in CROSS:
        torch.manual_seed(nq * 1000 + nk)
        _ok(check_kernel(kern, 2, 3, nq, nk))
        q, k, v = random_qkv(1, 3, nq, nk, 64, 64, BF16)
        out, lse = kern(q, k, v, return_lse=True)
        ref, ref_lse = _explicit_bottom_right(q, k, v, causal)
        empty = torch.isinf(ref_lse)
        if causal and nq > nk:
            assert bool(empty[..., : nq - nk].all()) and not bool(empty[..., nq - nk:].any())
        assert bool((out[empty] == 0).all()) and bool((lse[empty] == -math.inf).all()), "empty rows: 0, lse -inf"
        live = ~empty
        assert _maxabs((out.double() - ref)[live]) < 3e-2
        assert _maxabs((lse.double() - ref_lse)[live]) < 2e-3


def test_cross_attention_grads() -> None:
    for spec in (presets.plain(64), presets.causal(64)):
        kern = ac.compile(spec)
        for nq, nk in ((100, 300), (300, 100), (1, 513), (257, 1)):
            _ok(check_kernel_grads(kern, 2, 3, nq, nk, seed=nq + nk))


# ----------------------------------------------------------------------------------- LSE
@pytest.mark.parametrize("schedule", ["v2", "v1"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_lse_layout(schedule: str, layout: str) -> None:
    """lse: (B, H, Nq) float32, contiguous, natural log of sum_j exp(scaled, modified, masked score),
    query heads under GQA, whatever q's memory layout; the same through the autograd op."""
    kern = ac.compile(presets.causal(64), schedule)
    q, k, v = random_qkv(2, 4, 150, 170, 64, 64, BF16, H_kv=2)
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out, lse = kern(q, k, v, return_lse=True)
    assert lse.shape == (2, 4, 150) and lse.dtype == torch.float32 and lse.is_contiguous()
    s = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / 8.0
    i, j = torch.arange(150, device="cuda").view(-1, 1), torch.arange(170, device="cuda").view(1, -1)
    want = torch.logsumexp(s.masked_fill(j > i + 20, -math.inf), -1)
    assert float((lse.double() - want).abs().max()) < 2e-3
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out_g, lse_g = kern(*leaves, return_lse=True)
    assert lse_g.shape == (2, 4, 150) and lse_g.dtype == torch.float32
    torch.testing.assert_close(lse_g, lse, atol=0, rtol=0)


# ----------------------------------------------------------------------------------- head dims
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=lambda d: f"{d[0]}x{d[1]}")
def test_head_dims_forward_backward_or_explained(dims: tuple[int, int]) -> None:
    from attncompiler.plan.targets import detect_target

    d, dv = dims
    spec = presets.causal(d, head_dim_v=dv)
    ir, tgt = build_ir(spec), detect_target()
    for schedule in ("v2", "v1"):
        try:
            get_schedule(schedule).make_plan(ir, tgt)
        except PlanError as e:
            assert f"{d}" in str(e) and tgt.name in str(e) or "multiple of" in str(e), str(e)
            continue
        kern = ac.compile(spec, schedule)
        for nq, nk in ((113, 113), (200, 77)):
            _ok(check_kernel(kern, 2, 3, nq, nk, seed=d + dv + nq))
    try:
        make_bwd_plan(ir, tgt)
    except PlanError as e:  # e.g. 192 on sm_86 / sm_89 / sm_120 (99 KB of shared memory per block)
        msg = str(e)
        assert f"D={d}" in msg and tgt.name in msg and ("smem" in msg or "registers" in msg), msg
        return
    kern = ac.compile(spec)
    for nq, nk in ((113, 113), (77, 200)):
        _ok(check_kernel_grads(kern, 2, 3, nq, nk, seed=d * dv + nq))
