"""sympy -> CUDA C++ expression printer.

:func:`print_cuda` turns a traced score / mask expression (see :mod:`attncompiler.spec.symbols`)
into one CUDA C++ expression.  Every sub-expression is given a C type -- ``bool``, ``int`` or
``float`` -- and printed so that C computes what sympy means:

* index arithmetic (``b, h, q_idx, kv_idx, p.Nq, p.Nk``, int buffers, Integer constants) stays
  ``int``; products of indices are not widened, so they must fit in 32 bits.
* anything touching ``score``, a Float, a non-integer Rational, a float buffer, a true division
  or a transcendental function is ``float`` (single precision).  Constants are float literals
  (``0.5f``, ``30.0f``); a Rational coefficient p/q prints as ``p * x / q.0f`` so that C never
  performs integer division.
* ``floor(a/b)`` of integers prints as ``ac_floordiv(a, b)`` and ``Mod`` of integers as
  ``ac_mod(a, b)`` (Python semantics, common.cuh); float floor / ceil are ``floorf`` / ``ceilf``,
  float ``Mod(a, m)`` is ``a - m * floorf(a / m)``.
* math is single precision: ``expf``, ``logf``, ``tanhf``, ``sqrtf``, ``powf``, ``fabsf`` ...
  We print the accurate ``expf`` / ``logf`` rather than the ``__expf`` / ``__logf`` intrinsics:
  the score modifier runs once per score element, its cost is small next to the two mma's, and
  NVRTC's ``--use_fast_math`` maps them onto the intrinsics anyway when speed is asked for.
* a comparison of an integer expression with a non-integer Rational (``kv_idx < q_idx / 2``) is
  multiplied through by the common denominator so that it is decided exactly in ``int``.
* ``Piecewise`` prints as nested ``(c ? a : b)``; booleans as ``&&``, ``||``, ``!``.

``fast=True`` (what the kernels' hooks use, :mod:`attncompiler.codegen.hooks`) trades the last ulp
for throughput in the per-element hook math, where every extra MUFU / conversion instruction
competes with the softmax's exp2 for the same quarter-rate pipe:

* an int expression whose magnitude is provably below ``2**22`` when every index and length is at
  most :data:`FAST_INDEX_LIMIT` (sums and products of ``q_idx, kv_idx, b, h, p.Nq, p.Nk`` and
  constants) converts with ``ac_i2f`` -- an integer add and a float subtract on the FMA pipes,
  exact in that range -- instead of an I2F instruction; the runtime refuses longer sequences for
  such variants (:func:`uses_fast_index` + the launch checks);
* division by a constant multiplies by its float reciprocal, division by a run-time value is
  ``__fdividef`` and ``1/sqrt`` is ``rsqrtf`` (no IEEE division subroutine per element);
* ``tanh`` is ``ac_tanhf`` (``tanh.approx.f32``: one MUFU op, max relative error ~2**-11, as
  FlashAttention's softcapping uses).

Buffers ``name[i0, ..., ik]`` print row-major with clamped indices (docs/architecture.md).  Their
element type comes from ``buffers`` (``BufferInfo``'s or a name -> kind mapping), else from the
IndexedBase's ``integer`` assumption, else ``float``.

Output is deterministic (terms and arguments in sympy's canonical sort order) and parenthesized
by C precedence.  Unsupported nodes raise :class:`PrinterError`.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, NamedTuple

import sympy
from sympy.logic.boolalg import BooleanFalse, BooleanTrue

from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE

__all__ = ["CType", "PrinterError", "CudaPrinter", "SYMBOL_NAMES", "print_cuda", "cuda_type", "int_division_parts",
           "FAST_INDEX_LIMIT", "uses_fast_index"]

CType = Literal["bool", "int", "float"]

#: CUDA spelling of the shared symbols (docs/architecture.md, "Hooks").
SYMBOL_NAMES: tuple[tuple[sympy.Symbol, str], ...] = (
    (SCORE, "score"), (B, "b"), (H, "h"), (Q_IDX, "q_idx"), (KV_IDX, "kv_idx"),
    (Q_LEN, "p.Nq"), (KV_LEN, "p.Nk"),
)

_SUPPORTED = (
    "numbers (Integer, Rational, Float, pi, E, +-oo), the symbols score/b/h/q_idx/kv_idx/q_len/kv_len, "
    "buffer Indexed, Add, Mul, Pow, floor, ceiling, Mod, Abs, Min, Max, Piecewise, ITE, sign, "
    "exp, log, sqrt, tanh, sinh, cosh, sin, cos, tan, asin, acos, atan, atan2, erf, "
    "And, Or, Not, Xor, Eq, Ne, Lt, Le, Gt, Ge, true, false"
)

_FLOAT_FUNCS: dict[type, str] = {
    sympy.exp: "expf", sympy.log: "logf", sympy.tanh: "tanhf", sympy.sinh: "sinhf",
    sympy.cosh: "coshf", sympy.sin: "sinf", sympy.cos: "cosf", sympy.tan: "tanf",
    sympy.asin: "asinf", sympy.acos: "acosf", sympy.atan: "atanf", sympy.erf: "erff",
    sympy.atan2: "atan2f",
}

# C operator precedence (higher binds tighter).
_ATOM, _UNARY, _MUL, _ADD, _REL, _EQ, _AND, _OR, _COND = 100, 90, 80, 70, 60, 55, 40, 30, 20
_INT32_MAX = 2**31 - 1
_MAX_INT_POW = 8  # x**n with integer n up to this prints as repeated multiplication (int)
_MAX_FLOAT_POW = 4  # ... and up to this for float; beyond, powf

#: fast=True: the ``ac_i2f`` conversions are proven exact for indices (q_idx, kv_idx, b, h) below and
#: lengths (Nq, Nk, B, H) up to this; the runtime refuses larger ones for variants that use them.
FAST_INDEX_LIMIT = 2**21
#: ``ac_i2f`` (common.cuh) is exact for integers in [-2**22, 2**22).
_FAST_I2F_BOUND = 2**22 - 1


class PrinterError(ValueError):
    """A sympy expression that has no CUDA spelling here."""


def _unsupported(expr: object) -> PrinterError:
    return PrinterError(
        f"cannot print sympy node {type(expr).__name__} ({expr}) to CUDA: supported are {_SUPPORTED}"
    )


class _Out(NamedTuple):
    text: str
    ctype: str
    prec: int
    bound: int | None = None  # int results: |value| <= bound when indices <= FAST_INDEX_LIMIT


def _wrap(o: _Out, min_prec: int) -> str:
    return o.text if o.prec >= min_prec else f"({o.text})"


def _float32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


def _float_literal(v: float) -> _Out:
    """Shortest decimal that rounds to the same float32, with an ``f`` suffix."""
    if math.isnan(v):
        raise PrinterError("cannot print NaN to CUDA")
    f = _float32(v) if abs(v) < 3.4028235677973366e38 else math.copysign(math.inf, v)
    if math.isinf(f):
        return _Out("AC_NEG_INF", "float", _ATOM) if f < 0 else _Out("(-AC_NEG_INF)", "float", _ATOM)
    text = repr(f)
    for digits in range(1, 10):
        cand = f"{f:.{digits}g}"
        if _float32(float(cand)) == f:
            text = repr(float(cand))  # same digits, positional for 1e-4 <= |x| < 1e16
            break
    if "e" not in text and "." not in text:
        text += ".0"
    return _Out(text + "f", "float", _UNARY if text.startswith("-") else _ATOM)


def _int_literal(n: int) -> _Out:
    text = str(n) if abs(n) <= _INT32_MAX else f"{n}LL"
    return _Out(text, "int", _UNARY if n < 0 else _ATOM, abs(n))


def _join(types: Iterable[str]) -> str:
    ts = set(types)
    if "bool" in ts and len(ts) > 1:
        raise PrinterError("cannot mix booleans with arithmetic in a CUDA expression")
    return "float" if "float" in ts else ("int" if "int" in ts else "bool")


def _buffer_kinds(buffers: object) -> tuple[tuple[str, str, int], ...]:
    """Normalize BufferInfo's / {name: kind} / None to ((name, kind, ndim or -1), ...)."""
    if buffers is None:
        return ()
    if isinstance(buffers, Mapping):
        return tuple(sorted((str(k), str(v), -1) for k, v in buffers.items()))
    return tuple(sorted((b.name, b.kind, b.ndim) for b in buffers))  # type: ignore[attr-defined]


def int_division_parts(arg: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """``(n, d)`` with ``arg == n / d`` as the printer splits floor / ceiling arguments."""
    n, d = sympy.fraction(sympy.together(arg))
    return n, d


@dataclass(frozen=True)
class CudaPrinter:
    """A configured printer: symbol spellings, symbol C types and buffer element kinds."""

    names: tuple[tuple[sympy.Symbol, str], ...] = SYMBOL_NAMES
    float_symbols: frozenset[sympy.Symbol] = frozenset({SCORE})
    buffers: tuple[tuple[str, str, int], ...] = field(default=())
    fast: bool = False  # the kernels' hook math (module docstring)

    def with_names(self, extra: Mapping[sympy.Symbol, str]) -> "CudaPrinter":
        """A printer that also knows the symbols in ``extra`` (int unless in float_symbols)."""
        return CudaPrinter(self.names + tuple(extra.items()), self.float_symbols, self.buffers, self.fast)

    def print(self, expr: sympy.Basic | bool | int | float, kind: CType | None = None) -> str:
        return _Emitter(self).top(_sympify(expr), kind)

    def ctype(self, expr: sympy.Basic | bool | int | float) -> CType:
        return _Emitter(self).p(_sympify(expr)).ctype  # type: ignore[return-value]


def _sympify(expr: object) -> sympy.Basic:
    if isinstance(expr, bool):
        return sympy.true if expr else sympy.false
    return sympy.sympify(expr)


def print_cuda(
    expr: sympy.Basic | bool | int | float,
    *,
    kind: CType | None = None,
    buffers: object = None,
    fast: bool = False,
) -> str:
    """CUDA C++ expression for ``expr``.

    ``kind`` asks for a result type: "float" casts an int (or bool) result to float, "int" accepts
    int (bool becomes 0/1; float raises), "bool" compares a number with 0.  ``buffers``: the
    IR's ``BufferInfo`` tuple or ``{name: "float" | "int"}``.  ``fast``: the kernels' hook math
    (module docstring).
    """
    return CudaPrinter(buffers=_buffer_kinds(buffers), fast=fast).print(expr, kind)


def uses_fast_index(text: str) -> bool:
    """Whether printed (``fast=True``) code converts indices with ``ac_i2f``, which is exact only
    for indices and lengths up to :data:`FAST_INDEX_LIMIT`."""
    return "ac_i2f(" in text


def cuda_type(expr: sympy.Basic | bool | int | float, *, buffers: object = None) -> CType:
    """The C type (bool / int / float) :func:`print_cuda` gives ``expr``."""
    return CudaPrinter(buffers=_buffer_kinds(buffers)).ctype(expr)


class _Emitter:
    """One printing pass (memoized per sub-expression)."""

    def __init__(self, cfg: CudaPrinter) -> None:
        self.names = dict(cfg.names)
        self.float_symbols = cfg.float_symbols
        self.buffers = {name: (kind, ndim) for name, kind, ndim in cfg.buffers}
        self.fast = cfg.fast
        self.memo: dict[sympy.Basic, _Out] = {}

    # -- entry points -------------------------------------------------------------------------
    def top(self, expr: sympy.Basic, kind: CType | None) -> str:
        o = self.p(expr)
        if kind is None or kind == o.ctype:
            return o.text
        if kind == "float":
            return self.as_float(o).text
        if kind == "int":
            if o.ctype == "bool":
                return f"({_wrap(o, _COND + 1)} ? 1 : 0)"
            raise PrinterError(f"expression {expr} is float, an int was asked for")
        if kind == "bool":
            zero = "0.0f" if o.ctype == "float" else "0"
            return f"{_wrap(o, _REL)} != {zero}"
        raise PrinterError(f"unknown kind {kind!r}")

    def p(self, expr: sympy.Basic) -> _Out:
        o = self.memo.get(expr)
        if o is None:
            o = self._dispatch(expr)
            self.memo[expr] = o
        return o

    # -- conversions --------------------------------------------------------------------------
    def as_float(self, o: _Out) -> _Out:
        if o.ctype == "float":
            return o
        if o.ctype == "bool":
            return _Out(f"({_wrap(o, _COND + 1)} ? 1.0f : 0.0f)", "float", _ATOM)
        if o.text.lstrip("-").isdigit():  # an int literal
            return _float_literal(float(int(o.text)))
        if self.fast and o.bound is not None and o.bound <= _FAST_I2F_BOUND:
            return _Out(f"ac_i2f({o.text})", "float", _ATOM)
        return _Out(f"(float){_wrap(o, _UNARY)}", "float", _UNARY)

    def as_bool(self, o: _Out) -> _Out:
        if o.ctype == "bool":
            return o
        zero = "0.0f" if o.ctype == "float" else "0"
        return _Out(f"{_wrap(o, _REL)} != {zero}", "bool", _EQ)

    def number(self, n: sympy.Expr, as_float: bool) -> _Out:
        if n.is_Integer and not as_float:
            return _int_literal(int(n))
        return _float_literal(float(n))

    # -- dispatch -----------------------------------------------------------------------------
    def _dispatch(self, e: sympy.Basic) -> _Out:  # noqa: C901 - one branch per node kind
        if isinstance(e, BooleanTrue):
            return _Out("true", "bool", _ATOM)
        if isinstance(e, BooleanFalse):
            return _Out("false", "bool", _ATOM)
        if e.is_Integer:
            return _int_literal(int(e))
        if e.is_Rational:
            return _float_literal(float(Fraction(int(e.p), int(e.q))))
        if e.is_Float or isinstance(e, sympy.NumberSymbol):
            return _float_literal(float(e))
        if e is sympy.oo or e is sympy.S.NegativeInfinity:
            return _float_literal(float(e))
        if isinstance(e, sympy.Symbol):
            if e not in self.names:
                known = ", ".join(sorted(str(s) for s in self.names))
                raise PrinterError(f"unknown symbol {e} (known: {known})")
            if e in self.float_symbols:
                return _Out(self.names[e], "float", _ATOM)
            # indices are < FAST_INDEX_LIMIT, lengths <= FAST_INDEX_LIMIT (checked at launch)
            bound = {B: -1, H: -1, Q_IDX: -1, KV_IDX: -1, Q_LEN: 0, KV_LEN: 0}.get(e)
            return _Out(self.names[e], "int", _ATOM, None if bound is None else FAST_INDEX_LIMIT + bound)
        if isinstance(e, sympy.Indexed):
            return self._indexed(e)
        if e.is_Add:
            return self._add(e)
        if e.is_Mul:
            return self._mul(e)
        if e.is_Pow:
            return self._pow(e)
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            return self._floor(e)
        if isinstance(e, sympy.Mod):
            return self._mod(e)
        if isinstance(e, sympy.Abs):
            a = self.p(e.args[0])
            fn = "fabsf" if a.ctype == "float" else "abs"
            self._no_bool(a, e)
            return _Out(f"{fn}({a.text})", a.ctype, _ATOM, a.bound)
        if isinstance(e, sympy.sign):
            a = self.p(e.args[0])
            self._no_bool(a, e)
            zero = "0.0f" if a.ctype == "float" else "0"
            t = f"(({a.text}) > {zero}) - (({a.text}) < {zero})"
            return self.as_float(_Out(t, "int", _ADD)) if a.ctype == "float" else _Out(t, "int", _ADD)
        if isinstance(e, (sympy.Min, sympy.Max)):
            return self._minmax(e)
        if isinstance(e, sympy.Piecewise):
            return self._piecewise(e)
        if isinstance(e, sympy.ITE):
            return self._ternary([(e.args[1], e.args[0])], e.args[2])
        if type(e) in _FLOAT_FUNCS:
            args = ", ".join(self.as_float(self.p(a)).text for a in e.args)
            fn = "ac_tanhf" if self.fast and isinstance(e, sympy.tanh) else _FLOAT_FUNCS[type(e)]
            return _Out(f"{fn}({args})", "float", _ATOM)
        if isinstance(e, sympy.And) or isinstance(e, sympy.Or):
            op, prec = (" && ", _AND) if isinstance(e, sympy.And) else (" || ", _OR)
            outs = [self.as_bool(self.p(a)) for a in sorted(e.args, key=sympy.default_sort_key)]
            # parenthesize && inside || (and anything weaker inside &&), as -Wparentheses wants
            return _Out(op.join(_wrap(o, _AND + 1) for o in outs), "bool", prec)
        if isinstance(e, sympy.Not):
            return _Out("!" + _wrap(self.as_bool(self.p(e.args[0])), _UNARY), "bool", _UNARY)
        if isinstance(e, sympy.Xor):
            outs = [self.as_bool(self.p(a)) for a in sorted(e.args, key=sympy.default_sort_key)]
            acc = outs[0]
            for o in outs[1:]:
                acc = _Out(f"{_wrap(acc, _ADD)} != {_wrap(o, _ADD)}", "bool", _EQ)
            return acc
        if isinstance(e, sympy.core.relational.Relational) and e.rel_op in _REL_PREC:
            return self._relational(e)
        raise _unsupported(e)

    @staticmethod
    def _no_bool(o: _Out, e: sympy.Basic) -> None:
        if o.ctype == "bool":
            raise PrinterError(f"boolean argument in arithmetic node {e}")

    # -- nodes --------------------------------------------------------------------------------
    def _indexed(self, e: sympy.Indexed) -> _Out:
        name = str(e.base.label)
        if not name.isidentifier():
            raise PrinterError(f"buffer name {name!r} is not a C identifier")
        kind, ndim = self.buffers.get(name, (None, -1))
        if ndim >= 0 and ndim != len(e.indices):
            raise PrinterError(f"buffer {name} is {ndim}-d but indexed with {len(e.indices)} indices")
        flat = ""
        for k, idx in enumerate(e.indices):
            o = self.p(idx)
            if o.ctype != "int":
                raise PrinterError(f"buffer index {idx} of {name} is {o.ctype}, not an integer")
            term = f"ac_clamp({o.text}, buf.{name}_d{k})"
            if k == 0:
                flat = term
            else:
                lhs = flat if k == 1 else f"({flat})"
                flat = f"{lhs} * buf.{name}_d{k} + {term}"
        if kind is None:
            kind = "int" if e.is_integer else "float"
        return _Out(f"buf.{name}[{flat}]", "int" if kind == "int" else "float", _ATOM)

    def _add(self, e: sympy.Add) -> _Out:
        terms = list(e.as_ordered_terms())
        # lead with a term that has no minus sign when there is one (kv_idx - q_idx, not -q_idx + kv_idx)
        for i, t in enumerate(terms):
            if not t.could_extract_minus_sign():
                terms.insert(0, terms.pop(i))
                break
        outs = [self.p(t) for t in terms]
        ctype = _join(o.ctype for o in outs)
        as_float = ctype == "float"
        text = ""
        for i, t in enumerate(terms):
            neg = i > 0 and t.could_extract_minus_sign()
            body = -t if neg else t
            o = self.number(body, as_float) if body.is_Number else self.p(body)
            if self.fast and as_float and o.ctype == "int":  # ac_i2f instead of C's implicit I2F
                o = self.as_float(o)
            if i == 0:
                text = _wrap(o, _ADD)
            else:
                text += (" - " if neg else " + ") + _wrap(o, _ADD + 1)
        bounds = [o.bound for o in outs]
        bound = sum(bounds) if ctype == "int" and None not in bounds else None  # type: ignore[arg-type]
        return _Out(text, ctype, _ADD, bound)

    def _mul(self, e: sympy.Mul) -> _Out:
        coeff, rest = e.as_coeff_Mul()
        num: list[sympy.Expr] = []
        den: list[sympy.Expr] = []
        for f in ([] if rest == 1 else rest.as_ordered_factors()):
            if f.is_Pow and f.exp.is_Number and f.exp.is_negative:
                den.append(sympy.Pow(f.base, -f.exp))
            else:
                num.append(f)
        num_outs = [self.p(f) for f in num]
        den_outs = [self.p(f) for f in den]
        for o in num_outs + den_outs:
            self._no_bool(o, e)
        is_float = bool(den) or not coeff.is_Integer or any(o.ctype == "float" for o in num_outs + den_outs)
        negative = bool(coeff < 0)
        mag = -coeff if negative else coeff
        c_num, c_den = (mag.p, mag.q) if mag.is_Rational else (mag, 1)
        # numerator items: coefficient first, then float factors, then int factors
        items: list[_Out] = []
        if c_num != 1 or (mag.is_Float and not any(o.ctype == "float" for o in num_outs)):
            items.append(self.number(sympy.sympify(c_num), is_float))
        ints = [o for o in num_outs if o.ctype != "float"]
        if self.fast and is_float:  # explicit conversions, so that ac_i2f replaces C's implicit I2F
            ints = [self.as_float(o) for o in ints]
        items += [o for o in num_outs if o.ctype == "float"] + ints
        if is_float and (not items or items[0].ctype != "float"):
            items = [self.as_float(items[0])] + items[1:] if items else [_float_literal(1.0)]
        text = " * ".join(_wrap(o, _UNARY) for o in items)
        prec = _MUL if len(items) > 1 else (items[0].prec if items[0].prec >= _UNARY else _ATOM)
        dens: list[_Out] = ([_float_literal(float(c_den))] if c_den != 1 else []) + den_outs
        if dens and self.fast and not den_outs:  # x / c -> (1/c) * x: no division per element, and the
            # constant leads so that C's left-to-right products fold it into loop-invariant factors
            recip = _float_literal(1.0 / c_den).text
            text = f"{recip} * {_wrap(_Out(text, 'float', prec), _MUL)}" if text != "1.0f" else recip
            prec = _MUL
        elif dens:
            d_text = " * ".join(_wrap(o, _UNARY) for o in dens)
            d_out = _Out(d_text, "float", _MUL if len(dens) > 1 else max(dens[0].prec, _UNARY))
            if self.fast:
                text = f"__fdividef({text}, {d_out.text})"
                prec = _ATOM
            else:
                text = f"{_wrap(_Out(text, 'float', prec), _MUL)} / {_wrap(d_out, _MUL + 1)}"
                prec = _MUL
        if negative:  # -a * b == (-a) * b and -a / b == (-a) / b
            text = f"-({text})" if text.startswith("-") else "-" + text
            prec = _UNARY if prec >= _UNARY else _MUL
        bound = None
        if not is_float and all(o.bound is not None for o in num_outs):
            bound = int(abs(coeff))
            for o in num_outs:
                bound *= o.bound  # type: ignore[operator]
        return _Out(text, "float" if is_float else "int", prec, bound)

    def _pow(self, e: sympy.Pow) -> _Out:
        base, ex = e.base, e.exp
        b = self.p(base)
        self._no_bool(b, e)
        if ex.is_Integer:
            n = int(ex)
            limit = _MAX_INT_POW if b.ctype == "int" else _MAX_FLOAT_POW
            if 0 < abs(n) <= limit:
                t = " * ".join([_wrap(b, _UNARY)] * abs(n))
                prod = _Out(t, b.ctype, _MUL if abs(n) > 1 else max(b.prec, _UNARY))
            elif b.ctype == "float" or n < 0:
                prod = _Out(f"powf({self.as_float(b).text}, {abs(n)}.0f)", "float", _ATOM)
            else:
                raise PrinterError(f"integer power {e} too large for int arithmetic")
            if n > 0:
                if prod.ctype == "int" and b.bound is not None:
                    prod = prod._replace(bound=b.bound ** abs(n))
                return prod
            if self.fast:
                return _Out(f"__fdividef(1.0f, {self.as_float(prod).text})", "float", _ATOM)
            return _Out(f"1.0f / {_wrap(prod, _MUL + 1)}", "float", _MUL)
        if ex == sympy.Rational(1, 2):
            return _Out(f"sqrtf({self.as_float(b).text})", "float", _ATOM)
        if ex == sympy.Rational(-1, 2):
            if self.fast:
                return _Out(f"rsqrtf({self.as_float(b).text})", "float", _ATOM)
            return _Out(f"1.0f / sqrtf({self.as_float(b).text})", "float", _MUL)
        x = self.as_float(self.p(ex))
        return _Out(f"powf({self.as_float(b).text}, {x.text})", "float", _ATOM)

    def _floor(self, e: sympy.Function) -> _Out:
        arg = e.args[0]
        a = self.p(arg)
        self._no_bool(a, e)
        is_floor = isinstance(e, sympy.floor)
        if a.ctype == "int":
            return a
        n, d = int_division_parts(arg)
        if d != 1 and self.p(n).ctype == "int" and self.p(d).ctype == "int":
            if is_floor:
                return _Out(f"ac_floordiv({self.p(n).text}, {self.p(d).text})", "int", _ATOM)
            return _Out(f"-ac_floordiv({self.p(-n).text}, {self.p(d).text})", "int", _UNARY)
        return _Out(f"{'floorf' if is_floor else 'ceilf'}({a.text})", "float", _ATOM)

    def _mod(self, e: sympy.Mod) -> _Out:
        a, m = (self.p(x) for x in e.args)
        self._no_bool(a, e)
        self._no_bool(m, e)
        if a.ctype == "int" and m.ctype == "int":
            return _Out(f"ac_mod({a.text}, {m.text})", "int", _ATOM)
        fa, fm = self.as_float(a), self.as_float(m)
        t = f"{_wrap(fa, _ADD)} - {_wrap(fm, _UNARY)} * floorf({fa.text} / {_wrap(fm, _MUL + 1)})"
        return _Out(t, "float", _ADD)

    def _minmax(self, e: sympy.Basic) -> _Out:
        outs = [self.p(a) for a in sorted(e.args, key=sympy.default_sort_key)]
        for o in outs:
            self._no_bool(o, e)
        is_float = any(o.ctype == "float" for o in outs)
        base = "min" if isinstance(e, sympy.Min) else "max"
        fn = ("f" + base + "f") if is_float else base
        if is_float:
            outs = [self.as_float(o) for o in outs]
        bounds = [o.bound for o in outs]
        bound = max(bounds) if not is_float and None not in bounds else None  # type: ignore[type-var]
        acc = outs[-1]
        for o in reversed(outs[:-1]):
            acc = _Out(f"{fn}({o.text}, {acc.text})", acc.ctype, _ATOM, bound)
        return acc

    def _piecewise(self, e: sympy.Piecewise) -> _Out:
        pieces = list(e.args)
        if pieces[-1].cond != sympy.true:
            raise PrinterError(f"Piecewise without a default (True) branch: {e}")
        return self._ternary([(pc.expr, pc.cond) for pc in pieces[:-1]], pieces[-1].expr)

    def _ternary(self, branches: list[tuple[sympy.Basic, sympy.Basic]], default: sympy.Basic) -> _Out:
        vals = [self.p(v) for v, _ in branches] + [self.p(default)]
        types = {o.ctype for o in vals}
        ctype = "bool" if types == {"bool"} else ("float" if "float" in types else "int")
        if ctype == "float":
            vals = [self.as_float(o) for o in vals]
        elif ctype == "int":
            vals = [_Out(f"({_wrap(o, _COND + 1)} ? 1 : 0)", "int", _ATOM) if o.ctype == "bool" else o
                    for o in vals]
        acc = vals[-1]
        for (_, cond), val in zip(reversed(branches), reversed(vals[:-1])):
            c = self.as_bool(self.p(cond))
            acc = _Out(f"({_wrap(c, _COND + 1)} ? {val.text} : {acc.text})", ctype, _ATOM)
        return acc

    def _relational(self, e: sympy.core.relational.Relational) -> _Out:
        lhs, rhs = e.lhs, e.rhs
        lo, ro = self.p(lhs), self.p(rhs)
        if (lo.ctype == "bool") != (ro.ctype == "bool"):
            raise PrinterError(f"comparison of a boolean with a number: {e}")
        scale = self._rational_scale(lhs, rhs) if "float" in (lo.ctype, ro.ctype) else None
        if scale is not None:
            lo, ro = self.p(sympy.expand(scale * lhs)), self.p(sympy.expand(scale * rhs))
        prec = _REL_PREC[e.rel_op]
        return _Out(f"{_wrap(lo, _ADD)} {e.rel_op} {_wrap(ro, _ADD)}", "bool", prec)

    def _rational_scale(self, lhs: sympy.Expr, rhs: sympy.Expr) -> int | None:
        """lcm of the denominators when both sides are int terms with Rational coefficients."""
        dens = []
        for side in (lhs, rhs):
            for term, coeff in side.as_coefficients_dict().items():
                if not coeff.is_Rational or (term != 1 and self.p(term).ctype != "int"):
                    return None
                dens.append(int(coeff.q))
        lcm = math.lcm(*dens) if dens else 1
        return lcm if lcm > 1 else None


_REL_PREC = {"==": _EQ, "!=": _EQ, "<": _REL, "<=": _REL, ">": _REL, ">=": _REL}
