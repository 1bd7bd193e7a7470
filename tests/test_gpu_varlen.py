"""GPU: packed sequences (cu_seqlens), forward and backward, against the float64 reference.

Sequence lengths include empty sequences, a sequence with queries but no keys, one with keys but
no queries, 1, 113 and 1023 (multiples of no block size).  Run with ``python3 -m pytest -m gpu``.
"""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.runtime.launch import InputError
from attncompiler.spec import presets
from attncompiler.testing_varlen import check_varlen_grads, check_varlen_kernel, make_varlen_inputs

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# The forward schedules of packed batches: v2, and v3 (TMA maps over the packed rows) on an sm_90 GPU. The backward
# is the automatic choice either way: on an sm_90 GPU at head dims 48-128 the v3 backward, else v2's.
SCHEDULES = ["v2", pytest.param("v3", marks=pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU"))]


def _compile(spec: ac.AttentionSpec, schedule: str):
    kern = ac.compile(spec, schedule)
    assert kern.schedule == schedule
    return kern


def _ran_v3_varlen() -> bool:
    from attncompiler.runtime import varlen as rv

    return any(key[0] == "v3" for key in rv._sources)

SEQ_Q = (0, 1, 113, 1023, 7, 256)
SEQ_K = (5, 0, 200, 1023, 64, 300)  # cross attention: b=0 keys without queries, b=1 a query without keys
NB = len(SEQ_Q)
MAXLEN = 1023


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _spec(name: str, head_dim: int, dtype: str) -> ac.AttentionSpec:
    g = _gen(7)
    if name in ("plain", "causal"):
        return presets.get_preset(name, head_dim=head_dim, dtype=dtype)
    if name == "sliding_window":
        return presets.sliding_window(64, head_dim, dtype=dtype)
    if name == "prefix_lm":
        return presets.prefix_lm(37, head_dim, dtype=dtype)
    if name == "prefix_per_seq":  # each sequence its own prefix length, from a buffer indexed by b
        prefix = torch.randint(0, 300, (NB,), generator=g)
        return ac.AttentionSpec(head_dim, dtype=dtype, name="prefix_per_seq",
                                mask_mod=lambda b, h, q, k: (k < prefix[b]) | (q >= k))
    if name == "document":  # documents inside each packed sequence (ids per (sequence, position))
        docs = torch.cumsum((torch.rand(NB, MAXLEN, generator=g) < 0.01).long(), dim=1)
        return ac.AttentionSpec(head_dim, dtype=dtype, name="document_varlen",
                                mask_mod=lambda b, h, q, k: (docs[b, q] == docs[b, k]) & (q >= k))
    if name == "key_padding":  # a key-padding mask per sequence; sequence 5 has every key padded
        kpm = torch.rand(NB, MAXLEN, generator=g) < 0.8
        kpm[5] = False
        return ac.AttentionSpec(head_dim, dtype=dtype, name="key_padding", mask_mod=lambda b, h, q, k: kpm[b, k])
    if name == "alibi_causal":
        return presets.alibi(presets.alibi_slopes(4), head_dim, dtype=dtype, causal=True)
    if name == "softcap":
        return presets.softcap(20.0, head_dim, dtype=dtype)
    if name == "dropout":
        return ac.AttentionSpec(head_dim, dtype=dtype, dropout_p=0.2, causal=True, name="dropout")
    raise KeyError(name)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ["plain", "causal"])
def test_varlen_forward_backward(name, head_dim, dtype, schedule):
    kern = _compile(_spec(name, head_dim, dtype), schedule)
    for sq, sk in ((SEQ_Q, SEQ_Q), (SEQ_Q, SEQ_K)):
        res = check_varlen_kernel(kern, sq, sk, H=4)
        assert res.ok, f"forward {name} d={head_dim} {dtype}: {res}"
        res = check_varlen_grads(kern, sq, sk, H=4)
        assert res.ok, f"backward {name} d={head_dim} {dtype}: {res}"


@pytest.mark.parametrize("name", ["sliding_window", "prefix_lm", "prefix_per_seq", "document", "key_padding",
                                  "alibi_causal", "softcap", "dropout"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_varlen_variants(name, schedule):
    for head_dim, dtype in ((128, "bf16"), (64, "fp16")):
        kern = _compile(_spec(name, head_dim, dtype), schedule)
        res = check_varlen_kernel(kern, SEQ_Q, SEQ_K, H=4)
        assert res.ok, f"forward {name} d={head_dim} {dtype}: {res}"
        res = check_varlen_grads(kern, SEQ_Q, SEQ_K, H=4, use_lse=name == "key_padding")
        assert res.ok, f"backward {name} d={head_dim} {dtype}: {res}"


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_learnable_relative_bias(causal):
    """A learnable relative-bias table (|kv - q| beyond R = 16 share the edge columns), GQA: dq, dk, dv and
    d(table) against float64 autograd of the per-sequence reference, by the error-ratio rule."""
    table = 0.5 * torch.randn(4, 2 * 16 + 1, generator=_gen(5))
    kern = ac.compile(presets.relative_bias(table, 64, causal=causal), "v2")
    res = check_varlen_grads(kern, SEQ_Q, SEQ_K, H=4, H_kv=2, buffer_grads=("bias_table",))
    assert res.ok, str(res)


def test_varlen_captured_learnable_table_gets_grad():
    """A captured table with requires_grad gets .grad from a packed call's backward (as an nn.Parameter
    would), equal to the sum over sequences of the padded calls' table gradients."""
    table = (0.5 * torch.randn(4, 2 * 16 + 1, generator=_gen(6))).requires_grad_()
    kern = ac.compile(presets.relative_bias(table, 64, causal=True), "v2")
    q, k, v, cu_q, cu_k = make_varlen_inputs(kern, (113, 0, 300), (113, 7, 300), 4)
    dout = torch.randn(q.shape[0], 4, 64, device="cuda").to(q.dtype)
    kern(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).backward(dout)
    packed = table.grad.clone()
    table.grad = None
    for lo_q, hi_q, lo_k, hi_k in ((0, 113, 0, 113), (113, 413, 120, 420)):
        one = lambda t, lo, hi: t[lo:hi].transpose(0, 1).unsqueeze(0)  # noqa: E731
        kern(one(q, lo_q, hi_q), one(k, lo_k, hi_k), one(v, lo_k, hi_k)).backward(one(dout, lo_q, hi_q))
    assert packed.abs().max() > 0 and torch.allclose(packed, table.grad, rtol=1e-4, atol=1e-4), \
        (packed - table.grad).abs().max()


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_gqa(deterministic, schedule):
    kern = _compile(_spec("causal", 128, "bf16"), schedule)
    res = check_varlen_kernel(kern, SEQ_Q, SEQ_K, H=6, H_kv=2)
    assert res.ok, f"forward GQA: {res}"
    res = check_varlen_grads(kern, SEQ_Q, SEQ_K, H=6, H_kv=2, deterministic=deterministic, use_lse=True)
    assert res.ok, f"backward GQA deterministic={deterministic}: {res}"


def test_varlen_deterministic_is_bitwise_repeatable():
    kern = ac.compile(_spec("sliding_window", 64, "bf16"), "v2")
    q, k, v, cu_q, cu_k = make_varlen_inputs(kern, SEQ_Q, SEQ_Q, 4, generator=None)
    dout = torch.randn(q.shape[0], 4, 64, device="cuda").to(q.dtype)
    grads = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = kern(*leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, deterministic=True)
        grads.append(torch.autograd.grad((o.float() * dout.float()).sum(), leaves))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_varlen_equals_padded_batch_bitwise(schedule):
    """Equal lengths: the packed kernel computes exactly what the padded kernel does."""
    kern = _compile(_spec("causal", 128, "bf16"), schedule)
    B, H, N = 3, 4, 333
    q, k, v, cu_q, cu_k = make_varlen_inputs(kern, (N,) * B, (N,) * B, H)
    o_pack, lse_pack = kern(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
    as4 = lambda t: t.view(B, N, t.shape[1], t.shape[2]).transpose(1, 2)  # noqa: E731
    o_pad, lse_pad = kern(as4(q), as4(k), as4(v), return_lse=True)
    assert torch.equal(o_pack, o_pad.transpose(1, 2).reshape(B * N, H, -1))
    assert torch.equal(lse_pack, lse_pad.permute(1, 0, 2).reshape(H, B * N))


def test_varlen_functional_api_and_max_seqlen():
    q, k, v, cu_q, cu_k = make_varlen_inputs(ac.compile(_spec("causal", 64, "fp16"), "v2"), SEQ_Q, SEQ_K, 2)
    a = ac.attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    b = ac.attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=2000,
                     max_seqlen_k=1500)
    assert a.shape == (sum(SEQ_Q), 2, 64) and torch.equal(a, b)
    kern = ac.compile(_spec("causal", 64, "fp16"), "v2")
    res = check_varlen_kernel(kern, SEQ_Q, SEQ_K, H=2, max_seqlen=(1024, 4096))
    assert res.ok, str(res)


def test_varlen_bad_inputs_on_gpu():
    kern = ac.compile(_spec("plain", 64, "bf16"), "v2")
    q, k, v, cu_q, cu_k = make_varlen_inputs(kern, (5, 9), (5, 9), 2)
    with pytest.raises(InputError, match="cu_seqlens_q: expected an int32 tensor on cuda"):
        kern(q, k, v, cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k)
    bad = torch.tensor([0, 9, 5], dtype=torch.int32, device="cuda")  # not monotone (and the wrong total)
    with pytest.raises(InputError, match="non-decreasing"):
        kern(q, k, v, cu_seqlens_q=bad, cu_seqlens_k=cu_k)
    with pytest.raises(InputError, match="last offset"):
        kern(q, k, v, cu_seqlens_q=torch.tensor([0, 5, 13], dtype=torch.int32, device="cuda"), cu_seqlens_k=cu_k)
    with pytest.raises(InputError, match="at least the longest sequence"):
        kern(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=8)
    torch.cuda.synchronize()  # nothing above reached the GPU as a bad launch


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("head_dim", [32, 96, 256])
def test_varlen_other_head_dims(head_dim, schedule):
    """Other backward plans (d=256: on Hopper the v3 backward with dK / dV split by columns over its warpgroups,
    elsewhere the v2 backward's two dK / dV launches)."""
    kern = _compile(_spec("causal", head_dim, "bf16"), schedule)
    res = check_varlen_kernel(kern, SEQ_Q, SEQ_K, H=2)
    assert res.ok, f"forward d={head_dim}: {res}"
    for det in (False, True):
        res = check_varlen_grads(kern, SEQ_Q, SEQ_K, H=2, deterministic=det)
        assert res.ok, f"backward d={head_dim} deterministic={det}: {res}"


def test_varlen_with_a_v1_kernel_runs_the_v2_schedule():
    kern = ac.compile(_spec("sliding_window", 64, "bf16"), "v1")
    res = check_varlen_kernel(kern, SEQ_Q, SEQ_K, H=2)
    assert res.ok, str(res)


def test_varlen_torch_compile_fullgraph():
    kern = ac.compile(_spec("causal", 64, "bf16"), "v2")
    q, k, v, cu_q, cu_k = make_varlen_inputs(kern, SEQ_Q, SEQ_K, 2)

    def f(q_, k_, v_):
        o, lse = kern(q_, k_, v_, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(SEQ_Q),
                      max_seqlen_k=max(SEQ_K), return_lse=True)
        return o.float().square().sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()

    grads = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        grads.append(torch.autograd.grad(fn(*leaves), leaves))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")
def test_varlen_v3_runs_the_v3_kernel_and_masks_the_next_sequence():
    """An "auto" kernel on Hopper is v3 and its packed batches run the v3 varlen kernel: the TMA boxes of a sequence's
    last K/V block read the next sequence's rows, which must get P = 0 (huge keys there would dominate any row
    that saw them); a persistent or score-skip plan drops those options for the packed kernel."""
    from attncompiler.runtime import varlen as rv

    rv._sources.clear()
    kern = ac.compile(_spec("plain", 128, "bf16"))
    assert kern.schedule == "v3"
    seq = (100, 37, 300)
    q, k, v, cu_q, cu_k = make_varlen_inputs(kern, seq, seq, 2)
    k[100:137] *= 50.0  # sequence 1's keys: scores ~50x larger than anything sequence 0 sees
    v[100:137] = 1e4
    out = kern(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert _ran_v3_varlen()
    ref = torch.cat([kern(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None])
                     [0].transpose(0, 1) for a, b in ((0, 100), (100, 137), (137, 437))])
    assert torch.equal(out, ref)  # each sequence alone through the padded v3 kernel: bitwise the same
    for opts in ({"persistent": True}, {"score_skip": True}):
        spec = presets.alibi(presets.alibi_slopes(2), 128) if "score_skip" in opts else _spec("causal", 128, "bf16")
        kern = ac.compile(spec, "v3", **opts)
        res = check_varlen_kernel(kern, SEQ_Q, SEQ_K, H=2)
        assert res.ok, f"{opts}: {res}"


@pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")
@pytest.mark.parametrize("name", ["causal", "sliding_window", "document"])
def test_varlen_v3_one_consumer_two_ctas(name):
    """The v3 plan option block_m = 64 (one consumer warpgroup, two CTAs per SM) on packed sequences."""
    kern = ac.compile(_spec(name, 128, "bf16"), "v3", block_m=64)
    assert kern.kernel_source.plan.ctas_per_sm == 2
    res = check_varlen_kernel(kern, SEQ_Q, SEQ_K, H=4)
    assert res.ok, f"forward {name} block_m=64: {res}"
    assert _ran_v3_varlen()


def _ran_v3_backward_varlen() -> bool:
    from attncompiler.codegen.v3_bwd import V3BwdKernelSource
    from attncompiler.runtime import backward as rb

    return any(key[-1] and isinstance(src, V3BwdKernelSource) for key, src in rb._sources.items())


@pytest.mark.skipif(not _hopper(), reason="the v3 backward needs an sm_90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen_v3_backward_ignores_the_next_sequence(head_dim):
    """On Hopper a packed batch's .backward() runs the v3 backward (TMA maps over the packed rows). A sequence's
    last query and key blocks then read the next sequence's rows; huge keys, values and dO there must change
    nothing: dK and dV of each sequence equal (bitwise) those of the sequence run alone through the padded v3
    backward, and dQ (fp32 reds in another order) agrees to rounding."""
    from attncompiler.runtime import backward as rb

    rb._sources.clear()
    kern = ac.compile(_spec("causal", head_dim, "bf16"))
    seq_q, seq_k = (100, 37, 300, 0, 65), (130, 37, 250, 9, 64)
    q, k, v, cu_q, cu_k = make_varlen_inputs(kern, seq_q, seq_k, 2)
    dout = torch.randn(q.shape[0], 2, head_dim, device="cuda").to(q.dtype)
    k[130:167] *= 50.0  # sequence 1: scores ~50x larger than anything sequence 0 sees
    v[130:167] = 1e4
    dout[100:137] = 1e3

    def grads(qq, kk, vv, do, **kw):
        leaves = [t.detach().clone().requires_grad_() for t in (qq, kk, vv)]
        o = kern(*leaves, **kw)
        return torch.autograd.grad((o.float() * do.float()).sum(), leaves)

    dq, dk, dv = grads(q, k, v, dout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert _ran_v3_backward_varlen()
    as4 = lambda t: t.transpose(0, 1)[None]  # noqa: E731
    for b in range(len(seq_q)):
        (qa, qb), (ka, kb) = (cu_q[b].item(), cu_q[b + 1].item()), (cu_k[b].item(), cu_k[b + 1].item())
        if qa == qb:
            assert torch.equal(dk[ka:kb], torch.zeros_like(dk[ka:kb])) and torch.equal(dv[ka:kb], 0 * dv[ka:kb])
            continue
        rq, rk, rv = grads(as4(q[qa:qb]), as4(k[ka:kb]), as4(v[ka:kb]), as4(dout[qa:qb]))
        assert torch.equal(dk[ka:kb], rk[0].transpose(0, 1)), f"dk of sequence {b}"
        assert torch.equal(dv[ka:kb], rv[0].transpose(0, 1)), f"dv of sequence {b}"
        ref = rq[0].transpose(0, 1).float()
        err = (dq[qa:qb].float() - ref).abs().max().item()
        assert err <= 1e-2 * max(1.0, ref.abs().max().item()), f"dq of sequence {b}: {err}"


@pytest.mark.skipif(not _hopper(), reason="the v3 backward needs an sm_90 GPU")
@pytest.mark.parametrize("opts", [{"schedule": "v2"}, {"consumers": 1}, {"dq_split_n": False, "stages": 3},
                                  {"dq_red": 0, "dq_defer": False}, {"dq_red": 1}, {"dq_red": 2, "consumers": 1}],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_varlen_backward_options_on_hopper(opts):
    """The v2 backward (no longer the automatic choice on Hopper) and other v3 backward plans on packed batches."""
    for name, head_dim in (("document", 128), ("causal", 64)):
        kern = ac.compile(_spec(name, head_dim, "bf16"))
        kern.backward_options = dict(opts)
        res = check_varlen_grads(kern, SEQ_Q, SEQ_K, H=4, H_kv=2, use_lse=True)
        assert res.ok, f"backward {name} d={head_dim} {opts}: {res}"


_EDGE_LENS = (0, 1, 63, 64, 65, 127, 128, 129, 191, 257)


@pytest.mark.parametrize("seed", range(10))
def test_varlen_random_batches_forward_backward(seed):
    """Random packed batches (lengths at and around the 64 / 128-row blocks, empty sequences, cross lengths), a random
    variant, head dim, dtype and GQA grouping: forward and the automatic backward (v3 on Hopper at d = 48-128)
    against the float64 reference by the error-ratio rule."""
    g = _gen(1000 + seed)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    nb = int(torch.randint(1, 6, (1,), generator=g))
    lens = lambda: tuple(pick(_EDGE_LENS) if torch.rand(1, generator=g) < 0.7  # noqa: E731
                         else int(torch.randint(1, 700, (1,), generator=g)) for _ in range(nb))
    sq = lens()
    sk = sq if torch.rand(1, generator=g) < 0.5 else lens()
    if sum(sk) == 0 or sum(sq) == 0:
        sk, sq = sk[:-1] + (129,), sq[:-1] + (65,)
    head_dim, dtype = pick([(64, "bf16"), (128, "bf16"), (128, "fp16"), (64, "fp16")])
    name = pick(["plain", "causal", "sliding_window", "alibi_causal", "softcap", "dropout", "prefix_lm"])
    H, H_kv = pick([(2, 1), (4, 2), (3, 3), (2, 2)])
    kern = ac.compile(_spec(name, head_dim, dtype))
    what = f"{name} d={head_dim} {dtype} H={H}/{H_kv} seqlens_q={sq} seqlens_k={sk}"
    res = check_varlen_kernel(kern, sq, sk, H=H, H_kv=H_kv, seed=seed)
    assert res.ok, f"forward {what}: {res}"
    res = check_varlen_grads(kern, sq, sk, H=H, H_kv=H_kv, seed=seed, use_lse=bool(seed % 2))
    assert res.ok, f"backward {what}: {res}"
