"""CPU: the shape and variant contracts of docs/shapes.md, on the reference, the simulator and the
CPU custom-op path -- relative position bias (value and table gradient), GQA, bottom-right causal
alignment for Nq != Nk, the LSE layout, the head-dim support table, and the documented empty cases.
The GPU kernels are held to the same contracts by tests/test_gpu_variants.py."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import attncompiler as ac
from attncompiler.autograd import attention_op, make_rng
from attncompiler.ir.build import build_ir
from attncompiler.plan.support import head_dim_support
from attncompiler.reference import reference_attention
from attncompiler.simulate import TileSchedule, simulate
from attncompiler.spec import presets

DOC = Path(__file__).parent.parent / "docs" / "shapes.md"


def _qkv(B: int, H: int, Hkv: int, Nq: int, Nk: int, D: int = 16, DV: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g)  # noqa: E731
    return mk(B, H, Nq, D), mk(B, Hkv, Nk, D), mk(B, Hkv, Nk, DV)


def test_relative_bias_value_matches_its_definition() -> None:
    table = torch.randn(3, 9, dtype=torch.float64)  # R = 4
    spec = presets.relative_bias(table, 16)
    ir = build_ir(spec)
    q, k, v = _qkv(2, 3, 3, 11, 17)
    i, j = torch.arange(11).view(-1, 1), torch.arange(17).view(1, -1)
    bias = table[:, (j - i + 4).clamp(0, 8)]  # (3, 11, 17)
    s = q @ k.transpose(-1, -2) / 4.0 + bias
    want = torch.softmax(s, -1) @ v
    got = reference_attention(q, k, v, ir, buffers={"bias_table": table})
    torch.testing.assert_close(got, want)
    eager = spec.score_mod(s * 0, 0, torch.arange(3).view(1, 3, 1, 1), i.view(1, 1, 11, 1), j.view(1, 1, 1, 17))
    torch.testing.assert_close(eager.expand(2, 3, 11, 17), bias.expand(2, 3, 11, 17))
    res = simulate(ir, TileSchedule("v2", 4, 5), q, k, v, buffers={"bias_table": table})
    torch.testing.assert_close(res.out, want)


def test_relative_bias_table_gradient_on_the_cpu_op_path() -> None:
    """The autograd op's buffer gradient (scatter-add at the clamped index) equals float64 autograd."""
    kern = ac.compile(presets.relative_bias(presets.relative_bias_table(4, 3), 16, causal=True), "v2",
                      target="sm_90", build=False)
    q, k, v = (t.float() for t in _qkv(1, 4, 2, 13, 21))
    table = (0.3 * torch.randn(4, 7)).requires_grad_()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = attention_op(kern, *leaves, scale=kern.ir.scale, dropout_p=0.0, rng=make_rng(0, 0),
                          buffers={"bias_table": table})
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, [*leaves, table], dout)
    t64 = table.detach().double().requires_grad_()
    l64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = reference_attention(*l64, kern.ir, buffers={"bias_table": t64})
    want = torch.autograd.grad(ref, [*l64, t64], dout.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4)
    assert float(want[-1][:, 0].abs().sum()) > 0  # distances below -R land on the clamped edge column


def test_registry_default_relative_bias() -> None:
    spec = presets.get_preset("relative_bias", head_dim=64, num_heads=8)
    t = spec.trace().buffer_values["bias_table"]
    assert t.shape == (8, 257) and t.dtype == torch.float32 and float(t[:, 128].abs().max()) == 0.0
    assert bool((t[:, :128] < 0).all()) and torch.equal(t[:, :128].flip(1), t[:, 129:])


@pytest.mark.parametrize("nq,nk", [(7, 19), (19, 7), (1, 30), (30, 1), (12, 12)])
def test_causal_is_bottom_right_aligned(nq: int, nk: int) -> None:
    ir = build_ir(presets.causal(16))
    q, k, v = _qkv(1, 2, 2, nq, nk)
    out, lse = reference_attention(q, k, v, ir, return_lse=True)
    i, j = torch.arange(nq).view(-1, 1), torch.arange(nk).view(1, -1)
    s = (q @ k.transpose(-1, -2) / 4.0).masked_fill(j > i + (nk - nq), -math.inf)
    want_lse = torch.logsumexp(s, -1)
    empty = torch.isinf(want_lse)
    assert int(empty[0, 0].sum()) == max(0, nq - nk)  # the first Nq - Nk rows see no key
    p = torch.exp(s - torch.where(empty, 0.0, want_lse).unsqueeze(-1))
    torch.testing.assert_close(out, p @ v)
    torch.testing.assert_close(lse, want_lse)
    for sched in ("v1", "v2"):
        res = simulate(ir, TileSchedule(sched, 4, 8), q, k, v)
        torch.testing.assert_close(res.out, out)


def test_gqa_reads_kv_head_h_div_group() -> None:
    ir = build_ir(presets.plain(16))
    q, k, v = _qkv(2, 6, 3, 9, 14)
    out, lse = reference_attention(q, k, v, ir, return_lse=True)
    rep, lse_rep = reference_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), ir, return_lse=True)
    torch.testing.assert_close(out, rep)
    assert lse.shape == (2, 6, 9)  # query heads


def test_empty_problems_and_lse_layout_on_the_reference() -> None:
    ir = build_ir(presets.plain(16))
    out, lse = reference_attention(*_qkv(2, 2, 1, 5, 0), ir, return_lse=True)
    assert bool((out == 0).all()) and bool((lse == -math.inf).all()) and lse.shape == (2, 2, 5)
    out, lse = reference_attention(*_qkv(2, 2, 1, 0, 5), ir, return_lse=True)
    assert out.shape == (2, 2, 0, 16) and lse.shape == (2, 2, 0)


def test_doc_head_dim_table_matches_the_planner() -> None:
    """docs/shapes.md's support table (v2 forward / v1 forward / backward per target) is what the
    planner says; when the planner changes, paste ``python3 -m attncompiler.plan.support`` into it."""
    text = DOC.read_text()
    header = next(ln for ln in text.splitlines() if ln.startswith("| D x DV |"))
    archs = [c.strip() for c in header.strip("|").split("|")][1:]
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.split("|")[1].strip()[:1].isdigit()
            and "x" in ln.split("|")[1]]
    assert len(rows) >= 8, "docs/shapes.md lacks the head-dim table"
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        d, dv = (int(x) for x in cells[0].split("x"))
        for arch, cell in zip(archs, cells[1:]):
            want = head_dim_support(arch, d, dv).cell
            assert cell == want, (f"{d}x{dv} on {arch}: docs/shapes.md says {cell}, the planner says {want}; "
                                  f"regenerate the table with `python3 -m attncompiler.plan.support`")


def test_support_reasons_explain_refusals() -> None:
    s = head_dim_support("sm_86", 192, 192)
    assert s.planned == (True, True, False)
    assert "backward" in s.reasons[0] and "sm_86" in s.reasons[0] and "smem" in s.reasons[0]
    s = head_dim_support("sm_90", 40, 40)
    assert s.planned == (False, True, False) and "multiple of 16" in s.reasons[0]


def test_doc_mentions_every_contract() -> None:
    text = DOC.read_text()
    for needle in ("(B, H, N, D)", ".transpose(1, 2)", "H % H_kv", "bottom-right", "q_idx + (Nk - Nq) >= kv_idx",
                   "(B, H, Nq)", "float32", "natural log", "Nq = 0", "Nk = 0", "-inf", "NaN", "65535",
                   "16-byte", "relative_bias", "clamp"):
        assert needle in text, f"docs/shapes.md does not mention {needle!r}"
