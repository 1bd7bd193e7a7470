"""Interval arithmetic over sympy bounds and exact Python evaluation of bound expressions: the
arithmetic :mod:`attncompiler.ir.bounds` (tile classification) and :mod:`attncompiler.ir.bufreads`
(buffer-read bounds) are built from.

* ``_scale_iv`` / ``_mul_iv`` / ``_abs_iv`` / ``_pow_iv``: the image of an interval ``(lo, hi)`` of
  sympy expressions under scaling, products, ``abs`` and integer powers (sign-aware; Min / Max
  where the signs are unknown);
* ``_compile``: a closure evaluating a bound expression exactly (int / Fraction / bool) from
  symbol values, as the CPU classifier and the tests evaluate tile bounds.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import sympy
from sympy.core.relational import Relational
from sympy.logic.boolalg import BooleanFalse, BooleanTrue

__all__ = ["Interval", "Env"]

Interval = tuple[sympy.Expr, sympy.Expr]


def _scale_iv(c: sympy.Expr, iv: Interval) -> Interval:
    lo, hi = c * iv[0], c * iv[1]
    if c.is_nonnegative:
        return lo, hi
    if c.is_nonpositive:
        return hi, lo
    return sympy.Min(lo, hi), sympy.Max(lo, hi)


def _mul_iv(x: Interval, y: Interval) -> Interval:
    if x[0] == x[1]:
        return _scale_iv(x[0], y)
    if y[0] == y[1]:
        return _scale_iv(y[0], x)
    if x[0].is_nonnegative and y[0].is_nonnegative:
        return x[0] * y[0], x[1] * y[1]
    corners = [a * b for a in x for b in y]
    return sympy.Min(*corners), sympy.Max(*corners)


def _abs_iv(iv: Interval | None) -> Interval | None:
    if iv is None:
        return None
    lo, hi = iv
    if lo.is_nonnegative:
        return lo, hi
    if hi.is_nonpositive:
        return -hi, -lo
    return sympy.Max(0, lo, -hi), sympy.Max(-lo, hi)


def _pow_iv(iv: Interval | None, n: int) -> Interval | None:
    if iv is None:
        return None
    if n % 2:
        return iv[0] ** n, iv[1] ** n
    a = _abs_iv(iv)
    return None if a is None else (a[0] ** n, a[1] ** n)


Env = Mapping[sympy.Symbol, int]
_REL_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
            ">": operator.gt, ">=": operator.ge}


def _compile(e: sympy.Basic) -> Callable[[Env], Any]:  # noqa: C901 - one branch per node kind
    """A closure computing e exactly (int / Fraction / bool) from symbol values."""
    if isinstance(e, BooleanTrue) or isinstance(e, BooleanFalse):
        v = bool(e)
        return lambda env: v
    if e.is_Integer:
        i = int(e)
        return lambda env: i
    if e.is_Rational:
        fr = Fraction(int(e.p), int(e.q))
        return lambda env: fr
    if isinstance(e, sympy.Symbol):
        return lambda env: env[e]
    fs = [_compile(a) for a in e.args] if not isinstance(e, sympy.Piecewise) else []
    if e.is_Add:
        return lambda env: sum(f(env) for f in fs)
    if e.is_Mul:
        return lambda env: math.prod(f(env) for f in fs)
    if e.is_Pow and e.exp.is_Integer:
        base, n = fs[0], int(e.exp)
        return (lambda env: base(env) ** n) if n >= 0 else (lambda env: Fraction(1) / Fraction(base(env)) ** -n)
    if isinstance(e, sympy.floor):
        return lambda env: math.floor(fs[0](env))
    if isinstance(e, sympy.ceiling):
        return lambda env: math.ceil(fs[0](env))
    if isinstance(e, sympy.Mod):
        return lambda env: fs[0](env) % fs[1](env)
    if isinstance(e, sympy.Min):
        return lambda env: min(f(env) for f in fs)
    if isinstance(e, sympy.Max):
        return lambda env: max(f(env) for f in fs)
    if isinstance(e, sympy.Abs):
        return lambda env: abs(fs[0](env))
    if isinstance(e, Relational) and e.rel_op in _REL_OPS:
        op = _REL_OPS[e.rel_op]
        return lambda env: op(fs[0](env), fs[1](env))
    if isinstance(e, sympy.And):
        return lambda env: all(f(env) for f in fs)
    if isinstance(e, sympy.Or):
        return lambda env: any(f(env) for f in fs)
    if isinstance(e, sympy.Not):
        return lambda env: not fs[0](env)
    if isinstance(e, sympy.ITE):
        c, a, b = fs
        return lambda env: a(env) if c(env) else b(env)
    if isinstance(e, sympy.Piecewise):
        pieces = [(_compile(pc.expr), _compile(pc.cond)) for pc in e.args]
        return lambda env: next(v(env) for v, c in pieces if c(env))
    raise ValueError(f"cannot evaluate {type(e).__name__} in a tile bound")
