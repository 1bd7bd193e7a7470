"""CPU: packed sequences (varlen) -- the reference, the custom ops (CPU path, fake kernels), rendering
and an nvcc build of the varlen kernels.  GPU checks: tests/test_gpu_varlen.py; bad inputs:
tests/test_bad_inputs.py (varlen-* rows)."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import attncompiler as ac
from attncompiler import autograd
from attncompiler.runtime.launch import InputError
from attncompiler.codegen.schedule import get_schedule
from attncompiler.codegen.v2_bwd import make_bwd_plan, render_bwd
from attncompiler.ir.build import build_ir
from attncompiler.plan.targets import get_target
from attncompiler.reference import reference_attention
from attncompiler.runtime.compiler import compile_with_nvcc
from attncompiler.varlen import pack, reference_varlen, unpack

B, H, N, D = 3, 2, 37, 64


def _kpm_spec(dropout_p: float = 0.0) -> tuple[ac.AttentionSpec, torch.Tensor]:
    kpm = torch.rand(B, 64, generator=torch.Generator().manual_seed(3)) > 0.3
    spec = ac.AttentionSpec(D, causal=True, dropout_p=dropout_p, mask_mod=lambda b, h, q, k: kpm[b, k])
    return spec, kpm


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_reference_varlen_equals_batched_reference(dropout_p):
    """Equal lengths: the packed reference is the batched one (b-indexed buffers and dropout's counter too)."""
    spec, _ = _kpm_spec(dropout_p)
    kern = ac.compile(spec, "v2", target="sm_90", build=False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    ref, lse = reference_attention(q, k, v, kern.ir, buffers=kern._buffers, seed=5, return_lse=True)
    packed = [pack(list(t.transpose(1, 2))) for t in (q, k, v)]
    o2, l2 = reference_varlen(packed[0][0], packed[1][0], packed[2][0], packed[0][1], packed[1][1], kern.ir,
                              buffers=kern._buffers, seed=5)
    assert torch.allclose(o2, ref.transpose(1, 2).reshape(B * N, H, D), atol=1e-12, rtol=0)
    assert torch.equal(l2, lse.transpose(0, 1).reshape(H, B * N))


def test_pack_unpack_roundtrip():
    seqs = [torch.randn(n, 2, 8) for n in (0, 3, 1, 5)]
    packed, cu = pack(seqs)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 0, 3, 4, 9]
    assert all(torch.equal(a, b) for a, b in zip(unpack(packed, cu), seqs))


def _op_args(kern, q, k, v, cu_q, cu_k):
    bufs = [kern._buffers[b.name] for b in kern.ir.buffers]
    return (q, k, v, cu_q, cu_k, bufs, kern._op_id, -1, -1, kern.ir.scale, 0.0, autograd.make_rng(0, 0), False)


def test_cpu_ops_forward_backward_match_float64_autograd():
    spec, _ = _kpm_spec()
    kern = ac.compile(spec, "v2", target="sm_90", build=False)
    lens_q, lens_k = [0, 5, 1, 40], [3, 0, 20, 40]  # keys without queries; a query without keys
    g = torch.Generator().manual_seed(1)
    q = torch.randn(sum(lens_q), H, D, generator=g)
    k, v = (torch.randn(sum(lens_k), H, D, generator=g) for _ in range(2))
    cu_q = torch.tensor([0, *lens_q]).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0, *lens_k]).cumsum(0).to(torch.int32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = torch.ops.attncompiler.attention_varlen_fwd(*_op_args(kern, *leaves, cu_q, cu_k))
    assert o.shape == (sum(lens_q), H, D) and lse.shape == (H, sum(lens_q))
    assert torch.all(o[:5] == 0) and lse[:, :5].eq(float("-inf")).all()  # the queries of sequence 1 have no keys
    dout = torch.randn(o.shape, generator=g)
    dlse = torch.randn(lse.shape, generator=g)
    loss = (o * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse).sum()
    got = torch.autograd.grad(loss, leaves)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ro, rl = reference_varlen(*ref_leaves, cu_q, cu_k, kern.ir, buffers=kern._buffers)
    rloss = (ro * dout.double()).sum() + (torch.where(torch.isfinite(rl), rl, 0.0) * dlse.double()).sum()
    want = torch.autograd.grad(rloss, ref_leaves)
    assert torch.allclose(o.double(), ro, atol=1e-5)
    for a, b in zip(got, want):
        assert torch.allclose(a.double(), b, atol=1e-4), (a.double() - b).abs().max()
    assert torch.all(got[1][:3] == 0) and torch.all(got[2][:3] == 0)  # keys nobody queries


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_cpu_ops_learnable_buffer_gradients(dropout_p):
    """A learnable relative-bias table and a b-indexed key-padding mask (the mods read b; dropout's counter
    too): the ops' gradients of q, k, v and the table equal float64 autograd through the per-sequence
    reference (sequence b is batch entry b)."""
    from attncompiler.spec import presets

    g = torch.Generator().manual_seed(2)
    table = torch.randn(H, 2 * 8 + 1, generator=g)
    kpm = torch.rand(4, 64, generator=g) > 0.2
    bias = presets.relative_bias_score_mod(table)
    spec = ac.AttentionSpec(D, dropout_p=dropout_p, score_mod=bias, mask_mod=lambda b, h, q, k: kpm[b, k])
    kern = ac.compile(spec, "v2", target="sm_90", build=False)
    lens_q, lens_k = [7, 0, 30, 19], [9, 4, 30, 0]
    q = torch.randn(sum(lens_q), H, D, generator=g)
    k, v = (torch.randn(sum(lens_k), H, D, generator=g) for _ in range(2))
    cu_q = torch.tensor([0, *lens_q]).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0, *lens_k]).cumsum(0).to(torch.int32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, table)]
    bufs = dict(kern._buffers, bias_table=leaves[3])
    args = list(_op_args(kern, *leaves[:3], cu_q, cu_k))
    args[5] = [bufs[b.name] for b in kern.ir.buffers]
    args[10], args[11] = dropout_p, autograd.make_rng(11, 3)
    o, lse = torch.ops.attncompiler.attention_varlen_fwd(*args)
    dout = torch.randn(o.shape, generator=g)
    got = torch.autograd.grad((o * dout).sum(), leaves)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, table)]
    ro, _ = reference_varlen(*ref_leaves[:3], cu_q, cu_k, kern.ir, dropout_p=dropout_p, seed=11, offset=3,
                             buffers=dict(kern._buffers, bias_table=ref_leaves[3]))
    want = torch.autograd.grad((ro * dout.double()).sum(), ref_leaves)
    assert torch.allclose(o.double(), ro, atol=1e-5)
    for name, a, b in zip("q k v table".split(), got, want):
        assert a.shape == b.shape and torch.allclose(a.double(), b, atol=1e-4), (name, (a.double() - b).abs().max())
    assert want[3].abs().max() > 0.1  # the table's gradient is not trivially zero


def test_eager_function_and_custom_op_agree():
    """Eager calls take varlen._EagerVarlen (less host time), torch.compile and tensor subclasses the custom op: both
    run the same implementations, so outputs and gradients (a learnable buffer's included) are bitwise equal."""
    from attncompiler import varlen
    from attncompiler.spec import presets

    g = torch.Generator().manual_seed(4)
    table = torch.randn(H, 2 * 8 + 1, generator=g)
    spec = ac.AttentionSpec(D, causal=True, dropout_p=0.1, score_mod=presets.relative_bias_score_mod(table))
    kern = ac.compile(spec, "v2", target="sm_90", build=False)
    kid = autograd.register_kernel(kern)
    lens_q, lens_k = [6, 0, 21], [9, 3, 21]
    base = [torch.randn(sum(lens_q), H, D, generator=g).bfloat16()]
    base += [torch.randn(sum(lens_k), H, D, generator=g).bfloat16() for _ in range(2)] + [table.clone()]
    cu_q, cu_k = (torch.tensor([0, *n]).cumsum(0).to(torch.int32) for n in (lens_q, lens_k))
    dout = torch.randn(sum(lens_q), H, D, generator=g).bfloat16()
    results = []
    for path in ("eager", "op"):
        q, k, v, tb = (t.clone().requires_grad_() for t in base)
        args = (kid, -1, -1, kern.ir.scale, 0.1, autograd.make_rng(7, 2), False)
        if path == "eager":
            out, lse = varlen._EagerVarlen.apply(q, k, v, cu_q, cu_k, *args, tb)
            assert "_EagerVarlen" in type(out.grad_fn).__name__
        else:
            out, lse = torch.ops.attncompiler.attention_varlen_fwd(q, k, v, cu_q, cu_k, [tb], *args)
        finite = torch.where(torch.isfinite(lse), lse, 0.0)
        torch.autograd.backward([out, finite], [dout, torch.full_like(lse, 0.5)])
        results.append((out, lse, q.grad, k.grad, v.grad, tb.grad))
    for a, b in zip(*results):
        assert a is not None and torch.equal(a, b)
    assert results[0][5].abs().max() > 0  # the table's gradient came through the eager backward


def test_ops_schema_and_fake_kernels():
    kern = ac.compile(ac.AttentionSpec(D, causal=True), "v2", target="sm_90", build=False)
    q, k, v = (torch.randn(12, 2, D).to(torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    args = _op_args(kern, q, k, v, cu, cu)
    torch.library.opcheck(torch.ops.attncompiler.attention_varlen_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    o, lse = torch.ops.attncompiler.attention_varlen_fwd(*args)
    bargs = (o, q, k, v, o, lse, None, cu, cu, [], kern._op_id, -1, -1, kern.ir.scale, 0.0,
             autograd.make_rng(0, 0), False)
    torch.library.opcheck(torch.ops.attncompiler.attention_varlen_bwd.default, bargs,
                          test_utils=("test_schema", "test_faketensor"))
    table = torch.randn(2, 9)
    bias = ac.compile(ac.AttentionSpec(D, score_mod=presets_bias(table)), "v2", target="sm_90", build=False)
    o2, lse2 = torch.ops.attncompiler.attention_varlen_fwd(*_op_args(bias, q, k, v, cu, cu))
    gargs = (o2, q, k, v, o2, lse2, None, cu, cu, [table], [True], bias._op_id, bias.ir.scale, 0.0,
             autograd.make_rng(0, 0))
    torch.library.opcheck(torch.ops.attncompiler.attention_varlen_bwd_buffers.default, gargs,
                          test_utils=("test_schema", "test_faketensor"))


def presets_bias(table):
    from attncompiler.spec import presets

    return presets.relative_bias_score_mod(table)


def _sources(spec, arch: str):
    tgt = get_target(arch.rstrip("a"))
    ir = build_ir(spec)
    sched = get_schedule("v2")
    plan = sched.make_plan(ir, tgt)
    out = {"fwd": sched.render(ir, plan, tgt, varlen=True).source}
    for det in (False, True):
        out[f"bwd det={det}"] = render_bwd(ir, make_bwd_plan(ir, tgt, deterministic=det), tgt, varlen=True).source
    return out, sched.render(ir, plan, tgt).source


def test_render_varlen_only_when_asked():
    srcs, plain = _sources(ac.AttentionSpec(D, causal=True), "sm_90")
    assert "varlen_fwd_enter" in srcs["fwd"] and "varlen" not in plain.split("struct AttnParams")[0]
    assert "varlen_fwd_enter" not in plain and "attncompiler/varlen.cuh" not in plain
    for name in ("bwd det=False", "bwd det=True"):
        assert "varlen_bwd_kv_enter" in srcs[name] and "varlen_bwd_pre_enter" in srcs[name]
    assert "varlen_bwd_dq_enter" in srcs["bwd det=True"]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_nvcc_compiles_varlen_kernels(head_dim):
    kpm = torch.ones(4, 64, dtype=torch.bool)
    specs = [ac.AttentionSpec(head_dim, causal=True, name="causal"),
             ac.AttentionSpec(head_dim, dropout_p=0.1, mask_mod=lambda b, h, q, k: kpm[b, k], name="kpm_dropout")]
    jobs = {f"{s.name} {n}": src for s in specs for n, src in _sources(s, "sm_90a")[0].items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        reports = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reports.items():
        print(f"varlen d={head_dim} {name:28s}: {rep.registers:3d} regs, spill {rep.spill_stores}/{rep.spill_loads} B")
        assert rep.registers > 0


def test_graph_safe_rule() -> None:
    """The untagged packed ops take calls with both max_seqlen and no host dropout pair."""
    from attncompiler.varlen import graph_safe

    assert graph_safe(300, 300, None)
    assert not graph_safe(-1, 300, None) and not graph_safe(300, -1, None)
    assert not graph_safe(300, 300, torch.tensor([1, 2]))  # a CPU pair is read on the host


def test_captured_checks_from_shapes_alone() -> None:
    """Under capture cu_seqlens are not read: max_seqlen is required, and what the shapes say is still checked."""
    from attncompiler.runtime.varlen import _check_captured

    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    assert _check_captured(cu, cu, 7, 9, 12, 12) == (2, 7, 9)
    with pytest.raises(InputError, match="max_seqlen_q: expected an int under CUDA graph capture"):
        _check_captured(cu, cu, None, 9, 12, 12)
    with pytest.raises(InputError, match="max_seqlen_k: expected a non-negative int or None, got -3"):
        _check_captured(cu, cu, 7, -3, 12, 12)
    with pytest.raises(InputError, match="expected the same length B\\+1, got 3 and 2"):
        _check_captured(cu, cu[:2], 7, 9, 12, 12)
    with pytest.raises(InputError, match="expected dtype torch.int32, got torch.int64"):
        _check_captured(cu.long(), cu, 7, 9, 12, 12)
    with pytest.raises(InputError, match="expected B\\+1 >= 2 offsets for 12 query and 12 key rows, got one"):
        _check_captured(cu[:1], cu[:1], 7, 9, 12, 12)


def test_sequence_of_rows_matches_the_offsets_and_stays_in_range() -> None:
    from attncompiler.runtime.varlen import _sequence_of_rows

    lens = [0, 3, 0, 5, 1]
    cu = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    want = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    assert torch.equal(_sequence_of_rows(cu, sum(lens)), want)
    garbage = torch.tensor([7, 100, -90, 2**31 - 1, -2**31], dtype=torch.int32)  # what a graph replay may hold
    seq = _sequence_of_rows(garbage, 50)
    assert seq.shape == (50,) and int(seq.min()) >= 0 and int(seq.max()) <= 3


def test_launch_fields_of_a_packed_call() -> None:
    """A packed launch passes the packed row totals (the kernels clamp each sequence's view into them) and the error
    word's address only when the host did not check cu_seqlens (a captured call)."""
    from attncompiler.runtime.launch import AttnInputs, pack_params
    from attncompiler.runtime.params import PARAM_FIELDS, c_struct
    from attncompiler.runtime.varlen import VarlenInputs, _as4, _set_cu

    text = c_struct("AttnParams", PARAM_FIELDS)
    for field in ("int total_q;", "int total_k;", "int* varlen_errors;"):
        assert field in text
    q = torch.randn(12, 2, 64).to(torch.bfloat16)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    P, _ = pack_params(*(_as4(q),) * 4, None, None, AttnInputs(2, 2, 2, 7, 7, 64, 64), scale=1.0, dropout_p=0.0,
                       seed=0, offset=0, ir=build_ir(ac.AttentionSpec(64)), buffers=[])
    for errors, want in ((0, None), (0x1000, 0x1000)):
        vi = VarlenInputs(2, 2, 2, 12, 9, 7, 7, 64, 64, None if errors else (0, 5, 12), None if errors else (0, 4, 9),
                          errors)
        _set_cu(P, cu, cu, vi)
        assert (P.total_q, P.total_k, P.varlen_errors) == (12, 9, want)
        assert P.cu_seqlens_q == cu.data_ptr() and P.q_sb == 0
