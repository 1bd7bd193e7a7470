"""ir/scorerange.py: sound ranges of score_mods and the fixed softmax offset a bounded one allows (CPU)."""
from __future__ import annotations

import math
import random

import pytest
import sympy
import torch

import attncompiler as ac
from attncompiler.codegen import hooks
from attncompiler.ir.build import build_ir
from attncompiler.ir.scorerange import MAX_SHIFT_LOG2, UNDERFLOW_LIMIT_LOG2, score_range, static_offset_window
from attncompiler.spec import ops, presets

LOG2E = 1.4426950408889634
BIAS = torch.linspace(-1.0, 1.0, 64)

# name -> (score_mod, bounded)
MODS = {
    "softcap30": (presets.softcap_score_mod(30.0), True),
    "softcap_shifted": (lambda s, b, h, q, kv: 20.0 * ops.tanh(s / 20.0) - 5.0, True),
    "sigmoid": (lambda s, b, h, q, kv: 8.0 * ops.sigmoid(s), True),
    "clamped": (lambda s, b, h, q, kv: ops.clamp(s, -10.0, 10.0), True),
    "tanh_of_position": (lambda s, b, h, q, kv: 3.0 * ops.tanh(s) + ops.tanh(0.01 * (q - kv)), True),
    "abs_tanh": (lambda s, b, h, q, kv: 4.0 * abs(ops.tanh(s)), True),
    "plain_scale": (lambda s, b, h, q, kv: 2.0 * s, False),
    "alibi": (presets.alibi_score_mod(presets.alibi_slopes(4)), False),
    "softcap_plus_bias": (lambda s, b, h, q, kv: 30.0 * ops.tanh(s / 30.0) + BIAS[kv], False),
    "half_clamp": (lambda s, b, h, q, kv: ops.max(s, -3.0), False),
}


def _expr(fn, dtype="bf16"):
    ir = build_ir(ac.AttentionSpec(head_dim=64, score_mod=fn, dtype=dtype, name="t"))
    return ir, hooks._score_log2_sympy(ir)


@pytest.mark.parametrize("name", sorted(MODS))
def test_bounded_or_not(name):
    fn, bounded = MODS[name]
    _, e = _expr(fn)
    assert (score_range(e) is not None) == bounded


@pytest.mark.parametrize("name", sorted(n for n in MODS if MODS[n][1]))
def test_range_is_sound(name):
    """Sampled values of the expression (huge dot products, scales and positions included) lie in the range."""
    _, e = _expr(MODS[name][0])
    lo, hi = score_range(e)
    syms = sorted(e.free_symbols, key=str)
    f = sympy.lambdify(syms, e, modules="math")
    rng = random.Random(7)
    for _ in range(2000):
        vals = []
        for s in syms:
            mag = 10 ** rng.uniform(-3, 6)
            if s.is_integer:
                vals.append(rng.randrange(0, 100000))
            elif s.is_positive:
                vals.append(mag)
            else:
                vals.append(rng.choice((-1, 1)) * mag)
        try:
            v = f(*vals)
        except OverflowError:  # exp of a huge argument: the limit, as the kernel's fp32 reaches it
            continue
        assert lo - 1e-9 <= v <= hi + 1e-9, (name, dict(zip(syms, vals)), v, (lo, hi))


def test_softcap_ranges_and_offsets():
    for cap in (10.0, 30.0, 50.0):
        _, e = _expr(presets.softcap_score_mod(cap))
        lo, hi = score_range(e)
        assert lo == pytest.approx(-cap * LOG2E) and hi == pytest.approx(cap * LOG2E)
    _, e30 = _expr(presets.softcap_score_mod(30.0))
    lo, hi = score_range(e30)
    m_lo, m_hi = static_offset_window(e30, "bf16")
    assert m_lo == pytest.approx(hi - MAX_SHIFT_LOG2) and m_hi == pytest.approx(lo - UNDERFLOW_LIMIT_LOG2)
    assert m_lo <= hi <= m_hi                               # range 86.6: the cap itself is a safe offset
    _, e50 = _expr(presets.softcap_score_mod(50.0))
    lo, hi = score_range(e50)
    m_lo, m_hi = static_offset_window(e50, "bf16")
    assert m_lo <= m_hi < hi                                # range 144: the offset sits below the cap
    assert lo - m_hi == pytest.approx(UNDERFLOW_LIMIT_LOG2)  # any offset keeps the worst row's max >= 2^-100
    assert hi - m_lo == pytest.approx(MAX_SHIFT_LOG2)        # and every p <= 2^48
    _, e52 = _expr(presets.softcap_score_mod(52.0))        # range 150 > 148: the running maximum
    assert static_offset_window(e52, "bf16") is None
    assert static_offset_window(e30, "fp16") is None       # fp16 P has no room for a fixed offset


def test_prelude_hooks():
    for fn, static in ((presets.softcap_score_mod(30.0), True), (presets.softcap_score_mod(60.0), False),
                       (MODS["alibi"][0], False)):
        ir = build_ir(ac.AttentionSpec(head_dim=64, score_mod=fn, name="t"))
        src = hooks.render_prelude(ir)
        assert f"static constexpr bool kStaticMax = {'true' if static else 'false'};" in src
        assert "kStaticMaxLo = " in src and "kStaticMaxHi = " in src
    src = hooks.render_prelude(build_ir(presets.plain(64)))
    assert "static constexpr bool kStaticMax = false;" in src
    m_lo, m_hi = hooks.static_offset_of(build_ir(presets.softcap(30.0, 64)))
    assert math.isclose(m_lo, 30.0 * LOG2E - 48.0) and math.isclose(m_hi, -30.0 * LOG2E + 100.0)
