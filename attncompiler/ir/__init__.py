"""The attention IR: value types (types.py) and building / verifying / printing it (build.py)."""
from __future__ import annotations

from .types import DTYPES, AttentionIR, BufferInfo, DType, Node
from .build import GRAPH_INPUTS, OP_ORDER, IRError, build_ir, format_ir, verify

__all__ = [
    "AttentionIR", "BufferInfo", "Node", "DType", "DTYPES",
    "IRError", "build_ir", "verify", "format_ir", "OP_ORDER", "GRAPH_INPUTS",
]
