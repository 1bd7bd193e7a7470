"""The shape of a score_mod, as the forward kernels' softmax can exploit it.

The forward kernels feed the online softmax with ``E = log2(e) * score_mod(acc * scale)`` per score
(``acc`` the raw Q K^T dot product).  Two shapes of ``E`` save per-score work:

* **a positive constant factor**, ``E = K * F`` with ``K > 0`` a number (soft-capping:
  ``K = cap * log2 e``, ``F = tanh(acc * scale / cap)``): the row maximum of ``E`` is ``K`` times
  the row maximum of ``F`` and ``exp2(E - m) = exp2(K * F - m)`` is one fused multiply-add, so the
  kernel keeps ``F`` and folds ``K`` into the exponent's multiply-add (one multiply less per score);
* **separable**, ``E = a * acc + C(kv) + R(q)`` with ``a`` free of the positions, ``C`` a function
  of the key position (and batch, head, buffers) and ``R`` of the query position (ALiBi:
  ``a = scale log2 e``, ``C = log2 e slope[h] kv``, ``R = -log2 e slope[h] q``).  Softmax is
  invariant under a per-row shift, so the kernel computes only ``x = a * acc + (C(kv) - C(q_ref))``
  for a fixed reference row ``q_ref`` of its row block -- one multiply-add per score plus one term
  per *column* of a tile -- and adds the dropped per-row term ``R(q) + C(q_ref)`` to the row's LSE
  at the end.  When ``C`` is linear in ``kv`` (slope ``gamma`` free of the positions), the column
  term is ``gamma * (kv - q_ref)``: one multiply-add per column from the tile's first column, with
  no large cancelling magnitudes (the distance ``kv - q_ref`` is formed in integers).

:func:`q_scale_form` finds a third, **an inner scale**: ``F = G(c * acc)`` with ``c`` free of the positions
and buffers (soft-capping: ``c = scale / cap``, ``G = tanh``).  Then ``c * acc = (c q) . k``, so a kernel may
multiply its Q tile by ``c`` once and feed ``G`` the GEMM's output directly (one multiply less per score, off
the chain from the S GEMM to the exponential).

:func:`score_form` finds the first two shapes symbolically (sympy); :mod:`attncompiler.codegen.hooks` prints
them as the Variant hooks ``kScoreLog2Factor`` / ``score_mod_log2_inner`` and ``kScoreSeparable`` /
``score_sep_coef`` / ``score_sep_slope`` / ``score_sep_col`` / ``score_sep_row``.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..spec.symbols import KV_IDX, Q_IDX

__all__ = ["ScoreForm", "score_form", "q_scale_form", "Q_REF", "DIST_KV", "DIST_Q"]

#: the reference query row of a row block (an int the kernel passes to the separable hooks)
Q_REF = sympy.Symbol("q_ref", integer=True, nonnegative=True)
#: the integer distances ``kv_idx - q_ref`` and ``q_ref - q_idx`` (linear column terms)
DIST_KV = sympy.Symbol("ac_dkv", integer=True)
DIST_Q = sympy.Symbol("ac_dq", integer=True)


@dataclass(frozen=True)
class ScoreForm:
    """``E = factor * inner``; when ``separable``, ``inner = coef * acc + col + row`` where ``col`` is
    ``C(kv) - C(q_ref)`` (``col_slope * (kv - q_ref)`` when ``col_slope`` is not None) and ``row`` is
    ``R(q) + C(q_ref)`` (the per-row term the kernel drops from the softmax and adds to the LSE).
    In the linear case ``col`` and ``row`` are written in :data:`DIST_KV` = kv - q_ref and
    :data:`DIST_Q` = q_ref - q, otherwise in ``kv_idx``, ``q_idx`` and :data:`Q_REF`."""

    factor: sympy.Expr
    inner: sympy.Expr
    separable: bool = False
    coef: sympy.Expr | None = None
    col: sympy.Expr | None = None
    col_slope: sympy.Expr | None = None
    row: sympy.Expr | None = None


def _positive_factor(expr: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    coeff, rest = expr.as_coeff_Mul()
    if isinstance(coeff, sympy.Number) and coeff.is_positive and coeff != 1 and rest != 1:
        return coeff, rest
    return sympy.Integer(1), expr


def score_form(expr: sympy.Expr, acc: sympy.Symbol) -> ScoreForm:
    """The factor / separable shape of ``expr`` (``log2 e * score_mod(acc * scale)``) in ``acc``."""
    factor, inner = _positive_factor(expr)
    generic = ScoreForm(factor=factor, inner=inner)
    if factor != 1:
        return generic  # a separable E has no overall numeric factor worth folding (its terms carry it)
    coef = sympy.Integer(0)
    col_terms: list[sympy.Expr] = []
    row_terms: list[sympy.Expr] = []
    for term in sympy.Add.make_args(sympy.expand_mul(expr)):
        fs = term.free_symbols
        if acc in fs:
            c = term / acc  # a product with acc as a factor cancels it exactly; anything else keeps acc
            if c.free_symbols & {acc, Q_IDX, KV_IDX}:
                return generic
            coef += c
        elif KV_IDX in fs and Q_IDX in fs:
            return generic
        elif KV_IDX in fs:
            col_terms.append(term)
        else:
            row_terms.append(term)
    if not col_terms and not row_terms:
        return generic  # nothing but a scale of the score: the plain path
    C = sympy.Add(*col_terms)
    R = sympy.Add(*row_terms)
    slope = sympy.diff(C, KV_IDX) if col_terms else sympy.Integer(0)
    if col_terms and KV_IDX not in slope.free_symbols and sympy.expand(C - slope * KV_IDX) == 0:
        # linear in kv without a constant: C(kv) - C(q_ref) = slope * (kv - q_ref), and the dropped row
        # term R(q) + slope * q_ref = (R(q) + slope * q) + slope * (q_ref - q), each formed without
        # large cancelling magnitudes (the distances are integer differences).
        rest = sympy.expand(R + slope * Q_IDX)
        return ScoreForm(factor=factor, inner=inner, separable=True, coef=coef, col=slope * DIST_KV,
                         col_slope=slope, row=rest + slope * DIST_Q)
    col = C - C.subs(KV_IDX, Q_REF)
    row = R + C.subs(KV_IDX, Q_REF)
    return ScoreForm(factor=factor, inner=inner, separable=True, coef=coef, col=col, col_slope=None, row=row)


def q_scale_form(inner: sympy.Expr, acc: sympy.Symbol, allowed: frozenset[sympy.Symbol]
                 ) -> tuple[sympy.Expr, sympy.Expr] | None:
    """``(c, G)`` with ``inner = G(c * acc)``, where ``c``'s free symbols lie in ``allowed`` (the kernel's
    per-(batch, head) values: the scale, b, h) and ``G`` is written in ``acc`` (standing for ``c * acc``);
    None when ``acc`` does not occur only as ``c * acc``, or when ``G`` is the identity (nothing to save:
    the plain softmax already folds a scale into its exponential)."""
    if acc not in inner.free_symbols:
        return None
    c = next((node / acc for node in sympy.preorder_traversal(inner)
              if isinstance(node, sympy.Mul) and acc in node.args), None)
    if c is None or c == 0 or acc in c.free_symbols or not c.free_symbols <= allowed or c.atoms(sympy.Function):
        return None
    t = sympy.Dummy("t", real=True)
    g = inner.xreplace({acc: t / c})
    leftover = {sym for sym in c.free_symbols if not sym.is_integer}  # the scale: it must cancel (b, h may stay)
    if acc in g.free_symbols or g.free_symbols & leftover or g == t:
        return None
    return c, g.xreplace({t: acc})
