"""GPU (sm_90): calls whose queries fit one 64-row tile run v3's 64-row sibling under ``schedule="auto"``
(plan/short.py), against the float64 reference (error-ratio rule): every preset, fp16 too, cross attention with more
keys, a recorded launch, autograd through the short forward; calls with more queries keep the kernel's own plan."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.plan.short import SHORT_BLOCK_M
from attncompiler.spec import presets
from attncompiler.testing import check_kernel, check_kernel_grads

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the short-sequence sibling is v3's (sm_90)")
NAMES = sorted(presets.PRESETS)


def _auto(name: str, head_dim: int, dtype: str = "bf16", seqlen: int = 300, **kw) -> ac.CompiledAttention:
    kern = ac.compile(presets.get_preset(name, head_dim=head_dim, dtype=dtype, num_heads=4, seqlen=seqlen, **kw))
    assert kern.schedule == "v3" and kern._short is None
    # decided at compile time: the sibling runs where the plan is taller than 64 rows (every preset has a 64-row plan)
    assert kern.auto_short == (kern.plan.block_m > SHORT_BLOCK_M)
    return kern


def _ran_short(kern: ac.CompiledAttention) -> bool:
    return kern._short is not None and kern._short.plan.block_m == SHORT_BLOCK_M


@needs_hopper
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", NAMES)
def test_short_sibling_presets(name: str, head_dim: int) -> None:
    kern = _auto(name, head_dim)
    if kern.plan.block_m <= SHORT_BLOCK_M:
        pytest.skip(f"{name} d={head_dim}: the plan is already {kern.plan.block_m} rows")
    for nq, nk in ((49, 49), (SHORT_BLOCK_M, SHORT_BLOCK_M), (37, 300), (1, 113)):
        res = check_kernel(kern, 3, 4, nq, nk, seed=40 + nq)
        assert res.ok, f"{name} d={head_dim} Nq={nq} Nk={nk}: {res}"
    assert _ran_short(kern)


@needs_hopper
def test_short_sibling_fp16_causal_and_recorded_launch() -> None:
    kern = _auto("causal", 128, dtype="fp16")
    res = check_kernel(kern, 5, 4, 49, seed=41, repeat=True)  # the second call launches the recording
    assert res.ok, str(res)
    assert _ran_short(kern) and kern._recipes


@needs_hopper
def test_short_sibling_grads() -> None:
    kern = _auto("causal", 64)
    res = check_kernel_grads(kern, 3, 4, 49, seed=42)
    assert res.ok, str(res)
    assert _ran_short(kern)


@needs_hopper
def test_more_queries_keep_the_plan() -> None:
    kern = _auto("causal", 64)
    res = check_kernel(kern, 2, 4, SHORT_BLOCK_M + 1, seed=43)
    assert res.ok, str(res)
    assert kern._short is None


@needs_hopper
@pytest.mark.parametrize("name", ["causal", "plain", "document"])
def test_short_sibling_packed_sequences(name: str) -> None:
    """Packed sequences whose max_seqlen_q (given as an int) fits one 64-row tile run the sibling too, forward and
    backward; without max_seqlen_q (read from cu_seqlens) or with a longer one they keep the kernel's plan."""
    from attncompiler.testing_varlen import check_varlen_grads, check_varlen_kernel

    lens_q, lens_k = (49, 1, 64, 17, 0, 33), (49, 5, 64, 100, 3, 33)
    kern = _auto(name, 64)
    assert (r := check_varlen_kernel(kern, lens_q, lens_k, H=4, max_seqlen=(64, 100))).ok, str(r)
    assert _ran_short(kern)
    kern = _auto(name, 128)
    assert (r := check_varlen_grads(kern, lens_q, lens_k, H=4, max_seqlen=(64, 100))).ok, str(r)
    assert _ran_short(kern)
    for kern, mq in ((_auto(name, 64), None), (_auto(name, 64), 65)):
        assert (r := check_varlen_kernel(kern, lens_q, lens_k, H=4, max_seqlen=(mq, None))).ok, str(r)
        assert kern._short is None
