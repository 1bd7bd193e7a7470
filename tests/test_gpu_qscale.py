"""GPU (sm_90 only): the v3 plan option ``q_prescale`` (plan/qscale.py; ``v3_scale_q`` in
templates/include/attncompiler/v3_fwd.cuh): each consumer warpgroup multiplies its rows of the Q tile by the
score_mod's inner scale c, and the softmax takes G of the accumulator.

The option is opt-in (plan/qscale.py): c q is rounded to bf16, so the kernel computes the attention of
q~ = bf16(c q) / c. Every case asserts the plan really has the option on, passes the float64 reference by the
error-ratio rule on random inputs (LSE: within 2e-3 or twice eager bf16's error), and stays within bf16 rounding
of the same plan without the option; on inputs whose products q_i k_i cancel, it matches the reference of q~.

Run on an H100 / H200 with ``python3 -m pytest -m gpu tests/test_gpu_qscale.py``.
"""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.reference import eager_attention, error_ratio_check, reference_attention
from attncompiler.spec import presets

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")


def _cap_per_head(s, b, h, q_idx, kv_idx):
    return 20 * (h + 1) * torch.tanh(s / (20 * (h + 1)))


def _spec(kind: str, d: int) -> ac.AttentionSpec:
    if kind == "softcap":
        return presets.softcap(30.0, d)
    if kind == "softcap_causal":
        return ac.AttentionSpec(head_dim=d, score_mod=presets.softcap_score_mod(50.0), causal=True,
                                name="softcap_causal")
    if kind == "cap_per_head":  # unbounded over h: the running maximum, c per head
        return ac.AttentionSpec(head_dim=d, score_mod=_cap_per_head, name="cap_per_head")
    raise ValueError(kind)


def _lse_err(lse: torch.Tensor, ref_lse: torch.Tensor) -> float:
    err = (lse.double() - ref_lse).abs().masked_fill(torch.isinf(ref_lse) & (lse.double() == ref_lse), 0.0)
    return float(err.masked_fill(torch.isnan(err), float("inf")).max())


def _check(kern, q, k, v, out, lse) -> None:
    """Output by the error-ratio rule; LSE within 2e-3 or twice eager bf16's LSE error. The scaled Q adds one
    bf16 rounding per q element: ~1e-3 of a logit (scale * 2^-9 * |q| |k|), which a causal row with one key
    shows unaveraged in its LSE; eager bf16, rounding the scores themselves, errs more there."""
    ref, ref_lse = reference_attention(q, k, v, kern.ir, return_lse=True)
    eag, eag_lse = eager_attention(q, k, v, kern.ir, return_lse=True)
    assert torch.isfinite(out).all()
    ok, msg = error_ratio_check(out, ref, eag)
    assert ok, msg
    lerr, eerr = _lse_err(lse, ref_lse), _lse_err(eag_lse, ref_lse)
    assert lerr <= max(2e-3, 2.0 * eerr), f"lse max err {lerr:.3g} (eager bf16 {eerr:.3g})"


# (spec kind, head dim, B, H, H_kv, Nq, Nk, more plan options)
CASES = [
    ("softcap", 128, 2, 3, 3, 113, 113, {}),
    ("softcap", 128, 1, 4, 4, 1023, 1023, {}),
    ("softcap", 128, 1, 2, 2, 4096, 4096, {}),
    ("softcap", 128, 2, 4, 2, 1500, 4100, {"persistent": True}),       # GQA, Nq < Nk, Q reloaded per tile
    ("softcap", 128, 1, 4, 4, 1023, 1023, {"block_m": 192, "block_n": 64}),  # three consumers
    ("softcap", 64, 1, 4, 4, 1023, 1023, {}),
    ("softcap", 64, 1, 4, 4, 1023, 1023, {"block_m": 192, "block_n": 96}),
    ("softcap", 256, 1, 2, 2, 1023, 1023, {}),
    ("softcap", 96, 1, 4, 4, 1023, 1023, {}),                          # a zero-padded second box scaled too
    ("softcap", 96, 2, 4, 2, 1500, 4100, {"persistent": True}),
    ("softcap_causal", 128, 1, 4, 4, 1023, 1023, {}),
    ("cap_per_head", 128, 1, 4, 4, 1023, 1023, {}),
]


@needs_hopper
@pytest.mark.parametrize("kind, d, B, H, H_kv, Nq, Nk, opts", CASES)
def test_q_prescale_matches_the_reference(kind, d, B, H, H_kv, Nq, Nk, opts):
    spec = _spec(kind, d)
    kern = ac.compile(spec, "v3", q_prescale=True, **opts)
    assert kern.plan.q_prescale, kern.plan.reasons
    off = ac.compile(spec, "v3", **{**opts, "q_prescale": False})
    assert not off.plan.q_prescale
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(B, H, Nq, d, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, H_kv, Nk, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    a, lse = kern(q, k, v, out=torch.full_like(q, float("nan")), return_lse=True)
    b = off(q, k, v, out=torch.full_like(q, float("nan")))
    _check(kern, q, k, v, a, lse)
    # c q rounded to bf16 moves each logit by ~1e-3 here: at most one bf16 ulp of the output (2^-7 relative; a
    # causal row with few keys has |o| ~ 3) beyond an absolute 4e-3
    assert bool(((a.float() - b.float()).abs() <= 4e-3 + 2.0**-7 * b.float().abs()).all())


@needs_hopper
def test_q_prescale_computes_the_attention_of_the_rounded_q():
    """Rows whose products q_i k_i cancel: keys close to one direction u, queries nearly orthogonal to it with
    |q| ~ 1e4, so |q| |k| scale is far beyond the cap while some q . k sit in tanh's linear range. There the
    rounding of c q (plan/qscale.py) shows: the kernel is the attention of q~ = bf16(c q) / c, which it matches
    by the error-ratio rule, together with saturated rows (every score near -cap or +cap) and ordinary ones."""
    kern = ac.compile(presets.softcap(30.0, 128), "v3", q_prescale=True)
    assert kern.plan.q_prescale
    g = torch.Generator(device="cuda").manual_seed(5)
    N, d = 1023, 128
    q, k, v = (torch.randn(1, 2, N, d, device="cuda", generator=g) for _ in range(3))
    u = torch.randn(d, device="cuda", generator=g)
    k = u + 0.1 * k
    beta = 5.0 * 30.0 * d ** 0.5 / float(u @ u)
    q[:, :, :200] = -beta * u
    q[:, :, 200:400] = beta * u
    w = q[:, :, 400:420]
    q[:, :, 400:420] = 1e4 * (w - (w @ u)[..., None] * u / float(u @ u) + 1e-3 * u)  # ~ orthogonal to u
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    out, lse = kern(q, k, v, out=torch.full_like(q, float("nan")), return_lse=True)
    assert torch.isfinite(out).all()
    c = kern.ir.scale / 30.0
    q_rounded = (q.double() * c).to(torch.bfloat16).double() / c
    ref, ref_lse = reference_attention(q_rounded, k.double(), v.double(), kern.ir, return_lse=True)
    eag_err = (eager_attention(q, k, v, kern.ir).double() - reference_attention(q, k, v, kern.ir)).abs()
    err = (out.double() - ref).abs()
    assert float(err.max()) <= 2.0 * float(eag_err.max()), (float(err.max()), float(eag_err.max()))
    assert float(err.norm()) <= 2.0 * float(eag_err.norm()), (float(err.norm()), float(eag_err.norm()))
    assert _lse_err(lse, ref_lse) <= 2e-3
