"""The gradient check's allowance for D = rowsum(dO * O) read from the stored (rounded) output (CPU).

``check_kernel_grads`` rechecks a gradient that fails against the exact reference against the exact gradient
of ``loss - sum_i delta_i lse_i`` with ``delta_i = dO_i . (O_stored - O_exact)_i``.  These tests prove the
identity that rests on (FlashAttention's backward formula with D from a perturbed output equals that
gradient, dropout included) and that the recheck still refuses a gradient that follows neither.
"""
from __future__ import annotations

import math

import torch

from attncompiler.testing import _check_with_stored_output


def _fa_backward(q, k, v, dout, o_used, keep, p_drop, scale):
    """dq, dk, dv by FlashAttention's formula: P from the scores, D = rowsum(dO * o_used)."""
    p = torch.softmax(scale * q @ k.transpose(-1, -2), dim=-1)
    z = keep / (1.0 - p_drop)
    dp = (dout @ v.transpose(-1, -2)) * z
    d = (dout * o_used).sum(-1, keepdim=True)
    ds = p * (dp - d)
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, (p * z).transpose(-1, -2) @ dout


def _autograd_with_row_term(q, k, v, dout, keep, p_drop, scale, row_coef):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    qq, kk, vv = leaves
    s = scale * qq @ kk.transpose(-1, -2)
    o = (torch.softmax(s, dim=-1) * keep / (1.0 - p_drop)) @ vv
    lse = torch.logsumexp(s, dim=-1)
    loss = (o * dout).sum() + (lse * row_coef).sum()
    return torch.autograd.grad(loss, leaves), o.detach()


def test_stored_output_term_is_the_gradient_of_a_row_term() -> None:
    g = torch.Generator().manual_seed(0)
    for nk, p_drop in ((1, 0.25), (7, 0.25), (33, 0.0)):
        q, k, v = (torch.randn(2, 3, n, 16, generator=g, dtype=torch.float64) for n in (5, nk, nk))
        dout = torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64)
        keep = (torch.rand(2, 3, 5, nk, generator=g) >= p_drop).double()
        scale = 1 / math.sqrt(16)
        zero = torch.zeros(2, 3, 5, dtype=torch.float64)
        exact, o = _autograd_with_row_term(q, k, v, dout, keep, p_drop, scale, zero)
        o_stored = o.to(torch.bfloat16).double()  # the forward's output as the backward reads it
        delta = (dout * (o_stored - o)).sum(-1)
        shifted, _ = _autograd_with_row_term(q, k, v, dout, keep, p_drop, scale, -delta)
        fa = _fa_backward(q, k, v, dout, o_stored, keep, p_drop, scale)
        for name, a, b, x in zip(("dq", "dk", "dv"), fa, shifted, exact):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), f"{name} Nk={nk}: FA formula != row-term gradient"
        if nk == 1 and p_drop > 0:  # one key: the exact dq is 0, the stored output's is not
            assert float(exact[0].abs().max()) < 1e-12 < float(fa[0].abs().max())


def test_recheck_accepts_the_algorithm_and_refuses_others() -> None:
    g = torch.Generator().manual_seed(1)
    r = torch.zeros(4, 8, dtype=torch.float64)  # exact gradient 0 (one key per row)
    term = 1e-2 * torch.randn(4, 8, generator=g, dtype=torch.float64)
    r_stored = r + term
    eager = r.clone()  # eager is exact here
    ok, msg = _check_with_stored_output(r_stored * (1 + 2.0 ** -9), r, r_stored, eager, 2.0, "strict")
    assert ok, msg
    for wrong in (r_stored * 1.5, r_stored + 1e-3, -r_stored):
        ok, msg = _check_with_stored_output(wrong, r, r_stored, eager, 2.0, "strict")
        assert not ok, msg
        assert msg.startswith("strict; against D from the stored output")
    ok, msg = _check_with_stored_output(r, r, r.clone(), eager, 2.0, "strict")  # no term: the strict verdict
    assert not ok and msg == "strict"


def test_recheck_allows_one_ulp_of_the_gradients_type() -> None:
    """A gradient made of a few rounded terms (fuzz seed 101282: Nq = 2, a window of 33): eager's realized error
    at the largest entries can sit far below the element type's resolution there. The recheck allows the kernel
    one ulp of its gradient's type at the largest magnitude, and no more: a gradient off by 0.4 ulp at its largest
    entry before its rounding to bf16 passes, one off by 3 ulps does not, and a float64 gradient off by 0.4 bf16
    ulps gets no such allowance."""
    g = torch.Generator().manual_seed(2)
    r = torch.randn(2, 128, 16, generator=g, dtype=torch.float64)   # the exact gradient, |r| up to ~4
    term = 1e-3 * torch.randn(2, 128, 16, generator=g, dtype=torch.float64)
    r_stored = r + term
    top = float(r_stored.abs().max())
    ulp = torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(top))
    # eager: rounded to bf16 like any output, but a lucky draw (exact) at the entries above half the largest
    eager = torch.where(r.abs() > top / 2, r, r.to(torch.bfloat16).double())
    i = int(r_stored.abs().argmax())
    for n_ulp, want in ((0.4, True), (3.0, False)):
        pre = r_stored.clone()
        pre.view(-1)[i] += n_ulp * ulp * math.copysign(1.0, float(r_stored.view(-1)[i]))
        ok, msg = _check_with_stored_output(pre.to(torch.bfloat16), r, r_stored, eager, 2.0, "strict")
        assert ok == want, msg
        assert "1 ulp" in msg
        if want:  # and without the allowance it would not pass: max-abs beyond twice eager's error
            assert float((pre.to(torch.bfloat16).double() - r_stored).abs().max()) > 2 * float((eager - r).abs().max())
    pre = r_stored.clone()
    pre.view(-1)[i] += 0.9 * ulp
    ok, msg = _check_with_stored_output(pre, r, r_stored, eager, 2.0, "strict")
    assert not ok and "ulp" not in msg, msg  # float64: no allowance
