"""The range of a score_mod, and the window of fixed softmax offsets a bounded one allows.

The online softmax keeps a running row maximum ``m`` only so that ``exp2(E - m)`` neither overflows
nor underflows.  When the softmax input ``E = log2(e) * score_mod(s)`` is bounded for *every* input
(logit soft-capping: ``E`` in ``[-cap log2 e, cap log2 e]`` whatever the dot product), an offset that
stays fixed for the rest of the row does the same job: no row-max reduction, no rescale of O and l
per K/V block, and the exponentials no longer wait for the reduction.  The kernels take the row
maximum of the *first* visited K/V block, clamped into the window below, so a row whose keys all lie
in one block (one key, a short sequence) keeps ``P = 1`` for its largest score and is as exact as
with the running maximum.  The LSE (``m + log2 l``) is exact whatever ``m`` is; what ``m`` decides is
only where the fp32 / bf16 range of ``p = exp2(E - m)`` lies:

* **no underflow that matters**: the largest ``p`` of any row, at worst ``exp2(lo - m)``, must keep
  the terms within ``2^-24`` of it normal (fp32 and bf16 flush below ``2^-126``):
  ``m <= lo - UNDERFLOW_LIMIT_LOG2 = lo + 100``;
* **no overflow**: ``p <= exp2(hi - m) <= 2^MAX_SHIFT_LOG2 = 2^48``, i.e. ``m >= hi - 48``; then l
  and O (``sum p v`` in fp32 over at most 2^31 keys) overflow only for ``|v| >= 2^48``.

The window ``[hi - 48, lo + 100]`` is non-empty when ``hi - lo <= 148`` (cap <= 51.3: Gemma 2's 50
and Grok's 30 included).  As with FlashAttention-4's conditional rescaling, a later key may then
exceed the offset (``p > 1``) and the packed P of a row's largest score is rounded to bf16 like every
other P (relative error <= 2^-9).  Only for bf16 P: fp16's range (normal from 2^-14, max 65504) fits
no useful width, so fp16 keeps the running maximum.

:func:`score_range` bounds an expression by interval arithmetic over all values of its symbols (the
dot product is unbounded, positions are non-negative integers, buffer values are unbounded); it is
sound, not tight, and returns None where it cannot prove a finite bound.
"""
from __future__ import annotations

import math

import sympy

__all__ = ["score_range", "static_offset_window", "UNDERFLOW_LIMIT_LOG2", "MAX_SHIFT_LOG2"]

#: exp2 of the worst row maximum may sit this far below 2^0: its terms down to 2^-24 relative stay
#: above fp32's / bf16's smallest normal 2^-126 (with 2 bits to spare)
UNDERFLOW_LIMIT_LOG2 = -100.0
#: the largest p = exp2(E - m) allowed: l and O = sum p v stay finite for |v| < 2^48 over 2^31 keys
MAX_SHIFT_LOG2 = 48.0

_Range = tuple[float, float]
_ALL: _Range = (-math.inf, math.inf)


def _symbol_range(s: sympy.Symbol) -> _Range:
    if s.is_positive:
        return (1.0, math.inf) if s.is_integer else (0.0, math.inf)
    if s.is_nonnegative:
        return (0.0, math.inf)
    return _ALL


def _mul(x: _Range, y: _Range) -> _Range:
    if x == (0.0, 0.0) or y == (0.0, 0.0):
        return (0.0, 0.0)
    corners = []
    for a in x:
        for b in y:
            c = a * b
            if math.isnan(c):  # 0 * inf: the product is unbounded on that side
                return _ALL
            corners.append(c)
    return min(corners), max(corners)


def _monotone(f, r: _Range) -> _Range:
    def ev(v: float) -> float:
        try:
            return f(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    return ev(r[0]), ev(r[1])


def _range(e: sympy.Basic) -> _Range:  # noqa: C901 - one branch per node kind
    if e.is_Number:
        v = float(e)
        return (v, v)
    if isinstance(e, sympy.Symbol):
        return _symbol_range(e)
    if isinstance(e, sympy.Add):
        lo = hi = 0.0
        for a in e.args:
            r = _range(a)
            lo, hi = lo + r[0], hi + r[1]
            if math.isnan(lo) or math.isnan(hi):
                return _ALL
        return lo, hi
    if isinstance(e, sympy.Mul):
        r: _Range = (1.0, 1.0)
        for a in e.args:
            r = _mul(r, _range(a))
        return r
    if isinstance(e, sympy.tanh):
        return _monotone(math.tanh, _range(e.args[0]))
    if isinstance(e, sympy.exp):
        return _monotone(math.exp, _range(e.args[0]))
    if isinstance(e, sympy.Min):
        rs = [_range(a) for a in e.args]
        return min(r[0] for r in rs), min(r[1] for r in rs)
    if isinstance(e, sympy.Max):
        rs = [_range(a) for a in e.args]
        return max(r[0] for r in rs), max(r[1] for r in rs)
    if isinstance(e, sympy.Abs):
        lo, hi = _range(e.args[0])
        if lo >= 0:
            return lo, hi
        if hi <= 0:
            return -hi, -lo
        return 0.0, max(-lo, hi)
    if isinstance(e, sympy.Pow) and e.exp == -1:
        lo, hi = _range(e.base)
        if lo > 0:  # 1/x is decreasing on x > 0 (sigmoid: 1 / (1 + exp(-x)))
            return (1.0 / hi if hi != math.inf else 0.0), 1.0 / lo
        if hi < 0:
            return 1.0 / hi, (1.0 / lo if lo != -math.inf else 0.0)
        return _ALL
    return _ALL  # buffer reads, piecewise, anything else: unbounded as far as this knows


def score_range(expr: sympy.Expr) -> _Range | None:
    """A sound ``(lo, hi)`` of ``expr`` over every value of its symbols, or None when unbounded."""
    lo, hi = _range(expr)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return lo, hi


def static_offset_window(expr: sympy.Expr, dtype: str) -> tuple[float, float] | None:
    """The window ``(m_lo, m_hi)`` (log2 units; ``expr`` = the softmax input ``log2(e) * score_mod``)
    of fixed softmax offsets that keep every ``exp2(E - m)`` in range (module docstring), or None when
    the range is unbounded, wider than the limits allow, or P is fp16."""
    if dtype != "bf16":
        return None
    r = score_range(expr)
    if r is None:
        return None
    lo, hi = r
    m_lo, m_hi = hi - MAX_SHIFT_LOG2, lo - UNDERFLOW_LIMIT_LOG2
    if m_lo > m_hi:
        return None
    return m_lo, m_hi
