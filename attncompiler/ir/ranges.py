"""Index ranges of a mask: the K/V range a query block can see (and the Q range of a K/V block).

For the rows ``q_idx in [q_lo, q_hi]`` of one ``(b, h)`` with known ``q_len`` / ``kv_len``,
:func:`kv_range` derives, symbolically, ``[kv_min, kv_max]`` such that **no visible element of those
rows lies outside it** (sound).  The forward kernel visits only the K/V blocks that meet the range
(instead of scanning every block with ``tile_class``); :func:`q_range` is the transpose (the query
rows a K/V block ``[kv_lo, kv_hi]`` can be seen from), for the backward's loop over query blocks.

How.  The mask is brought to negation normal form and each relational ``a OP b`` to ``d OP 0``
(``d = a - b``, scaled by the common denominator of its Rational coefficients, as in
:mod:`attncompiler.ir.bounds`).  Writing ``x`` for the solved index (``kv_idx``) and ``y`` for the
other (``q_idx``, ranged over the block):

* ``d = c x + r(y, ...)`` with an integer ``c != 0`` and ``r`` boundable by :func:`bounds.bound`
  over the block (``r in [r_lo, r_hi]``):  ``d >= 0`` gives ``x >= ceil(-r_hi / c)`` (c > 0) or
  ``x <= floor(r_hi / -c)`` (c < 0); ``d > 0`` is ``d - 1 >= 0`` when ``d`` is an integer;
  ``d == 0`` gives both ends.  Each end is attained by some row of the block, so the range of one
  such relational is exact (tight).
* ``d >= 0`` (or ``>``) with ``x`` inside ``k * Min(...)`` / ``k * Max(...)`` / ``k * Abs(...)``
  splits into an And / Or of relationals without it (``|q - kv| <= w`` is two linear ones).
* ``x`` only inside one ``floor(alpha x + beta)`` (chunked masks): solved for ``u = floor(...)``,
  then ``u in [u_lo, u_hi]`` maps back to ``x in [ceil((u_lo - beta) / alpha),
  ceil((u_hi + 1 - beta) / alpha) - 1]``.
* a relational without ``x`` holds for some row of the block or for none (bounded as in the tile
  classifier): the whole range or nothing.
* And -> intersection, Or -> hull of the union (both sound; Or keeps tightness, And may lose it),
  anything else -- ``!=`` in ``x``, buffer reads, ``Mod`` of ``x``, non-linear terms, Floats --
  is the whole range ``[0, len - 1]``.

The result is clamped to ``[0, len - 1]``; ``lo > hi`` means no visible element.  The same
expressions are evaluated exactly in Python (:meth:`IndexRange.evaluate`) and printed as int CUDA
(:meth:`IndexRange.to_cuda`), with the tile classifier's guards: inputs are only trusted in
``[0, INDEX_LIMIT)`` (else the whole range), and an end whose arithmetic could leave int32 or needs
float is dropped (unbounded on that side).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy
from sympy.core.relational import Relational
from sympy.logic.boolalg import BooleanFalse, BooleanTrue

from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN

from .bounds import (
    _INT32_MAX, _LOWEST, _PRINTER, INDEX_LIMIT, KV_HI, KV_LO, Q_HI, Q_LO, _compile, _exact_int, _is_bool,
    _mag, bound,
)

__all__ = ["IndexRange", "kv_range", "q_range", "index_range", "kv_dense", "AXES"]

Range = tuple[sympy.Expr, sympy.Expr]   # (lo, hi) in the solved index; sentinels: see _Axis
Ends = tuple[Any, Any]                   # (lo | None, hi | None): None = unbounded on that side

_MAX_SPLIT_DEPTH = 6  # Min / Max / Abs splits of one relational (each at most doubles the work)


@dataclass(frozen=True)
class _Axis:
    """The solved index ``var`` (length ``length``), the other index ``other`` ranged over
    ``[lo_end, hi_end]`` (the block)."""

    name: str
    var: sympy.Symbol
    length: sympy.Symbol
    other: sympy.Symbol
    lo_end: sympy.Symbol
    hi_end: sympy.Symbol

    def box(self) -> dict[sympy.Symbol, tuple[sympy.Expr, sympy.Expr]]:
        pts = {s: (s, s) for s in (B, H, Q_LEN, KV_LEN)}
        return {self.other: (self.lo_end, self.hi_end), **pts}

    @property
    def full(self) -> Range:
        return sympy.Integer(0), self.length - 1

    @property
    def empty(self) -> Range:
        return self.length, sympy.Integer(-1)


AXES = {
    "kv": _Axis("kv", KV_IDX, KV_LEN, Q_IDX, Q_LO, Q_HI),
    "q": _Axis("q", Q_IDX, Q_LEN, KV_IDX, KV_LO, KV_HI),
}


# ---------------------------------------------------------------------------------------------
# range algebra
# ---------------------------------------------------------------------------------------------
def _intersect(rs: list[Range]) -> Range:
    return sympy.Max(*(r[0] for r in rs)), sympy.Min(*(r[1] for r in rs))


def _hull(rs: list[Range], ax: _Axis) -> Range:
    """Hull of the union; a part that is empty once clamped to [0, len - 1] becomes the neutral
    (len, -1) first, so that it cannot widen the hull (keeps Or tight)."""
    e_lo, e_hi = ax.empty
    parts = []
    for lo, hi in rs:
        c_lo, c_hi = sympy.Max(0, lo), sympy.Min(ax.length - 1, hi)
        empty = _cmp(sympy.Gt, c_lo, c_hi)
        if empty is sympy.true:
            lo, hi = e_lo, e_hi
        elif empty is not sympy.false:
            lo, hi = _select(empty, e_lo, c_lo), _select(empty, e_hi, c_hi)
        parts.append((lo, hi))
    return sympy.Min(*(r[0] for r in parts)), sympy.Max(*(r[1] for r in parts))


def _cmp(rel: type, a: sympy.Expr, b: sympy.Expr) -> sympy.Basic:
    """``rel(a, b)``: sympy.true / false when sympy decides it, else unevaluated -- sympy would
    otherwise divide ``2 x > y`` into ``x > y / 2``, which is no longer exact int arithmetic."""
    v = rel(a, b)
    return v if v in (sympy.true, sympy.false) else rel(a, b, evaluate=False)


def _select(cond: sympy.Basic, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """``cond ? a : b``, with the condition kept as written (Piecewise's evaluation would divide
    its relationals through by their leading coefficient, leaving int arithmetic)."""
    return sympy.Piecewise((a, cond), (b, True), evaluate=False)


def _trusted(e: sympy.Expr) -> bool:
    """Printable as exact int CUDA, with every intermediate in int32 for inputs < INDEX_LIMIT."""
    return _exact_int(e) and _mag(e) <= _INT32_MAX


def _ends_to_range(ends: Ends, ax: _Axis) -> Range:
    lo, hi = ends
    full_lo, full_hi = ax.full
    lo = full_lo if lo is None or not _trusted(lo) else lo
    hi = full_hi if hi is None or not _trusted(hi) else hi
    return lo, hi


# ---------------------------------------------------------------------------------------------
# derivation
# ---------------------------------------------------------------------------------------------
class _Unknown(Exception):
    """This piece of the mask gives no bound (the whole range is used)."""


def _derive(m: Any, neg: bool, ax: _Axis, depth: int = 0) -> Range:  # noqa: C901 - one branch per boolean form
    """Sound range of ``m`` (``not m`` when ``neg``) in negation normal form."""
    if m is None or m is True or isinstance(m, BooleanTrue):
        return ax.empty if neg else ax.full
    if m is False or isinstance(m, BooleanFalse):
        return ax.full if neg else ax.empty
    if isinstance(m, sympy.Not):
        return _derive(m.args[0], not neg, ax, depth)
    if isinstance(m, (sympy.And, sympy.Or)):
        parts = [_derive(a, neg, ax, depth) for a in m.args]
        return _intersect(parts) if isinstance(m, sympy.And) != neg else _hull(parts, ax)
    if isinstance(m, sympy.Implies):
        a, c = m.args
        return _derive(sympy.Or(sympy.Not(a, evaluate=False), c, evaluate=False), neg, ax, depth)
    if isinstance(m, sympy.Xor):
        acc = m.args[0]
        for x in m.args[1:]:
            acc = sympy.Or(sympy.And(acc, sympy.Not(x, evaluate=False), evaluate=False),
                           sympy.And(sympy.Not(acc, evaluate=False), x, evaluate=False), evaluate=False)
        return _derive(acc, neg, ax, depth)
    if isinstance(m, sympy.Equivalent):
        nots = [sympy.Not(a, evaluate=False) for a in m.args]
        return _derive(sympy.Or(sympy.And(*m.args, evaluate=False), sympy.And(*nots, evaluate=False),
                                evaluate=False), neg, ax, depth)
    if isinstance(m, sympy.ITE):
        c, a, b = m.args
        ite = sympy.Or(sympy.And(c, a, evaluate=False), sympy.And(sympy.Not(c, evaluate=False), b, evaluate=False),
                       evaluate=False)
        return _derive(ite, neg, ax, depth)
    if isinstance(m, sympy.Piecewise) and all(_is_bool(pc.expr) for pc in m.args):
        terms, earlier = [], []
        for pc in m.args:
            terms.append(sympy.And(pc.cond, *earlier, pc.expr, evaluate=False))
            earlier.append(sympy.Not(pc.cond, evaluate=False))
        return _derive(sympy.Or(*terms, evaluate=False), neg, ax, depth)
    if isinstance(m, Relational):
        return _relational(m, neg, ax, depth)
    return ax.full


_NEGATED = {">=": "<", ">": "<=", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}
_REL = {">=": sympy.Ge, ">": sympy.Gt, "==": sympy.Eq, "!=": sympy.Ne}


def _relational(rel: Relational, neg: bool, ax: _Axis, depth: int) -> Range:
    lhs, rhs, op = rel.lhs, rel.rhs, rel.rel_op
    if op not in _NEGATED:
        return ax.full
    if neg:
        op = _NEGATED[op]
    if _is_bool(lhs) or _is_bool(rhs):
        if op not in ("==", "!="):
            return ax.full
        eq = sympy.Equivalent(lhs, rhs, evaluate=False)
        return _derive(eq, op == "!=", ax, depth)
    if op in ("<", "<="):
        d, op = rhs - lhs, {"<": ">", "<=": ">="}[op]
    else:
        d = lhs - rhs
    if d.has(sympy.Float):
        return ax.full  # decided in float by the kernel: no exact bound
    try:
        return _solve(d, op, ax, depth)
    except _Unknown:
        return ax.full


def _scaled(d: sympy.Expr) -> sympy.Expr:
    """``d`` times the common denominator of its Rational coefficients (same sign, integer coefficients)."""
    d = sympy.expand(d, deep=False)
    coeffs = d.as_coefficients_dict().values()
    if all(c.is_Rational for c in coeffs):
        d = sympy.expand(math.lcm(*(int(c.q) for c in coeffs)) * d, deep=False)
    return d


def _solve(d: sympy.Expr, op: str, ax: _Axis, depth: int) -> Range:
    """Range of ``d OP 0`` (op: >=, >, ==, !=) in ``ax.var``; raises _Unknown."""
    d = _scaled(d)
    if not d.has(ax.var):
        return _no_var(d, op, ax)
    if op == "!=":
        raise _Unknown
    terms = sympy.Add.make_args(d)
    linear = [t for t in terms if t.has(ax.var) and t.as_coeff_Mul()[1] == ax.var]
    other = [t for t in terms if t.has(ax.var) and t not in linear]
    if not other:
        return _ends_to_range(_solve_linear(d, op, ax.var, ax), ax)
    for pw in sorted(d.atoms(sympy.Piecewise), key=sympy.default_sort_key):
        if pw.has(ax.var) and depth < _MAX_SPLIT_DEPTH and not any(pc.cond.has(ax.var) for pc in pw.args):
            # branch conditions free of the solved index: OR_i (c_i and not c_<i and d[pw -> e_i] OP 0)
            branches, earlier = [], []
            for pc in pw.args:
                rel = _REL[op](d.xreplace({pw: pc.expr}), 0, evaluate=False)
                branches.append(sympy.And(pc.cond, *earlier, rel, evaluate=False))
                earlier.append(sympy.Not(pc.cond, evaluate=False))
            return _derive(sympy.Or(*branches, evaluate=False), False, ax, depth + 1)
    if op in (">=", ">") and depth < _MAX_SPLIT_DEPTH:
        for t in other:
            k, f = t.as_coeff_Mul()
            if isinstance(f, sympy.Abs):
                f = sympy.Max(f.args[0], -f.args[0], evaluate=False)
            if isinstance(f, (sympy.Min, sympy.Max)) and k.is_Rational and k != 0:
                rest = d - t
                # k > 0: k Min(a) = Min(k a) (all must hold), k Max(a) = Max(k a) (one must hold);
                # k < 0 swaps Min and Max.
                conj = isinstance(f, sympy.Min) == (k > 0)
                parts = [_solve(rest + k * a, op, ax, depth + 1) for a in f.args]
                return _intersect(parts) if conj else _hull(parts, ax)
    floors = {f for f in d.atoms(sympy.floor) if f.has(ax.var)}
    if len(floors) == 1 and not linear:
        return _ends_to_range(_solve_floor(d, op, next(iter(floors)), ax), ax)
    raise _Unknown


def _no_var(d: sympy.Expr, op: str, ax: _Axis) -> Range:
    """``d OP 0`` without the solved index: the whole range if some row of the block satisfies it."""
    iv = bound(d, ax.box())
    if iv is None or not (_trusted(iv[0]) and _trusted(iv[1])):
        return ax.full
    lo, hi = iv
    if op == ">=":
        empty = _cmp(sympy.Gt, 0, hi)
    elif op == ">":
        empty = _cmp(sympy.Ge, 0, hi)
    elif op == "==":
        empty = sympy.Or(_cmp(sympy.Gt, lo, 0), _cmp(sympy.Gt, 0, hi))
    else:
        empty = sympy.And(_cmp(sympy.Ge, lo, 0), _cmp(sympy.Ge, 0, hi))
    if empty is sympy.true:
        return ax.empty
    if empty is sympy.false:
        return ax.full
    (e_lo, e_hi), (f_lo, f_hi) = ax.empty, ax.full
    return _select(empty, e_lo, f_lo), _select(empty, e_hi, f_hi)


def _solve_linear(d: sympy.Expr, op: str, var: sympy.Symbol, ax: _Axis) -> Ends:
    """Ends of ``d OP 0`` with ``d = c var + r``, c a nonzero integer, r free of var."""
    c = d.coeff(var)
    r = sympy.expand(d - c * var, deep=False)
    if not (c.is_Integer and c != 0) or r.has(var):
        raise _Unknown
    iv = bound(r, ax.box())
    if iv is None:
        raise _Unknown
    r_lo, r_hi = iv
    if op == ">":
        if d.is_integer:
            r_lo, r_hi = r_lo - 1, r_hi - 1   # d > 0  <=>  d - 1 >= 0
        op = ">="                             # else d > 0 implies d >= 0 (looser, still sound)
    c = int(c)
    if op == ">=":
        return (sympy.ceiling(-r_hi / c), None) if c > 0 else (None, sympy.floor(r_hi / -c))
    if op == "==":
        if c > 0:
            return sympy.ceiling(-r_hi / c), sympy.floor(-r_lo / c)
        return sympy.ceiling(r_lo / -c), sympy.floor(r_hi / -c)
    raise _Unknown


def _solve_floor(d: sympy.Expr, op: str, fl: sympy.floor, ax: _Axis) -> Ends:
    """``d`` reads the solved index only through ``fl = floor(alpha x + beta)``: solve for it."""
    arg = sympy.expand(fl.args[0])
    alpha = arg.coeff(ax.var)
    beta = sympy.expand(arg - alpha * ax.var)
    if not (alpha.is_Rational and alpha > 0) or beta.has(ax.var) or beta.has(ax.other):
        raise _Unknown
    u = sympy.Dummy("u", integer=True)
    du = d.xreplace({fl: u})
    if du.has(ax.var):
        raise _Unknown
    u_lo, u_hi = _solve_linear(du, op, u, ax)
    lo = None if u_lo is None else sympy.ceiling((u_lo - beta) / alpha)
    hi = None if u_hi is None else sympy.ceiling((u_hi + 1 - beta) / alpha) - 1
    return lo, hi


# ---------------------------------------------------------------------------------------------
# the range object
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexRange:
    """``[lo, hi]`` of one index (``axis`` "kv" or "q") visible from a block of the other."""

    mask: sympy.Basic | None
    axis: str
    lo: sympy.Expr
    hi: sympy.Expr
    _inputs: frozenset[sympy.Symbol] = field(default=frozenset(), compare=False, repr=False)
    _fns: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        ax = AXES[self.axis]
        syms = (self.lo.free_symbols | self.hi.free_symbols) - {ax.length}
        object.__setattr__(self, "_inputs", frozenset(syms))
        object.__setattr__(self, "_fns", (_compile(self.lo), _compile(self.hi)))

    @classmethod
    def from_mask(cls, mask: sympy.Basic | bool | None, axis: str = "kv") -> "IndexRange":
        ax = AXES[axis]
        m = mask if mask is None or isinstance(mask, sympy.Basic) else sympy.sympify(mask)
        lo, hi = _derive(m, False, ax)
        lo, hi = sympy.Max(0, lo), sympy.Min(ax.length - 1, hi)
        if not (_trusted(lo) and _trusted(hi)):
            lo, hi = ax.full
        return cls(m, axis, lo, hi)

    def inputs(self) -> frozenset[sympy.Symbol]:
        """The symbols the range reads besides the solved index's length."""
        return self._inputs

    def is_full(self) -> bool:
        """The derivation found no bound: always ``[0, len - 1]``."""
        return (self.lo, self.hi) == AXES[self.axis].full

    def evaluate(self, lo_end: int, hi_end: int, b: int = 0, h: int = 0, q_len: int | None = None,
                 kv_len: int | None = None) -> tuple[int, int]:
        """``(lo, hi)`` for the block ``[lo_end, hi_end]`` of the other index (inclusive);
        ``lo > hi``: no visible element."""
        ax = AXES[self.axis]
        if lo_end > hi_end:
            raise ValueError(f"empty block [{lo_end}, {hi_end}]")
        env: dict[sympy.Symbol, Any] = {ax.lo_end: lo_end, ax.hi_end: hi_end, B: b, H: h, Q_LEN: q_len,
                                        KV_LEN: kv_len}
        n = env[ax.length]
        if n is None:
            raise ValueError(f"the {self.axis} range needs {ax.length}")
        missing = [str(s) for s in self._inputs if s in env and env[s] is None]
        if missing:
            raise ValueError(f"mask needs {', '.join(sorted(missing))} for its {self.axis} range")
        if any(not _LOWEST.get(s, 0) <= env[s] < INDEX_LIMIT for s in self._inputs | {ax.length}):
            return 0, n - 1  # the bounds' int arithmetic is only guarded below INDEX_LIMIT
        return int(self._fns[0](env)), int(self._fns[1](env))

    def to_cuda(self) -> str:
        """Body of ``void kv_range(int b, int h, int q_lo, int q_hi, const AttnParams& p,
        const AttnBuffers& buf, int& lo, int& hi)`` (or ``q_range(..., kv_lo, kv_hi, ...)``)."""
        ax = AXES[self.axis]
        n = _PRINTER.print(ax.length)
        what = "(no mask)" if self.mask is None else " ".join(str(self.mask).split())
        lines = [f"// {self.axis} range of mask: {what}"]
        if self.is_full():
            return "\n".join(lines + ["lo = 0;", f"hi = {n} - 1;"])
        checks = []
        order = (ax.lo_end, ax.hi_end, B, H, Q_LEN, KV_LEN)
        for x in (x for x in order if x in self._inputs or x == ax.length):
            low, name = _LOWEST.get(x, 0), _PRINTER.print(x)
            checks.append(f"(unsigned)({name}{f' - {low}' if low else ''}) >= {INDEX_LIMIT - low}u")
        guard = " ||\n    ".join(checks)
        lines.append(f"// exact int arithmetic for inputs in [0, {INDEX_LIMIT}); else the whole range")
        lines.append(f"if ({guard}) {{\n  lo = 0;\n  hi = {n} - 1;\n  return;\n}}")
        lines.append(f"lo = {_PRINTER.print(self.lo, 'int')};")
        lines.append(f"hi = {_PRINTER.print(self.hi, 'int')};")
        return "\n".join(lines)


def index_range(mask: sympy.Basic | bool | None, axis: str) -> IndexRange:
    """:class:`IndexRange` of ``mask`` along ``axis`` ("kv": K/V range of a query block, "q": Q
    range of a K/V block)."""
    if axis not in AXES:
        raise ValueError(f"axis: expected one of {sorted(AXES)}, got {axis!r}")
    return IndexRange.from_mask(mask, axis)


def kv_range(mask: sympy.Basic | bool | None) -> IndexRange:
    """The K/V range visible from query rows ``[q_lo, q_hi]``."""
    return index_range(mask, "kv")


def q_range(mask: sympy.Basic | bool | None) -> IndexRange:
    """The query rows that can see K/V rows ``[kv_lo, kv_hi]``."""
    return index_range(mask, "q")


# ---------------------------------------------------------------------------------------------
# dense K/V ranges: no EMPTY block inside a query block's range
# ---------------------------------------------------------------------------------------------
def kv_dense(mask: sympy.Basic | bool | None) -> bool:
    """True when no K/V block that meets :func:`kv_range` of some query rows is EMPTY for those rows.

    The kernels' walks then visit the range's blocks without asking the tile classifier which to skip
    (``Variant::kKvDense``): the same blocks as with the search, in the same order. Proved for a
    conjunction of relationals linear in the indices, where each bound on ``kv_idx`` rises with ``q_idx``
    at slope 0 or 1 (causal, bottom-right causal, sliding windows, bands, diagonals, and their conjunctions;
    terms in b, h and the lengths are constants of the tile, conditions on b and h alone may empty it):
    - the lower bound a(q) is a maximum of such lines (convex), the upper bound b(q) a minimum (concave), so
      a - b is convex, and the rows that see a key form one interval [q1, q2];
    - on the rows before q1, a - b falls by one per row, so a stays constant there and a(q_lo) = a(q1);
      likewise b(q_hi) = b(q2). So the derived range, [max_i a_i(q_lo), min_i b_i(q_hi)], is exactly
      [a(q1), b(q2)];
    - consecutive rows' keys overlap or touch (a(q + 1) <= a(q) + 1 <= b(q) + 1), so every key of that
      range is visible from some row, and every block that meets it holds a visible key.

    Anything else gives False, which keeps the search: Or, !=, Abs / Min / Max, floors, reads of buffers
    at an index, Floats, slopes other than 0 and 1, and conditions on q_idx alone (rows that see nothing
    would widen the derived range beyond the visible one). Past the derivation's input guard (indices
    beyond INDEX_LIMIT) the range is the whole axis; there EMPTY blocks are visited and add nothing."""
    if mask is None or mask is True or isinstance(mask, BooleanTrue):
        return True
    return _dense(mask, False)


def _dense(m: Any, neg: bool) -> bool:
    if isinstance(m, sympy.Not):
        return _dense(m.args[0], not neg)
    if isinstance(m, (sympy.And, sympy.Or)):
        return isinstance(m, sympy.And) != neg and all(_dense(a, neg) for a in m.args)
    if m is True or m is False or isinstance(m, (BooleanTrue, BooleanFalse)):
        return True
    if not isinstance(m, Relational) or m.rel_op not in _NEGATED:
        return False
    op = _NEGATED[m.rel_op] if neg else m.rel_op
    if op == "!=" or _is_bool(m.lhs) or _is_bool(m.rhs):
        return False
    d = m.lhs - m.rhs
    if d.has(sympy.Float):
        return False
    d = _scaled(d)
    c, e = d.coeff(KV_IDX), d.coeff(Q_IDX)
    rest = sympy.expand(d - c * KV_IDX - e * Q_IDX, deep=False)
    if rest.has(KV_IDX) or rest.has(Q_IDX) or not (c.is_Integer and e.is_Integer):
        return False  # the indices only in integer linear terms (the rest, buffer reads of b / h included, is per tile)
    if c == 0:
        return e == 0  # a condition on b, h or the lengths: the whole tile, or nothing
    return (-e / c) in (0, 1)  # kv's bound moves with q at slope 0 or 1
