"""The symbols every traced expression is written in.

Score and mask modifiers are traced by calling them on these symbols (wrapped in
:class:`attncompiler.spec.sym.Sym`).  Everything downstream -- the IR, the CUDA
printer, the tile bounder, the float64 reference -- agrees on these names:

=========  ===========================  ==========================
symbol     meaning                      CUDA spelling (hooks)
=========  ===========================  ==========================
SCORE      scaled q.k score (float)     ``score``
B          batch index                  ``b``
H          query-head index             ``h``
Q_IDX      query position               ``q_idx``
KV_IDX     key/value position           ``kv_idx``
Q_LEN      query sequence length        ``p.Nq``
KV_LEN     key/value sequence length    ``p.Nk``
=========  ===========================  ==========================

Captured buffers appear as ``sympy.Indexed(sympy.IndexedBase(name), *idx)``.
"""
from __future__ import annotations

import sympy

__all__ = ["SCORE", "B", "H", "Q_IDX", "KV_IDX", "Q_LEN", "KV_LEN", "INDEX_SYMBOLS", "ALL_SYMBOLS"]

SCORE = sympy.Symbol("score", real=True)
B = sympy.Symbol("b", integer=True, nonnegative=True)
H = sympy.Symbol("h", integer=True, nonnegative=True)
Q_IDX = sympy.Symbol("q_idx", integer=True, nonnegative=True)
KV_IDX = sympy.Symbol("kv_idx", integer=True, nonnegative=True)
Q_LEN = sympy.Symbol("q_len", integer=True, positive=True)
KV_LEN = sympy.Symbol("kv_len", integer=True, positive=True)

INDEX_SYMBOLS = (B, H, Q_IDX, KV_IDX)
ALL_SYMBOLS = (SCORE, B, H, Q_IDX, KV_IDX, Q_LEN, KV_LEN)
