"""Float64 reference semantics of an AttentionIR, the eager same-dtype twin and the error-ratio rule."""
from __future__ import annotations

import math

import pytest
import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attncompiler.reference as refmod
from attncompiler.ir.types import AttentionIR, BufferInfo
from attncompiler.philox import dropout_keep_mask
from attncompiler.reference import eager_attention, error_ratio_check, evaluate, reference_attention
from attncompiler.spec.symbols import B as SB
from attncompiler.spec.symbols import H as SH
from attncompiler.spec.symbols import KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE

F64 = torch.float64
SLOPES = sympy.IndexedBase("slopes")
DOC = sympy.IndexedBase("doc")


def make_ir(score=None, mask=None, p: float = 0.0, D: int = 16, DV: int | None = None, buffers=(),
            scale: float | None = None) -> AttentionIR:
    return AttentionIR(head_dim=D, head_dim_v=D if DV is None else DV, dtype="bf16",
                       scale=D ** -0.5 if scale is None else scale, score_expr=score, mask_expr=mask,
                       dropout_p=p, buffers=tuple(buffers))


def qkv(B=2, H=3, Nq=40, Nk=40, D=16, DV=None, Hkv=None, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hkv = H if Hkv is None else Hkv
    DV = D if DV is None else DV
    q = torch.randn(B, H, Nq, D, generator=g, dtype=F64).to(dtype)
    k = torch.randn(B, Hkv, Nk, D, generator=g, dtype=F64).to(dtype)
    v = torch.randn(B, Hkv, Nk, DV, generator=g, dtype=F64).to(dtype)
    return q, k, v


def scores(q, k, scale):
    return torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) * scale


def close(a, b, tol=1e-12):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, rtol=tol, atol=tol), float((a - b).abs().max())


# ------------------------------------------------------------------------------- vs SDPA / loops


@pytest.mark.parametrize("Nq,Nk,DV", [(40, 40, 16), (1, 37, 16), (113, 113, 8), (113, 50, 24)])
def test_plain_equals_sdpa(Nq, Nk, DV):
    q, k, v = qkv(Nq=Nq, Nk=Nk, DV=DV)
    ir = make_ir(DV=DV)
    out, lse = reference_attention(q, k, v, ir, return_lse=True)
    assert out.dtype == F64 and out.shape == (2, 3, Nq, DV) and lse.shape == (2, 3, Nq)
    close(out, F.scaled_dot_product_attention(q, k, v))
    close(lse, torch.logsumexp(scores(q, k, ir.scale), -1))


@pytest.mark.parametrize("N", [1, 64, 113])
def test_causal_equals_sdpa(N):
    q, k, v = qkv(Nq=N, Nk=N)
    out = reference_attention(q, k, v, make_ir(mask=Q_IDX >= KV_IDX))
    close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_bottom_right_causal():
    q, k, v = qkv(Nq=20, Nk=57)
    ir = make_ir(mask=Q_IDX + (KV_LEN - Q_LEN) >= KV_IDX)
    bool_mask = torch.ones(20, 57, dtype=torch.bool).tril(diagonal=57 - 20)
    close(reference_attention(q, k, v, ir), F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask))


def test_alibi_equals_sdpa_with_bias():
    B, H, N = 2, 4, 53
    q, k, v = qkv(B=B, H=H, Nq=N, Nk=N)
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / H) for i in range(H)], dtype=torch.float32)
    ir = make_ir(score=SCORE + sympy.Indexed(SLOPES, SH) * (KV_IDX - Q_IDX), mask=Q_IDX >= KV_IDX,
                 buffers=(BufferInfo("slopes", 1, "float"),))
    i = torch.arange(N).view(N, 1)
    j = torch.arange(N).view(1, N)
    bias = slopes.double().view(1, H, 1, 1) * (j - i).double()
    bias = bias.masked_fill(j > i, -math.inf)
    out, lse = reference_attention(q, k, v, ir, buffers={"slopes": slopes}, return_lse=True)
    close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    close(lse, torch.logsumexp(scores(q, k, ir.scale) + bias, -1))


def test_softcap_equals_loop():
    B, H, Nq, Nk, D, cap = 1, 2, 9, 11, 8, 5.0
    q, k, v = qkv(B=B, H=H, Nq=Nq, Nk=Nk, D=D)
    ir = make_ir(score=cap * sympy.tanh(SCORE / cap), D=D, scale=0.7)
    out, lse = reference_attention(q, k, v, ir, return_lse=True)
    for b in range(B):
        for h in range(H):
            for i in range(Nq):
                s = [cap * math.tanh(0.7 * float(q[b, h, i] @ k[b, h, j]) / cap) for j in range(Nk)]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                z = sum(w)
                o = sum(w[j] / z * v[b, h, j] for j in range(Nk))
                close(out[b, h, i], o)
                assert abs(float(lse[b, h, i]) - (m + math.log(z))) < 1e-12


def test_document_mask_int_buffer():
    N = 48
    q, k, v = qkv(B=1, H=2, Nq=N, Nk=N)
    doc = torch.tensor([0] * 10 + [1] * 25 + [2] * 13, dtype=torch.int32)
    ir = make_ir(mask=sympy.And(sympy.Eq(sympy.Indexed(DOC, Q_IDX), sympy.Indexed(DOC, KV_IDX)), Q_IDX >= KV_IDX),
                 buffers=(BufferInfo("doc", 1, "int"),))
    bool_mask = (doc.view(N, 1) == doc.view(1, N)) & torch.ones(N, N, dtype=torch.bool).tril()
    close(reference_attention(q, k, v, ir, buffers={"doc": doc}),
          F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask))
    # bool buffers are int buffers too
    close(reference_attention(q, k, v, ir, buffers={"doc": doc == 1}),
          F.scaled_dot_product_attention(q, k, v, attn_mask=((doc == 1).view(N, 1) == (doc == 1).view(1, N))
                                         & torch.ones(N, N, dtype=torch.bool).tril()))


def test_buffer_indices_are_clamped():
    q, k, v = qkv(B=1, H=1, Nq=12, Nk=12)
    doc = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2], dtype=torch.int64)  # shorter than N: indices clamp
    ir = make_ir(mask=sympy.Eq(sympy.Indexed(DOC, Q_IDX - 2), sympy.Indexed(DOC, KV_IDX + 3)),
                 buffers=(BufferInfo("doc", 1, "int"),))
    i = torch.arange(12)
    di = doc[(i - 2).clamp(0, 7)]
    dj = doc[(i + 3).clamp(0, 7)]
    bool_mask = di.view(12, 1) == dj.view(1, 12)
    out = reference_attention(q, k, v, ir, buffers={"doc": doc})
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask).nan_to_num(0.0)
    close(out, ref)


def test_fully_masked_rows_zero_and_neg_inf_lse():
    q, k, v = qkv(Nq=20, Nk=16)
    ir = make_ir(mask=sympy.And(Q_IDX >= 5, Q_IDX < 17, KV_IDX <= Q_IDX))
    out, lse = reference_attention(q, k, v, ir, return_lse=True)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    dead = torch.tensor([i < 5 or i >= 17 for i in range(20)])
    assert torch.all(out[:, :, dead] == 0)
    assert torch.all(lse[:, :, dead] == -math.inf)
    assert torch.all(torch.isfinite(lse[:, :, ~dead]))
    for fn, x in ((eager_attention, (q.bfloat16(), k.bfloat16(), v.bfloat16())), (reference_attention, (q, k, v))):
        o, l = fn(*x, ir, return_lse=True, dropout_p=0.3, seed=3)
        assert not torch.isnan(o).any() and not torch.isnan(l).any()
        assert torch.all(o[:, :, dead] == 0) and torch.all(l[:, :, dead] == -math.inf)
    # every key masked / mask identically false
    out, lse = reference_attention(q, k, v, make_ir(mask=sympy.false), return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


def test_lse_equals_logsumexp_with_score_mod_and_mask():
    q, k, v = qkv(Nq=31, Nk=45)
    ir = make_ir(score=SCORE * 1.5 - sympy.Abs(Q_IDX - KV_IDX) / 8, mask=KV_IDX <= Q_IDX + 10, scale=0.3)
    _, lse = reference_attention(q, k, v, ir, return_lse=True)
    i = torch.arange(31).view(31, 1)
    j = torch.arange(45).view(1, 45)
    s = scores(q, k, 0.3) * 1.5 - (i - j).abs().double() / 8
    close(lse, torch.logsumexp(s.masked_fill(j > i + 10, -math.inf), -1))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_equals_hand_computed(p):
    B, H, Nq, Nk = 2, 2, 37, 29
    q, k, v = qkv(B=B, H=H, Nq=Nq, Nk=Nk)
    ir = make_ir(mask=Q_IDX + (KV_LEN - Q_LEN) >= KV_IDX, p=p)
    out, lse = reference_attention(q, k, v, ir, seed=1234, offset=99, return_lse=True)
    i = torch.arange(Nq).view(Nq, 1)
    j = torch.arange(Nk).view(1, Nk)
    s = scores(q, k, ir.scale).masked_fill(j > i + (Nk - Nq), -math.inf)
    P = torch.softmax(s, -1).nan_to_num(0.0)
    keep = dropout_keep_mask(B, H, Nq, Nk, seed=1234, offset=99, p=p)
    close(out, (P * keep / (1 - p)) @ v)
    close(lse, torch.logsumexp(s, -1))  # lse ignores dropout
    # dropout_p defaults to the IR's and can be overridden
    close(reference_attention(q, k, v, ir, dropout_p=0.0), P @ v)
    assert not torch.allclose(reference_attention(q, k, v, ir, seed=1235, offset=99), out)


def test_gqa_equals_repeated_heads():
    q, k, v = qkv(B=2, H=6, Hkv=2, Nq=33, Nk=21, DV=12)
    slopes = torch.linspace(0.1, 0.6, 6)
    ir = make_ir(score=SCORE + sympy.Indexed(SLOPES, SH) * (KV_IDX - Q_IDX) + SB, mask=Q_IDX + 12 >= KV_IDX,
                 DV=12, p=0.2, buffers=(BufferInfo("slopes", 1, "float"),))
    kw = dict(buffers={"slopes": slopes}, seed=7, offset=1, return_lse=True)
    out, lse = reference_attention(q, k, v, ir, **kw)
    out2, lse2 = reference_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), ir, **kw)
    close(out, out2)
    close(lse, lse2)
    ir0 = make_ir(DV=12)
    close(reference_attention(q, k, v, ir0),
          F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)))


@pytest.mark.parametrize("q_chunk", [1, 7, 16, 1000])
def test_chunked_equals_unchunked(q_chunk):
    q, k, v = qkv(B=2, H=2, Nq=50, Nk=44)
    slopes = torch.tensor([0.25, 0.5])
    ir = make_ir(score=SCORE + sympy.Indexed(SLOPES, SH) * (KV_IDX - Q_IDX), mask=Q_IDX + (KV_LEN - Q_LEN) >= KV_IDX,
                 p=0.25, buffers=(BufferInfo("slopes", 1, "float"),))
    kw = dict(buffers={"slopes": slopes}, seed=11, offset=5, return_lse=True)
    full_o, full_l = reference_attention(q, k, v, ir, q_chunk=50, **kw)
    o, lse = reference_attention(q, k, v, ir, q_chunk=q_chunk, **kw)
    close(o, full_o, 1e-14)
    close(lse, full_l, 1e-14)
    eo, el = eager_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), ir, q_chunk=q_chunk, **kw)
    eo_full, el_full = eager_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), ir, q_chunk=50, **kw)
    assert torch.allclose(eo.double(), eo_full.double(), atol=2e-2)


def test_automatic_chunking(monkeypatch):
    q, k, v = qkv(B=1, H=2, Nq=100, Nk=64)
    ir = make_ir(mask=Q_IDX >= KV_IDX, p=0.1)
    full = reference_attention(q, k, v, ir, q_chunk=100, seed=2)
    monkeypatch.setattr(refmod, "_CHUNK_ELEMS_CPU", 2 * 64 * 20)  # 20 rows -> 16-row chunks
    seen = []
    orig = refmod.dropout_keep_mask

    def spy(*a, **kw):
        seen.append((kw["q_start"], kw["q_end"]))
        return orig(*a, **kw)

    monkeypatch.setattr(refmod, "dropout_keep_mask", spy)
    close(reference_attention(q, k, v, ir, seed=2), full, 1e-14)
    assert seen[:2] == [(0, 16), (16, 32)] and seen[-1] == (96, 100)


def test_low_precision_inputs_are_upcast():
    q, k, v = qkv(dtype=torch.bfloat16)
    out = reference_attention(q, k, v, make_ir())
    assert out.dtype == F64
    close(out, F.scaled_dot_product_attention(q.double(), k.double(), v.double()))
    assert reference_attention(q, k, v, make_ir(), dtype=torch.float32).dtype == torch.float32


# ------------------------------------------------------------------------- eager + error ratio


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eager_is_close_but_not_equal(dtype):
    q, k, v = qkv(B=1, H=2, Nq=64, Nk=64, dtype=dtype)
    slopes = torch.tensor([0.1, 0.3])
    ir = make_ir(score=10.0 * sympy.tanh(SCORE / 10.0) + sympy.Indexed(SLOPES, SH) * (KV_IDX - Q_IDX),
                 mask=Q_IDX >= KV_IDX, buffers=(BufferInfo("slopes", 1, "float"),))
    ref, rlse = reference_attention(q, k, v, ir, buffers={"slopes": slopes}, return_lse=True)
    eag, else_ = eager_attention(q, k, v, ir, buffers={"slopes": slopes}, return_lse=True)
    assert eag.dtype == dtype and else_.dtype == dtype
    err = (eag.double() - ref).abs().max().item()
    assert 0 < err < 5e-2
    assert (else_.double() - rlse).abs().max().item() < 5e-2


def test_error_ratio_check():
    q, k, v = qkv(B=1, H=2, Nq=64, Nk=64)
    ir = make_ir(mask=Q_IDX >= KV_IDX)
    ref = reference_attention(q, k, v, ir)
    eag = eager_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), ir)
    ok, msg = error_ratio_check(eag, ref, eag)
    assert ok, msg
    assert "max-abs" in msg and "rel-fro" in msg
    # a float32 computation is far better than eager bf16
    ok, msg = error_ratio_check(reference_attention(q, k, v, ir, dtype=torch.float32), ref, eag)
    assert ok, msg
    bad = eag.double().clone()
    bad[0, 1, 7, 3] += 0.1
    ok, msg = error_ratio_check(bad, ref, eag)
    assert not ok and msg.startswith("FAIL")
    ok, _ = error_ratio_check(eag.double() * 1.02, ref, eag)  # small everywhere, large in Frobenius
    assert not ok
    zero = torch.zeros(3, 4, dtype=torch.float64)  # dq when every row sees one key: max-abs only
    ok, msg = error_ratio_check(zero + 1e-6, zero, zero)
    assert ok and "rel-fro n/a (all-zero reference)" in msg, msg
    ok, msg = error_ratio_check(zero + 1e-3, zero, zero)
    assert not ok and "exceeded" in msg, msg
    nan = eag.double().clone()
    nan[0, 0, 0, 0] = math.nan
    assert not error_ratio_check(nan, ref, eag)[0]
    # lse with -inf rows: equal infinities are no error, a finite value there is
    _, rl = reference_attention(q, k, v, make_ir(mask=Q_IDX >= 3), return_lse=True)
    assert error_ratio_check(rl.float(), rl, rl.bfloat16())[0]
    wrong = rl.clone()
    wrong[0, 0, 0] = 0.0
    assert not error_ratio_check(wrong, rl, rl.bfloat16())[0]
    with pytest.raises(ValueError, match="expected out, ref and eager of one shape"):
        error_ratio_check(ref[0], ref, eag)



def test_lse_check_bound():
    """check_kernel's LSE rule: lse_tol plus LSE_ULPS fp32 ulps of |LSE| (large ALiBi LSEs), equal infinities
    match, NaN and a finite value against -inf fail."""
    from attncompiler.testing import LSE_ULPS, lse_check

    ref = torch.tensor([0.5, -3.0, 16386.27, -math.inf], dtype=torch.float64)
    ok, err = lse_check(ref.float(), ref)
    assert ok and err < 1e-3
    big = ref.clone()
    big[2] += 2.2e-3  # 1.1 fp32 ulps at 16386: beyond 2e-3, within the bound
    assert lse_check(big, ref) == (True, pytest.approx(2.2e-3))
    big[2] = ref[2] + 2e-3 + (LSE_ULPS + 1) * 2.0**-23 * 16386.27
    assert not lse_check(big, ref)[0]
    small = ref.clone()
    small[0] += 2.5e-3  # |LSE| ~ 0.5: the bound is lse_tol
    assert not lse_check(small, ref)[0]
    assert lse_check(small, ref, lse_tol=3e-3)[0]
    assert lse_check(small, ref, floor=3e-3)[0]  # an accepted floor (eager's error, check_kernel with tanh)
    assert not lse_check(small, ref, floor=2.4e-3)[0]
    for bad in (math.nan, 0.0):
        wrong = ref.clone()
        wrong[3] = bad
        ok, err = lse_check(wrong, ref)
        assert not ok and err == math.inf
        assert not lse_check(wrong, ref, floor=1.0)[0]

# ------------------------------------------------------------------------------------ evaluator


# Signed integer symbols with the IR's names (the IR's own symbols are nonnegative, which lets sympy
# simplify e.g. Max(q_idx, 0) -> q_idx; the evaluator matches symbols by name).
QI = sympy.Symbol("q_idx", integer=True)
KJ = sympy.Symbol("kv_idx", integer=True)


def ev(expr, **values):
    return evaluate(expr, values)


def test_evaluator_nodes():
    i = torch.arange(-6, 7).view(-1, 1)
    j = torch.arange(1, 5).view(1, -1)
    s = torch.linspace(-3, 3, 13, dtype=F64).view(-1, 1)
    assert torch.equal(ev(sympy.floor(QI / KJ), q_idx=i, kv_idx=j), torch.div(i, j, rounding_mode="floor"))
    assert torch.equal(ev(sympy.Mod(QI, KJ), q_idx=i, kv_idx=j), torch.remainder(i, j))
    assert ev(sympy.floor(sympy.Rational(7, 2)) + sympy.ceiling(Q_LEN / 4), q_len=9) == 6
    assert torch.equal(ev(sympy.Min(QI, KJ, 2), q_idx=i, kv_idx=j), i.clamp(max=2).minimum(j))
    assert torch.equal(ev(sympy.Max(QI, 0), q_idx=i), i.clamp(min=0))
    close(ev(sympy.Max(SCORE, QI / 2), score=s, q_idx=i), torch.maximum(s, i.double() / 2))
    close(ev(sympy.exp(SCORE) + sympy.log(KJ) + sympy.sqrt(KJ) + 1 / KJ, score=s, kv_idx=j),
          s.exp() + j.double().log() + j.double().sqrt() + 1.0 / j.double())
    close(ev(SCORE ** 2 + sympy.Float(0.25) * SCORE ** 3 + 2 ** KJ, score=s, kv_idx=j), s**2 + 0.25 * s**3 + 2**j)
    assert ev(KJ ** 3, kv_idx=j).dtype == torch.int64
    close(ev(sympy.Abs(SCORE) + sympy.sign(QI) + sympy.pi, score=s, q_idx=i), s.abs() + i.sign() + math.pi)
    close(ev(sympy.tanh(SCORE) * sympy.Rational(1, 3), score=s), s.tanh() / 3)
    pw = sympy.Piecewise((SCORE, QI > 2), (-SCORE, sympy.Eq(QI, 0)), (sympy.Integer(7), True))
    close(ev(pw, score=s, q_idx=i), torch.where(i > 2, s, torch.where(i == 0, -s, torch.full_like(s, 7.0))))
    m = sympy.Or(sympy.And(QI >= KJ, sympy.Not(sympy.Eq(KJ, 2))), sympy.Ne(QI, -6) & (QI < -4))
    assert torch.equal(ev(m, q_idx=i, kv_idx=j), ((i >= j) & (j != 2)) | ((i != -6) & (i < -4)))
    assert torch.equal(ev(sympy.ITE(QI > 0, KJ > 2, KJ < 2), q_idx=i, kv_idx=j),
                       torch.where(i > 0, j > 2, j < 2))
    assert ev(sympy.true) is True and ev(sympy.false) is False
    assert torch.equal(ev(sympy.Equivalent(QI > 0, KJ > 2), q_idx=i, kv_idx=j), (i > 0) == (j > 2))
    assert torch.equal(ev(sympy.Xor(QI > 0, KJ > 2), q_idx=i, kv_idx=j), (i > 0) != (j > 2))
    close(ev(sympy.atan2(SCORE, KJ) + sympy.sinh(SCORE) * sympy.atan(SCORE), score=s, kv_idx=j),
          torch.atan2(s, j.double()) + s.sinh() * s.atan())
    got = ev(sympy.Piecewise((-sympy.oo, QI < 0), (SCORE + sympy.E, True)), score=s, q_idx=i)
    assert torch.equal(got, torch.where(i < 0, -math.inf, s + math.e))
    nan = torch.tensor([math.nan, 1.0], dtype=F64)
    assert torch.equal(ev(sympy.Max(SCORE, 0), score=nan), torch.tensor([0.0, 1.0], dtype=F64))  # fmaxf
    assert ev(sympy.Min(SCORE, -sympy.oo), score=s) == -math.inf  # sympy folds it


def test_evaluator_float_constants_stay_float64():
    i = torch.arange(5)
    out = ev(sympy.Float("0.1") * QI + sympy.Rational(1, 3), q_idx=i)
    assert out.dtype == F64
    assert torch.equal(out, 0.1 * i.double() + 1 / 3)


def test_evaluator_buffers():
    t = torch.arange(12, dtype=F64).view(3, 4)
    tb = sympy.IndexedBase("t")
    i = torch.arange(-1, 5).view(-1, 1)
    j = torch.arange(-2, 6).view(1, -1)
    got = evaluate(sympy.Indexed(tb, QI, KJ), {"q_idx": i, "kv_idx": j}, {"t": t})
    assert torch.equal(got, t[i.clamp(0, 2), j.clamp(0, 3)])
    got = evaluate(sympy.Indexed(tb, 1, sympy.floor(QI / 2)), {"q_idx": i}, {"t": t})
    assert torch.equal(got, t[1, torch.div(i, 2, rounding_mode="floor").clamp(0, 3)])
    with pytest.raises(TypeError, match="expected an integer index"):
        evaluate(sympy.Indexed(tb, 0, QI / 2), {"q_idx": i}, {"t": t})
    with pytest.raises(KeyError, match="expected buffer 'u'"):
        evaluate(sympy.Indexed(sympy.IndexedBase("u"), QI), {"q_idx": i}, {"t": t})
    with pytest.raises(ValueError, match="expected 2 indices"):
        evaluate(sympy.Indexed(tb, QI), {"q_idx": i}, {"t": t})


def test_evaluator_errors():
    with pytest.raises(NotImplementedError, match="expected one of .* got gamma"):
        ev(sympy.gamma(QI + 1), q_idx=torch.arange(3))
    with pytest.raises(KeyError, match="expected a symbol among"):
        ev(sympy.Symbol("zz") + 1, q_idx=1)


@settings(max_examples=200, deadline=None)
@given(st.integers(-1000, 1000), st.integers(-50, 50).filter(lambda x: x != 0), st.integers(0, 7))
def test_evaluator_integer_division_matches_python(a, b, c):
    ta, tb = torch.tensor([a]), torch.tensor([b])
    assert int(ev(sympy.floor((QI + c) / KJ), q_idx=ta, kv_idx=tb)) == (a + c) // b
    assert int(ev(sympy.ceiling(QI / KJ), q_idx=ta, kv_idx=tb)) == -(-a // b)
    assert int(ev(sympy.Mod(QI + c, KJ), q_idx=ta, kv_idx=tb)) == (a + c) % b
    assert ev(sympy.floor(QI / KJ), q_idx=a, kv_idx=b) == a // b
    assert ev(sympy.Mod(QI, KJ), q_idx=a, kv_idx=b) == a % b


# ------------------------------------------------------------------------------------ validation


def test_input_validation():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="expected head_dim 32"):
        reference_attention(q, k, v, make_ir(D=32))
    with pytest.raises(ValueError, match="expected head_dim_v 8"):
        reference_attention(q, k, v, make_ir(DV=8))
    with pytest.raises(ValueError, match="expected the key/value heads to divide"):
        reference_attention(q, k[:, :2], v[:, :2], make_ir())
    with pytest.raises(ValueError, match="expected q as a 4-d tensor"):
        reference_attention(q[0], k, v, make_ir())
    with pytest.raises(ValueError, match="expected buffer 'slopes'"):
        reference_attention(q, k, v, make_ir(score=SCORE + sympy.Indexed(SLOPES, SH),
                                             buffers=(BufferInfo("slopes", 1, "float"),)))
    with pytest.raises(TypeError, match="expected an int or bool tensor"):
        reference_attention(q, k, v, make_ir(buffers=(BufferInfo("doc", 1, "int"),)), buffers={"doc": torch.ones(3)})
    with pytest.raises(ValueError, match="expected dropout_p in"):
        reference_attention(q, k, v, make_ir(), dropout_p=1.0)
    with pytest.raises(TypeError, match="expected an AttentionIR"):
        reference_attention(q, k, v, None)  # type: ignore[arg-type]


def test_error_ratio_check_all_zero_reference_uses_the_absolute_bound():
    ref = torch.zeros(4, 4, dtype=torch.float64)
    eager = torch.zeros(4, 4, dtype=torch.float64)
    ok, msg = error_ratio_check(ref + 3e-7, ref, eager)
    assert ok, msg
    ok, msg = error_ratio_check(ref + 1e-2, ref, eager)
    assert not ok, msg
