"""Tracing, AttentionSpec validation and presets (CPU only)."""
from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attncompiler.spec import (
    AttentionSpec, SpecError, TraceError, TracedSpec, ops, presets, trace_mask_mod, trace_score_mod,
)
from attncompiler.spec.spec import causal_mask_expr
from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE
from attncompiler.spec.trace import Sym, Tracer

GLOBAL_BIAS = torch.randn(4, 32)
_private_table = torch.arange(8.0)
SLOPES = presets.alibi_slopes(4)
DOCS = presets.document_ids(32, 4)


def ib(name: str) -> sympy.IndexedBase:
    return sympy.IndexedBase(name)


def same_expr(a: sympy.Basic, b: sympy.Basic) -> bool:
    return a == b or sympy.simplify(a - b) == 0


def same_mask(a: sympy.Basic, b: sympy.Basic, buffers: dict[str, np.ndarray] | None = None, n: int = 24) -> bool:
    """Boolean expressions agree on a (q_idx, kv_idx) grid (q_len = kv_len = n), b = 0, h in 0..3."""
    return bool(np.array_equal(eval_expr(a, buffers, n), eval_expr(b, buffers, n)))


def eval_expr(e: sympy.Basic, buffers: dict[str, np.ndarray] | None = None, n: int = 24,
              score: np.ndarray | None = None) -> np.ndarray:
    buffers = buffers or {}
    bases = [ib(k) for k in buffers]
    f = sympy.lambdify([SCORE, B, H, Q_IDX, KV_IDX, Q_LEN, KV_LEN, *bases], e, "numpy")
    h, q, kv = np.meshgrid(np.arange(4), np.arange(n), np.arange(n), indexing="ij")  # full shapes: lambdify
    s = np.zeros((4, n, n)) if score is None else np.broadcast_to(score, (4, n, n))  # And/Or reduce needs them
    return np.broadcast_to(f(s, np.zeros_like(h), h, q, kv, n, n, *buffers.values()), (4, n, n))


# ----------------------------------------------------------------------------------- presets
PRESET_CASES = [
    ("plain", lambda: presets.plain(64), None, None, {}),
    ("causal", lambda: presets.causal(64), None, causal_mask_expr(), {}),
    ("sliding_window", lambda: presets.sliding_window(5, head_dim=64), None,
     sympy.And(Q_IDX >= KV_IDX, Q_IDX - KV_IDX <= 5), {}),
    ("alibi", lambda: presets.alibi(SLOPES, head_dim=64), SCORE + ib("slopes")[H] * (KV_IDX - Q_IDX), None,
     {"slopes": SLOPES}),
    ("alibi_causal", lambda: presets.alibi(SLOPES, head_dim=64, causal=True),
     SCORE + ib("slopes")[H] * (KV_IDX - Q_IDX), causal_mask_expr(), {"slopes": SLOPES}),
    ("softcap", lambda: presets.softcap(30.0, head_dim=64), 30 * sympy.tanh(SCORE / 30), None, {}),
    ("prefix_lm", lambda: presets.prefix_lm(7, head_dim=64), None, sympy.Or(KV_IDX < 7, Q_IDX >= KV_IDX), {}),
    ("document", lambda: presets.document(DOCS, head_dim=64), None,
     sympy.Eq(ib("doc_ids")[Q_IDX], ib("doc_ids")[KV_IDX]), {"doc_ids": DOCS}),
]


@pytest.mark.parametrize("name,make,score,mask,bufs", PRESET_CASES, ids=[c[0] for c in PRESET_CASES])
def test_preset_traces_to_expected_expression(name, make, score, mask, bufs):
    t0 = time.perf_counter()
    tr = make().trace()
    assert time.perf_counter() - t0 < 1.0  # milliseconds in practice
    assert isinstance(tr, TracedSpec)
    if score is None:
        assert tr.score_expr is None
    else:
        assert same_expr(tr.score_expr, score), tr.score_expr
    if mask is None:
        assert tr.mask_expr is None
    else:
        np_bufs = {k: v.numpy() for k, v in bufs.items()}
        assert same_mask(tr.mask_expr, mask, np_bufs), tr.mask_expr
    assert set(tr.buffer_values) == set(bufs)
    for k, v in bufs.items():
        assert tr.buffer_values[k] is v


def test_preset_mask_exact_forms():
    assert presets.sliding_window(5, 64).trace().mask_expr == sympy.And(Q_IDX >= KV_IDX, Q_IDX - KV_IDX <= 5)
    assert presets.prefix_lm(7, 64).trace().mask_expr == sympy.Or(KV_IDX < 7, Q_IDX >= KV_IDX)
    doc = presets.document(DOCS, 64).trace().mask_expr
    assert isinstance(doc, sympy.Eq)


MOD_CASES = [
    ("alibi", presets.alibi_score_mod(SLOPES), "score"),
    ("softcap", presets.softcap_score_mod(20.0), "score"),
    ("sliding_window", presets.sliding_window_mask(6), "mask"),
    ("prefix_lm", presets.prefix_lm_mask(5), "mask"),
    ("document", presets.document_mask(DOCS), "mask"),
    ("causal_mask", presets.causal_mask, "mask"),
    ("and_masks", presets.and_masks(presets.document_mask(DOCS), presets.sliding_window_mask(4)), "mask"),
    ("or_masks", presets.or_masks(presets.prefix_lm_mask(3), presets.causal_mask), "mask"),
]


@pytest.mark.parametrize("name,mod,kind", MOD_CASES, ids=[c[0] for c in MOD_CASES])
def test_mods_eager_on_tensors_match_traced(name, mod, kind):
    n = 32
    torch.manual_seed(0)
    score = torch.randn(1, 4, n, n, dtype=torch.float64) * 10
    b = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    h = torch.arange(4).view(1, 4, 1, 1)
    q = torch.arange(n).view(1, 1, n, 1)
    kv = torch.arange(n).view(1, 1, 1, n)
    if kind == "score":
        eager = mod(score, b, h, q, kv)
        expr, bufs = trace_score_mod(mod)
    else:
        eager = mod(b, h, q, kv)
        expr, bufs = trace_mask_mod(mod)
    traced = eval_expr(expr, {k: v.numpy() for k, v in bufs}, n, score[0].numpy())
    eager = np.broadcast_to(eager[0].numpy(), (4, n, n))
    if kind == "score":
        np.testing.assert_allclose(traced, eager, rtol=1e-6, atol=1e-6)
    else:
        assert eager.dtype == np.bool_
        np.testing.assert_array_equal(traced, eager)


# ----------------------------------------------------------------------------------- tracing
@pytest.mark.parametrize("fn", [
    lambda s, b, h, q, kv: 10 * torch.tanh(s / 10),
    lambda s, b, h, q, kv: 10 * ops.tanh(s / 10),
    lambda s, b, h, q, kv: 10 * (s / 10).tanh(),
    lambda s, b, h, q, kv: 10 * sympy.tanh(s / 10),
], ids=["torch", "ops", "method", "sympy"])
def test_tanh_spellings_trace_alike(fn):
    expr, bufs = trace_score_mod(fn)
    assert expr == 10 * sympy.tanh(SCORE / 10)
    assert bufs == []


def test_operators():
    s, q, kv = Sym(SCORE), Sym(Q_IDX), Sym(KV_IDX)
    assert isinstance((q == kv).expr, sympy.Eq)
    assert isinstance((q != kv).expr, sympy.Ne)
    assert (q // 2).expr == sympy.floor(Q_IDX / 2)
    assert (q % 3).expr == sympy.Mod(Q_IDX, 3)
    assert (q / 2).expr == Q_IDX * sympy.Rational(1, 2)  # true division, not C integer division
    assert (7 - q).expr == 7 - Q_IDX and (2 ** q).expr == 2 ** Q_IDX and (-s).expr == -SCORE
    assert abs(q - kv).expr == sympy.Abs(Q_IDX - KV_IDX)
    assert ((q >= kv) & (q < 5)).expr == sympy.And(Q_IDX >= KV_IDX, Q_IDX < 5)
    assert ((q >= kv) | (kv < 5)).expr == sympy.Or(Q_IDX >= KV_IDX, KV_IDX < 5)
    assert (~(q >= kv)).expr == (Q_IDX < KV_IDX)
    assert (s * 0.5).expr == SCORE * sympy.Float(0.5)
    assert ((q >= kv) * s).expr == SCORE * sympy.Piecewise((1, Q_IDX >= KV_IDX), (0, True))
    assert isinstance(torch.where(q >= kv, s, -float("inf")).expr, sympy.Piecewise)
    assert torch.clamp(s, min=-1, max=1).expr == sympy.Min(sympy.Max(SCORE, -1), 1)
    assert torch.maximum(s, q).expr == sympy.Max(SCORE, Q_IDX)
    assert torch.sigmoid(s).expr == 1 / (1 + sympy.exp(-SCORE))


def test_ops_dispatch_numbers_sympy_tensors():
    assert ops.tanh(0.5) == pytest.approx(math.tanh(0.5))
    assert ops.sigmoid(-800.0) == pytest.approx(0.0) and ops.sigmoid(0.0) == 0.5
    assert ops.where(True, 1, 2) == 1 and ops.min(3, 4) == 3 and ops.clamp(5, 0, 2) == 2
    assert ops.exp(SCORE) == sympy.exp(SCORE) and ops.max(SCORE, 1) == sympy.Max(SCORE, 1)
    t = torch.tensor([-2.0, 0.0, 3.0])
    assert torch.equal(ops.clamp(t, -1, 1), torch.tensor([-1.0, 0.0, 1.0]))
    assert torch.equal(ops.max(t, 0.5), torch.tensor([0.5, 0.5, 3.0]))
    assert torch.equal(ops.where(t > 0, t, 0.0), torch.tensor([0.0, 0.0, 3.0]))
    assert torch.allclose(ops.sigmoid(t), torch.sigmoid(t))
    assert isinstance(ops.sqrt(Sym(SCORE)), Sym)
    assert set(ops.__all__) >= {"tanh", "exp", "log", "abs", "min", "max", "where", "sqrt", "sigmoid", "clamp"}


def test_mask_simplification_is_cheap_and_sound():
    expr, _ = trace_mask_mod(lambda b, h, q, kv: (q >= kv) & ~(q < kv) & ((q >= kv) | (kv < 3)))
    assert expr == (Q_IDX >= KV_IDX)
    expr, _ = trace_mask_mod(lambda b, h, q, kv: True)
    assert expr is sympy.true


# ----------------------------------------------------------------------------------- buffers
def test_buffer_by_closure_multi_dim():
    bias = torch.randn(4, 32)
    expr, bufs = trace_score_mod(lambda s, b, h, q, kv: s + bias[h, kv - q])
    assert expr == SCORE + ib("bias")[H, KV_IDX - Q_IDX]
    assert bufs == [("bias", bias)]


def test_buffer_by_global_and_chained_index():
    expr, bufs = trace_score_mod(lambda s, b, h, q, kv: s + GLOBAL_BIAS[h][kv])
    assert expr == SCORE + ib("GLOBAL_BIAS")[H, KV_IDX]
    assert bufs[0][0] == "GLOBAL_BIAS" and bufs[0][1] is GLOBAL_BIAS


def test_buffer_name_sanitized():
    _, bufs = trace_score_mod(lambda s, b, h, q, kv: s + _private_table[h])
    assert bufs[0][0] == "buf_private_table"
    exp = torch.ones(4)  # noqa: F841 - a reserved name (C/math function)
    _, bufs = trace_score_mod(lambda s, b, h, q, kv: s + exp[h])
    assert bufs[0][0] == "exp_buf"


def test_buffer_default_argument_and_nested_helper_and_dedupe():
    def make_helper():
        table = torch.zeros(4)
        return lambda h: table[h]

    helper = make_helper()  # a helper whose closure captures another tensor named `table`
    table = torch.arange(4.0)

    def mod(s, b, h, q, kv, extra=torch.ones(32)):
        return s + helper(h) + extra[kv] + table[h]

    expr, bufs = trace_score_mod(mod)
    assert sorted(n for n, _ in bufs) == ["extra", "table", "table_1"]
    assert any(t is table for _, t in bufs) and dict(bufs)["extra"].shape == (32,)
    assert expr.has(ib("table")[H]) and expr.has(ib("table_1")[H]) and expr.has(ib("extra")[KV_IDX])


def test_tensor_created_inside_mod_is_an_anonymous_buffer():
    expr, bufs = trace_score_mod(lambda s, b, h, q, kv: s + torch.arange(4.0)[h])
    assert expr == SCORE + ib("buffer0")[H] and bufs[0][1].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_same_tensor_twice_one_buffer_and_unused_not_listed():
    t = torch.arange(32)
    u = torch.arange(5)  # noqa: F841
    expr, bufs = trace_mask_mod(lambda b, h, q, kv: t[q] == t[kv])
    assert [n for n, _ in bufs] == ["t"]


def test_explicit_buffers_take_precedence():
    captured = torch.ones(4)
    given_ = torch.full((4,), 2.0)

    def mod(s, b, h, q, kv):
        return s + captured[h]

    expr, bufs = trace_score_mod(mod, buffers={"captured": given_})
    assert bufs == [("captured", given_)]
    # a name the function does not define at all is supplied by the explicit buffers
    expr, bufs = trace_score_mod(lambda s, b, h, q, kv: s + undefined_table[h], buffers={"undefined_table": given_})  # noqa: F821
    assert expr == SCORE + ib("undefined_table")[H]
    # identity: a captured tensor that *is* an explicit buffer takes the explicit name
    expr, bufs = trace_score_mod(mod, buffers={"scales": captured})
    assert bufs == [("scales", captured)]


def test_anonymous_bool_and_scalar_buffers():
    class Holder:
        bias = torch.randn(4)

    obj = Holder()
    keep = torch.ones(32, 32, dtype=torch.bool)
    temp = torch.tensor(0.5)
    expr, bufs = trace_score_mod(lambda s, b, h, q, kv: s * temp + obj.bias[h])
    assert expr == SCORE * ib("temp")[0] + ib("buffer0")[H]
    assert dict(bufs)["temp"].shape == (1,)
    expr, bufs = trace_mask_mod(lambda b, h, q, kv: keep[q, kv] & (q >= kv))
    assert expr == sympy.And(sympy.Ne(ib("keep")[Q_IDX, KV_IDX], 0), Q_IDX >= KV_IDX)


def test_tensor_on_the_left_of_operators():
    t = torch.tensor(2.0)
    assert trace_score_mod(lambda s, b, h, q, kv: t - s)[0] == ib("t")[0] - SCORE
    assert trace_score_mod(lambda s, b, h, q, kv: t / s)[0] == ib("t")[0] / SCORE
    assert trace_score_mod(lambda s, b, h, q, kv: (t > s) * s)[0] == SCORE * sympy.Piecewise((1, SCORE < ib("t")[0]), (0, True))


def test_partial_and_method_mods():
    bias = torch.randn(4)

    def mod(s, b, h, q, kv, c):
        return s * c + bias[h]

    expr, bufs = trace_score_mod(functools.partial(mod, c=2))
    assert expr == 2 * SCORE + ib("bias")[H] and bufs[0][0] == "bias"

    class M:
        def __init__(self):
            self.w = torch.randn(4)

        def mod(self, s, b, h, q, kv):
            return s + self.w[h]

    expr, _ = trace_score_mod(M().mod)
    assert expr == SCORE + ib("buffer0")[H]


def test_spec_shares_buffer_names_between_mods():
    t = torch.arange(32)
    spec = AttentionSpec(64, score_mod=lambda s, b, h, q, kv: s + t[kv], mask_mod=lambda b, h, q, kv: t[q] >= t[kv])
    tr = spec.trace()
    assert [b.name for b in tr.buffers] == ["t"]
    assert tr.buffers[0].kind == "int" and tr.buffers[0].ndim == 1


# ----------------------------------------------------------------------------------- errors
def _err(fn, *args, **kw) -> str:
    with pytest.raises(SpecError) as ei:
        fn(*args, **kw)
    return str(ei.value)


def test_error_if_on_symbol():
    def mod(s, b, h, q, kv):
        if q >= kv:
            return s
        return s - 1

    msg = _err(trace_score_mod, mod)
    assert "Python control flow" in msg and "bool()" in msg and "q_idx >= kv_idx" in msg and "where" in msg
    assert "mod" in msg  # names the mod
    msg = _err(trace_mask_mod, lambda b, h, q, kv: q >= kv and kv < 4)
    assert "Python control flow" in msg


def test_error_mask_returning_number_and_score_returning_bool():
    msg = _err(trace_mask_mod, lambda b, h, q, kv: kv - q)
    assert "mask_mod must return a boolean, got expression kv_idx - q_idx of type Add" in msg
    msg = _err(trace_mask_mod, lambda b, h, q, kv: 1)
    assert "mask_mod must return a boolean" in msg
    msg = _err(trace_score_mod, lambda s, b, h, q, kv: q >= kv)
    assert "score_mod must return a number" in msg and "q_idx >= kv_idx" in msg


def test_error_wrong_arity():
    msg = _err(trace_score_mod, lambda s, b: s)
    assert "score_mod must take (score, b, h, q_idx, kv_idx), got (s, b)" in msg
    msg = _err(trace_mask_mod, lambda s, b, h, q, kv: True)
    assert "mask_mod must take (b, h, q_idx, kv_idx), got (s, b, h, q, kv)" in msg
    assert isinstance(trace_mask_mod(lambda *a: a[2] >= a[3])[0], sympy.GreaterThan)


def test_error_unknown_symbols_exceptions_and_bad_returns():
    x = sympy.Symbol("x")
    assert "unknown symbols ['x']" in _err(trace_score_mod, lambda s, b, h, q, kv: s + x)
    msg = _err(trace_score_mod, lambda s, b, h, q, kv: s + {}["k"])
    assert "raised KeyError" in msg and "<lambda>" in msg
    bias = torch.randn(4, 4)
    assert "returned a torch.Tensor" in _err(trace_score_mod, lambda s, b, h, q, kv: torch.zeros(3))
    assert "must be indexed" in _err(trace_score_mod, lambda s, b, h, q, kv: s + bias)
    assert "expected at most 2 indices, got 3" in _err(trace_score_mod, lambda s, b, h, q, kv: bias[h, q, kv])
    assert "slicing is not supported" in _err(trace_score_mod, lambda s, b, h, q, kv: bias[h, :].sum())
    assert "expected a constant index in [0, 4) for dim 1, got 4" in _err(
        trace_score_mod, lambda s, b, h, q, kv: bias[h, 4])
    assert "got -1" in _err(trace_score_mod, lambda s, b, h, q, kv: bias[h, -1])
    assert "returned None" in _err(trace_score_mod, lambda s, b, h, q, kv: None)
    assert "unsupported value" in _err(trace_score_mod, lambda s, b, h, q, kv: "s")
    assert "math.* functions" in _err(trace_score_mod, lambda s, b, h, q, kv: math.tanh(s))
    assert "not supported on traced values" in _err(trace_score_mod, lambda s, b, h, q, kv: torch.cumsum(s, 0))
    assert "division by zero" in _err(trace_score_mod, lambda s, b, h, q, kv: s / 0)
    assert isinstance(TraceError("x"), ValueError)


# ----------------------------------------------------------------------------------- spec
@pytest.mark.parametrize("given_,want", [
    ("bf16", "bf16"), ("bfloat16", "bf16"), (torch.bfloat16, "bf16"), ("BF16", "bf16"),
    ("fp16", "fp16"), ("float16", "fp16"), (torch.float16, "fp16"),
])
def test_dtype_normalized(given_, want):
    assert AttentionSpec(64, dtype=given_).dtype == want


@pytest.mark.parametrize("kw,expect", [
    (dict(head_dim=100), ["head_dim", "multiple of 8 in [8, 256]", "got 100", "104"]),
    (dict(head_dim=300), ["head_dim", "multiple of 8 in [8, 256]", "got 300"]),
    (dict(head_dim=0), ["head_dim", "got 0"]),
    (dict(head_dim=64.0), ["head_dim", "got 64.0"]),
    (dict(head_dim=64, head_dim_v=12), ["head_dim_v", "got 12"]),
    (dict(head_dim=64, dtype="fp32"), ["dtype", "expected one of", "got 'fp32'"]),
    (dict(head_dim=64, dtype=torch.float32), ["dtype", "got torch.float32"]),
    (dict(head_dim=64, dropout_p=1.0), ["dropout_p", "expected a probability in [0, 1)", "got 1.0"]),
    (dict(head_dim=64, dropout_p=-0.1), ["dropout_p", "got -0.1"]),
    (dict(head_dim=64, scale=0.0), ["scale", "expected a finite float > 0", "got 0.0"]),
    (dict(head_dim=64, scale=float("inf")), ["scale", "got inf"]),
    (dict(head_dim=64, causal=1), ["causal", "expected True or False", "got 1"]),
    (dict(head_dim=64, score_mod=3), ["score_mod", "expected a callable", "got int"]),
    (dict(head_dim=64, mask_mod="x"), ["mask_mod", "expected a callable", "got str"]),
    (dict(head_dim=64, buffers={"score": torch.ones(2)}), ["buffer name", "got 'score'"]),
    (dict(head_dim=64, buffers={"ok": [1, 2]}), ["buffers['ok']", "expected a torch.Tensor", "got list"]),
    (dict(head_dim=64, name=""), ["name", "non-empty"]),
])
def test_spec_validation_errors(kw, expect):
    msg = _err(AttentionSpec, **kw)
    for part in expect:
        assert part in msg, (part, msg)


def test_spec_defaults_hash_with_and_cache():
    s = AttentionSpec(64)
    assert s.head_dim_v == 64 and s.dtype == "bf16" and s.scale is None
    assert s.softmax_scale == pytest.approx(1 / 8)
    assert AttentionSpec(64, scale=0.5).softmax_scale == 0.5
    t = torch.ones(4)
    a = AttentionSpec(64, buffers={"x": t})
    assert a == AttentionSpec(64) and hash(a) == hash(AttentionSpec(64))  # buffers excluded
    assert a.buffers == (("x", t),)
    s2 = s.with_(head_dim=128)
    assert s2.head_dim_v == 128 and s2.softmax_scale == pytest.approx(128 ** -0.5)
    assert AttentionSpec(64, head_dim_v=32).with_(head_dim=128).head_dim_v == 32
    assert s.trace() is s.trace()
    with pytest.raises(Exception):
        s.head_dim = 32  # frozen


def test_trace_folds_causal_and_normalizes_identity():
    spec = AttentionSpec(64, causal=True, mask_mod=presets.sliding_window_mask(8), score_mod=lambda s, b, h, q, kv: s)
    tr = spec.trace()
    assert tr.score_expr is None
    assert tr.mask_expr == sympy.And(sympy.Ge(Q_IDX + KV_LEN - Q_LEN, KV_IDX), Q_IDX >= KV_IDX, Q_IDX - KV_IDX <= 8)
    assert AttentionSpec(64, mask_mod=lambda b, h, q, kv: True).trace().mask_expr is None
    assert tr.spec is spec and tr.scale == pytest.approx(0.125)


def test_traced_buffer_infos():
    tr = presets.alibi(SLOPES, 64, mask_mod=presets.document_mask(DOCS)).trace()
    kinds = {b.name: (b.kind, b.ndim) for b in tr.buffers}
    assert kinds == {"slopes": ("float", 1), "doc_ids": ("int", 1)}
    assert tr.buffer_values["slopes"] is SLOPES


# ----------------------------------------------------------------------------------- presets API
def test_preset_fields_and_conflicts():
    s = presets.alibi(SLOPES, head_dim=128, causal=True, dtype="fp16")
    assert s.causal and s.dtype == "fp16" and s.name == "alibi" and s.score_mod is not None
    assert presets.causal(64, name="mine").name == "mine"
    msg = _err(presets.softcap, 30.0, 64, score_mod=lambda s, b, h, q, kv: s)
    assert "expected no `score_mod`" in msg and "and_masks" in msg
    assert "expected a 1-D floating torch.Tensor" in _err(presets.alibi, torch.arange(4), 64)
    assert "expected a 1-D integer torch.Tensor" in _err(presets.document, torch.ones(4), 64)
    assert "expected an int >= 0" in _err(presets.sliding_window, -1, 64)
    assert "expected a finite number > 0" in _err(presets.softcap, 0.0, 64)


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_get_preset_zero_config(name):
    spec = presets.get_preset(name, head_dim=64, dtype="fp16", num_heads=8, seqlen=256)
    assert spec.head_dim == 64 and spec.dtype == "fp16" and spec.name == name
    spec.trace()


def test_get_preset_defaults_and_unknown():
    slopes = presets.get_preset("alibi", num_heads=8).trace().buffer_values["slopes"]
    assert slopes.dtype == torch.float32
    torch.testing.assert_close(slopes, torch.tensor([2.0 ** (-(i + 1)) for i in range(8)]))
    docs = presets.get_preset("document", seqlen=16).trace().buffer_values["doc_ids"]
    assert docs.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert presets.get_preset("sliding_window").trace().mask_expr.has(sympy.Integer(256))
    assert presets.get_preset("prefix_lm", seqlen=400).trace().mask_expr.has(sympy.Integer(100))
    assert presets.get_preset("alibi", causal=True).causal
    msg = _err(presets.get_preset, "nope")
    assert "unknown preset 'nope'; expected one of [" in msg and "'alibi'" in msg


# ----------------------------------------------------------------------------------- properties
_INT_OPS = [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b,
    lambda a, b: a // (abs(b) + 1), lambda a, b: a % (abs(b) + 1),
]


@st.composite
def _int_program(draw):
    return [(draw(st.integers(0, len(_INT_OPS) - 1)), draw(st.integers(0, 3)), draw(st.integers(-5, 5)))
            for _ in range(draw(st.integers(1, 5)))]


def _run_program(prog, q, kv):
    vals = [q, kv]
    for op, src, const in prog:
        vals.append(_INT_OPS[op](vals[src % len(vals)], vals[-1] + const))
    return vals[-1]


@settings(max_examples=40, deadline=None)
@given(_int_program(), st.integers(-3, 3))
def test_integer_arithmetic_semantics_match_torch(prog, thr):
    mask = lambda b, h, q, kv: _run_program(prog, q, kv) >= thr  # noqa: E731
    expr, _ = trace_mask_mod(mask)
    n = 12
    q, kv = torch.arange(n).view(n, 1), torch.arange(n).view(1, n)
    eager = torch.broadcast_to(torch.as_tensor(mask(0, 0, q, kv)), (n, n)).numpy()
    traced = eval_expr(expr, None, n)[0]
    np.testing.assert_array_equal(traced, eager)


def test_tracer_reuse_across_mods():
    tr = Tracer()
    t = torch.arange(4.0)
    tr.trace_score(lambda s, b, h, q, kv: s + t[h])
    tr.trace_mask(lambda b, h, q, kv: t[h] > 0)
    assert [n for n, _ in tr.buffers] == ["t"]


@pytest.mark.parametrize("prog, thr", [
    ([(0, 3, -2), (4, 2, -5), (0, 0, -1)], -3),  # sympy's Mod evaluation recursed without end
    ([(1, 0, 3), (1, 1, 5), (2, 3, 3), (4, 3, 1), (3, 0, -3)], 0),  # and Abs of such a Mod
])
def test_integer_programs_that_recurse_in_sympy_trace_and_match(prog, thr):
    mask = lambda b, h, q, kv: _run_program(prog, q, kv) >= thr  # noqa: E731
    expr, _ = trace_mask_mod(mask)
    n = 12
    q, kv = torch.arange(n).view(n, 1), torch.arange(n).view(1, n)
    eager = torch.broadcast_to(torch.as_tensor(mask(0, 0, q, kv)), (n, n)).numpy()
    np.testing.assert_array_equal(eval_expr(expr, None, n)[0], eager)
