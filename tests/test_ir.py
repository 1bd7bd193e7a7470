"""AttentionIR building, verification and printing (CPU only)."""
from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch

from attncompiler.ir import AttentionIR, BufferInfo, IRError, Node, build_ir, format_ir, verify
from attncompiler.spec import AttentionSpec, presets
from attncompiler.spec.symbols import H, KV_IDX, Q_IDX, SCORE

SLOPES = presets.alibi_slopes(4)


def specs() -> list[tuple[str, AttentionSpec]]:
    out = [(n, presets.get_preset(n, head_dim=64, num_heads=4, seqlen=64)) for n in sorted(presets.PRESETS)]
    out.append(("alibi_causal_dropout", presets.alibi(SLOPES, 64, causal=True, dropout_p=0.1)))
    out.append(("fp16_dv32", AttentionSpec(64, head_dim_v=32, dtype="fp16", scale=0.3,
                                           score_mod=presets.softcap_score_mod(20.0))))
    return out


SPECS = specs()


@pytest.mark.parametrize("name,spec", SPECS, ids=[n for n, _ in SPECS])
def test_build_verify_format(name, spec):
    ir = build_ir(spec)
    verify(ir)
    ops = [n.op for n in ir.nodes]
    assert ops[0] == "matmul_qk" and ops[1] == "scale" and ops[-1] == "matmul_pv"
    assert ("score_mod" in ops) == (ir.score_expr is not None)
    assert ("mask" in ops) == (ir.mask_expr is not None)
    assert ("dropout" in ops) == (ir.dropout_p > 0)
    assert ir.nodes[-1].output == "out"
    text = format_ir(ir)
    assert f"dtype={ir.dtype}" in text and f"head_dim={ir.head_dim}" in text
    assert len(text.splitlines()) == len(ir.nodes) + 1 + (1 if ir.buffers else 0)
    for n in ir.nodes:
        assert f"%{n.output} = {n.op}(" in text


def test_format_alibi_line():
    ir = build_ir(presets.alibi(SLOPES, 64, causal=True, dropout_p=0.1))
    text = format_ir(ir)
    assert "%s2 = score_mod(%s1) : score + (kv_idx - q_idx)*slopes[h]" in text
    assert "%s3 = mask(%s2) : kv_len + q_idx - q_len >= kv_idx" in text
    assert "%p1 = dropout(%p0) : p=0.1" in text
    assert "%out = matmul_pv(%p1, %v)" in text
    assert "buffers: slopes: float[1-d]" in text
    assert ir.buffers == (BufferInfo("slopes", 1, "float"),)
    assert ir.name == "alibi" and ir.scale == pytest.approx(0.125)


def test_build_from_traced_spec_and_key():
    spec = presets.alibi(SLOPES, 64)
    assert build_ir(spec.trace()) == build_ir(spec)
    other = presets.alibi(torch.ones(4), 64, scale=0.5)
    assert build_ir(other).key() == build_ir(spec).key()  # values and scale are run-time parameters
    with pytest.raises(IRError, match="expected an AttentionSpec or TracedSpec, got int"):
        build_ir(3)


# ----------------------------------------------------------------------------------- broken IRs
def _good() -> AttentionIR:
    spec = presets.alibi(SLOPES, 64, mask_mod=presets.document_mask(presets.document_ids(64)), dropout_p=0.1)
    return build_ir(spec)


def _swap(nodes, i, j):
    nodes = list(nodes)
    nodes[i], nodes[j] = nodes[j], nodes[i]
    return tuple(nodes)


BROKEN = [
    ("order", lambda ir: dataclasses.replace(ir, nodes=_swap(ir.nodes, 2, 3)), "expected ops"),
    ("missing_softmax", lambda ir: dataclasses.replace(ir, nodes=tuple(n for n in ir.nodes if n.op != "softmax")),
     "expected ops"),
    ("no_nodes", lambda ir: dataclasses.replace(ir, nodes=()), "got no nodes"),
    ("use_before_def", lambda ir: dataclasses.replace(
        ir, nodes=ir.nodes[:2] + (dataclasses.replace(ir.nodes[2], inputs=("s9",)),) + ir.nodes[3:]),
     "used before it is defined"),
    ("skips_previous", lambda ir: dataclasses.replace(
        ir, nodes=ir.nodes[:3] + (dataclasses.replace(ir.nodes[3], inputs=("s0",)),) + ir.nodes[4:]),
     "expected first input %s2"),
    ("head_dim", lambda ir: dataclasses.replace(ir, head_dim=12), "head_dim: expected a positive multiple of 8, got 12"),
    ("head_dim_v", lambda ir: dataclasses.replace(ir, head_dim_v=0), "head_dim_v"),
    ("dtype", lambda ir: dataclasses.replace(ir, dtype="fp32"), "dtype: expected one of ['bf16', 'fp16'], got 'fp32'"),
    ("dropout", lambda ir: dataclasses.replace(ir, dropout_p=1.0), "dropout_p: expected a probability in [0, 1), got 1.0"),
    ("scale", lambda ir: dataclasses.replace(ir, scale=-1.0), "scale: expected a finite float > 0"),
    ("unknown_symbol", lambda ir: dataclasses.replace(ir, score_expr=ir.score_expr + sympy.Symbol("x")),
     "got unknown ['x']"),
    ("mask_uses_score", lambda ir: dataclasses.replace(ir, mask_expr=sympy.And(ir.mask_expr, SCORE > 0)),
     "(not score), got ['score']"),
    ("mask_not_boolean", lambda ir: dataclasses.replace(ir, mask_expr=Q_IDX - KV_IDX), "mask_expr: expected a sympy boolean"),
    ("score_boolean", lambda ir: dataclasses.replace(ir, score_expr=Q_IDX > KV_IDX), "score_expr: expected a numeric"),
    ("undeclared_buffer", lambda ir: dataclasses.replace(ir, score_expr=SCORE + sympy.IndexedBase("zz")[H]),
     "reads buffer `zz`"),
    ("wrong_ndim", lambda ir: dataclasses.replace(ir, score_expr=SCORE + sympy.IndexedBase("slopes")[H, Q_IDX]),
     "declared with ndim=1, got 2 indices"),
    ("duplicate_buffer", lambda ir: dataclasses.replace(ir, buffers=ir.buffers + (ir.buffers[0],)), "unique names"),
    ("bad_kind", lambda ir: dataclasses.replace(ir, buffers=(BufferInfo("slopes", 1, "half"),) + ir.buffers[1:]),
     "kind 'float' or 'int'"),
    ("node_expr_mismatch", lambda ir: dataclasses.replace(
        ir, nodes=ir.nodes[:2] + (Node("score_mod", ("s1",), "s2", (("expr", SCORE),)),) + ir.nodes[3:]),
     "score_mod node: expected expr"),
    ("dropout_node_without_p", lambda ir: dataclasses.replace(ir, dropout_p=0.0), "expected ops"),
]


@pytest.mark.parametrize("name,breaker,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_verify_catches_broken_ir(name, breaker, message):
    ir = _good()
    verify(ir)
    bad = breaker(ir)
    with pytest.raises(IRError) as ei:
        verify(bad)
    assert message in str(ei.value), str(ei.value)


def test_ir_package_exports():
    import attncompiler.ir as irpkg

    for name in irpkg.__all__:
        assert hasattr(irpkg, name)
