"""Core IR value types shared by the whole pipeline (spec -> ir -> plan -> codegen -> runtime)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import sympy

__all__ = ["BufferInfo", "Node", "AttentionIR", "DTYPES", "DType"]

DType = Literal["bf16", "fp16"]
DTYPES: tuple[str, ...] = ("bf16", "fp16")


@dataclass(frozen=True)
class BufferInfo:
    """A tensor captured by a score or mask modifier, passed to the kernel at run time.

    ``name`` is a C identifier; ``ndim`` its rank; ``kind`` says how the kernel reads it:
    ``"float"`` buffers are passed as float32, ``"int"`` buffers (int or bool tensors) as int32.
    """

    name: str
    ndim: int
    kind: Literal["float", "int"]


@dataclass(frozen=True)
class Node:
    """One IR operation. ``op`` is one of matmul_qk, scale, score_mod, mask, softmax, dropout, matmul_pv."""

    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, key: str, default: object = None) -> object:
        for k, v in self.attrs:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class AttentionIR:
    """What the kernel computes, independent of how (the schedule).

    out[b,h,i,:] = sum_j dropout(softmax_j(where(mask, score_mod(scale * q_i.k_j), -inf))) v_j

    ``score_expr`` is written in SCORE, B, H, Q_IDX, KV_IDX (Q_LEN, KV_LEN) and buffer Indexed
    terms, or None for the identity.  ``mask_expr`` is a sympy boolean in the index symbols (causal
    already folded in), or None when every key is visible.
    """

    head_dim: int
    head_dim_v: int
    dtype: DType
    scale: float
    score_expr: sympy.Expr | None
    mask_expr: sympy.Basic | None
    dropout_p: float
    buffers: tuple[BufferInfo, ...] = ()
    nodes: tuple[Node, ...] = field(default=(), compare=False)
    name: str = field(default="attention", compare=False)

    def key(self) -> tuple:
        """Hashable identity of the generated code (for caches).

        Structural only: buffer values, the softmax scale and the dropout probability are run-time
        kernel parameters, so they are left out (only whether dropout is on matters).  Computed once
        per IR (``sympy.srepr`` of the expressions takes ~100 us; the per-call paths ask for it)."""
        return self._key

    @functools.cached_property
    def _key(self) -> tuple:
        return (
            self.head_dim,
            self.head_dim_v,
            self.dtype,
            sympy.srepr(self.score_expr) if self.score_expr is not None else None,
            sympy.srepr(self.mask_expr) if self.mask_expr is not None else None,
            self.dropout_p > 0.0,
            self.buffers,
        )
