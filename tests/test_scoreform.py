"""ir/scoreform.py: the positive-factor and separable shapes of log2(e) * score_mod(acc * scale), and the
hooks printed from them (CPU)."""
from __future__ import annotations

import math
import random

import pytest
import sympy
import torch

import attncompiler as ac
from attncompiler.codegen import hooks
from attncompiler.ir.build import build_ir
from attncompiler.ir.scoreform import DIST_KV, DIST_Q, Q_REF, q_scale_form, score_form
from attncompiler.spec import presets
from attncompiler.spec.symbols import B, H, KV_IDX, Q_IDX

SLOPES = presets.alibi_slopes(4)
KEY_BIAS = torch.linspace(-1.0, 1.0, 64)
HEAD_SCALE = torch.linspace(-1.0, 1.0, 4)

MODS = {
    "alibi": (presets.alibi_score_mod(SLOPES), "linear"),
    "linear_numeric": (lambda s, b, h, q, kv: s - 0.03 * (q - kv), "linear"),
    "linear_head": (lambda s, b, h, q, kv: 0.5 * s + (h + 1) * 0.01 * kv - 0.02 * q, "linear"),
    "key_buffer": (lambda s, b, h, q, kv: s + KEY_BIAS[kv], "separable"),
    "key_square": (lambda s, b, h, q, kv: s + 0.001 * kv * kv, "separable"),
    "row_only": (lambda s, b, h, q, kv: s + 0.001 * q * q, "separable"),
    "softcap": (presets.softcap_score_mod(30.0), "factor"),
    "relative_bias": (presets.relative_bias_score_mod(torch.randn(4, 9)), "generic"),
    "q_times_kv": (lambda s, b, h, q, kv: s + 1e-6 * q * kv, "generic"),
    "plain_scale": (lambda s, b, h, q, kv: 2.0 * s, "factor"),
}


def _form(name):
    fn, _ = MODS[name]
    spec = ac.AttentionSpec(head_dim=64, score_mod=fn, name=name)
    ir = build_ir(spec)
    expr = hooks._score_log2_sympy(ir)
    return spec.trace().buffer_values, expr, score_form(expr, hooks._ACC)


def _numeric(expr, tensors, vals):
    """expr at the given symbol values, buffer reads evaluated from the captured tensors."""

    def read(e):
        if isinstance(e, sympy.Indexed):
            idx = tuple(int(read(i)) for i in e.indices)
            return sympy.Float(float(tensors[str(e.base)][idx]))
        if e.args:
            return e.func(*[read(a) for a in e.args])
        return e
    return float(read(expr.subs(vals)).evalf())


@pytest.mark.parametrize("name", sorted(MODS))
def test_shape(name):
    _, _, form = _form(name)
    kind = MODS[name][1]
    assert form.separable == (kind in ("linear", "separable"))
    assert (form.col_slope is not None) == (kind == "linear")
    assert (form.factor != 1) == (kind == "factor")
    if kind == "factor":
        assert form.factor.is_positive


@pytest.mark.parametrize("name", sorted(MODS))
def test_forms_equal_the_expression(name):
    """factor * inner == E, and for separable forms coef * acc + col + row == E for any q_ref, at random
    points (the identity the kernels rely on)."""
    tensors, expr, form = _form(name)
    rng = random.Random(hash(name) % 1000)
    for _ in range(20):
        vals = {hooks._ACC: rng.uniform(-20, 20), hooks._SCALE: rng.uniform(0.05, 0.5), B: rng.randrange(2),
                H: rng.randrange(4), Q_IDX: rng.randrange(64), KV_IDX: rng.randrange(64)}
        want = _numeric(expr, tensors, vals)
        assert math.isclose(_numeric(form.factor * form.inner, tensors, vals), want, rel_tol=1e-9, abs_tol=1e-9)
        if form.separable:
            qref = rng.randrange(64)
            v2 = dict(vals)
            v2.update({Q_REF: qref, DIST_KV: vals[KV_IDX] - qref, DIST_Q: qref - vals[Q_IDX]})
            got = _numeric(form.coef * hooks._ACC + form.col + form.row, tensors, v2)
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-7), (got, want)


def test_alibi_hooks_use_integer_distances():
    """ALiBi's column and row terms are slope * (kv - q_ref) and slope * (q_ref - q), each distance formed
    in integers (no large cancelling float magnitudes)."""
    text = hooks.render_prelude(build_ir(presets.alibi(SLOPES, 64)))
    assert "kScoreSeparable = true" in text and "kScoreSepLinear = true" in text
    assert "const int ac_dkv = kv_idx - q_ref;" in text and "const int ac_dq = q_ref - q_idx;" in text
    assert "score_sep_coef(int b, int h, const AttnParams& p, const AttnBuffers& buf) { return 1.442695f * p.scale; }" \
        in text


@pytest.mark.parametrize("mod, positive", [
    (lambda s, b, h, q, kv: s + 0.03 * (kv - q), True),           # ALiBi-like: coef = log2(e) * scale
    (lambda s, b, h, q, kv: 0.5 * s + KEY_BIAS[kv], True),        # non-linear column term
    (lambda s, b, h, q, kv: 0.02 * kv - 0.5 * s, False),          # negative coefficient
    (lambda s, b, h, q, kv: s * HEAD_SCALE[h] + 0.01 * kv, False),  # a buffer's sign sympy cannot prove
    (lambda s, b, h, q, kv: 3.0 * torch.tanh(s / 3.0), False),     # not separable
])
def test_separable_coef_sign_hook(mod, positive):
    """kScoreSepCoefPositive (the v3 forward then starts the S GEMM from col / coef) only where sympy
    proves the score's coefficient positive for every input."""
    text = hooks.render_prelude(build_ir(ac.AttentionSpec(head_dim=64, score_mod=mod, name="m")))
    assert f"kScoreSepCoefPositive = {'true' if positive else 'false'}" in text


def test_softcap_factor_hook():
    text = hooks.render_prelude(build_ir(presets.softcap(30.0, 64)))
    assert "kScoreLog2Factor = 43.28085f" in text
    assert "return ac_tanhf(0.033333335f * p.scale * s);" in text
    assert "kScoreSeparable = false" in text


def test_no_score_mod_defaults():
    text = hooks.render_prelude(build_ir(presets.causal(64)))
    assert "kScoreLog2Factor = 1.0f" in text and "kScoreSeparable = false" in text


ACC = sympy.Symbol("ac_acc", real=True)
SC = sympy.Symbol("aa_scale", positive=True)
ALLOWED = frozenset({SC, B, H})


@pytest.mark.parametrize("inner, c, g", [
    (sympy.tanh(SC * ACC / 30), SC / 30, sympy.tanh(ACC)),                       # softcap
    (sympy.tanh(SC * ACC / (30 + H)), SC / (30 + H), sympy.tanh(ACC)),           # a cap per head
    (sympy.tanh(SC * ACC / 30) + SC * ACC / 30, SC / 30, ACC + sympy.tanh(ACC)),
    (sympy.tanh(SC * ACC / 30) ** 2 + KV_IDX * sympy.sin(SC * ACC / 30), SC / 30,
     sympy.tanh(ACC) ** 2 + KV_IDX * sympy.sin(ACC)),                          # positions may sit outside c
])
def test_q_scale_form_finds_the_inner_scale(inner, c, g):
    """inner = G(c * acc): c and G, and G(c * acc) is inner again."""
    got = q_scale_form(inner, ACC, ALLOWED)
    assert got is not None
    assert sympy.simplify(got[0] - c) == 0 and sympy.simplify(got[1] - g) == 0
    assert sympy.simplify(got[1].subs(ACC, got[0] * ACC) - inner) == 0


@pytest.mark.parametrize("inner", [
    SC * ACC,                                    # the identity: the plain softmax already folds the scale
    sympy.tanh(SC * ACC * Q_IDX),                # c depends on the query position
    sympy.tanh(SC * ACC / (1 + KV_IDX)),         # ... or the key position
    sympy.tanh(SC * ACC) + ACC ** 2,             # acc outside c * acc
    sympy.tanh(sympy.Function("buf")(H) * ACC),  # c reads a buffer
    sympy.Integer(3) + Q_IDX,                    # no acc at all
])
def test_q_scale_form_refuses(inner):
    assert q_scale_form(inner, ACC, ALLOWED) is None


def test_q_scale_hooks():
    """softcap prints c = scale / cap and G = tanh; ALiBi (separable) and plain take no Q scale."""
    src = hooks.render_prelude(build_ir(presets.softcap(30.0, 128)))
    assert "static constexpr bool kScoreQScale = true;" in src
    assert "{ return 0.033333335f * p.scale; }" in src
    assert "return ac_tanhf(s);" in src
    for spec in (presets.alibi(SLOPES, 128), presets.plain(128)):
        assert "static constexpr bool kScoreQScale = false;" in hooks.render_prelude(build_ir(spec))
    assert hooks.q_scale_of(build_ir(presets.alibi(SLOPES, 128))) is None


def test_q_scale_of_a_cap_per_head():
    """A cap that depends on the head: c = scale / (20 (h + 1)); G keeps its own use of h."""
    spec = ac.AttentionSpec(head_dim=128, score_mod=lambda s, b, h, q, kv: 20 * (h + 1) * torch.tanh(s / (20 * (h + 1))),
                            name="cap_per_head")
    c, g = hooks.q_scale_of(build_ir(spec))
    assert sympy.simplify(c - hooks._SCALE / (20 * (H + 1))) == 0
    assert H in g.free_symbols and hooks._SCALE not in g.free_symbols
