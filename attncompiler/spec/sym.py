"""Symbolic values for tracing: :class:`Sym`, the expression helpers and the operator tables.

While a modifier is traced (:mod:`attncompiler.spec.trace`), every argument is a :class:`Sym`
wrapping a sympy expression; Python operators and the supported torch functions on it build new
expressions (``BINARY_OPS`` / ``COMPARE_OPS`` here, the function table in :mod:`attncompiler.spec.ops`).
The names a generated kernel reserves (``RESERVED_NAMES``) and the modifier signatures live here too,
so that both the tracer and the buffer proxies read them from one place.
"""
from __future__ import annotations

import builtins
import contextvars
import functools
import math
import numbers
import operator
import types
from typing import TYPE_CHECKING, Any, Callable

import sympy
import torch
from sympy.logic.boolalg import BooleanAtom, BooleanFunction
from sympy.core.relational import Relational

from .symbols import ALL_SYMBOLS

if TYPE_CHECKING:
    from .trace import Tracer

__all__ = [
    "SpecError", "TraceError", "Sym", "SymProxy", "to_expr", "is_boolean", "is_numeric", "as_number", "as_boolean",
    "RESERVED_NAMES", "SCORE_MOD_PARAMS", "MASK_MOD_PARAMS", "BINARY_OPS", "COMPARE_OPS",
]

SCORE_MOD_PARAMS = ("score", "b", "h", "q_idx", "kv_idx")
MASK_MOD_PARAMS = ("b", "h", "q_idx", "kv_idx")

_C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline "
    "int long register restrict return short signed sizeof static struct switch typedef union unsigned "
    "void volatile while bool true false class namespace template typename this new delete operator "
    "public private protected virtual friend using nullptr".split()
)
RESERVED_NAMES: frozenset[str] = _C_KEYWORDS | frozenset(
    [s.name for s in ALL_SYMBOLS] + ["p", "buf", "Variant", "AttnParams", "AttnBuffers"]
    + "exp log tanh sqrt abs min max floor ceil pow sigmoid where clamp fabs fmin fmax expf logf "
      "tanhf sqrtf powf exp2 log2 exp2f log2f floorf ceilf rsqrt rsqrtf math torch sympy".split()
)


class SpecError(ValueError):
    """An attention spec is invalid (what was expected, what was given, what to do)."""


class TraceError(SpecError):
    """A score / mask modifier cannot be traced into a compilable expression."""


_CURRENT: contextvars.ContextVar["Tracer | None"] = contextvars.ContextVar("attncompiler_tracer", default=None)


# ----------------------------------------------------------------------------------- expressions
def is_boolean(e: Any) -> bool:
    """True for sympy booleans: relationals, And/Or/Not/..., true/false (not plain symbols)."""
    return isinstance(e, (Relational, BooleanFunction, BooleanAtom))


def is_numeric(e: Any) -> bool:
    return isinstance(e, sympy.Expr) and not is_boolean(e)


def _short(e: Any) -> str:
    s = str(e)
    return s if len(s) <= 120 else s[:117] + "..."


class SymProxy:
    """Base of the stand-ins that become a :class:`Sym` only when used in an expression (the
    tracer's :class:`~attncompiler.spec.trace.BufferProxy` of a captured tensor)."""

    __slots__ = ()

    def _as_sym(self) -> "Sym":
        raise NotImplementedError


def to_expr(x: Any) -> sympy.Basic:
    """A sympy object from a Sym, sympy object, Python number or bool (or, while tracing, a tensor
    reached without a name, which becomes an anonymous buffer)."""
    if isinstance(x, Sym):
        return x.expr
    if isinstance(x, SymProxy):
        return x._as_sym().expr
    if isinstance(x, sympy.Basic):
        return x
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    if isinstance(x, numbers.Integral):
        return sympy.Integer(int(x))
    if isinstance(x, numbers.Real):
        v = float(x)
        if math.isnan(v):
            raise TraceError("NaN constant in a traced expression; expected a finite number or +-inf")
        if math.isinf(v):
            return sympy.oo if v > 0 else -sympy.oo
        if v.is_integer() and builtins.abs(v) < 2**24:  # 30.0 -> 30: exact, and 30*tanh(score/30)
            return sympy.Integer(int(v))
        return sympy.Float(v)
    if isinstance(x, torch.Tensor):
        tracer = _CURRENT.get()
        if tracer is not None:
            return tracer.anonymous_proxy(x)._as_sym().expr
        raise TraceError(
            f"a torch.Tensor of shape {tuple(x.shape)} was used in a traced expression outside of "
            "tracing; index a captured tensor with the traced indices (e.g. bias[h, q_idx])"
        )
    raise TraceError(
        f"unsupported value {x!r} of type {type(x).__name__} in a traced expression; expected a "
        "traced value, a Python number, or an indexed captured tensor"
    )


def as_number(x: Any) -> sympy.Expr:
    """A numeric sympy expression; booleans become 1/0 like torch's bool -> number promotion."""
    e = to_expr(x)
    if is_boolean(e):
        if e is sympy.true:
            return sympy.Integer(1)
        if e is sympy.false:
            return sympy.Integer(0)
        return sympy.Piecewise((sympy.Integer(1), e), (sympy.Integer(0), True))
    if not isinstance(e, sympy.Expr):
        raise TraceError(f"expected a number expression, got {_short(e)} of type {type(e).__name__}")
    return e


def as_boolean(x: Any, op: str = "&") -> sympy.Basic:
    e = to_expr(x)
    if not is_boolean(e):
        raise TraceError(
            f"`{op}` combines booleans (comparisons such as q_idx >= kv_idx); got the number "
            f"expression {_short(e)}; compare it first (e.g. x != 0)"
        )
    return e


def _eq(a: Any, b: Any) -> sympy.Basic:
    ea, eb = to_expr(a), to_expr(b)
    if is_boolean(ea) and is_boolean(eb):
        return sympy.Equivalent(ea, eb)
    return sympy.Eq(as_number(a), as_number(b))


def _ne(a: Any, b: Any) -> sympy.Basic:
    ea, eb = to_expr(a), to_expr(b)
    if is_boolean(ea) and is_boolean(eb):
        return sympy.Xor(ea, eb)
    return sympy.Ne(as_number(a), as_number(b))


def _binop(f: Callable[[sympy.Expr, sympy.Expr], Any]) -> Callable[[Any, Any], sympy.Basic]:
    return lambda a, b: f(as_number(a), as_number(b))


def _unevaluated_on_recursion(f: Callable[..., sympy.Basic], *args: Any) -> sympy.Basic:
    """``f(*args)``; where sympy's automatic evaluation recurses without end (it does for Mod and
    Abs of some nested integer expressions, e.g. ``(2*x - 2) % (|2*x - 7| + 1)``), the node is kept
    unevaluated instead, which means the same."""
    try:
        return f(*args)
    except RecursionError:
        return f(*args, evaluate=False)


def _mod(a: sympy.Expr, b: sympy.Expr) -> sympy.Basic:
    """``a % b``: Python's floor modulo, as torch's on integers."""
    return _unevaluated_on_recursion(sympy.Mod, a, b)


def _logic(f: Callable[..., sympy.Basic], op: str) -> Callable[[Any, Any], sympy.Basic]:
    return lambda a, b: f(as_boolean(a, op), as_boolean(b, op))


# Python operator name -> symbolic implementation (Sym gets __op__ and, for BINARY_OPS, __rop__)
BINARY_OPS: dict[str, Callable[[Any, Any], sympy.Basic]] = {
    "add": _binop(operator.add), "sub": _binop(operator.sub), "mul": _binop(operator.mul),
    "truediv": _binop(operator.truediv),  # true division: q_idx / 2 is the rational q_idx/2
    "floordiv": _binop(lambda a, b: sympy.floor(a / b)), "mod": _binop(_mod),
    "pow": _binop(operator.pow),
    "and": _logic(sympy.And, "&"), "or": _logic(sympy.Or, "|"), "xor": _logic(sympy.Xor, "^"),
}
COMPARE_OPS: dict[str, Callable[[Any, Any], sympy.Basic]] = {
    "lt": _binop(sympy.Lt), "le": _binop(sympy.Le), "gt": _binop(sympy.Gt), "ge": _binop(sympy.Ge),
    "eq": _eq, "ne": _ne,  # == is sympy.Eq (Equivalent for two booleans), never structural equality
}


# ----------------------------------------------------------------------------------- Sym
class Sym:
    """A traced value: wraps a sympy expression and records operations applied to it."""

    __slots__ = ("expr",)
    __hash__ = None  # type: ignore[assignment]  # == builds sympy.Eq, so no structural hashing
    __array_ufunc__ = None  # numpy scalars on the left defer to our reflected operators

    def __init__(self, expr: Any) -> None:
        self.expr = to_expr(expr)

    def __repr__(self) -> str:
        return f"Sym({self.expr})"

    def _sympy_(self) -> sympy.Basic:  # lets sympy functions accept a Sym directly
        return self.expr

    # + - * / // % ** & | ^ and comparisons are installed from BINARY_OPS / COMPARE_OPS below
    def __neg__(self) -> Sym: return Sym(-as_number(self))
    def __pos__(self) -> Sym: return Sym(as_number(self))
    def __abs__(self) -> Sym: return Sym(_unevaluated_on_recursion(sympy.Abs, as_number(self)))
    def __invert__(self) -> Sym: return Sym(sympy.Not(as_boolean(self, "~")))

    # things that need a concrete value
    def __bool__(self) -> bool:
        raise TraceError(
            "Python control flow (if/and/or/not/while) on a traced value cannot be compiled; got "
            f"`bool()` of {_short(self.expr)}; use attncompiler.ops.where(cond, a, b) (or torch.where) "
            "to choose a value, or & / | / ~ instead of and / or / not"
        )

    def _concrete(self, what: str) -> TraceError:
        return TraceError(
            f"`{what}()` of the traced value {_short(self.expr)} cannot be compiled (math.* functions, "
            "int(), float() and range() need concrete numbers); use torch.* functions or "
            "attncompiler.spec.ops (tanh, exp, log, ...) on traced values"
        )

    def __float__(self) -> float: raise self._concrete("float")
    def __int__(self) -> int: raise self._concrete("int")
    def __index__(self) -> int: raise self._concrete("index")
    def __iter__(self) -> Any: raise TraceError(f"cannot iterate over the traced value {_short(self.expr)}")

    def __getattr__(self, attr: str) -> Any:  # tensor-style methods: score.tanh(), x.clamp(min=0)
        methods = _ops().tensor_methods()
        method = methods.get(attr)
        if method is None:
            raise AttributeError(f"traced values have no attribute {attr!r}; their tensor-style methods: "
                                 f"{', '.join(sorted(methods))}")
        return functools.partial(method, self)

    @classmethod
    def __torch_function__(cls, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.Tensor.__getitem__:
            tensor, index = args
            tracer = _CURRENT.get()
            if tracer is None:
                raise TraceError("a tensor was indexed with a traced value outside of tracing")
            return tracer.anonymous_proxy(tensor)[index]
        table = _ops().torch_functions()
        impl = table.get(func)
        if impl is None:
            raise TraceError(
                f"torch function `{getattr(func, '__name__', func)}` is not supported on traced values; "
                f"supported: {', '.join(sorted({f.__name__ for f in table}))}"
            )
        return Sym(impl(*args, **(kwargs or {})))


def _install_sym_operators() -> None:
    for name, f in BINARY_OPS.items():
        setattr(Sym, f"__{name}__", lambda self, o, f=f: Sym(f(self, o)))
        setattr(Sym, f"__r{name}__", lambda self, o, f=f: Sym(f(o, self)))
    for name, f in COMPARE_OPS.items():
        setattr(Sym, f"__{name}__", lambda self, o, f=f: Sym(f(self, o)))


_install_sym_operators()


def _ops() -> types.ModuleType:
    from . import ops  # lazy: ops builds on this module

    return ops
