"""Math for score / mask modifiers that works on traced values, sympy, tensors and numbers.

Every function dispatches on its arguments:

* any :class:`~attncompiler.spec.sym.Sym` (while tracing)  -> a ``Sym``
* any ``torch.Tensor`` (the float64 reference evaluating a mod) -> a tensor (torch semantics)
* any sympy object                                            -> a sympy expression
* plain Python numbers                                        -> a Python float / the chosen value

so one modifier serves both tracing and eager evaluation::

    from attncompiler.spec import ops
    def softcap(score, b, h, q_idx, kv_idx):
        return 30.0 * ops.tanh(score / 30.0)

``torch.tanh(score)`` and friends also work on traced values (see :func:`torch_functions`).
"""
from __future__ import annotations

import builtins
import functools
import math
import numbers
from typing import Any, Callable

import sympy
import torch

from .trace import BINARY_OPS, COMPARE_OPS, BufferProxy, Sym, TraceError, as_boolean, as_number, is_boolean, to_expr

__all__ = [
    "tanh", "exp", "log", "abs", "min", "max", "where", "sqrt", "sigmoid", "clamp",
    "torch_functions", "tensor_methods",
]


# ----------------------------------------------------------------------------------- symbolic
def _sym_sigmoid(x: Any) -> sympy.Expr:
    return 1 / (1 + sympy.exp(-as_number(x)))


def _sym_where(cond: Any, a: Any, b: Any) -> sympy.Basic:
    c = as_boolean(cond, "where")
    ea, eb = to_expr(a), to_expr(b)
    if c is sympy.true:
        return ea
    if c is sympy.false:
        return eb
    if is_boolean(ea) and is_boolean(eb):
        return sympy.Or(sympy.And(c, ea), sympy.And(sympy.Not(c), eb))  # where() of two masks
    return sympy.Piecewise((as_number(a), c), (as_number(b), True))


def _sym_clamp(x: Any, lo: Any = None, hi: Any = None) -> sympy.Expr:
    e = as_number(x)
    if lo is not None:
        e = sympy.Max(e, as_number(lo))
    if hi is not None:
        e = sympy.Min(e, as_number(hi))
    return e


_SYMBOLIC: dict[str, Callable[..., sympy.Basic]] = {
    "tanh": lambda x: sympy.tanh(as_number(x)),
    "exp": lambda x: sympy.exp(as_number(x)),
    "log": lambda x: sympy.log(as_number(x)),
    "abs": lambda x: sympy.Abs(as_number(x)),
    "sqrt": lambda x: sympy.sqrt(as_number(x)),
    "sigmoid": _sym_sigmoid,
    "min": lambda a, b: sympy.Min(as_number(a), as_number(b)),
    "max": lambda a, b: sympy.Max(as_number(a), as_number(b)),
    "where": _sym_where,
    "clamp": _sym_clamp,
}


# ----------------------------------------------------------------------------------- dispatch
def _mode(args: tuple[Any, ...]) -> str:
    if any(isinstance(a, (Sym, BufferProxy)) for a in args):
        return "sym"
    if any(isinstance(a, torch.Tensor) for a in args):
        return "torch"
    if any(isinstance(a, sympy.Basic) for a in args):
        return "sympy"
    for a in args:
        if a is not None and not isinstance(a, numbers.Real):
            raise TypeError(f"expected a traced value, tensor, sympy expression or number, got {type(a).__name__}")
    return "number"


def _apply(name: str, args: tuple[Any, ...], torch_fn: Callable[..., Any], num_fn: Callable[..., Any]) -> Any:
    mode = _mode(args)
    if mode == "sym":
        return Sym(_SYMBOLIC[name](*args))
    if mode == "sympy":
        return _SYMBOLIC[name](*args)
    if mode == "torch":
        return torch_fn(*args)
    return num_fn(*args)


def _t(x: Any, like: tuple[Any, ...]) -> torch.Tensor:
    """``x`` as a tensor on the device of the first tensor in ``like``."""
    if isinstance(x, torch.Tensor):
        return x
    ref = next(a for a in like if isinstance(a, torch.Tensor))
    return torch.as_tensor(x, device=ref.device)


def _num_sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def tanh(x: Any) -> Any:
    """Hyperbolic tangent."""
    return _apply("tanh", (x,), torch.tanh, math.tanh)


def exp(x: Any) -> Any:
    """Natural exponential."""
    return _apply("exp", (x,), torch.exp, math.exp)


def log(x: Any) -> Any:
    """Natural logarithm."""
    return _apply("log", (x,), torch.log, math.log)


def abs(x: Any) -> Any:  # noqa: A001 - math namespace
    """Absolute value."""
    return _apply("abs", (x,), torch.abs, builtins.abs)


def sqrt(x: Any) -> Any:
    """Square root."""
    return _apply("sqrt", (x,), torch.sqrt, math.sqrt)


def sigmoid(x: Any) -> Any:
    """Logistic function 1 / (1 + exp(-x))."""
    return _apply("sigmoid", (x,), torch.sigmoid, _num_sigmoid)


def min(a: Any, b: Any) -> Any:  # noqa: A001
    """Elementwise minimum of two values."""
    args = (a, b)
    return _apply("min", args, lambda a, b: torch.minimum(_t(a, args), _t(b, args)), builtins.min)


def max(a: Any, b: Any) -> Any:  # noqa: A001
    """Elementwise maximum of two values."""
    args = (a, b)
    return _apply("max", args, lambda a, b: torch.maximum(_t(a, args), _t(b, args)), builtins.max)


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` holds, else ``b`` (sympy Piecewise when traced)."""
    args = (cond, a, b)
    if _mode(args) == "torch" and not isinstance(cond, torch.Tensor):
        return a if bool(cond) else b
    return _apply("where", args, torch.where, lambda c, a, b: a if c else b)


def clamp(x: Any, lo: Any = None, hi: Any = None) -> Any:
    """``x`` limited to [lo, hi]; either bound may be None."""
    def num(x: Any, lo: Any, hi: Any) -> Any:
        x = x if lo is None else builtins.max(x, lo)
        return x if hi is None else builtins.min(x, hi)

    def tch(x: Any, lo: Any, hi: Any) -> torch.Tensor:
        return torch.clamp(_t(x, (x, lo, hi)), lo, hi)

    return _apply("clamp", (x, lo, hi), tch, num)


# ----------------------------------------------------------------------------------- tables
def _minmax(name: str) -> Callable[..., sympy.Expr]:
    def impl(input: Any, other: Any = None, *, dim: Any = None) -> sympy.Expr:
        if other is None or dim is not None:
            raise TraceError(f"torch.{name} on a traced value needs two operands (torch.{name}(a, b))")
        return _SYMBOLIC[name](input, other)
    return impl


def _binary(op: str) -> Callable[..., sympy.Basic]:
    f = BINARY_OPS.get(op) or COMPARE_OPS[op]
    return lambda input, other: f(input, other)


@functools.cache
def torch_functions() -> dict[Any, Callable[..., sympy.Basic]]:
    """torch function -> symbolic implementation, used by ``Sym.__torch_function__``."""
    t, S = torch, _SYMBOLIC
    table: dict[Any, Callable[..., sympy.Basic]] = {
        t.tanh: S["tanh"], t.exp: S["exp"], t.log: S["log"], t.abs: S["abs"], t.sqrt: S["sqrt"],
        t.sigmoid: S["sigmoid"],
        t.rsqrt: lambda input: 1 / sympy.sqrt(as_number(input)),
        t.square: lambda input: as_number(input) ** 2,
        t.floor: lambda input: sympy.floor(as_number(input)),
        t.ceil: lambda input: sympy.ceiling(as_number(input)),
        t.log2: lambda input: sympy.log(as_number(input), 2),
        t.exp2: lambda input: 2 ** as_number(input),
        t.neg: lambda input: -as_number(input), t.negative: lambda input: -as_number(input),
        t.minimum: lambda input, other: S["min"](input, other),
        t.maximum: lambda input, other: S["max"](input, other),
        t.min: _minmax("min"), t.max: _minmax("max"),
        t.where: lambda condition, input, other: S["where"](condition, input, other),
        t.clamp: lambda input, min=None, max=None: S["clamp"](input, min, max),
        t.clip: lambda input, min=None, max=None: S["clamp"](input, min, max),
        t.pow: lambda input, exponent: BINARY_OPS["pow"](input, exponent),
        t.add: _binary("add"), t.sub: _binary("sub"), t.mul: _binary("mul"), t.div: _binary("truediv"),
        t.remainder: _binary("mod"), t.floor_divide: _binary("floordiv"),
        t.eq: _binary("eq"), t.ne: _binary("ne"), t.lt: _binary("lt"), t.le: _binary("le"),
        t.gt: _binary("gt"), t.ge: _binary("ge"),
        t.logical_and: _binary("and"), t.logical_or: _binary("or"), t.logical_xor: _binary("xor"),
        t.logical_not: lambda input: sympy.Not(as_boolean(input, "logical_not")),
    }
    # the same as Tensor methods (a tensor on the left: `t.mul(s)`, `t * s` -> Tensor.mul)
    for fn, impl in list(table.items()):
        method = getattr(torch.Tensor, fn.__name__, None)
        if method is not None:
            table[method] = impl
    for op, f in BINARY_OPS.items():
        for dunder, g in ((f"__{op}__", f), (f"__r{op}__", lambda a, b, f=f: f(b, a))):
            if hasattr(torch.Tensor, dunder):
                table[getattr(torch.Tensor, dunder)] = g
    return table


@functools.cache
def tensor_methods() -> dict[str, Callable[..., Any]]:
    """Tensor-style methods on traced values (``score.tanh()``, ``x.clamp(min=0)``)."""
    out: dict[str, Callable[..., Any]] = {}
    for name in ("tanh exp log abs sqrt sigmoid rsqrt square floor ceil neg minimum maximum clamp clip "
                 "logical_not logical_and logical_or").split():
        fn = getattr(torch, name)
        out[name] = functools.partial(lambda fn, *a, **k: Sym(torch_functions()[fn](*a, **k)), fn)
    out["pow"] = lambda self, exponent: Sym(BINARY_OPS["pow"](self, exponent))
    out["where"] = lambda self, condition, other: Sym(_sym_where(condition, self, other))
    return out
