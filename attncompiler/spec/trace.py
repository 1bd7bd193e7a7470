"""Tracing Python score / mask modifiers into sympy expressions.

A modifier is an ordinary Python function with a FlexAttention signature::

    score_mod(score, b, h, q_idx, kv_idx) -> number
    mask_mod(b, h, q_idx, kv_idx)         -> bool (True = visible)

It is *traced* by calling it once on :class:`Sym` proxies of the symbols in
:mod:`attncompiler.spec.symbols`; every arithmetic operator, comparison and supported torch
function applied to a proxy builds a sympy expression instead of computing a value.

Captured tensors (closure variables, globals, default arguments, explicit ``buffers=``) become
:class:`BufferProxy` objects, so ``slopes[h]`` traces to ``Indexed(IndexedBase("slopes"), h)``.
A tensor reached any other way (an attribute, a list element) and indexed with a traced value is
caught through ``__torch_function__`` and named ``buffer0``, ``buffer1``, ...  Bool tensors read as
``Ne(x[i], 0)`` (they are passed to the kernel as int32), 0-dim tensors as ``x[0]`` of a 1-element
buffer (a run-time scalar, e.g. a learnable temperature).
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import types
from typing import Any, Callable, Iterable, Mapping

import sympy
import torch
from sympy.logic.boolalg import BooleanFunction
from sympy.core.relational import Relational

from .symbols import ALL_SYMBOLS, B, H, KV_IDX, Q_IDX, SCORE
from .sym import (
    BINARY_OPS, COMPARE_OPS, MASK_MOD_PARAMS, RESERVED_NAMES, SCORE_MOD_PARAMS, SpecError, Sym, SymProxy,
    TraceError, _CURRENT, _short, as_boolean, as_number, is_boolean, is_numeric, to_expr,
)

__all__ = [
    "SpecError", "TraceError", "Sym", "BufferProxy", "Tracer", "trace_score_mod", "trace_mask_mod",
    "to_expr", "is_boolean", "is_numeric", "sanitize_buffer_name", "check_buffer_name",
    "RESERVED_NAMES", "SCORE_MOD_PARAMS", "MASK_MOD_PARAMS", "as_number", "as_boolean",
    "BINARY_OPS", "COMPARE_OPS",
    "simplify_mask",
]

# ----------------------------------------------------------------------------------- buffers
def sanitize_buffer_name(name: str) -> str:
    """Turn a Python variable name into a C identifier that collides with nothing generated."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", name) or "buffer"
    if s[0].isdigit():
        s = "buf_" + s
    if s.startswith("_"):
        s = "buf" + s
    if s in RESERVED_NAMES:
        s += "_buf"
    return s


def check_buffer_name(name: Any) -> str:
    if not isinstance(name, str) or sanitize_buffer_name(name) != name:
        raise SpecError(
            f"buffer name: expected a C identifier (letters, digits, '_'; no leading '_' or digit) "
            f"that is not reserved (such as score, b, h, q_idx, kv_idx, p, buf, exp), got {name!r}; "
            f"rename it (e.g. {sanitize_buffer_name(str(name))!r})"
        )
    return name


def _buffer_kind(name: str, t: torch.Tensor) -> str:
    if t.dtype.is_complex:
        raise TraceError(f"captured tensor `{name}` has complex dtype {t.dtype}; expected a float, int or bool tensor")
    return "float" if t.is_floating_point() else "int"


class BufferProxy(SymProxy):
    """Stands in for a captured tensor while tracing; indexing it yields a sympy.Indexed."""

    __slots__ = ("name", "tensor", "_tracer", "_prefix")

    def __init__(self, name: str, tensor: torch.Tensor, tracer: "Tracer", prefix: tuple = ()) -> None:
        self.name, self.tensor, self._tracer, self._prefix = name, tensor, tracer, prefix

    def __repr__(self) -> str:
        return f"BufferProxy({self.name!r}, shape={tuple(self.tensor.shape)}, dtype={self.tensor.dtype})"

    shape = property(lambda self: self.tensor.shape[len(self._prefix):])
    ndim = property(lambda self: self.tensor.dim() - len(self._prefix))
    dtype = property(lambda self: self.tensor.dtype)

    def dim(self) -> int:
        return self.ndim

    def size(self, d: int | None = None) -> Any:
        return self.shape if d is None else self.shape[d]

    def __len__(self) -> int:
        return int(self.shape[0]) if self.ndim else 0

    def __getattr__(self, attr: str) -> Any:
        # t.float(), t.to(...), t.contiguous(): apply to the real tensor, keep proxying the result
        value = getattr(self.tensor, attr)
        if self._prefix or not callable(value):
            return value

        def call(*a: Any, **k: Any) -> Any:
            out = value(*a, **k)
            return BufferProxy(self.name, out, self._tracer) if isinstance(out, torch.Tensor) else out
        return call

    def _index(self, i: Any, pos: int) -> sympy.Expr:
        if isinstance(i, (slice, type(None), type(Ellipsis), torch.Tensor, bool, list, tuple)):
            raise TraceError(
                f"captured tensor `{self.name}`: index {pos} must be an integer expression of the traced "
                f"indices (b, h, q_idx, kv_idx), got {i!r} of type {type(i).__name__}; slicing is not supported"
            )
        e = to_expr(i)
        if isinstance(e, sympy.Integer) and not 0 <= int(e) < self.tensor.shape[pos]:
            raise TraceError(
                f"captured tensor `{self.name}`: expected a constant index in [0, {self.tensor.shape[pos]}) "
                f"for dim {pos}, got {e}; write the position explicitly (e.g. {self.name}.shape[{pos}] - 1)"
            )
        if is_boolean(e) or not isinstance(e, sympy.Expr) or e.is_integer is False or e.has(SCORE):
            raise TraceError(
                f"captured tensor `{self.name}`: index {pos} must be an integer expression of the traced "
                f"indices (b, h, q_idx, kv_idx), got {_short(e)}"
            )
        return e

    def __getitem__(self, index: Any) -> Any:
        idx = index if isinstance(index, tuple) else (index,)
        nd, k0 = self.tensor.dim(), len(self._prefix)
        if nd == 0:
            raise TraceError(f"captured tensor `{self.name}` is 0-dim; use it as a number (e.g. score * {self.name})")
        if k0 + len(idx) > nd:
            raise TraceError(
                f"captured tensor `{self.name}` has {nd} dims (shape {tuple(self.tensor.shape)}), "
                f"expected at most {nd} indices, got {k0 + len(idx)}"
            )
        full = self._prefix + tuple(self._index(i, k0 + k) for k, i in enumerate(idx))
        if len(full) < nd:
            return BufferProxy(self.name, self.tensor, self._tracer, full)
        name = self._tracer.register(self.name, self.tensor)
        e = sympy.Indexed(sympy.IndexedBase(name), *full)
        return Sym(sympy.Ne(e, 0)) if self.tensor.dtype == torch.bool else Sym(e)

    def _as_sym(self) -> Sym:
        if self.tensor.dim() == 0 and not self._prefix:
            name = self._tracer.register(self.name, self.tensor, value=self.tensor.reshape(1))
            e = sympy.Indexed(sympy.IndexedBase(name), sympy.Integer(0))
            return Sym(sympy.Ne(e, 0)) if self.tensor.dtype == torch.bool else Sym(e)
        raise TraceError(
            f"captured tensor `{self.name}` (shape {tuple(self.tensor.shape)}) must be indexed with the "
            f"traced indices before use in an expression, e.g. {self.name}[{', '.join(['h', 'q_idx', 'kv_idx'][:max(self.ndim, 1)])}]"
        )

    @classmethod
    def __torch_function__(cls, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        args = tuple(a._as_sym() if isinstance(a, BufferProxy) else a for a in args)
        return Sym.__torch_function__(func, types_, args, kwargs)

    def __bool__(self) -> bool:
        return bool(self._as_sym())


def _proxy_forward(dunder: str) -> Callable[..., Any]:
    return lambda self, *a: getattr(self._as_sym(), dunder)(*a)


for _d in ([f"__{n}__" for n in (*BINARY_OPS, *COMPARE_OPS)] + [f"__r{n}__" for n in BINARY_OPS]
           + "__neg__ __pos__ __abs__ __invert__ __float__ __int__ __index__".split()):
    setattr(BufferProxy, _d, _proxy_forward(_d))
BufferProxy.__hash__ = None  # type: ignore[assignment]
del _d


# ----------------------------------------------------------------------------------- tracer
def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


_SKIP_MODULES = ("torch", "sympy", "numpy", "builtins", "functools", "attncompiler.spec.ops",
                 "attncompiler.spec.sym", "attncompiler.spec.trace")
_MAX_DEPTH = 4


def _label(fn: Any) -> str:
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    if code is not None:
        return f"`{name}` ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
    return f"`{name}`"


def _check_signature(fn: Callable[..., Any], what: str, params: tuple[str, ...]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    try:
        sig.bind(*params)
    except TypeError:
        got = ", ".join(str(p).split(":")[0].split("=")[0] for p in sig.parameters.values())
        raise TraceError(f"{what} must take ({', '.join(params)}), got ({got}) in {_label(fn)}") from None


class Tracer:
    """Traces one or more modifiers, sharing buffer names between them.

    ``buffers`` (name -> tensor) are explicit: they bind by variable name (overriding a closure
    variable or global of that name, or supplying one the function does not define) and by
    identity (a captured tensor that *is* an explicit buffer takes the explicit name).
    """

    def __init__(self, buffers: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        items = list((buffers or {}).items()) if isinstance(buffers, Mapping) or buffers is None else list(buffers)
        self.explicit: dict[str, torch.Tensor] = {}
        for name, t in items:
            check_buffer_name(name)
            if not isinstance(t, torch.Tensor):
                raise SpecError(f"buffers[{name!r}]: expected a torch.Tensor, got {type(t).__name__}")
            self.explicit[name] = t
        self._used: dict[str, torch.Tensor] = {}
        self._by_id: dict[int, str] = {}
        self._anon: dict[int, BufferProxy] = {}
        self._keep: list[Any] = []  # keeps keyed objects alive so ids stay unique

    # -- buffers
    @property
    def buffers(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) for every buffer actually read, in first-use order."""
        return list(self._used.items())

    def register(self, preferred: str, tensor: torch.Tensor, value: torch.Tensor | None = None) -> str:
        if id(tensor) in self._by_id:
            return self._by_id[id(tensor)]
        name = next((n for n, t in self.explicit.items() if t is tensor), None)
        if name is None:
            base = sanitize_buffer_name(preferred)
            taken = set(self._used) | set(self.explicit)
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
        val = tensor if value is None else value
        _buffer_kind(name, val)
        self._used[name] = val
        self._by_id[id(tensor)] = name
        self._keep.append(tensor)
        return name

    def proxy(self, name: str, tensor: torch.Tensor) -> BufferProxy:
        return BufferProxy(name, tensor, self)

    def anonymous_proxy(self, tensor: torch.Tensor) -> BufferProxy:
        """Proxy for a tensor reached without a variable name (attribute, container element)."""
        if id(tensor) not in self._anon:
            name = self._by_id.get(id(tensor)) or next(
                (n for n, t in self.explicit.items() if t is tensor), f"buffer{len(self._anon)}")
            self._anon[id(tensor)] = BufferProxy(name, tensor, self)
            self._keep.append(tensor)
        return self._anon[id(tensor)]

    # -- function rewriting
    def _replace(self, name: str, value: Any, depth: int, memo: dict[int, Any]) -> Any:
        if name in self.explicit:
            return self.proxy(name, self.explicit[name])
        if isinstance(value, torch.Tensor):
            return self.proxy(name, value)
        if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)) and depth < _MAX_DEPTH:
            mod = getattr(value, "__module__", None) or ""
            if not any(mod == m or mod.startswith(m + ".") for m in _SKIP_MODULES):
                return self.instrument(value, depth + 1, memo)
        return value

    def instrument(self, fn: Any, depth: int = 0, memo: dict[int, Any] | None = None) -> Any:
        """``fn`` with captured tensors replaced by BufferProxy (the original if none are)."""
        memo = {} if memo is None else memo
        if id(fn) in memo:
            return memo[id(fn)]
        memo[id(fn)] = fn
        out = fn
        if isinstance(fn, types.MethodType):
            f = self.instrument(fn.__func__, depth, memo)
            out = fn if f is fn.__func__ else types.MethodType(f, fn.__self__)
        elif isinstance(fn, functools.partial):  # tensors among partial's args are named buffer<k>
            f = self.instrument(fn.func, depth, memo)
            out = fn if f is fn.func else functools.partial(f, *fn.args, **fn.keywords)
        elif isinstance(fn, types.FunctionType):
            out = self._instrument_function(fn, depth, memo)
        memo[id(fn)] = out
        return out

    def _instrument_function(self, fn: types.FunctionType, depth: int, memo: dict[int, Any]) -> types.FunctionType:
        code, changed = fn.__code__, False
        new_globals: dict[str, Any] = {}
        for name in _code_names(code):
            if name in fn.__globals__ or name in self.explicit:
                old = fn.__globals__.get(name)
                new = self._replace(name, old, depth, memo)
                if new is not old:
                    new_globals[name], changed = new, True
        cells = []
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                old = cell.cell_contents
            except ValueError:  # empty cell (recursive helper not yet bound)
                cells.append(cell)
                continue
            new = self._replace(name, old, depth, memo)
            cells.append(cell if new is old else types.CellType(new))
            changed |= new is not old
        defaults, kwdefaults = fn.__defaults__, fn.__kwdefaults__
        if defaults:  # def mod(score, b, h, q_idx, kv_idx, bias=bias)
            names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]
            defaults = tuple(self._replace(n, d, depth, memo) if isinstance(d, torch.Tensor) else d
                             for n, d in zip(names, defaults))
            changed |= any(a is not b for a, b in zip(defaults, fn.__defaults__))
        if kwdefaults:
            kwdefaults = {k: self._replace(k, v, depth, memo) if isinstance(v, torch.Tensor) else v
                          for k, v in kwdefaults.items()}
            changed |= any(kwdefaults[k] is not v for k, v in fn.__kwdefaults__.items())
        if not changed:
            return fn
        g = dict(fn.__globals__)
        g.update(new_globals)
        new_fn = types.FunctionType(code, g, fn.__name__, defaults, tuple(cells) if cells else None)
        new_fn.__kwdefaults__ = kwdefaults
        new_fn.__qualname__ = fn.__qualname__
        new_fn.__dict__.update(fn.__dict__)
        return new_fn

    # -- tracing
    def _call(self, fn: Callable[..., Any], what: str, params: tuple[str, ...], args: list[Sym]) -> sympy.Basic:
        if not callable(fn):
            raise TraceError(f"{what}: expected a callable {what}({', '.join(params)}), got {type(fn).__name__}")
        _check_signature(fn, what, params)
        token = _CURRENT.set(self)
        try:
            out = self.instrument(fn)(*args)
            if out is None:
                raise TraceError("returned None; expected an expression (missing `return`?)")
            if isinstance(out, torch.Tensor):
                raise TraceError(f"returned a torch.Tensor of shape {tuple(out.shape)}; expected an expression "
                                 "built from its arguments (captured tensors must be indexed with them)")
            expr = to_expr(out)
        except TraceError as e:
            raise TraceError(f"{what} {_label(fn)}: {e}") from e
        except Exception as e:
            raise TraceError(f"{what} {_label(fn)} raised {type(e).__name__} while tracing: {e}") from e
        finally:
            _CURRENT.reset(token)
        if expr.has(sympy.nan, sympy.zoo):
            raise TraceError(f"{what} {_label(fn)}: expected a finite expression, got {_short(expr)} (division by zero?)")
        allowed = set(ALL_SYMBOLS) - ({SCORE} if what == "mask_mod" else set())
        indexed = expr.atoms(sympy.Indexed)
        ok = allowed | indexed | {i.base.label for i in indexed}
        unknown = expr.free_symbols - ok
        if unknown:
            raise TraceError(
                f"{what} {_label(fn)} uses unknown symbols {sorted(map(str, unknown))}; expected only its "
                f"arguments ({', '.join(params)}) and captured tensors"
            )
        return expr

    def trace_score(self, fn: Callable[..., Any]) -> sympy.Expr:
        expr = self._call(fn, "score_mod", SCORE_MOD_PARAMS, [Sym(s) for s in (SCORE, B, H, Q_IDX, KV_IDX)])
        if not is_numeric(expr):
            kind = "boolean" if is_boolean(expr) else type(expr).__name__
            raise TraceError(
                f"score_mod must return a number (the modified score), got {kind} expression "
                f"{_short(expr)} of type {type(expr).__name__}; masks belong in mask_mod"
            )
        return expr

    def trace_mask(self, fn: Callable[..., Any]) -> sympy.Basic:
        expr = self._call(fn, "mask_mod", MASK_MOD_PARAMS, [Sym(s) for s in (B, H, Q_IDX, KV_IDX)])
        if not is_boolean(expr):
            raise TraceError(
                f"mask_mod must return a boolean, got expression {_short(expr)} of type "
                f"{type(expr).__name__}; compare it (e.g. kv_idx <= q_idx) and combine with & / |"
            )
        return simplify_mask(expr)


def simplify_mask(expr: sympy.Basic) -> sympy.Basic:
    """Cheap boolean simplification: relationals stay atoms (deep=False), at most 8 of them."""
    if isinstance(expr, BooleanFunction) and len(expr.atoms(Relational)) <= 8:
        return sympy.simplify_logic(expr, deep=False)
    return expr


def trace_score_mod(
    fn: Callable[..., Any], buffers: Mapping[str, torch.Tensor] | None = None
) -> tuple[sympy.Expr, list[tuple[str, torch.Tensor]]]:
    """Trace ``fn(score, b, h, q_idx, kv_idx)``; returns (expression, [(buffer name, tensor)])."""
    t = Tracer(buffers)
    return t.trace_score(fn), t.buffers


def trace_mask_mod(
    fn: Callable[..., Any], buffers: Mapping[str, torch.Tensor] | None = None
) -> tuple[sympy.Basic, list[tuple[str, torch.Tensor]]]:
    """Trace ``fn(b, h, q_idx, kv_idx)``; returns (boolean expression, [(buffer name, tensor)])."""
    t = Tracer(buffers)
    return t.trace_mask(fn), t.buffers

