"""GPU: the split-KV decode schedule against the float64 reference (error-ratio rule), the automatic
pick for small Nq, autograd through a decode forward (v2 backward from its out and lse), and the plan
options fold_combine / loader="bulk" (reference checks, CUDA-graph replays, the counters' reset).

Run on a GPU machine with ``python3 -m pytest -m gpu tests/test_gpu_decode.py``.
"""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.plan.decode import DECODE_MIN_KV
from attncompiler.runtime import decode as rt
from attncompiler.runtime.launch import AttnInputs
from attncompiler.spec import presets
from attncompiler.testing import check_kernel, check_kernel_grads

pytestmark = pytest.mark.gpu

NQS = (1, 3, 16)
NKS = (1, 113, 4099, 65537)


def _spec(name: str, head_dim: int = 128, dtype: str = "bf16", H: int = 4, seqlen: int = 4099) -> ac.AttentionSpec:
    if name == "dropout":
        return ac.AttentionSpec(head_dim=head_dim, dtype=dtype, dropout_p=0.2, name="dropout")
    return presets.get_preset(name, head_dim=head_dim, dtype=dtype, num_heads=H, seqlen=seqlen)


def _splits(kern, B, H, H_kv, Nq, Nk) -> int:
    return rt.split_choice(kern.plan, AttnInputs(B, H, H_kv, Nq, Nk, kern.ir.head_dim, kern.ir.head_dim_v)).num_splits


@pytest.mark.parametrize("name", ["plain", "causal", "sliding_window", "alibi", "softcap"])
def test_decode_presets_shapes(name):
    """Nq in {1, 3, 16} x Nk in {1, 113, 4099, 65537}: one split (direct write) and many (combine)."""
    kern = ac.compile(_spec(name), "decode")
    seen = set()
    for nk in NKS:
        for nq in NQS:
            res = check_kernel(kern, 2, 4, nq, nk, seed=nq * 7 + nk)
            assert res.ok, f"{name} Nq={nq} Nk={nk}: {res}"
            seen.add(_splits(kern, 2, 4, 4, nq, nk) > 1)
    assert seen == {False, True}, "expected both the direct (1 split) and the combine path to run"


@pytest.mark.parametrize("name", ["prefix_lm", "document", "dropout"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_decode_other_variants(name, dtype):
    kern = ac.compile(_spec(name, dtype=dtype), "decode")
    for nq, nk in ((1, 4099), (16, 4099), (3, 113)):
        res = check_kernel(kern, 2, 4, nq, nk)
        assert res.ok, f"{name} {dtype} Nq={nq} Nk={nk}: {res}"


@pytest.mark.parametrize("H_kv", [8, 1])
@pytest.mark.parametrize("name", ["plain", "causal", "alibi"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_gqa_mqa(H_kv, name, dtype, head_dim):
    """H=32 query heads over 8 (GQA) or 1 (MQA) K/V heads: the group's heads share the M rows."""
    kern = ac.compile(_spec(name, head_dim, dtype, H=32), "decode")
    for nq, nk in ((1, 65537), (16, 4099), (3, 113)):
        # ALiBi's bias reaches slope * Nk (~5.5e4 for the first of 32 heads at 64k keys), where one
        # float32 ulp of the LSE is ~4e-3: check_kernel's LSE bound allows 4 ulps of |LSE|.
        res = check_kernel(kern, 1, 32, nq, nk, H_kv=H_kv)
        assert res.ok, f"{name} {dtype} d={head_dim} H_kv={H_kv} Nq={nq} Nk={nk}: {res}"


@pytest.mark.parametrize("head_dim", [32, 96, 256])
def test_decode_head_dims(head_dim):
    for name in ("plain", "causal", "softcap"):
        kern = ac.compile(_spec(name, head_dim), "decode")
        for nq, nk in ((1, 4099), (5, 1023)):
            res = check_kernel(kern, 2, 4, nq, nk, H_kv=2)
            assert res.ok, f"{name} d={head_dim} Nq={nq} Nk={nk}: {res}"


def test_decode_bnhd_layout():
    kern = ac.compile(_spec("causal"), "decode")
    res = check_kernel(kern, 2, 8, 3, 4099, H_kv=2, layout="bnhd")
    assert res.ok, str(res)


def test_decode_fully_masked_rows():
    """Heads 1 and 2 see no key: O = 0 and LSE = -inf (never NaN), with one split and with many."""
    spec = ac.AttentionSpec(head_dim=128, mask_mod=lambda b, h, q_idx, kv_idx: (h < 1) | (h > 2), name="holes")
    kern = ac.compile(spec, "decode")
    for nk in (113, 65537):
        q, k, v = (torch.randn(2, 4, n, 128, device="cuda", dtype=torch.bfloat16) for n in (3, nk, nk))
        out = torch.full_like(q, float("nan"))
        _, lse = kern(q, k, v, out=out, return_lse=True)
        assert not torch.isnan(out).any()
        assert (out[:, 1:3] == 0).all()
        assert torch.isneginf(lse[:, 1:3]).all() and torch.isfinite(lse[:, [0, 3]]).all()
        res = check_kernel(kern, 2, 4, 3, nk)
        assert res.ok, str(res)


def test_decode_window_at_the_end():
    """A 256-key window at the end of a 128k K/V (bottom-right for Nq = 1): kv_range confines the splits
    to the window; also a window in the middle and the top-left sliding_window preset (key 0 only)."""
    nk = 131073
    for lo, hi in ((nk - 256, nk - 1), (70000, 70999)):
        spec = ac.AttentionSpec(head_dim=128, mask_mod=lambda b, h, q_idx, kv_idx, lo=lo, hi=hi:
                                (kv_idx >= q_idx + lo) & (kv_idx <= q_idx + hi), name=f"win{lo}")
        res = check_kernel(ac.compile(spec, "decode"), 1, 8, 1, nk, H_kv=2)
        assert res.ok, f"window [{lo}, {hi}]: {res}"
    res = check_kernel(ac.compile(presets.sliding_window(256, 128), "decode"), 1, 8, 2, nk, H_kv=2)
    assert res.ok, str(res)


def test_auto_picks_decode_for_small_nq():
    spec = presets.causal(128)
    kern = ac.compile(spec)  # schedule="auto"
    assert kern.auto_decode
    res = check_kernel(kern, 2, 8, 16, 1023, H_kv=2)  # Nk >= 512, Nq <= 16: decode
    assert res.ok, str(res)
    assert kern._decode is not None and kern._decode.schedule == "decode"
    kern2 = ac.compile(presets.softcap(20.0, 128))
    res = check_kernel(kern2, 2, 8, 17, 4099, H_kv=2)  # Nq > 16: the prefill schedule
    assert res.ok, str(res)
    assert kern2._decode is None
    res = check_kernel(kern2, 2, 8, 1, DECODE_MIN_KV - 1, H_kv=2)  # short K/V: the prefill schedule
    assert res.ok and kern2._decode is None, str(res)
    assert ac.compile(spec, "v2")._decode is None and not ac.compile(spec, "v2").auto_decode


def test_functional_attention_decode_matches_v2():
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, 32768, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o, lse = ac.attention(q, k, v, causal=True, return_lse=True)
    o2, lse2 = ac.attention(q, k, v, causal=True, return_lse=True, schedule="v2")
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1),
                                                           v.float().repeat_interleave(4, 1))
    assert (o.float() - ref).abs().max() <= 2 * (o2.float() - ref).abs().max() + 1e-3
    assert (lse - lse2).abs().max() < 1e-3


@pytest.mark.parametrize("name", ["causal", "alibi", "softcap"])
@pytest.mark.parametrize("use_lse", [False, True])
def test_autograd_through_decode(name, use_lse):
    """schedule="auto" with Nq <= 16 and a long K/V runs decode forward; the v2 backward uses its lse."""
    kern = ac.compile(_spec(name, H=8))
    res = check_kernel_grads(kern, 2, 8, 3, 1500, H_kv=2, use_lse=use_lse)
    assert kern._decode is not None, "expected the decode schedule to serve the forward"
    assert res.ok, f"{name}: {res}"


def test_decode_side_stream():
    """The two launches run on torch's current stream (a side stream gives the same bits)."""
    kern = ac.compile(presets.causal(128), "decode")
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 20000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want = kern(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # (q, k, v and want are made on the current stream)
    with torch.cuda.stream(s):
        got = kern(q, k, v)
    s.synchronize()
    assert torch.equal(got, want)


# ---- plan options: fold_combine (the split kernel merges) and loader="bulk" (cp.async.bulk K/V ring) --------

_OPTIONS = {"fold": dict(fold_combine=True), "bulk": dict(loader="bulk"),
            "fold+bulk": dict(fold_combine=True, loader="bulk"), "tma": dict(loader="tma"),
            "tma+combine+8warps": dict(loader="tma", fold_combine=False, num_warps=8, block_n=128),
            "separate_combine": dict(fold_combine=False)}  # the combine kernel (fold_combine is the default)
_OPT_SHAPES = ((1, 32, 8), (2, 4, 4))
_OPT_NKS = (1023, 4097, 32768)


def _needs(opts: dict) -> None:
    if opts.get("loader") in ("bulk", "tma") and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip(f"loader {opts['loader']!r} needs sm_90+")


@pytest.mark.parametrize("opt", list(_OPTIONS))
@pytest.mark.parametrize("name", ["plain", "causal", "alibi"])
def test_decode_options_against_reference(opt, name):
    """fold_combine / bulk / both against the float64 reference: Nk in {1023, 4097, 32768} x (B, H, H_kv) in
    {(1, 32, 8), (2, 4, 4)}, Nq in {1, 3}; the last tile is partial at 1023 and 4097 (bulk: clamped rows)."""
    opts = _OPTIONS[opt]
    _needs(opts)
    seen = set()
    for B, H, H_kv in _OPT_SHAPES:
        kern = ac.compile(_spec(name, H=H), "decode", **opts)  # ALiBi: one slope per query head
        assert all(getattr(kern.plan, k) == v for k, v in opts.items())
        for nk in _OPT_NKS:
            for nq in (1, 3):
                res = check_kernel(kern, B, H, nq, nk, H_kv=H_kv, seed=nk + nq)
                assert res.ok, f"{name} {opt} B={B} H={H} H_kv={H_kv} Nq={nq} Nk={nk}: {res}"
                seen.add(_splits(kern, B, H, H_kv, nq, nk) > 1)
    assert seen == {True}, "expected several splits (the folded merge) at these shapes"
    # one split (direct write) with the options too
    kern = ac.compile(_spec(name, H=32), "decode", **opts)
    res = check_kernel(kern, 8, 32, 1, 4097, H_kv=32)
    assert res.ok, str(res)


@pytest.mark.parametrize("opt", list(_OPTIONS))
def test_decode_options_other_variants(opt):
    opts = _OPTIONS[opt]
    _needs(opts)
    for name, dtype in (("dropout", "bf16"), ("document", "fp16"), ("softcap", "bf16")):
        kern = ac.compile(_spec(name, dtype=dtype), "decode", **opts)
        for nq, nk in ((1, 4097), (16, 1023), (3, 113)):
            res = check_kernel(kern, 2, 4, nq, nk)
            assert res.ok, f"{name} {dtype} {opt} Nq={nq} Nk={nk}: {res}"
    for head_dim in (64, 256):
        if head_dim == 256 and opts.get("num_warps") == 8:
            continue  # 8 warps x 16 keys x 2 stages of d=256 exceed the block's shared memory
        kern = ac.compile(_spec("causal", head_dim), "decode", **opts)
        res = check_kernel(kern, 1, 32, 1, 32768, H_kv=8)
        assert res.ok, f"d={head_dim} {opt}: {res}"


@pytest.mark.parametrize("opt", list(_OPTIONS))
def test_decode_options_fully_masked_rows(opt):
    """fold_combine's merge of rows no split sees (O = 0, LSE = -inf), and bulk's ring with skipped tiles."""
    opts = _OPTIONS[opt]
    _needs(opts)
    spec = ac.AttentionSpec(head_dim=128, mask_mod=lambda b, h, q_idx, kv_idx: (h < 1) | (h > 2), name="holes")
    kern = ac.compile(spec, "decode", **opts)
    for nk in (1023, 32768):
        q, k, v = (torch.randn(2, 4, n, 128, device="cuda", dtype=torch.bfloat16) for n in (3, nk, nk))
        out = torch.full_like(q, float("nan"))
        _, lse = kern(q, k, v, out=out, return_lse=True)
        assert _splits(kern, 2, 4, 4, 3, nk) > 1
        assert not torch.isnan(out).any()
        assert (out[:, 1:3] == 0).all()
        assert torch.isneginf(lse[:, 1:3]).all() and torch.isfinite(lse[:, [0, 3]]).all()
        res = check_kernel(kern, 2, 4, 3, nk)
        assert res.ok, str(res)


def _graph_case(kern, B, H, H_kv, nk):
    q = torch.randn(B, H, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, H_kv, nk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(q)
    lse = None

    def run():
        nonlocal lse
        _, lse = kern(q, k, v, out=out, return_lse=True)

    return q, k, v, out, run, lambda: lse


@pytest.mark.parametrize("opt", list(_OPTIONS))
@pytest.mark.parametrize("shape", _OPT_SHAPES)
def test_decode_options_cuda_graph_replays(opt, shape):
    """A CUDA graph of one call, replayed twice: both replays equal the eager call (fold_combine: the
    counters start at zero on every replay), and so does an eager call after them."""
    opts = _OPTIONS[opt]
    _needs(opts)
    B, H, H_kv = shape
    kern = ac.compile(presets.causal(128), "decode", **opts)
    for nk in (4097, 32768):
        assert _splits(kern, B, H, H_kv, 1, nk) > 1
        q, k, v, out, run, get_lse = _graph_case(kern, B, H, H_kv, nk)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run()  # warm-up (compile, load) outside the capture
        torch.cuda.current_stream().wait_stream(s)
        want, want_lse = out.clone(), get_lse().clone()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        g_lse = get_lse()
        for rep in range(2):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"{opt} {shape} Nk={nk}: replay {rep} differs from the eager call"
            assert torch.equal(g_lse, want_lse), f"{opt} {shape} Nk={nk}: replay {rep} lse differs"
        run()
        assert torch.equal(out, want)
        res = check_kernel(kern, B, H, 1, nk, H_kv=H_kv)
        assert res.ok, str(res)


def _capture(run) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one ``run()``, captured on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        run()
    torch.cuda.synchronize()
    return g


def _assert_replays(g: torch.cuda.CUDAGraph, out: torch.Tensor, want: torch.Tensor, n: int = 2) -> None:
    for rep in range(n):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"replay {rep}"


def test_decode_fold_counters_zeroed_once(monkeypatch):
    """fold_combine's counters come zeroed from runtime/counters.py and the kernel's last CTA leaves them
    zero: eager calls on one stream reuse one slice, a captured call takes a slice of its own, and no
    call zeroes anything (eager calls and graph replays all equal the first call)."""
    from attncompiler.runtime import counters

    kern = ac.compile(presets.causal(128), "decode", fold_combine=True)
    q, k, v, out, run, get_lse = _graph_case(kern, 1, 32, 8, 32768)
    assert _splits(kern, 1, 32, 8, 1, 32768) > 1
    zeroed = []
    monkeypatch.setattr(rt, "_zero_counters", lambda *a: zeroed.append(a))
    run()
    torch.cuda.synchronize()
    want = out.clone()
    used = counters.arena_stats()["used"]
    for rep in range(3):
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"eager call {rep}: counters not left at zero"
    assert counters.arena_stats()["used"] == used, "eager calls on one stream should reuse its slice"
    g = _capture(run)
    assert counters.arena_stats()["used"] > used, "a captured call takes a slice of its own"
    _assert_replays(g, out, want)
    out.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and zeroed == []


def test_decode_fold_counters_in_capture_without_arena_room(monkeypatch):
    """A capture that finds no arena room zeroes workspace counters of its own in the graph (a memset
    node): replays equal the eager call."""
    kern = ac.compile(presets.causal(128), "decode", fold_combine=True)
    q, k, v, out, run, get_lse = _graph_case(kern, 2, 32, 8, 4097)
    run()
    torch.cuda.synchronize()
    want = out.clone()
    zeroed = []
    real_zero = rt._zero_counters
    monkeypatch.setattr(rt, "_counters", lambda device, count: None)
    monkeypatch.setattr(rt, "_zero_counters", lambda *a: zeroed.append(a) or real_zero(*a))
    g = _capture(run)
    assert len(zeroed) == 1
    _assert_replays(g, out, want)


def test_decode_fold_counters_concurrent_streams():
    """Two streams running decode calls at once each count on their own counters: every result equals
    its stream's first (serial) result."""
    kern = ac.compile(presets.causal(128), "decode", fold_combine=True)
    cases = [_graph_case(kern, 1, 32, 8, 32768) for _ in range(2)]
    wants = []
    for _, _, _, out, run, _ in cases:
        run()
        torch.cuda.synchronize()
        wants.append(out.clone())
    streams = [torch.cuda.Stream() for _ in cases]
    for st in streams:
        st.wait_stream(torch.cuda.current_stream())
    outs = [[], []]
    for _ in range(20):
        for i, ((_, _, _, out, run, _), st) in enumerate(zip(cases, streams)):
            with torch.cuda.stream(st):
                run()
                outs[i].append(out.clone())
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(o, wants[i]) for o in outs[i]), f"stream {i}"


def test_auto_decode_falls_back_to_cp_async_for_expanded_kv():
    """schedule="auto" on an sm_90: decode's default TMA loader cannot describe K/V broadcast over heads
    (stride 0); the call runs the cp.async-loader sibling instead, with the same answer as dense K/V."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the TMA loader is the default on sm_90+ only")
    from attncompiler.reference import reference_attention

    kern = ac.compile(presets.plain(128))
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    k1, v1 = (torch.randn(2, 1, 4097, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = k1.expand(2, 2, 4097, 128), v1.expand(2, 2, 4097, 128)
    out = kern(q, k, v)
    assert kern._decode is not None and kern._decode.plan.loader == "tma"
    assert kern._decode_cp is not None and kern._decode_cp.plan.loader == "cp_async"
    dense = kern(q, k.contiguous(), v.contiguous())  # the TMA path
    ref = reference_attention(q.double(), k.double(), v.double(), kern.ir).to(torch.float32)
    assert float(ref.abs().max()) > 1e-2  # a real signal, not zeros
    err, err_dense = (float((o.float() - ref).abs().max()) for o in (out, dense))
    assert err < 2e-3 and err_dense < 2e-3, (err, err_dense)
    # an explicit decode kernel with the TMA loader says what it needs
    from attncompiler.runtime.launch import InputError

    tma = ac.compile(presets.plain(128), "decode", loader="tma")
    with pytest.raises(InputError, match="loader 'tma'"):
        tma(q, k, v)
