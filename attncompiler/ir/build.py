"""Build, verify and print the AttentionIR of a spec.

The IR is a straight-line chain of value-producing nodes::

    %s0  = matmul_qk(%q, %k)       scores q.k^T
    %s1  = scale(%s0)              * softmax scale
    %s2  = score_mod(%s1)          optional: score_expr
    %s3  = mask(%s2)               optional: -inf where not mask_expr
    %p0  = softmax(%s3)            over kv (rows with no visible key give 0)
    %p1  = dropout(%p0)            optional: dropout_p > 0
    %out = matmul_pv(%p1, %v)

``q``, ``k`` and ``v`` are the graph inputs; ``out`` is the only graph output.
"""
from __future__ import annotations

import math
import re
from typing import Any

import sympy

from ..spec.symbols import ALL_SYMBOLS, SCORE
from ..spec.trace import is_boolean, is_numeric
from .types import DTYPES, AttentionIR, BufferInfo, Node

__all__ = ["IRError", "build_ir", "verify", "format_ir", "OP_ORDER", "GRAPH_INPUTS"]

OP_ORDER: tuple[str, ...] = ("matmul_qk", "scale", "score_mod", "mask", "softmax", "dropout", "matmul_pv")
GRAPH_INPUTS: tuple[str, ...] = ("q", "k", "v")
_OPTIONAL = {"score_mod", "mask", "dropout"}
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


class IRError(ValueError):
    """An AttentionIR is malformed (what was expected, what was found)."""


def build_ir(spec: Any) -> AttentionIR:
    """The verified AttentionIR of an AttentionSpec (traced here; the trace is cached) or TracedSpec."""
    from ..spec.spec import AttentionSpec, TracedSpec  # lazy: spec imports ir.types

    if isinstance(spec, AttentionSpec):
        t = spec.trace()
    elif isinstance(spec, TracedSpec):
        t = spec
    else:
        raise IRError(f"build_ir: expected an AttentionSpec or TracedSpec, got {type(spec).__name__}")
    nodes: list[Node] = []
    counters = {"s": 0, "p": 0}

    def emit(op: str, kind: str, extra_inputs: tuple[str, ...], attrs: tuple[tuple[str, object], ...]) -> None:
        prev = (nodes[-1].output,) if nodes else ()
        if kind == "out":
            out = "out"
        else:
            out = f"{kind}{counters[kind]}"
            counters[kind] += 1
        nodes.append(Node(op=op, inputs=prev + extra_inputs, output=out, attrs=attrs))

    emit("matmul_qk", "s", ("q", "k"), (("head_dim", t.head_dim),))
    emit("scale", "s", (), (("scale", t.scale),))
    if t.score_expr is not None:
        emit("score_mod", "s", (), (("expr", t.score_expr),))
    if t.mask_expr is not None:
        emit("mask", "s", (), (("expr", t.mask_expr), ("causal", t.causal)))
    emit("softmax", "p", (), (("axis", "kv"),))
    if t.dropout_p > 0.0:
        emit("dropout", "p", (), (("p", t.dropout_p),))
    emit("matmul_pv", "out", ("v",), (("head_dim_v", t.head_dim_v),))
    ir = AttentionIR(
        head_dim=t.head_dim, head_dim_v=t.head_dim_v, dtype=t.dtype, scale=t.scale,  # type: ignore[arg-type]
        score_expr=t.score_expr, mask_expr=t.mask_expr, dropout_p=t.dropout_p,
        buffers=t.buffers, nodes=tuple(nodes), name=t.name,
    )
    verify(ir)
    return ir


# ----------------------------------------------------------------------------------- verify
def _fail(msg: str) -> None:
    raise IRError(msg)


def _check_indexed(where: str, expr: sympy.Basic, buffers: dict[str, BufferInfo]) -> None:
    for idx in expr.atoms(sympy.Indexed):
        name = str(idx.base.label)
        if name not in buffers:
            _fail(f"{where}: reads buffer `{name}`, expected one of the declared buffers "
                  f"{sorted(buffers)}; got undeclared `{idx}`")
        if len(idx.indices) != buffers[name].ndim:
            _fail(f"{where}: buffer `{name}` is declared with ndim={buffers[name].ndim}, got "
                  f"{len(idx.indices)} indices in `{idx}`")
        for i in idx.indices:
            if i.has(SCORE) or is_boolean(i):
                _fail(f"{where}: buffer index must be an integer expression of b, h, q_idx, kv_idx; got `{i}`")


def _free_symbols(expr: sympy.Basic) -> set[sympy.Basic]:
    """Free symbols, with Indexed terms (and their base labels) replaced by their indices' symbols."""
    indexed = expr.atoms(sympy.Indexed)
    out = set(expr.free_symbols) - indexed - {i.base.label for i in indexed}
    for i in indexed:
        for ix in i.indices:
            out |= _free_symbols(ix)
    return out


def _check_head_dim(what: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % 8:
        _fail(f"{what}: expected a positive multiple of 8, got {v!r}")


def verify(ir: AttentionIR) -> None:
    """Raise IRError unless ``ir`` is well-formed (structure, types, expressions, buffers)."""
    _check_head_dim("head_dim", ir.head_dim)
    _check_head_dim("head_dim_v", ir.head_dim_v)
    if ir.dtype not in DTYPES:
        _fail(f"dtype: expected one of {list(DTYPES)}, got {ir.dtype!r}")
    if isinstance(ir.scale, bool) or not isinstance(ir.scale, (int, float)) or not math.isfinite(ir.scale) \
            or ir.scale <= 0:
        _fail(f"scale: expected a finite float > 0, got {ir.scale!r}")
    if isinstance(ir.dropout_p, bool) or not isinstance(ir.dropout_p, (int, float)) \
            or not 0.0 <= ir.dropout_p < 1.0:
        _fail(f"dropout_p: expected a probability in [0, 1), got {ir.dropout_p!r}")

    buffers: dict[str, BufferInfo] = {}
    for b in ir.buffers:
        if not isinstance(b, BufferInfo):
            _fail(f"buffers: expected BufferInfo entries, got {type(b).__name__}")
        if not _IDENT.match(b.name) or b.name in {s.name for s in ALL_SYMBOLS}:
            _fail(f"buffer name: expected a C identifier distinct from the index symbols, got {b.name!r}")
        if b.name in buffers:
            _fail(f"buffers: expected unique names, got `{b.name}` twice")
        if isinstance(b.ndim, bool) or not isinstance(b.ndim, int) or b.ndim < 1:
            _fail(f"buffer `{b.name}`: expected ndim >= 1, got {b.ndim!r}")
        if b.kind not in ("float", "int"):
            _fail(f"buffer `{b.name}`: expected kind 'float' or 'int', got {b.kind!r}")
        buffers[b.name] = b

    allowed = set(ALL_SYMBOLS)
    if ir.score_expr is not None:
        if not is_numeric(ir.score_expr):
            _fail(f"score_expr: expected a numeric sympy expression, got {ir.score_expr} "
                  f"of type {type(ir.score_expr).__name__}")
        bad = _free_symbols(ir.score_expr) - allowed
        if bad:
            _fail(f"score_expr: expected free symbols within {sorted(s.name for s in ALL_SYMBOLS)} and "
                  f"buffers, got unknown {sorted(map(str, bad))} in {ir.score_expr}")
        _check_indexed("score_expr", ir.score_expr, buffers)
    if ir.mask_expr is not None:
        if not is_boolean(ir.mask_expr):
            _fail(f"mask_expr: expected a sympy boolean (relational, And/Or/Not, true/false), got "
                  f"{ir.mask_expr} of type {type(ir.mask_expr).__name__}")
        bad = _free_symbols(ir.mask_expr) - (allowed - {SCORE})
        if bad:
            _fail(f"mask_expr: expected free symbols within b, h, q_idx, kv_idx, q_len, kv_len and buffers "
                  f"(not score), got {sorted(map(str, bad))} in {ir.mask_expr}")
        _check_indexed("mask_expr", ir.mask_expr, buffers)
    _verify_nodes(ir)


def _verify_nodes(ir: AttentionIR) -> None:
    if not ir.nodes:
        _fail("nodes: expected the op chain matmul_qk .. matmul_pv, got no nodes (build the IR with build_ir)")
    present = {"score_mod": ir.score_expr is not None, "mask": ir.mask_expr is not None,
               "dropout": ir.dropout_p > 0.0}
    expected = [op for op in OP_ORDER if op not in _OPTIONAL or present[op]]
    got = [n.op for n in ir.nodes]
    if got != expected:
        _fail(f"nodes: expected ops {expected}, got {got}")
    defined = set(GRAPH_INPUTS)
    prev: str | None = None
    for n in ir.nodes:
        for i in n.inputs:
            if i not in defined:
                _fail(f"node {n.op}: input %{i} is used before it is defined (defined so far: "
                      f"{sorted(defined)})")
        if prev is not None and (not n.inputs or n.inputs[0] != prev):
            _fail(f"node {n.op}: expected first input %{prev} (the previous node's output), got {list(n.inputs)}")
        if n.output in defined:
            _fail(f"node {n.op}: output %{n.output} is defined twice")
        defined.add(n.output)
        prev = n.output
    if ir.nodes[0].inputs != ("q", "k"):
        _fail(f"matmul_qk: expected inputs (%q, %k), got {list(ir.nodes[0].inputs)}")
    if ir.nodes[-1].inputs[1:] != ("v",) or ir.nodes[-1].output != "out":
        _fail(f"matmul_pv: expected inputs (%p, %v) and output %out, got {list(ir.nodes[-1].inputs)} -> "
              f"%{ir.nodes[-1].output}")
    for n in ir.nodes:
        if n.op == "score_mod" and n.attr("expr") != ir.score_expr:
            _fail(f"score_mod node: expected expr {ir.score_expr}, got {n.attr('expr')}")
        if n.op == "mask" and n.attr("expr") != ir.mask_expr:
            _fail(f"mask node: expected expr {ir.mask_expr}, got {n.attr('expr')}")


# ----------------------------------------------------------------------------------- format
def _attr_text(n: Node) -> str:
    if n.op in ("score_mod", "mask"):
        return str(n.attr("expr"))
    if n.op == "scale":
        return f"{n.attr('scale'):.6g}"
    return ", ".join(f"{k}={v}" for k, v in n.attrs)


def format_ir(ir: AttentionIR) -> str:
    """Readable printout: a header, the buffers, one line per node."""
    lines = [f"attention {ir.name!r}: dtype={ir.dtype} head_dim={ir.head_dim} head_dim_v={ir.head_dim_v} "
             f"scale={ir.scale:.6g} dropout_p={ir.dropout_p:g}"]
    if ir.buffers:
        lines.append("buffers: " + ", ".join(f"{b.name}: {b.kind}[{b.ndim}-d]" for b in ir.buffers))
    for n in ir.nodes:
        args = ", ".join(f"%{i}" for i in n.inputs)
        text = _attr_text(n)
        lines.append(f"  %{n.output} = {n.op}({args})" + (f" : {text}" if text else ""))
    return "\n".join(lines)
