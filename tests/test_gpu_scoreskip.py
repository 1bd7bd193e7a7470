"""GPU (sm_90 only): the v3 score skip (plan option ``score_skip``; ``v3_skip_begin`` in
templates/include/attncompiler/v3_fwd.cuh, the per-call bound in attncompiler/runtime/scoreskip.py).

The skipped K/V blocks are those whose every P is exactly 0, so a kernel with the skip must give O and
LSE bit-identical to the same plan without it. The tests use ALiBi slopes from steep (1.0: a row's
weight halves every ~0.7 keys) to flat (2^-8: nothing to skip), check that the steep heads really visit
fewer blocks (the traced build counts them), that both kernels pass the float64 reference, and that
a NaN or inf in q or k turns the skip off for its head.

Run on an H100 / H200 with ``python3 -m pytest -m gpu tests/test_gpu_scoreskip.py``.
"""
from __future__ import annotations

import math

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel

pytestmark = pytest.mark.gpu

SLOPES = (1.0, 0.25, 2.0**-5, 2.0**-8)  # H = 4: the first heads skip most blocks, the last none


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")


def _spec(kind: str, d: int, dtype: str) -> ac.AttentionSpec:
    slopes = torch.tensor(SLOPES)
    if kind == "alibi":
        return presets.alibi(slopes, d, dtype=dtype)
    if kind == "alibi_causal":
        return presets.alibi(slopes, d, dtype=dtype, causal=True)
    if kind == "alibi_window":
        return presets.alibi(slopes, d, dtype=dtype, mask_mod=presets.sliding_window_mask(1024))
    if kind == "alibi_document":
        doc = torch.repeat_interleave(torch.arange(3), torch.tensor([1500, 1100, 1500]))
        return presets.alibi(slopes, d, dtype=dtype, mask_mod=presets.document_mask(doc))
    raise ValueError(kind)


# (schedule, spec kind, head dim, dtype, Nq, Nk, H_kv, plan options)
CASES = [
    ("v3", "alibi", 64, "bf16", 4096, 4096, 4, {}),                      # BLOCK_M 192: three consumers
    ("v3", "alibi", 128, "bf16", 4113, 4113, 4, {}),
    ("v3", "alibi", 128, "fp16", 1500, 4100, 2, {}),                     # GQA, Nq < Nk
    ("v3", "alibi", 256, "bf16", 4100, 4100, 4, {}),
    ("v3", "alibi", 128, "bf16", 4096, 4096, 4, {"persistent": True}),
    ("v3", "alibi_causal", 128, "bf16", 4096, 4096, 4, {}),
    ("v3", "alibi_causal", 64, "fp16", 4500, 4500, 4, {}),
    ("v3", "alibi_window", 128, "bf16", 4096, 4096, 4, {}),
    ("v3", "alibi_document", 128, "bf16", 4100, 4100, 4, {}),
    ("v2", "alibi", 128, "bf16", 4113, 4113, 4, {}),
    ("v2", "alibi", 96, "fp16", 1500, 4100, 2, {}),
    ("v2", "alibi_causal", 64, "bf16", 4500, 4500, 4, {}),
    ("v2", "alibi_document", 128, "bf16", 4100, 4100, 4, {}),
]


def _inputs(B: int, H: int, H_kv: int, Nq: int, Nk: int, d: int, dt: torch.dtype, kind: str, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, Nq, d, device="cuda", generator=g).to(dt)
    k = torch.randn(B, H_kv, Nk, d, device="cuda", generator=g).to(dt)
    v = torch.randn(B, H_kv, Nk, d, device="cuda", generator=g).to(dt)
    if kind == "aligned":  # every q . k at the bound: |q . k| = max |q| max |k| for every pair
        row = torch.randn(d, device="cuda", generator=g)
        row = row / row.norm() * 3.0
        q[:] = row.to(dt)
        k[:] = row.to(dt)
    return q, k, v


def _run(kern, q, k, v):
    out = torch.full((q.shape[0], q.shape[1], q.shape[2], kern.ir.head_dim_v), float("nan"), device="cuda",
                     dtype=q.dtype)
    _, lse = kern(q, k, v, out=out, return_lse=True)
    return out, lse


def _visited_blocks(kern, q, k, v) -> torch.Tensor:
    """(B*H, query blocks): K/V blocks consumer 0 visited per tile, from the AC_V3_TRACE build
    (attncompiler/bench/v3trace.py); non-persistent plans only."""
    from attncompiler.bench.v3trace import SLOT_BLOCKS, TRACE_TILES, run_traced

    assert not kern.plan.persistent
    q_blocks = -(-q.shape[2] // kern.plan.block_m)
    tiles = q.shape[0] * q.shape[1] * q_blocks
    assert tiles <= TRACE_TILES
    rows = run_traced(kern, q, k, v)[:tiles]
    return torch.tensor(rows[:, SLOT_BLOCKS].astype("int64")).reshape(q.shape[0] * q.shape[1], q_blocks)


@needs_hopper
@pytest.mark.parametrize("sched, kind, d, dtype, Nq, Nk, H_kv, opts", CASES)
def test_skip_is_bit_identical(sched, kind, d, dtype, Nq, Nk, H_kv, opts):
    """v3 visits the skipped blocks' lower neighbours first (descending walk): their P would be exactly 0.
    v2 walks up: the skipped blocks would come first and be scaled down by 2^-136 or more later, below
    the fp32 rounding of every sum they would join (l >= 1), so the outputs are the same bits there too."""
    spec = _spec(kind, d, dtype)
    on = ac.compile(spec, sched, **opts)
    off = ac.compile(spec, sched, **{**on.plan.options, "score_skip": False})
    assert on.plan.score_skip and not off.plan.score_skip
    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    for inputs in ("random", "aligned"):
        q, k, v = _inputs(1, 4, H_kv, Nq, Nk, d, dt, inputs)
        o1, l1 = _run(on, q, k, v)
        o0, l0 = _run(off, q, k, v)
        assert not torch.isnan(o1).any() and not torch.isnan(l1).any(), f"{kind} {inputs}: NaN in the output"
        diff = (o1.float() - o0.float()).abs().max()
        assert torch.equal(o1, o0) and torch.equal(l1, l0), f"{sched} {kind} d={d} {dtype} {inputs}: max |dO| = {diff}"
    # The steep heads' LSE reaches ~slope * Nk (thousands), where fp32's spacing alone is ~2e-4 and the ALiBi
    # column terms are rounded at ~1.44 * slope * Nk: d = 256 measured 5.8e-3 here (H100, 2026-11-22), ~12 ulps,
    # over check_kernel's 2e-3 + 4 ulps, so this bound keeps 2e-6 relative to the largest bias.
    res = check_kernel(on, 1, 4, Nq, Nk, H_kv=H_kv, lse_tol=2e-3 + 2e-6 * max(SLOPES) * max(Nq, Nk))
    assert res.ok, f"{sched} {kind} d={d} {dtype} with the skip: {res}"


@needs_hopper
@pytest.mark.parametrize("kind, d", [("alibi", 128), ("alibi", 64), ("alibi_causal", 128), ("alibi_window", 128)])
def test_steep_heads_visit_fewer_blocks(kind, d):
    spec = _spec(kind, d, "bf16")
    on = ac.compile(spec, "v3", persistent=False)  # the block trace counts one CTA per tile
    off = ac.compile(spec, "v3", **{**on.plan.options, "score_skip": False})
    N = 4096
    q, k, v = _inputs(1, 4, 4, N, N, d, torch.bfloat16, "random")
    with_skip, without = _visited_blocks(on, q, k, v), _visited_blocks(off, q, k, v)
    bn = on.plan.block_n
    # head 0 (slope 1): a row's weights fall by 2^-136 within ~(2 |coef| S + 144) / 1.44 keys (S = |q . k|
    # bound ~ d + 7 sqrt(d)): a few blocks past the diagonal's or the last block's
    s_bound = (math.sqrt(d) + 4.0) ** 2
    reach = (2 * s_bound * math.log2(math.e) / math.sqrt(d) + 144) / math.log2(math.e)
    limit = math.ceil(reach / bn) + math.ceil(on.plan.block_m / bn) + 2
    assert int(with_skip[0].max()) <= limit < int(without[0].max()), (with_skip[0], without[0])
    assert torch.equal(with_skip[3], without[3])  # slope 2^-8: nothing underflows within 4096 keys
    assert bool((with_skip <= without).all())
    assert int(without[0].max()) >= min(N, 1024 + on.plan.block_m) // bn  # the reference walk is the full one


@needs_hopper
@pytest.mark.parametrize("d", [128, 80])
def test_v2_skips_the_far_blocks(d):
    """v2 has no traced build: a NaN in a far key's v row shows the skip (see test_non_finite_inputs)."""
    spec = _spec("alibi", d, "bf16")
    on = ac.compile(spec, "v2")
    off = ac.compile(spec, "v2", **{**on.plan.options, "score_skip": False})
    assert on.plan.score_skip and "score skip: on" in on.plan.describe()
    N = 4096
    q, k, v = _inputs(1, 4, 4, N, N, d, torch.bfloat16, "random")
    v[0, 0, 3, 1] = float("nan")  # slope 1: far below every row's last keys
    v[0, 3, 3, 1] = float("nan")  # slope 2^-8: nothing skipped, NaN everywhere in column 1
    o1, _ = _run(on, q, k, v)
    o0, _ = _run(off, q, k, v)
    assert torch.isnan(o0[0, 0, :, 1]).all() and not torch.isnan(o1[0, 0]).any()
    assert torch.isnan(o1[0, 3, :, 1]).all()
    keep = torch.ones(d, dtype=torch.bool)
    keep[1] = False
    assert torch.equal(o1[0, 0][:, keep], o0[0, 0][:, keep]) and torch.equal(o1[0, 1:3], o0[0, 1:3])


@needs_hopper
def test_non_finite_inputs():
    """A NaN or inf in a head's k (or q) turns the skip off for that head: its results match the full walk,
    NaN for NaN. A NaN in v does not: like a key of an EMPTY block, a skipped key adds nothing, not even
    0 * NaN, so only the full walk's output carries it."""
    spec = _spec("alibi", 128, "bf16")
    on = ac.compile(spec, "v3", persistent=False)  # the block trace counts one CTA per tile
    off = ac.compile(spec, "v3", **{**on.plan.options, "score_skip": False})
    N = 4096
    q, k, v = _inputs(1, 4, 4, N, N, 128, torch.bfloat16, "random")
    v[0, 1, 5, 7] = float("nan")  # far below every row's last keys: its P is 0
    k[0, 2, 9, 3] = float("inf")
    o1, l1 = _run(on, q, k, v)
    o0, l0 = _run(off, q, k, v)
    assert torch.isnan(o0[0, 1, :, 7]).all() and torch.isnan(o0[0, 2]).any()
    assert not torch.isnan(o1[0, 1]).any()
    keep = torch.ones(128, dtype=torch.bool)
    keep[7] = False
    assert torch.equal(o1[0, 1][:, keep], o0[0, 1][:, keep]) and torch.equal(l1, l0)
    torch.testing.assert_close(o1[0, 2], o0[0, 2], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(o1[0, ::3], o0[0, ::3])  # heads 0 and 3
    visited = _visited_blocks(on, q, k, v)
    full = -(-N // on.plan.block_n)
    assert int(visited[2].min()) == full and int(visited[1].max()) < full and int(visited[0].max()) < full


@needs_hopper
@pytest.mark.parametrize("d, dtype, H_kv, layout", [(64, "bf16", 4, "bhnd"), (128, "fp16", 2, "bnhd"),
                                                    (256, "bf16", 1, "bhnd")])
def test_row_norm_kernel(d, dtype, H_kv, layout):
    """attn_row_norms against torch: the largest squared row norms of q per (b, h), then of k per (b, h_kv)."""
    from attncompiler.runtime.launch import check_inputs, pack_params, prepare_buffers
    from attncompiler.runtime.scoreskip import BOUND_MARGIN, launch_row_norms, score_bound_reference

    kern = ac.compile(_spec("alibi", d, dtype), "v3")
    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    B, H, Nq, Nk = 2, 4, 777, 5000
    q, k, v = _inputs(B, H, H_kv, Nq, Nk, d, dt, "random")
    q = q * 3
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    k[1, 0, 4999, 0] = float("nan")
    dims = check_inputs(q, k, v, kern.ir)
    o = torch.empty_like(q)
    P, _ = pack_params(q, k, v, o, None, None, dims, scale=1.0, dropout_p=0.0, seed=0, offset=0, ir=kern.ir,
                       buffers=prepare_buffers(kern.ir, kern._buffers, q.device))
    table = launch_row_norms(kern.kernel_source, dims, P, q.device)
    torch.cuda.synchronize()
    assert P.row_norms_sq == table.data_ptr() and table.shape == (B * H + B * H_kv,)
    want_q = q.float().square().sum(-1).amax(-1).flatten()
    want_k = k.float().square().sum(-1).amax(-1).flatten()
    torch.testing.assert_close(table[: B * H], want_q, rtol=1e-5, atol=0)
    torch.testing.assert_close(table[B * H:], want_k, rtol=1e-5, atol=0, equal_nan=True)
    assert torch.isnan(table[B * H + H_kv])  # (b = 1, h_kv = 0) holds the NaN
    ref = score_bound_reference(q, k)
    qb = table[: B * H].sqrt().reshape(B, H)
    kb = table[B * H:].sqrt().reshape(B, H_kv).repeat_interleave(H // H_kv, dim=1)
    torch.testing.assert_close(qb * kb * BOUND_MARGIN, ref, rtol=1e-5, atol=0, equal_nan=True)


@needs_hopper
def test_short_keys_take_no_bound():
    """Below SCORE_SKIP_MIN_KEYS keys the bound is not computed: null pointer, nothing skipped."""
    from attncompiler.plan.v3 import SCORE_SKIP_MIN_KEYS

    on = ac.compile(_spec("alibi", 128, "bf16"), "v3", persistent=False)  # the block trace: one CTA per tile
    n = SCORE_SKIP_MIN_KEYS - 1
    q, k, v = _inputs(1, 4, 4, n, n, 128, torch.bfloat16, "random")
    visited = _visited_blocks(on, q, k, v)
    assert bool((visited == -(-n // on.plan.block_n)).all())
    res = check_kernel(on, 1, 4, n, lse_tol=2e-3 + 2e-6 * max(SLOPES) * n)
    assert res.ok, str(res)


@needs_hopper
def test_cuda_graph_replays_the_bound():
    """Under CUDA-graph capture the row-norm pass is captured with the attention kernel, so a replay bounds the
    new q and k: bit-identical to the full walk on fresh inputs, and off for a head whose k turned non-finite."""
    spec = _spec("alibi", 128, "bf16")
    on = ac.compile(spec, "v3")
    off = ac.compile(spec, "v3", **{**on.plan.options, "score_skip": False})
    N = 4096
    q, k, v = _inputs(1, 4, 4, N, N, 128, torch.bfloat16, "random")
    bufs = {"slopes": torch.tensor(SLOPES, device="cuda")}
    on(q, k, v, buffers=bufs)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = on(q, k, v, buffers=bufs)
    for seed in (1, 2):
        q2, k2, v2 = _inputs(1, 4, 4, N, N, 128, torch.bfloat16, "random", seed=seed)
        q.copy_(q2 * (2 * seed))  # larger norms: a different bound
        k.copy_(k2)
        v.copy_(v2)
        if seed == 2:
            k[0, 0, 3, 5] = float("inf")
        graph.replay()
        want = off(q, k, v, buffers=bufs)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
        assert not torch.isnan(out[0, 1:]).any()
