"""Reference semantics of an :class:`~attncompiler.ir.types.AttentionIR` in torch.

:func:`reference_attention` computes, in float64 (on the device ``q`` lives on), exactly the
semantics of ``docs/architecture.md``: scaled scores, ``score_expr``, ``mask_expr`` (masked ->
-inf), softmax (rows with no visible key give 0 and lse = -inf), Philox dropout, ``P @ V``.
:func:`eager_attention` runs the same computation in the inputs' dtype, the way plain eager
PyTorch would; the two together give the acceptance rule of :func:`error_ratio_check`:

    err(kernel vs float64 reference) <= factor * err(eager same-dtype vs float64 reference) + atol

The IR's sympy expressions are evaluated by :func:`evaluate`, a small tree walker over torch
tensors (no string lambdify).  Query rows are processed in chunks so that the (B, H, rows, Nk)
score block stays bounded.
"""
from __future__ import annotations

import math
import operator
from functools import reduce
from typing import Callable, Mapping, Optional, Union

import sympy
import torch

from attncompiler.ir.types import AttentionIR
from attncompiler.philox import dropout_keep_mask
from attncompiler.spec.symbols import B as SYM_B
from attncompiler.spec.symbols import H as SYM_H
from attncompiler.spec.symbols import KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE

__all__ = ["Value", "evaluate", "reference_attention", "eager_attention", "error_ratio_check"]

Value = Union[torch.Tensor, int, float, bool]

# Score-block elements (B * H * rows * Nk) per query-row chunk.
_CHUNK_ELEMS_CPU = 1 << 20  # small blocks are reused by the allocator (measured fastest)
_CHUNK_ELEMS_CUDA = 1 << 26

_REL_OPS: dict[str, Callable[[Value, Value], Value]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_FLOAT_FUNCS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    sympy.exp: torch.exp, sympy.log: torch.log, sympy.tanh: torch.tanh, sympy.sinh: torch.sinh,
    sympy.cosh: torch.cosh, sympy.sin: torch.sin, sympy.cos: torch.cos, sympy.tan: torch.tan,
    sympy.asin: torch.asin, sympy.acos: torch.acos, sympy.atan: torch.atan, sympy.erf: torch.erf,
}
_SUPPORTED = ("Integer, Rational, Float, +-oo, pi, E, Symbol, Indexed, Add, Mul, Pow, floor, ceiling, Mod, Abs, "
              "sign, Min, Max, exp, log, tanh, sinh, cosh, sin, cos, tan, asin, acos, atan, atan2, erf, "
              "Piecewise, ITE, relationals, And, Or, Not, Xor, Equivalent, true, false")


def _is_bool(v: Value) -> bool:
    return isinstance(v, bool) or (isinstance(v, torch.Tensor) and v.dtype == torch.bool)


def _is_float(v: Value) -> bool:
    return isinstance(v, float) or (isinstance(v, torch.Tensor) and v.is_floating_point())


def _is_int(v: Value) -> bool:
    return not _is_bool(v) and not _is_float(v)


class _Evaluator:
    """Evaluates one sympy tree; integers stay int64 (or Python ints), reals use torch floats."""

    def __init__(self, symbols: Mapping[str, Value], buffers: Mapping[str, torch.Tensor],
                 float_dtype: torch.dtype, device: torch.device) -> None:
        self.symbols = symbols
        self.buffers = buffers
        self.float_dtype = float_dtype
        self.device = device

    # -- conversions
    def ft(self, v: Value) -> torch.Tensor:
        """As a float tensor: float tensors keep their dtype, ints/scalars become ``float_dtype``."""
        if isinstance(v, torch.Tensor):
            return v if v.is_floating_point() else v.to(self.float_dtype)
        return torch.tensor(float(v), dtype=self.float_dtype, device=self.device)

    def fl(self, v: Value) -> Value:
        """Float-valued, keeping Python scalars as scalars (torch's scalar promotion rules)."""
        if isinstance(v, torch.Tensor):
            return v if v.is_floating_point() else v.to(self.float_dtype)
        return float(v)

    def common(self, vals: list[Value]) -> list[torch.Tensor]:
        """Tensors of one dtype: float if any value is real, else int64 if any is an int, else bool."""
        if any(_is_float(v) for v in vals):
            dts = [v.dtype for v in vals if isinstance(v, torch.Tensor) and v.is_floating_point()]
            if not dts or any(isinstance(v, torch.Tensor) and _is_int(v) for v in vals):
                dts.append(self.float_dtype)
            target = reduce(torch.promote_types, dts)
        elif any(_is_int(v) for v in vals):
            target = torch.int64
        else:
            target = torch.bool
        return [v.to(target) if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=target, device=self.device)
                for v in vals]

    def bt(self, v: Value) -> torch.Tensor:
        if not _is_bool(v):
            raise TypeError(f"expected a boolean operand, got {type(v).__name__}")
        return torch.as_tensor(v, device=self.device)

    # -- the walk
    def __call__(self, e: sympy.Basic) -> Value:
        if e is sympy.true or e is sympy.false:
            return bool(e)
        if isinstance(e, sympy.Indexed):
            return self.indexed(e)
        if e.is_Integer:
            return int(e)
        if e.is_Number or e.is_NumberSymbol:
            try:
                return float(e)
            except TypeError:
                raise NotImplementedError(f"expected a real constant, got {e}") from None
        if e.is_Symbol:
            if e.name not in self.symbols:
                raise KeyError(f"expected a symbol among {sorted(self.symbols)}, got {e.name!r}")
            return self.symbols[e.name]
        if e.is_Add or e.is_Mul:
            vals = [self(a) for a in e.args]
            if any(_is_float(v) for v in vals):
                vals = [self.fl(v) for v in vals]
            return reduce(operator.add if e.is_Add else operator.mul, vals)
        if e.is_Pow:
            return self.power(e)
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            return self.rounding(e)
        if isinstance(e, sympy.Mod):
            a, b = self(e.args[0]), self(e.args[1])
            if not (_is_int(a) and _is_int(b)):
                a, b = self.fl(a), self.fl(b)
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                a, b = self.common([a, b])
                return torch.remainder(a, b)
            return a % b  # Python semantics, as torch.remainder and ac_mod
        if isinstance(e, sympy.Abs):
            v = self(e.args[0])
            return torch.abs(v) if isinstance(v, torch.Tensor) else abs(v)
        if isinstance(e, sympy.sign):
            return torch.sign(self.common([self(e.args[0])])[0])
        if isinstance(e, (sympy.Min, sympy.Max)):
            ts = self.common([self(a) for a in e.args])
            if ts[0].is_floating_point():  # fminf / fmaxf: a NaN operand is ignored
                return reduce(torch.fmin if isinstance(e, sympy.Min) else torch.fmax, ts)
            return reduce(torch.minimum if isinstance(e, sympy.Min) else torch.maximum, ts)
        for cls, fn in _FLOAT_FUNCS.items():
            if isinstance(e, cls):
                return fn(self.ft(self(e.args[0])))
        if isinstance(e, sympy.atan2):
            y, x = (self.ft(self(a)) for a in e.args)
            return torch.atan2(y, x)
        if isinstance(e, sympy.Piecewise):
            return self.piecewise(e)
        if isinstance(e, sympy.ITE):
            c, a, b = (self(x) for x in e.args)
            c, (a, b) = self.bt(c), self.common([a, b])
            return torch.where(c, a, b)
        if isinstance(e, sympy.core.relational.Relational):
            op = _REL_OPS.get(e.rel_op)
            if op is None:
                raise NotImplementedError(f"expected a comparison ==, !=, <, <=, >, >=, got {e.rel_op}")
            return op(self(e.lhs), self(e.rhs))
        if isinstance(e, (sympy.And, sympy.Or, sympy.Xor)):
            fn = {sympy.And: torch.logical_and, sympy.Or: torch.logical_or, sympy.Xor: torch.logical_xor}[e.func]
            return reduce(fn, [self.bt(self(a)) for a in e.args])
        if isinstance(e, sympy.Equivalent):
            ts = [self.bt(self(a)) for a in e.args]
            return reduce(torch.logical_and, [torch.eq(ts[0], t) for t in ts[1:]])
        if isinstance(e, sympy.Not):
            return torch.logical_not(self.bt(self(e.args[0])))
        raise NotImplementedError(f"expected one of ({_SUPPORTED}), got {type(e).__name__}: {e}")

    def power(self, e: sympy.Pow) -> Value:
        base, ex = e.args
        b = self(base)
        if ex.is_Integer:
            n = int(ex)
            if _is_int(b) and n >= 0:
                return b ** n
            return torch.pow(self.ft(b), n)
        if ex == sympy.Rational(1, 2):
            return torch.sqrt(self.ft(b))
        if ex == sympy.Rational(-1, 2):
            return torch.rsqrt(self.ft(b))
        x = self(ex)
        return torch.pow(self.ft(b), self.fl(x))

    def rounding(self, e: sympy.Basic) -> Value:
        """floor / ceiling; ``floor(a / b)`` of integers is exact integer floor division."""
        is_floor = isinstance(e, sympy.floor)
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if den != 1:
            a, b = self(num), self(den)
            if _is_int(a) and _is_int(b):
                if not is_floor:
                    a = -a
                if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                    a, b = self.common([a, b])
                    r = torch.div(a, b, rounding_mode="floor")
                else:
                    r = a // b
                return r if is_floor else -r
        v = self(e.args[0])
        if _is_int(v):
            return v
        return (torch.floor if is_floor else torch.ceil)(self.ft(v))

    def piecewise(self, e: sympy.Piecewise) -> Value:
        vals = [self(pair.expr) for pair in e.args]
        conds = [self(pair.cond) for pair in e.args]
        if not any(c is True for c in conds):  # no `otherwise` branch: undefined -> NaN
            vals.append(math.nan)
            conds.append(True)
        ts = self.common(vals)
        out = ts[-1]
        for t, c in zip(reversed(ts[:-1]), reversed(conds[:-1])):  # the first true condition wins
            if c is True:
                out = t
            elif c is not False:
                out = torch.where(self.bt(c), t, out)
        return out

    def indexed(self, e: sympy.Indexed) -> torch.Tensor:
        name = str(e.base.label)
        if name not in self.buffers:
            raise KeyError(f"expected buffer {name!r} among the given buffers {sorted(self.buffers)}, got none")
        buf = self.buffers[name]
        if len(e.indices) != buf.ndim:
            raise ValueError(f"expected {buf.ndim} indices for buffer {name!r}, got {len(e.indices)}: {e}")
        idx = []
        for d, i in enumerate(e.indices):
            v = self(i)
            t = self.common([v])[0]
            if t.is_floating_point() and not bool(torch.all(torch.floor(t) == t)):
                raise TypeError(f"expected an integer index into {name!r}, got the real-valued index {i}")
            t = t.to(torch.int64)
            idx.append(t.clamp(0, buf.shape[d] - 1))  # as ac_clamp: out of range reads the edge
        return buf[tuple(idx)]


def evaluate(expr: sympy.Basic, values: Mapping[str, Value], buffers: Optional[Mapping[str, torch.Tensor]] = None,
             *, float_dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> Value:
    """Evaluate a sympy expression of the IR with torch broadcasting.

    ``values`` maps symbol names (``score``, ``b``, ``h``, ``q_idx``, ``kv_idx``, ``q_len``,
    ``kv_len``) to tensors or Python numbers; ``buffers`` maps buffer names to tensors (indexed with
    indices clamped into range).  Integer arithmetic stays in int64 (``//`` and ``%`` with Python
    semantics); anything real is computed in ``float_dtype`` (float tensors keep their dtype).
    Constants are created on ``device`` (default: that of the first tensor given, else the CPU).
    Raises NotImplementedError for a sympy node outside the supported set.
    """
    if device is None:
        tensors = [v for v in (*values.values(), *(buffers or {}).values()) if isinstance(v, torch.Tensor)]
        device = tensors[0].device if tensors else "cpu"
    return _Evaluator(values, dict(buffers or {}), float_dtype, torch.device(device))(expr)


# ------------------------------------------------------------------------------------ attention


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ir: AttentionIR) -> tuple[int, ...]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"expected {name} as a 4-d tensor (B, heads, N, dim), got {got}")
        if t.device != q.device:
            raise ValueError(f"expected {name} on {q.device}, got {t.device}")
    B, H, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if Bk != B or tuple(v.shape[:3]) != (Bk, Hkv, Nk):
        raise ValueError(f"expected k (B={B}, H_kv, Nk, D) and v (B, H_kv, Nk, DV) to agree, "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"expected the key/value heads to divide the query heads {H}, got {Hkv}")
    if D != ir.head_dim or Dk != ir.head_dim:
        raise ValueError(f"expected head_dim {ir.head_dim} for q and k, got {D} and {Dk}")
    if v.shape[3] != ir.head_dim_v:
        raise ValueError(f"expected head_dim_v {ir.head_dim_v} for v, got {v.shape[3]}")
    return B, H, Hkv, Nq, Nk, v.shape[3]


def _prepare_buffers(ir: AttentionIR, buffers: Optional[Mapping[str, torch.Tensor]], float_dtype: torch.dtype,
                     device: torch.device) -> dict[str, torch.Tensor]:
    given = dict(buffers or {})
    kinds = {info.name: info for info in ir.buffers}
    for name in kinds:
        if name not in given:
            raise ValueError(f"expected buffer {name!r} (declared by the IR), got only {sorted(given)}")
    out: dict[str, torch.Tensor] = {}
    for name, t in given.items():
        t = torch.as_tensor(t)
        info = kinds.get(name)
        if info is not None and t.ndim != info.ndim:
            raise ValueError(f"expected buffer {name!r} with {info.ndim} dims, got shape {tuple(t.shape)}")
        if any(s == 0 for s in t.shape):
            raise ValueError(f"expected buffer {name!r} without empty dimensions, got shape {tuple(t.shape)}")
        kind = info.kind if info is not None else ("float" if t.is_floating_point() else "int")
        if kind == "int" and (t.is_floating_point() or t.is_complex()):
            raise TypeError(f"expected an int or bool tensor for int buffer {name!r}, got {t.dtype}")
        out[name] = t.to(device=device, dtype=float_dtype if kind == "float" else torch.int64)
    return out


def _broadcast(val: Value, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(val, torch.Tensor):
        return torch.broadcast_to(val.to(dtype), shape)
    return torch.full(shape, val, dtype=dtype, device=device)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in the inputs' dtype.  CPU half/bf16 GEMMs are emulated as float32 GEMMs rounded to
    the dtype (what GPU GEMMs do: float32 accumulation, one rounding of the output), much faster."""
    if a.device.type == "cpu" and a.dtype in (torch.float16, torch.bfloat16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ir: AttentionIR, *,
               buffers: Optional[Mapping[str, torch.Tensor]], scale: Optional[float], dropout_p: Optional[float],
               seed: int, offset: int, return_lse: bool, dtype: torch.dtype, float_dtype: torch.dtype, eager: bool,
               q_chunk: Optional[int]) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    if not isinstance(ir, AttentionIR):
        raise TypeError(f"expected an AttentionIR, got {type(ir).__name__}")
    B, H, Hkv, Nq, Nk, DV = _check_qkv(q, k, v, ir)
    dev = q.device
    scale = float(ir.scale if scale is None else scale)
    p_drop = float(ir.dropout_p if dropout_p is None else dropout_p)
    if not 0.0 <= p_drop < 1.0:
        raise ValueError(f"expected dropout_p in [0, 1), got {p_drop}")
    if q_chunk is not None and (isinstance(q_chunk, bool) or not isinstance(q_chunk, int) or q_chunk < 1):
        raise ValueError(f"expected q_chunk as a positive int, got {q_chunk!r}")
    bufs = _prepare_buffers(ir, buffers, float_dtype, dev)
    G = H // Hkv
    qc = q.to(dtype)
    kt = k.to(dtype).transpose(-1, -2).unsqueeze(2)  # (B, Hkv, 1, D, Nk): GQA without copying k
    vc = v.to(dtype).unsqueeze(2)                    # (B, Hkv, 1, Nk, DV)
    out = torch.zeros((B, H, Nq, DV), dtype=dtype, device=dev)
    lse = torch.full((B, H, Nq), -math.inf, dtype=dtype, device=dev)
    if Nq == 0 or Nk == 0 or B * H == 0:
        return (out, lse) if return_lse else out

    if q_chunk is None:
        budget = _CHUNK_ELEMS_CUDA if dev.type == "cuda" else _CHUNK_ELEMS_CPU
        q_chunk = max(1, budget // (B * H * Nk))
        if q_chunk >= 16:
            q_chunk = q_chunk // 16 * 16  # keeps Philox row pairs (q, q^8) in one chunk
    b_idx = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h_idx = torch.arange(H, device=dev).view(1, H, 1, 1)
    kv_idx = torch.arange(Nk, device=dev).view(1, 1, 1, Nk)
    for r0 in range(0, Nq, q_chunk):
        r1 = min(Nq, r0 + q_chunk)
        n = r1 - r0
        shape = (B, H, n, Nk)
        s = _matmul(qc[:, :, r0:r1].reshape(B, Hkv, G, n, -1), kt).reshape(shape) * scale
        env: dict[str, Value] = {
            SCORE.name: s, SYM_B.name: b_idx, SYM_H.name: h_idx, KV_IDX.name: kv_idx,
            Q_IDX.name: torch.arange(r0, r1, device=dev).view(1, 1, n, 1), Q_LEN.name: Nq, KV_LEN.name: Nk,
        }
        ev = _Evaluator(env, bufs, float_dtype, dev)
        if ir.score_expr is not None:
            s = _broadcast(ev(ir.score_expr), shape, dtype, dev)
        if ir.mask_expr is not None:
            m = ev(ir.mask_expr)
            if not _is_bool(m):
                m = ev.common([m])[0] != 0
            s = s.masked_fill(~_broadcast(m, shape, torch.bool, dev), -math.inf)
        if eager:
            p = torch.softmax(s, dim=-1)
            # softmax of an all -inf row is NaN; such a row outputs 0
            p = p.masked_fill((s == -math.inf).all(dim=-1, keepdim=True), 0.0)
            row_lse = torch.logsumexp(s, dim=-1)
        else:
            mx = s.amax(dim=-1, keepdim=True)
            mx = mx.masked_fill(mx == -math.inf, 0.0)
            e = torch.exp(s - mx)
            den = e.sum(dim=-1, keepdim=True)
            p = e / den.masked_fill(den == 0, 1.0)
            row_lse = (torch.log(den) + mx).squeeze(-1)
        if p_drop > 0.0:
            keep = dropout_keep_mask(B, H, Nq, Nk, seed=seed, offset=offset, p=p_drop, device=dev,
                                     q_start=r0, q_end=r1)
            p = p.masked_fill(~keep, 0.0)
            p = p * (1.0 / (1.0 - p_drop)) if eager else p / (1.0 - p_drop)
        out[:, :, r0:r1] = _matmul(p.reshape(B, Hkv, G, n, Nk), vc).reshape(B, H, n, DV)
        lse[:, :, r0:r1] = row_lse
    return (out, lse) if return_lse else out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ir: AttentionIR, *,
                        buffers: Optional[Mapping[str, torch.Tensor]] = None, scale: Optional[float] = None,
                        dropout_p: Optional[float] = None, seed: int = 0, offset: int = 0, return_lse: bool = False,
                        dtype: torch.dtype = torch.float64, q_chunk: Optional[int] = None,
                        ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The attention ``ir`` describes, computed in ``dtype`` (float64) on ``q``'s device.

    q (B, H, Nq, D), k (B, H_kv, Nk, D), v (B, H_kv, Nk, DV); H_kv divides H (query head h reads
    key/value head h // (H // H_kv)).  ``buffers`` maps the IR's buffer names to tensors (float
    buffers are read as ``dtype``, int/bool buffers as int64; indices are clamped into range).
    ``scale`` and ``dropout_p`` default to the IR's; dropout keep bits come from
    :func:`attncompiler.philox.dropout_keep_mask` with ``seed`` and ``offset``.  Returns the output
    (B, H, Nq, DV) in ``dtype``, and with ``return_lse`` also lse (B, H, Nq): natural-log
    log-sum-exp of the (undropped) masked scores, -inf for a row with no visible key (whose output
    is 0).  ``q_chunk`` forces the number of query rows per chunk (default: bounded memory).
    """
    return _attention(q, k, v, ir, buffers=buffers, scale=scale, dropout_p=dropout_p, seed=seed, offset=offset,
                      return_lse=return_lse, dtype=dtype, float_dtype=dtype, eager=False, q_chunk=q_chunk)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ir: AttentionIR, *,
                    buffers: Optional[Mapping[str, torch.Tensor]] = None, scale: Optional[float] = None,
                    dropout_p: Optional[float] = None, seed: int = 0, offset: int = 0, return_lse: bool = False,
                    q_chunk: Optional[int] = None) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Same computation as :func:`reference_attention`, the way eager PyTorch does it in q's dtype.

    ``q @ k^T``, the scale, ``torch.softmax``, dropout and ``P @ V`` all run in the input dtype
    (bf16/fp16; on the CPU the two GEMMs accumulate in float32 and round once, as GPU GEMMs do).
    In ``score_expr`` the score stays in that dtype, while index arithmetic converted to real
    numbers and float buffers use float32 (as the kernel receives them); the modified score is
    rounded back to the input dtype.  Output (and lse) are in the input dtype.  A row with no
    visible key outputs 0 (not softmax's NaN).
    """
    low = q.dtype in (torch.float16, torch.bfloat16)
    return _attention(q, k, v, ir, buffers=buffers, scale=scale, dropout_p=dropout_p, seed=seed, offset=offset,
                      return_lse=return_lse, dtype=q.dtype, float_dtype=torch.float32 if low else q.dtype,
                      eager=True, q_chunk=q_chunk)


def _abs_err(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|a - ref| with equal values (also equal infinities) giving 0 and NaN giving +inf."""
    d = (a - ref).abs()
    d = d.masked_fill(a == ref, 0.0)
    return d.masked_fill(torch.isnan(d), math.inf)


def error_ratio_check(out: torch.Tensor, ref: torch.Tensor, eager: torch.Tensor, factor: float = 2.0,
                      atol: float = 1e-5, rel_atol: float = 1e-6) -> tuple[bool, str]:
    """Accept ``out`` iff its error against the float64 ``ref`` is at most ``factor`` times the error
    of the same-dtype ``eager`` result, plus a tiny absolute allowance.

    Two metrics, both must pass: max-abs error (allowance ``atol``) and relative Frobenius error
    ``||x - ref|| / ||ref||`` over finite ref entries (allowance ``rel_atol``).  NaN in ``out`` where
    ``ref`` has none, or an infinite error, fails.  Returns ``(ok, message)``; the message gives the
    kernel error, the eager error and the bound for each metric.
    """
    if not (tuple(out.shape) == tuple(ref.shape) == tuple(eager.shape)):
        raise ValueError(f"expected out, ref and eager of one shape, got {tuple(out.shape)}, "
                         f"{tuple(ref.shape)}, {tuple(eager.shape)}")
    r = ref.detach().to(torch.float64)
    o = out.detach().to(device=r.device, dtype=torch.float64)
    e = eager.detach().to(device=r.device, dtype=torch.float64)
    eo, ee = _abs_err(o, r), _abs_err(e, r)
    rfin = torch.where(torch.isfinite(r), r, torch.zeros((), dtype=torch.float64, device=r.device))
    rnorm_raw = float(torch.linalg.vector_norm(rfin))
    rnorm = max(rnorm_raw, 1e-300)
    max_o = float(eo.max()) if eo.numel() else 0.0
    max_e = float(ee.max()) if ee.numel() else 0.0
    fro_o = float(torch.linalg.vector_norm(eo)) / rnorm
    fro_e = float(torch.linalg.vector_norm(ee)) / rnorm
    bound_max = factor * max_e + atol
    bound_fro = factor * fro_e + rel_atol
    ok_max = math.isfinite(max_o) and max_o <= bound_max
    ok_fro = math.isfinite(fro_o) and fro_o <= bound_fro
    if rnorm_raw == 0.0 and math.isfinite(max_o):
        # An all-zero reference (e.g. dq when every row sees one key) has no relative error:
        # only the absolute bound applies.
        ok_fro = True
    ok = ok_max and ok_fro
    fro_text = (f"rel-fro err {fro_o:.3e} vs eager {fro_e:.3e} (bound {bound_fro:.3e}: {'ok' if ok_fro else 'exceeded'})"
                if rnorm_raw > 0.0 else "rel-fro n/a (all-zero reference)")
    msg = (f"{'PASS' if ok else 'FAIL'}: max-abs err {max_o:.3e} vs eager {max_e:.3e} "
           f"(bound {bound_max:.3e}: {'ok' if ok_max else 'exceeded'}); {fro_text}; factor {factor}")
    return ok, msg
