"""Symbolic gradients of the score modifier (for the backward pass).

The backward pass needs, per score element, the derivative of the modified score with respect to
the *scaled* score (``score_mod``'s argument), and -- when a captured float buffer is learnable --
the derivative with respect to each buffer element the expression reads:

    x = score_expr(score, b, h, q_idx, kv_idx, buf[...])
    dL/dscore      = dL/dx * dx/dscore                   -> :func:`score_grad_expr`
    dL/dbuf[i(..)] += dL/dx * dx/dbuf[i(..)]             -> :func:`buffer_grad_terms`

Derivatives are taken with sympy and then made printable: ``Heaviside(u)`` (from ``Max`` /
``Min``) becomes ``Piecewise((1, u > 0), (0, True))``, ``DiracDelta`` (from ``sign``) becomes 0,
``floor`` / ``ceiling`` have derivative 0 and ``Mod(a, m)`` is rewritten ``a - m*floor(a/m)``
before differentiating (all almost-everywhere derivatives, as autograd uses).  Anything that
still holds an unevaluated ``Derivative`` or ``Subs`` raises :class:`GradError` naming what failed.

Buffer terms are found per distinct ``Indexed`` atom: ``bias[q_idx] + bias[kv_idx]`` gives two
terms for ``bias`` with their own index expressions (each atom is replaced by a fresh symbol
before differentiating, so sympy's KroneckerDelta rules for Indexed never apply).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..spec.symbols import SCORE
from .types import AttentionIR

__all__ = ["GradError", "BufferGradTerm", "score_grad_expr", "buffer_grad_terms", "grad_is_one",
           "differentiable_buffers"]


class GradError(ValueError):
    """A derivative that cannot be formed or printed; the message names the expression or buffer."""


@dataclass(frozen=True)
class BufferGradTerm:
    """One read of a float buffer in score_expr: ``dx/d(buffer[indices])`` = ``expr``."""

    buffer: str
    indices: tuple[sympy.Expr, ...]
    expr: sympy.Expr


def _prepare(e: sympy.Expr) -> sympy.Expr:
    """Rewrite Mod so that its derivative exists: Mod(a, m) = a - m*floor(a/m)."""
    return e.replace(lambda x: isinstance(x, sympy.Mod), lambda x: x.args[0] - x.args[1] * sympy.floor(x.args[0] / x.args[1]))


def _is_piecewise_constant_derivative(d: sympy.Derivative) -> bool:
    return isinstance(d.expr, (sympy.floor, sympy.ceiling, sympy.sign, sympy.Heaviside))


def _clean(d: sympy.Expr, what: str) -> sympy.Expr:
    """Make a sympy derivative printable (a.e. derivatives), or raise GradError."""
    d = d.replace(lambda x: isinstance(x, sympy.Derivative) and _is_piecewise_constant_derivative(x),
                  lambda x: sympy.Integer(0))
    d = d.replace(lambda x: isinstance(x, sympy.Subs) and x.expr.is_number, lambda x: x.expr)
    d = d.replace(lambda x: isinstance(x, sympy.DiracDelta), lambda x: sympy.Integer(0))
    d = d.replace(lambda x: isinstance(x, sympy.Heaviside),
                  lambda x: sympy.Piecewise((sympy.Integer(1), sympy.Gt(x.args[0], 0)), (sympy.Integer(0), True)))
    bad = [a for a in sympy.preorder_traversal(d) if isinstance(a, (sympy.Derivative, sympy.Subs))]
    if bad:
        raise GradError(f"{what}: sympy could not form a closed-form derivative (left {bad[0]}); "
                        f"rewrite the score_mod with differentiable operations")
    return d


def score_grad_expr(score_expr: sympy.Expr | None) -> sympy.Expr:
    """d score_expr / d score (1 for the identity), simplified and printable."""
    if score_expr is None:
        return sympy.Integer(1)
    d = sympy.diff(_prepare(score_expr), SCORE)
    d = _clean(d, f"d/dscore of score_mod {score_expr}")
    # expand (not simplify): keeps the functions score_mod computes (tanh stays tanh, so the
    # kernel's score_mod and score_mod_grad share one tanhf) while folding constant factors.
    e = sympy.expand(d)
    return e if sympy.count_ops(e) <= sympy.count_ops(d) else d


def grad_is_one(score_expr: sympy.Expr | None) -> bool:
    """True when the score modifier's derivative is identically 1 (identity, additive biases)."""
    return score_grad_expr(score_expr) == 1


def buffer_grad_terms(ir: AttentionIR, name: str) -> tuple[BufferGradTerm, ...]:
    """The derivative terms of ``score_expr`` for float buffer ``name`` (one per distinct read).

    Raises GradError (naming the buffer) when the buffer is not a float buffer, is read only by the
    mask (a boolean: no gradient), or has no closed-form derivative."""
    info = next((b for b in ir.buffers if b.name == name), None)
    if info is None:
        raise GradError(f"buffer {name!r}: not a buffer of this attention (buffers: {[b.name for b in ir.buffers]})")
    if info.kind != "float":
        raise GradError(f"buffer {name!r}: an integer buffer has no gradient")
    reads = []
    if ir.score_expr is not None:
        reads = sorted((a for a in ir.score_expr.atoms(sympy.Indexed) if str(a.base.label) == name),
                       key=sympy.default_sort_key)
    in_mask = ir.mask_expr is not None and any(str(a.base.label) == name for a in ir.mask_expr.atoms(sympy.Indexed))
    if not reads:
        where = "only by mask_mod (a boolean, so it has no gradient)" if in_mask else "by no score_mod"
        raise GradError(f"buffer {name!r} requires grad but is read {where}; detach it or make it differentiable "
                        f"through score_mod")
    dummies = {a: sympy.Dummy(f"{name}_{i}", real=True) for i, a in enumerate(reads)}
    e = _prepare(ir.score_expr).xreplace(dummies)
    back = {v: k for k, v in dummies.items()}
    out = []
    for atom, dummy in dummies.items():
        d = sympy.diff(e, dummy)
        try:
            d = _clean(d, f"d/d{atom} of score_mod {ir.score_expr}")
        except GradError as err:
            raise GradError(f"buffer {name!r}: {err}") from None
        d = d.xreplace(back)
        if any(isinstance(x, sympy.Dummy) for x in d.free_symbols):
            raise GradError(f"buffer {name!r}: derivative {d} still holds a placeholder")
        out.append(BufferGradTerm(name, tuple(atom.indices), d))
    return tuple(out)


def differentiable_buffers(ir: AttentionIR) -> tuple[str, ...]:
    """Float buffers that score_expr reads (those a gradient can flow into)."""
    if ir.score_expr is None:
        return ()
    names = {str(a.base.label) for a in ir.score_expr.atoms(sympy.Indexed)}
    return tuple(b.name for b in ir.buffers if b.kind == "float" and b.name in names)
