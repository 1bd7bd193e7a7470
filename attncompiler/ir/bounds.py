"""Tile classification of a mask expression over index boxes: EMPTY, PARTIAL or FULL.

A tile is the box ``q_idx in [q_lo, q_hi]`` x ``kv_idx in [kv_lo, kv_hi]`` (inclusive, non-empty)
for one ``(b, h)`` with known ``q_len`` / ``kv_len``.  :class:`TileClassifier` decides, soundly:

* ``TILE_EMPTY`` (0) only if no element of the tile is visible,
* ``TILE_FULL`` (2) only if every element is visible,
* ``TILE_PARTIAL`` (1) otherwise (mixed, or not known).

How.  :func:`bound` is interval arithmetic over sympy expressions, done *symbolically*: the
bounds are sympy expressions in ``q_lo, q_hi, kv_lo, kv_hi`` (and ``b, h, q_len, kv_len`` as
points), so one derivation serves both Python (:meth:`TileClassifier.classify`) and CUDA
(:meth:`TileClassifier.to_cuda`).  Linear expressions are bounded exactly (each coefficient's
sign picks the end of its variable's range); Add / Mul / Abs / Min / Max / floor / ceiling / Mod
/ integer Pow / Piecewise combine sub-bounds soundly; reads of int buffers whose indices are fixed
over the tile but one get run-time value ranges (:mod:`attncompiler.ir.bufreads`: the symbols
``rd<k>_lo`` / ``rd<k>_hi``, read in CUDA from a per-buffer range table, in Python from the values;
``doc[q_idx] == doc[kv_idx]`` is EMPTY on disjoint id ranges, FULL on one shared id); anything else
-- float buffers, ``score``, unknown functions -- is unknown.

A relational ``a OP b`` is bounded as one difference ``d = a - b`` (so correlated terms such as
``q_idx - kv_idx`` cancel), multiplied by the common denominator of its Rational coefficients so
that all arithmetic is exact in ``int``.  With ``[lo, hi]`` the range of ``d`` over the tile,
``d >= 0`` is FULL if ``lo >= 0`` and EMPTY if ``hi < 0`` (``>``, ``==``, ``!=`` alike).  Booleans
combine in Kleene's three-valued logic, which with EMPTY < PARTIAL < FULL is: And = min, Or = max,
Not = FULL - x.  This is exact for causal (top-left or bottom-right), sliding windows, prefix-LM,
chunked (``floor(q/c) == floor(kv/c)``) masks and bands built from them.

Exactness contract.  Relationals with a Float, or whose bound needs float arithmetic, are
unknown (PARTIAL): the kernel evaluates such masks in float, and rounding could make a claimed
FULL / EMPTY tile wrong.  The emitted CUDA computes in ``int``: bounds are derived for inputs
(``q_lo .. kv_hi``, ``b``, ``h``, ``q_len``, ``kv_len``) in ``[0, INDEX_LIMIT)`` = ``[0, 2**24)``,
a relational whose bound could leave the int32 range there is unknown, and a tile with an input
outside that range is PARTIAL (checked at run time in both Python and CUDA); a buffer read whose
min / max leaves ``(-INDEX_LIMIT, INDEX_LIMIT)`` is unknown (its relationals PARTIAL).  So the two
agree exactly, and never overflow.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import sympy
from sympy.core.relational import Relational
from sympy.logic.boolalg import BooleanAtom, BooleanFalse, BooleanFunction, BooleanTrue

from attncompiler.codegen.cuda_printer import CudaPrinter, PrinterError, int_division_parts
from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN

from .intervals import Env, Interval, _abs_iv, _compile, _mul_iv, _pow_iv

__all__ = [
    "TILE_EMPTY", "TILE_PARTIAL", "TILE_FULL", "INDEX_LIMIT",
    "Q_LO", "Q_HI", "KV_LO", "KV_HI", "Interval",
    "tile_box", "bound",
    "ConstNode", "RelNode", "AndNode", "OrNode", "NotNode", "TileNode",
    "TileClassifier", "tile_classifier", "ReadBound",
]

TILE_EMPTY, TILE_PARTIAL, TILE_FULL = 0, 1, 2
_CUDA_CLASS = {TILE_EMPTY: "AC_TILE_EMPTY", TILE_PARTIAL: "AC_TILE_PARTIAL", TILE_FULL: "AC_TILE_FULL"}

#: Bounds are derived for inputs (tile ends, b, h, q_len, kv_len) in [0, INDEX_LIMIT); a tile with
#: an input outside is PARTIAL (Python and CUDA check it), so int32 arithmetic never overflows.
INDEX_LIMIT = 2**24
_INT32_MAX = 2**31 - 1

Q_LO = sympy.Symbol("q_lo", integer=True, nonnegative=True)
Q_HI = sympy.Symbol("q_hi", integer=True, nonnegative=True)
KV_LO = sympy.Symbol("kv_lo", integer=True, nonnegative=True)
KV_HI = sympy.Symbol("kv_hi", integer=True, nonnegative=True)


_PRINTER = CudaPrinter().with_names({Q_LO: "q_lo", Q_HI: "q_hi", KV_LO: "kv_lo", KV_HI: "kv_hi"})
_INPUTS = (Q_LO, Q_HI, KV_LO, KV_HI, B, H, Q_LEN, KV_LEN)
_LOWEST = {Q_LEN: 1, KV_LEN: 1}  # smallest valid value of an input (lengths are positive), else 0


class ReadBound(sympy.Symbol):
    """The run-time min (``rd<k>_lo``) or max (``rd<k>_hi``) of a buffer read over a tile
    (:mod:`attncompiler.ir.bufreads`); valid iff ``rd<k>_ok``, and then in (-INDEX_LIMIT, INDEX_LIMIT)."""

    @property
    def ok_name(self) -> str:
        return self.name.rsplit("_", 1)[0] + "_ok"


def tile_box() -> dict[sympy.Symbol, Interval]:
    """The box of one tile: q_idx, kv_idx ranged; b, h, q_len, kv_len fixed (points)."""
    return {Q_IDX: (Q_LO, Q_HI), KV_IDX: (KV_LO, KV_HI), B: (B, B), H: (H, H),
            Q_LEN: (Q_LEN, Q_LEN), KV_LEN: (KV_LEN, KV_LEN)}


# ---------------------------------------------------------------------------------------------
# interval arithmetic
# ---------------------------------------------------------------------------------------------
def bound(expr: sympy.Expr | int, box: Mapping[sympy.Symbol, tuple[Any, Any]] | None = None,
          reads: Any = None) -> Interval | None:
    """Sound ``(lo, hi)`` of ``expr`` over ``box`` (symbol -> (lo, hi)), or None if unknown.

    Bounds may be symbolic (sympy expressions in the box's ends) or numbers.  Symbols missing from
    the box are free, i.e. unknown; a symbol with ``lo == hi`` is a point.  Buffer reads are unknown
    unless ``reads`` (a :class:`attncompiler.ir.bufreads.ReadContext`) gives int reads run-time
    value ranges (:class:`ReadBound` symbols).
    """
    b = {s: (sympy.sympify(lo), sympy.sympify(hi)) for s, (lo, hi) in (box or tile_box()).items()}
    return _Bounder(b, reads).bound(sympy.sympify(expr))


class _Bounder:
    def __init__(self, box: dict[sympy.Symbol, Interval], reads: Any = None) -> None:
        self.box = box
        self.reads = reads  # a bufreads.ReadContext: int buffer reads get run-time value ranges
        self.points = {s: lo for s, (lo, hi) in box.items() if lo == hi}
        self.ranged = tuple(sorted((s for s in box if s not in self.points), key=sympy.default_sort_key))

    def is_point(self, e: sympy.Basic) -> bool:
        return not e.has(sympy.Indexed) and e.free_symbols <= self.points.keys() and not e.has(sympy.nan, sympy.zoo)

    def bound(self, e: sympy.Expr) -> Interval | None:
        if _is_bool(e) or not isinstance(e, sympy.Expr):
            return None
        if self.is_point(e):
            v = e.xreplace(self.points)
            return (v, v) if v.is_finite is not False else None
        lin = self._linear(e)
        if lin is not None:
            return lin
        if isinstance(e, sympy.Symbol):
            return self.box.get(e)
        if isinstance(e, sympy.Indexed):
            return None if self.reads is None else self.reads.interval(e, self)
        if e.is_Add:
            reads = [a for a in e.args if a.has(sympy.Indexed)]
            rest = [a for a in e.args if not a.has(sympy.Indexed)]
            parts = [sympy.Add(*rest), *reads] if reads and len(rest) > 1 else e.args  # keep q - kv correlated
            return self._fold(parts, lambda x, y: (x[0] + y[0], x[1] + y[1]))
        if e.is_Mul:
            return self._fold(e.args, _mul_iv)
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return _pow_iv(self.bound(e.base), int(e.exp))
        if isinstance(e, sympy.Abs):
            return _abs_iv(self.bound(e.args[0]))
        if isinstance(e, (sympy.Min, sympy.Max)):
            f = sympy.Min if isinstance(e, sympy.Min) else sympy.Max
            return self._fold(e.args, lambda x, y: (f(x[0], y[0]), f(x[1], y[1])))
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            iv = self.bound(e.args[0])
            return None if iv is None else (type(e)(iv[0]), type(e)(iv[1]))
        if isinstance(e, sympy.Mod):
            return self._mod(e)
        if isinstance(e, sympy.Piecewise):
            ivs = [self.bound(pc.expr) for pc in e.args]
            if any(iv is None for iv in ivs):
                return None
            if all(self.is_point(pc.cond) for pc in e.args):  # the branch is known per tile: exact
                conds = [pc.cond.xreplace(self.points) for pc in e.args]
                return (sympy.Piecewise(*((iv[0], c) for iv, c in zip(ivs, conds))),
                        sympy.Piecewise(*((iv[1], c) for iv, c in zip(ivs, conds))))
            return sympy.Min(*(iv[0] for iv in ivs)), sympy.Max(*(iv[1] for iv in ivs))
        return None

    def _fold(self, args: Any, combine: Callable[[Interval, Interval], Interval]) -> Interval | None:
        acc: Interval | None = None
        for a in args:
            iv = self.bound(a)
            if iv is None:
                return None
            acc = iv if acc is None else combine(acc, iv)
        return acc

    def _linear(self, e: sympy.Expr) -> Interval | None:
        """Exact range of an expression affine in the ranged symbols with point coefficients."""
        used = [s for s in self.ranged if e.has(s)]
        if not used or e.has(sympy.Indexed):
            return None
        poly = e.as_poly(*used)
        if poly is None or poly.total_degree() > 1:
            return None
        const = poly.coeff_monomial(1)
        if not self.is_point(const):
            return None
        lo = hi = const.xreplace(self.points)
        for s in used:
            c = poly.coeff_monomial(s)
            if not self.is_point(c):
                return None
            slo, shi = _mul_iv((c.xreplace(self.points),) * 2, self.box[s])
            lo, hi = lo + slo, hi + shi
        return lo, hi

    def _mod(self, e: sympy.Mod) -> Interval | None:
        x, m = e.args
        if not (self.is_point(m) and m.xreplace(self.points).is_positive):
            return None
        m = m.xreplace(self.points)
        if not (x.is_integer and m.is_integer):
            return (sympy.Integer(0), m)  # [0, m) closed up
        iv = self.bound(x)
        if iv is None or not m.is_Integer:
            return (sympy.Integer(0), m - 1)
        same = sympy.Eq(sympy.floor(iv[0] / m), sympy.floor(iv[1] / m))  # no wrap inside the range
        if same is sympy.true:
            return sympy.Mod(iv[0], m), sympy.Mod(iv[1], m)
        if same is sympy.false:
            return (sympy.Integer(0), m - 1)
        return (sympy.Piecewise((sympy.Mod(iv[0], m), same), (0, True)),
                sympy.Piecewise((sympy.Mod(iv[1], m), same), (m - 1, True)))


def _is_bool(e: Any) -> bool:
    """A logical value (sympy's Symbol also subclasses Boolean, so test the logical kinds)."""
    return isinstance(e, (bool, Relational, BooleanAtom, BooleanFunction))


# ---------------------------------------------------------------------------------------------
# exactness guards: int-only arithmetic, int32 range for inputs below INDEX_LIMIT
# ---------------------------------------------------------------------------------------------
def _exact_int(e: sympy.Expr, printer: CudaPrinter = _PRINTER) -> bool:
    try:
        if printer.ctype(e) != "int":
            return False
        return all(printer.ctype(r.lhs) == "int" and printer.ctype(r.rhs) == "int" for r in e.atoms(Relational))
    except PrinterError:
        return False


def _mag(e: sympy.Basic) -> float:
    """Upper bound on |value| of e and of every intermediate C computes for it."""
    if e.is_Integer:
        return abs(int(e))
    if isinstance(e, (BooleanTrue, BooleanFalse)):
        return 1
    if isinstance(e, sympy.Symbol):
        return INDEX_LIMIT if e in _INPUTS or isinstance(e, ReadBound) else math.inf
    if e.is_Add:
        return float(sum(_mag(a) for a in e.args))
    if isinstance(e, Relational):  # int sides (_exact_int) print as `a OP b`: no difference is formed
        return max(_mag(a) for a in e.args)
    if e.is_Mul:
        return math.prod(_mag(a) for a in e.args)
    if e.is_Pow and e.exp.is_Integer and e.exp > 0:
        return _mag(e.base) ** int(e.exp)
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        n, d = int_division_parts(e.args[0])
        return max(_mag(n), _mag(d)) + 1
    if isinstance(e, (sympy.Mod, sympy.Min, sympy.Max, sympy.Abs, sympy.And, sympy.Or, sympy.Not, sympy.ITE)):
        return max(_mag(a) for a in e.args)
    if isinstance(e, sympy.Piecewise):
        return max(max(_mag(pc.expr), _mag(pc.cond)) for pc in e.args)
    return math.inf


# ---------------------------------------------------------------------------------------------
# the classification tree
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConstNode:
    """A class known without looking at the tile."""

    value: int

    def evaluate(self, env: Env) -> int:
        return self.value


@dataclass(frozen=True)
class RelNode:
    """``d OP 0`` with ``d`` in ``[lo, hi]`` over the tile; op is ">=", ">", "==" or "!=".

    FULL / EMPTY conditions:  >=: lo >= 0 / hi < 0;  >: lo > 0 / hi <= 0;
    ==: lo == hi == 0 / (lo > 0 or hi < 0);  !=: the reverse of ==.
    """

    op: str
    lo: sympy.Expr
    hi: sympy.Expr
    source: str = ""
    _lo_fn: Callable[[Env], Any] = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    _hi_fn: Callable[[Env], Any] = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    _reads: tuple[ReadBound, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lo_fn", _compile(self.lo))
        object.__setattr__(self, "_hi_fn", _compile(self.hi))
        reads = {s for s in self.lo.free_symbols | self.hi.free_symbols if isinstance(s, ReadBound)}
        object.__setattr__(self, "_reads", tuple(sorted(reads, key=lambda s: s.name)))

    def read_flags(self) -> list[str]:
        """CUDA names of the validity flags of the buffer reads this node uses."""
        return sorted({s.ok_name for s in self._reads})

    @staticmethod
    def decide(op: str, lo: Any, hi: Any) -> tuple[Any, Any]:
        """(full, empty): Python bools for numbers, sympy booleans for sympy expressions."""
        sym = isinstance(lo, sympy.Basic) or isinstance(hi, sympy.Basic)
        ge, gt = (sympy.Ge, sympy.Gt) if sym else (operator.ge, operator.gt)
        both, either = (sympy.And, sympy.Or) if sym else ((lambda x, y: x and y), (lambda x, y: x or y))
        if op == ">=":
            return ge(lo, 0), gt(0, hi)
        if op == ">":
            return gt(lo, 0), ge(0, hi)
        zero = both(ge(lo, 0), ge(0, hi))  # lo == hi == 0 (lo <= hi)
        off = either(gt(lo, 0), gt(0, hi))  # 0 outside [lo, hi]
        return (zero, off) if op == "==" else (off, zero)

    def evaluate(self, env: Env) -> int:
        if any(env[s] is None for s in self._reads):  # a buffer read with no known value range
            return TILE_PARTIAL
        full, empty = self.decide(self.op, self._lo_fn(env), self._hi_fn(env))
        return TILE_FULL if full else (TILE_EMPTY if empty else TILE_PARTIAL)

    def cuda_conditions(self, lo: str, hi: str) -> tuple[str, str]:
        if self.op == ">=":
            return f"{lo} >= 0", f"{hi} < 0"
        if self.op == ">":
            return f"{lo} > 0", f"{hi} <= 0"
        both, either = f"({lo} >= 0 && {hi} <= 0)", f"({lo} > 0 || {hi} < 0)"
        return (both, either) if self.op == "==" else (either, both)


@dataclass(frozen=True)
class AndNode:
    children: tuple["TileNode", ...]

    def evaluate(self, env: Env) -> int:
        return min(c.evaluate(env) for c in self.children)


@dataclass(frozen=True)
class OrNode:
    children: tuple["TileNode", ...]

    def evaluate(self, env: Env) -> int:
        return max(c.evaluate(env) for c in self.children)


@dataclass(frozen=True)
class NotNode:
    child: "TileNode"

    def evaluate(self, env: Env) -> int:
        return TILE_FULL + TILE_EMPTY - self.child.evaluate(env)


TileNode = Union[ConstNode, RelNode, AndNode, OrNode, NotNode]
_PARTIAL = ConstNode(TILE_PARTIAL)


def _and(children: list[TileNode]) -> TileNode:
    flat: list[TileNode] = []
    for c in children:
        for g in (c.children if isinstance(c, AndNode) else (c,)):
            if g == ConstNode(TILE_EMPTY):
                return g
            if g != ConstNode(TILE_FULL) and g not in flat:
                flat.append(g)
    return ConstNode(TILE_FULL) if not flat else (flat[0] if len(flat) == 1 else AndNode(tuple(flat)))


def _or(children: list[TileNode]) -> TileNode:
    flat: list[TileNode] = []
    for c in children:
        for g in (c.children if isinstance(c, OrNode) else (c,)):
            if g == ConstNode(TILE_FULL):
                return g
            if g != ConstNode(TILE_EMPTY) and g not in flat:
                flat.append(g)
    return ConstNode(TILE_EMPTY) if not flat else (flat[0] if len(flat) == 1 else OrNode(tuple(flat)))


def _not(c: TileNode) -> TileNode:
    if isinstance(c, ConstNode):
        return ConstNode(TILE_FULL + TILE_EMPTY - c.value)
    return c.child if isinstance(c, NotNode) else NotNode(c)


def _build(m: Any, ctx: Any = None) -> TileNode:  # noqa: C901 - one branch per boolean form
    """The tree of mask ``m``; ``ctx`` (a bufreads.ReadContext) bounds int buffer reads."""

    def rec(a: Any) -> TileNode:
        return _build(a, ctx)

    if m is None or m is True or isinstance(m, BooleanTrue):
        return ConstNode(TILE_FULL)
    if m is False or isinstance(m, BooleanFalse):
        return ConstNode(TILE_EMPTY)
    if isinstance(m, sympy.And):
        return _and([rec(a) for a in m.args])
    if isinstance(m, sympy.Or):
        return _or([rec(a) for a in m.args])
    if isinstance(m, sympy.Not):
        return _not(rec(m.args[0]))
    if isinstance(m, sympy.Xor):
        acc = rec(m.args[0])
        for a in m.args[1:]:
            x = rec(a)
            acc = _or([_and([acc, _not(x)]), _and([_not(acc), x])])
        return acc
    if isinstance(m, sympy.Implies):
        return _or([_not(rec(m.args[0])), rec(m.args[1])])
    if isinstance(m, sympy.Equivalent):
        parts = [rec(a) for a in m.args]
        return _or([_and(parts), _and([_not(p) for p in parts])])
    if isinstance(m, sympy.ITE):
        c = rec(m.args[0])
        return _or([_and([c, rec(m.args[1])]), _and([_not(c), rec(m.args[2])])])
    if isinstance(m, sympy.Piecewise) and all(_is_bool(pc.expr) for pc in m.args):
        # value of the first piece whose condition holds: OR_i (c_i and not c_<i and e_i)
        terms, earlier = [], []
        for pc in m.args:
            c = rec(pc.cond)
            terms.append(_and([c, *earlier, rec(pc.expr)]))
            earlier.append(_not(c))
        return _or(terms)
    if isinstance(m, Relational):
        return _relational(m, ctx)
    return _PARTIAL


def _relational(rel: Relational, ctx: Any = None) -> TileNode:
    lhs, rhs, op = rel.lhs, rel.rhs, rel.rel_op
    if _is_bool(lhs) or _is_bool(rhs):
        if op not in ("==", "!="):
            return _PARTIAL
        eq = _build(sympy.Equivalent(lhs, rhs, evaluate=False), ctx)
        return eq if op == "==" else _not(eq)
    if op in ("<", "<="):
        d, op = rhs - lhs, {"<": ">", "<=": ">="}[op]
    elif op in (">", ">=", "==", "!="):
        d = lhs - rhs
    else:
        return _PARTIAL
    if d.has(sympy.Float):
        return _PARTIAL
    coeffs = d.as_coefficients_dict().values()
    if all(c.is_Rational for c in coeffs):
        d = math.lcm(*(int(c.q) for c in coeffs)) * d
    iv = bound(d, reads=ctx)
    if iv is None:
        return _PARTIAL
    lo, hi = iv
    printer = _PRINTER if ctx is None else ctx.printer()
    if not (_exact_int(lo, printer) and _exact_int(hi, printer)) or max(_mag(lo), _mag(hi)) > _INT32_MAX:
        return _PARTIAL
    full, empty = RelNode.decide(op, lo, hi)
    if full is sympy.true:
        return ConstNode(TILE_FULL)
    if empty is sympy.true:
        return ConstNode(TILE_EMPTY)
    if full is sympy.false and empty is sympy.false:
        return _PARTIAL
    try:
        return RelNode(op, lo, hi, str(rel))
    except ValueError:
        return _PARTIAL


def _walk(root: TileNode) -> list[TileNode]:
    """Every node of the tree, children before parents (the CUDA emission order)."""
    out: dict[TileNode, None] = {}

    def walk(n: TileNode) -> None:
        if n in out:
            return
        for c in (n.child,) if isinstance(n, NotNode) else getattr(n, "children", ()):
            walk(c)
        out[n] = None

    walk(root)
    return list(out)


# ---------------------------------------------------------------------------------------------
# the classifier
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TileClassifier:
    """EMPTY / PARTIAL / FULL for tiles of one mask; Python and CUDA from the same tree."""

    mask: sympy.Basic | None
    root: TileNode
    reads: tuple[Any, ...] = ()  # the bufreads.BufferRead's the tree uses, by k
    _inputs: frozenset[sympy.Symbol] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        syms: set[sympy.Symbol] = set()
        for n in self.nodes():
            if isinstance(n, RelNode):
                syms |= {s for s in n.lo.free_symbols | n.hi.free_symbols if not isinstance(s, ReadBound)}
        for r in self.reads:
            syms |= r.inputs()
        object.__setattr__(self, "_inputs", frozenset(syms))

    @classmethod
    def from_mask(cls, mask: sympy.Basic | bool | None, buffers: object = None) -> "TileClassifier":
        from .bufreads import ReadContext

        m = mask if mask is None or isinstance(mask, sympy.Basic) else sympy.sympify(mask)
        ctx = ReadContext(m, buffers)
        root = _build(m, ctx)
        used = {s for n in _walk(root) if isinstance(n, RelNode) for s in n._reads}
        return cls(m, root, tuple(r for r in ctx.reads.values() if r.lo_sym in used or r.hi_sym in used))

    def nodes(self) -> list[TileNode]:
        """Every node, children before parents (the CUDA emission order)."""
        return _walk(self.root)

    def inputs(self) -> frozenset[sympy.Symbol]:
        """The symbols classification reads (of q_lo, q_hi, kv_lo, kv_hi, b, h, q_len, kv_len)."""
        return self._inputs

    def buffer_values(self, buffers: Mapping[str, Any] | None) -> dict[str, Any]:
        """The buffers :meth:`classify` reads, as ``bufreads.BufferValues`` (convert once, classify often)."""
        from .bufreads import BufferValues

        names = {r.name for r in self.reads}
        return {n: BufferValues.of(v) for n, v in (buffers or {}).items() if n in names}

    def classify(self, q_lo: int, q_hi: int, kv_lo: int, kv_hi: int, b: int = 0, h: int = 0,
                 q_len: int | None = None, kv_len: int | None = None,
                 buffers: Mapping[str, Any] | None = None) -> int:
        """TILE_EMPTY / TILE_PARTIAL / TILE_FULL of tile [q_lo, q_hi] x [kv_lo, kv_hi] (inclusive).

        ``buffers``: name -> int tensor / nested list / BufferValues (:meth:`buffer_values`); the
        mask's buffer reads are unknown (their relationals PARTIAL) without them."""
        if q_lo > q_hi or kv_lo > kv_hi:
            raise ValueError(f"empty tile [{q_lo}, {q_hi}] x [{kv_lo}, {kv_hi}]")
        env: dict[sympy.Symbol, Any] = {Q_LO: q_lo, Q_HI: q_hi, KV_LO: kv_lo, KV_HI: kv_hi, B: b, H: h,
                                        Q_LEN: q_len, KV_LEN: kv_len}
        missing = [str(s) for s in self._inputs if env[s] is None]
        if missing:
            raise ValueError(f"mask needs {', '.join(sorted(missing))} to classify tiles")
        if any(not _LOWEST.get(s, 0) <= env[s] < INDEX_LIMIT for s in self._inputs):
            return TILE_PARTIAL  # the bounds' int arithmetic is only guarded below INDEX_LIMIT
        if self.reads:
            values = self.buffer_values(buffers)
            for r in self.reads:
                iv = r.evaluate(env, values)
                env[r.lo_sym], env[r.hi_sym] = iv if iv is not None else (None, None)
        return self.root.evaluate(env)

    def to_cuda(self) -> str:
        """Body of ``Variant::tile_class(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi,
        const AttnParams& p, const AttnBuffers& buf)``."""
        head = f"  // tile class of mask: {' '.join(str(self.mask).split())}"
        if isinstance(self.root, ConstNode):
            return f"{head}\n  return {_CUDA_CLASS[self.root.value]};"
        lines = [head]
        if self._inputs:
            checks = []
            for x in (x for x in _INPUTS if x in self._inputs):  # lowest <= x < INDEX_LIMIT, one compare
                low, name = _LOWEST.get(x, 0), _PRINTER.print(x)
                checks.append(f"(unsigned)({name}{f' - {low}' if low else ''}) >= {INDEX_LIMIT - low}u")
            guard = " ||\n      ".join(checks)
            lines.append(f"  // the bounds below are exact int arithmetic for inputs in [0, {INDEX_LIMIT})")
            lines.append(f"  if ({guard})\n    return AC_TILE_PARTIAL;")
        printer = _PRINTER.with_names({s: s.name for r in self.reads for s in (r.lo_sym, r.hi_sym)})
        for r in self.reads:
            lines += ["  " + ln for ln in r.to_cuda(printer)]
        names: dict[TileNode, str] = {}
        for i, n in enumerate(self.nodes()):
            t = names[n] = f"t{i}"
            if isinstance(n, ConstNode):
                lines.append(f"  const int {t} = {_CUDA_CLASS[n.value]};")
            elif isinstance(n, RelNode):
                lines.append(f"  // {n.source}: d {n.op} 0 with d in [lo{i}, hi{i}]")
                lines.append(f"  const int lo{i} = {printer.print(n.lo, 'int')};")
                lines.append(f"  const int hi{i} = {printer.print(n.hi, 'int')};")
                full, empty = n.cuda_conditions(f"lo{i}", f"hi{i}")
                cls = f"{full} ? AC_TILE_FULL : ({empty} ? AC_TILE_EMPTY : AC_TILE_PARTIAL)"
                if n.read_flags():  # a buffer read with no known value range: PARTIAL
                    cls = f"!({' && '.join(n.read_flags())}) ? AC_TILE_PARTIAL : ({cls})"
                lines.append(f"  const int {t} = {cls};")
            elif isinstance(n, NotNode):
                lines.append(f"  const int {t} = AC_TILE_FULL + AC_TILE_EMPTY - {names[n.child]};  // not")
            else:
                pick, what = ("<", "and: min") if isinstance(n, AndNode) else (">", "or: max")
                lines.append(f"  int {t} = {names[n.children[0]]};  // {what}")
                for c in n.children[1:]:
                    lines.append(f"  {t} = {names[c]} {pick} {t} ? {names[c]} : {t};")
        lines.append(f"  return {names[self.root]};")
        return "\n".join(lines)


def tile_classifier(mask: sympy.Basic | bool | None, buffers: object = None) -> TileClassifier:
    """:class:`TileClassifier` for a mask expression (None: every key visible, always FULL).

    ``buffers`` (the IR's ``BufferInfo`` tuple or ``{name: "int" | "float"}``) says which buffers
    are int: reads of those get run-time value ranges (:mod:`attncompiler.ir.bufreads`)."""
    return TileClassifier.from_mask(mask, buffers)
