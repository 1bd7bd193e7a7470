"""AttentionSpec: what attention to compute (validated, hashable), and its traced form."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable, Iterable, Mapping

import sympy
import torch

from ..ir.types import DTYPES, BufferInfo
from .symbols import KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE
from .trace import SpecError, TraceError, Tracer, check_buffer_name

__all__ = ["AttentionSpec", "TracedSpec", "SpecError", "TraceError", "causal_mask_expr",
           "normalize_dtype", "HEAD_DIM_MIN", "HEAD_DIM_MAX"]

HEAD_DIM_MIN, HEAD_DIM_MAX = 8, 256

_DTYPE_ALIASES: dict[Any, str] = {
    "bf16": "bf16", "bfloat16": "bf16", torch.bfloat16: "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", torch.float16: "fp16",
}


def normalize_dtype(dtype: Any) -> str:
    """"bf16" / "fp16" from any accepted spelling (str, case-insensitive, or torch dtype)."""
    key = dtype.lower() if isinstance(dtype, str) else dtype
    try:
        out = _DTYPE_ALIASES.get(key)
    except TypeError:  # unhashable
        out = None
    if out is None:
        raise SpecError(
            f"dtype: expected one of 'bf16', 'bfloat16', 'fp16', 'float16', torch.bfloat16, "
            f"torch.float16, got {dtype!r}; the kernels compute in bf16/fp16 with float32 accumulation"
        )
    assert out in DTYPES
    return out


def causal_mask_expr() -> sympy.Basic:
    """Bottom-right aligned causal mask ``q_idx + (kv_len - q_len) >= kv_idx`` (FA >= 2.1)."""
    return sympy.Ge(Q_IDX + (KV_LEN - Q_LEN), KV_IDX)


def _check_head_dim(what: str, v: Any) -> int:
    ok = isinstance(v, numbers.Integral) and not isinstance(v, bool)
    if ok and HEAD_DIM_MIN <= int(v) <= HEAD_DIM_MAX and int(v) % 8 == 0:
        return int(v)
    hint = "pass an int"
    if ok and 0 < int(v) < HEAD_DIM_MAX:
        hint = f"zero-pad the head dimension to {(int(v) + 7) // 8 * 8} (and pass scale explicitly)"
    elif ok and int(v) > HEAD_DIM_MAX:
        hint = f"head dimensions above {HEAD_DIM_MAX} are not supported; split the head"
    raise SpecError(f"{what}: expected a multiple of 8 in [{HEAD_DIM_MIN}, {HEAD_DIM_MAX}], got {v!r}; {hint}")


def _normalize_buffers(buffers: Any) -> tuple[tuple[str, torch.Tensor], ...]:
    if buffers is None:
        return ()
    if isinstance(buffers, Mapping):
        items = list(buffers.items())
    elif isinstance(buffers, Iterable) and not isinstance(buffers, (str, torch.Tensor)):
        items = list(buffers)
        if not all(isinstance(p, tuple) and len(p) == 2 for p in items):
            raise SpecError("buffers: expected a mapping name -> torch.Tensor (or (name, tensor) pairs), "
                            f"got {type(buffers).__name__} with non-pair items")
    else:
        raise SpecError(f"buffers: expected a mapping name -> torch.Tensor, got {type(buffers).__name__}")
    for name, t in items:
        check_buffer_name(name)
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"buffers[{name!r}]: expected a torch.Tensor, got {type(t).__name__}")
    return tuple((n, t) for n, t in items)


@dataclass(frozen=True)
class TracedSpec:
    """An AttentionSpec with its modifiers traced to sympy (see attncompiler.ir.types.AttentionIR).

    ``score_expr`` is None when there is no score modifier (or it is the identity); ``mask_expr``
    is None when every key is visible, otherwise a sympy boolean with causal folded in.
    """

    name: str
    head_dim: int
    head_dim_v: int
    dtype: str
    scale: float
    causal: bool
    dropout_p: float
    score_expr: sympy.Expr | None
    mask_expr: sympy.Basic | None
    buffers: tuple[BufferInfo, ...]
    buffer_values: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, hash=False, repr=False)
    spec: "AttentionSpec | None" = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class AttentionSpec:
    """What attention to compute.  Everything after ``head_dim`` is keyword-only.

    ``scale`` None means 1/sqrt(head_dim) (see :attr:`softmax_scale`); it stays None so that
    ``with_(head_dim=...)`` keeps the default.  ``head_dim_v`` None means ``head_dim`` (stored
    resolved).  ``causal`` is bottom-right aligned (``q_idx + kv_len - q_len >= kv_idx``) and is
    And-ed with ``mask_mod``.  ``mask_mod(b, h, q_idx, kv_idx)`` and
    ``score_mod(score, b, h, q_idx, kv_idx)`` use FlexAttention signatures and are traced by
    :meth:`trace`.  ``buffers`` names tensors explicitly (they override captured variables of the
    same name); it is stored as a tuple of (name, tensor) pairs and ignored by ==/hash.
    """

    head_dim: int
    _: KW_ONLY
    head_dim_v: int | None = None
    dtype: str | torch.dtype = "bf16"
    scale: float | None = None
    causal: bool = False
    mask_mod: Callable[..., Any] | None = None
    score_mod: Callable[..., Any] | None = None
    dropout_p: float = 0.0
    buffers: Mapping[str, torch.Tensor] | tuple[tuple[str, torch.Tensor], ...] = field(
        default=(), compare=False, hash=False, repr=False)
    name: str = "attention"

    def __post_init__(self) -> None:
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        put("head_dim", _check_head_dim("head_dim", self.head_dim))
        put("head_dim_v", _check_head_dim("head_dim_v", self.head_dim if self.head_dim_v is None else self.head_dim_v))
        put("dtype", normalize_dtype(self.dtype))
        if self.scale is not None:
            s = self.scale
            if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(float(s)) or float(s) <= 0:
                raise SpecError(f"scale: expected a finite float > 0 (or None for 1/sqrt(head_dim)), got {s!r}")
            put("scale", float(s))
        if not isinstance(self.causal, bool):
            raise SpecError(f"causal: expected True or False, got {self.causal!r}")
        for what in ("mask_mod", "score_mod"):
            mod = getattr(self, what)
            if mod is not None and not callable(mod):
                sig = "(score, b, h, q_idx, kv_idx)" if what == "score_mod" else "(b, h, q_idx, kv_idx)"
                raise SpecError(f"{what}: expected a callable {what}{sig} or None, got {type(mod).__name__}")
        p = self.dropout_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.0 <= float(p) < 1.0):
            raise SpecError(f"dropout_p: expected a probability in [0, 1), got {p!r}; "
                            "use 0.0 to disable dropout (p = 1 would drop every element)")
        put("dropout_p", float(p))
        put("buffers", _normalize_buffers(self.buffers))
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"name: expected a non-empty string, got {self.name!r}")

    @property
    def softmax_scale(self) -> float:
        """The score scale: ``scale`` or 1/sqrt(head_dim)."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    def with_(self, **changes: Any) -> AttentionSpec:
        """A copy with ``changes`` applied (dataclasses.replace).

        Changing ``head_dim`` also changes ``head_dim_v`` when it equalled ``head_dim`` and is not
        given; the default scale follows ``head_dim`` automatically."""
        if "head_dim" in changes and "head_dim_v" not in changes and self.head_dim_v == self.head_dim:
            changes["head_dim_v"] = changes["head_dim"]
        return dataclasses.replace(self, **changes)

    def trace(self) -> TracedSpec:
        """Trace the modifiers (cached: the result depends only on this immutable spec)."""
        cached = self.__dict__.get("_traced")
        if cached is not None:
            return cached
        tracer = Tracer(self.buffers)
        score = tracer.trace_score(self.score_mod) if self.score_mod is not None else None
        if score == SCORE:  # identity
            score = None
        mask = tracer.trace_mask(self.mask_mod) if self.mask_mod is not None else None
        if self.causal:
            mask = causal_mask_expr() if mask is None else sympy.And(causal_mask_expr(), mask)
        if mask is sympy.true:
            mask = None
        values = dict(tracer.buffers)
        infos = tuple(
            BufferInfo(name=n, ndim=t.dim(), kind="float" if t.is_floating_point() else "int")
            for n, t in values.items()
        )
        traced = TracedSpec(
            name=self.name, head_dim=self.head_dim, head_dim_v=int(self.head_dim_v or self.head_dim),
            dtype=str(self.dtype), scale=self.softmax_scale, causal=self.causal, dropout_p=self.dropout_p,
            score_expr=score, mask_expr=mask, buffers=infos, buffer_values=values, spec=self,
        )
        object.__setattr__(self, "_traced", traced)
        return traced
