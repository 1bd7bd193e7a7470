"""GPU: repeated packed-sequence calls take the launches recorded for their signature and cu_seqlens tensors
(runtime/varlen_fastpath.py): bit-identical to the full path on the same inputs (dQ too where its summation order is
fixed), forward and backward, v2 and v3, with sequences that have no queries or no keys; and the cases that must
take the full path again: other or changed cu_seqlens, per-call buffers, CUDA graph capture."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.runtime import bwd_fastpath, fastpath
from attncompiler.runtime.launch import InputError
from attncompiler.spec import presets
from attncompiler.testing_varlen import make_varlen_inputs

from _graphs import capture, replay
from _recordings import assert_recorded_grads
from _v3 import hopper

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SEQ_Q = (0, 1, 113, 1023, 7, 256)
SEQ_K = (5, 0, 200, 1023, 64, 300)  # b=0: keys without queries, b=1: a query without keys
H, H_KV = 4, 2


def _schedules() -> list[str]:
    return ["v2", "v3"] if hopper() else ["v2"]


def _spec(name: str) -> ac.AttentionSpec:
    if name == "causal":
        return presets.causal(128)
    if name == "window":
        return presets.sliding_window(64, 64)
    if name == "alibi":
        return presets.alibi(presets.alibi_slopes(H), 128, causal=True)
    return ac.AttentionSpec(head_dim=64, dropout_p=0.2, name="dropout")


def _inputs(kern, seed: int) -> tuple[torch.Tensor, ...]:
    return make_varlen_inputs(kern, SEQ_Q, SEQ_K, H, H_KV, generator=torch.Generator(device="cuda").manual_seed(seed))


def _stale(t: torch.Tensor) -> None:
    """Leave NaN in the caching allocator's free blocks of ``t``'s size, where the next outputs are likely placed."""
    junk = [torch.full_like(t, float("nan")) for _ in range(3)]
    del junk


@needs_cuda
@pytest.mark.parametrize("schedule", _schedules())
@pytest.mark.parametrize("name", ["causal", "window", "alibi", "dropout"])
def test_gpu_packed_forward_recording_matches_the_full_path(schedule: str, name: str) -> None:
    kern = ac.compile(_spec(name), schedule)
    q, k, v, cu_q, cu_k = _inputs(kern, 0)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True, seed=5)
    first, _ = kern(q, k, v, **kw)  # records
    a, b, c = _inputs(kern, 1)[:3]  # other tensors (pointers), the same signature
    hits = fastpath.stats["hits"]
    _stale(first)
    fast, fast_lse = kern(a, b, c, **kw)
    assert fastpath.stats["hits"] == hits + 1, "expected the recorded launch"
    kern._recipes.clear()
    full, full_lse = kern(a, b, c, **kw)
    assert fastpath.stats["hits"] == hits + 1
    assert torch.isfinite(fast).all() and not torch.equal(fast, first)
    assert torch.equal(fast, full) and torch.equal(fast_lse, full_lse), f"{schedule} {name}: recording != full path"
    assert torch.isinf(fast_lse[:, SEQ_Q[0]]).all()  # the query without keys: lse -inf, out 0
    assert torch.equal(fast[SEQ_Q[0]], torch.zeros_like(fast[SEQ_Q[0]]))
    # out= (its own signature): a poisoned tensor per call, every row written
    kern(a, b, c, out=torch.full_like(full, float("nan")), **kw)
    out = torch.full_like(full, float("nan"))
    res, _ = kern(a, b, c, out=out, **kw)
    assert res is out and fastpath.stats["hits"] == hits + 2 and torch.equal(out, full)
    if name == "dropout":  # a new seed per call reaches the recording
        other, _ = kern(a, b, c, **{**kw, "seed": 6})
        assert fastpath.stats["hits"] == hits + 3 and not torch.equal(other, full)


@needs_cuda
def test_gpu_packed_recording_follows_its_cu_seqlens_only() -> None:
    """A changed (in place) or another cu_seqlens tensor takes the full path and records anew; the answers follow
    the offsets in every case."""
    kern = ac.compile(presets.causal(128))
    q, k, v, cu_q, cu_k = _inputs(kern, 2)

    def call(cq: torch.Tensor, ck: torch.Tensor, **kw: object) -> torch.Tensor:
        return kern(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **kw)

    base = call(cu_q, cu_k)
    hits = fastpath.stats["hits"]
    assert torch.equal(call(cu_q, cu_k), base) and fastpath.stats["hits"] == hits + 1
    twin_q, twin_k = cu_q.clone(), cu_k.clone()  # equal values, other tensors: read on the host, recorded anew
    assert torch.equal(call(twin_q, twin_k), base) and fastpath.stats["hits"] == hits + 1
    assert torch.equal(call(twin_q, twin_k), base) and fastpath.stats["hits"] == hits + 2
    assert torch.equal(call(cu_q, cu_k, max_seqlen_q=1100, max_seqlen_k=1100), base)  # another key
    assert fastpath.stats["hits"] == hits + 2
    cu_q[3] += 50  # in place: sequences 2 and 3 split elsewhere (same total)
    cu_k[3] += 50
    moved = call(cu_q, cu_k)
    assert fastpath.stats["hits"] == hits + 2, "a changed cu_seqlens must take the full path"
    assert torch.equal(moved, call(cu_q.clone(), cu_k.clone())) and not torch.equal(moved, base)
    assert torch.equal(call(cu_q, cu_k), moved) and fastpath.stats["hits"] == hits + 3  # recorded again


@needs_cuda
def test_gpu_packed_per_call_buffers_never_record() -> None:
    kern = ac.compile(_spec("alibi"))
    q, k, v, cu_q, cu_k = _inputs(kern, 3)
    name = next(iter(kern._buffers))
    n = len(kern._recipes)
    hits = fastpath.stats["hits"]
    for scale in (1.0, 0.5):
        got = kern(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, buffers={name: presets.alibi_slopes(H) * scale})
        want = ac.compile(presets.alibi(presets.alibi_slopes(H) * scale, 128, causal=True))(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        assert torch.equal(got, want)
    assert len(kern._recipes) == n and fastpath.stats["hits"] == hits


def _backward_cases() -> list[tuple[str, str, dict, bool]]:
    cases = [("causal", "auto", {}, False), ("causal", "auto", {}, True), ("dropout", "auto", {}, True),
             ("alibi", "auto", {"schedule": "v2"}, False)]  # v2: dQ gathered from a row-major accumulator
    if hopper():
        cases.append(("window", "auto", {"dq_red": 2, "consumers": 1}, False))
    return cases


@needs_cuda
@pytest.mark.parametrize("name,schedule,opts,det", _backward_cases(),
                         ids=lambda x: x if isinstance(x, str) else ("det" if x is True else ""))
def test_gpu_packed_backward_recording_matches_the_full_path(name: str, schedule: str, opts: dict, det: bool) -> None:
    kern = ac.compile(_spec(name), schedule)
    kern.backward_options = dict(opts)
    q, k, v, cu_q, cu_k = _inputs(kern, 4)
    gen = torch.Generator(device="cuda").manual_seed(9)
    go = torch.randn(q.shape[0], H, kern.ir.head_dim_v, device="cuda", generator=gen).to(q.dtype)
    gl = torch.randn(H, q.shape[0], device="cuda", generator=gen)

    def step(leaves: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        out, lse = kern(*leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seed=7, deterministic=det, return_lse=True)
        loss = (out.float() * go.float()).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * gl).sum()
        return torch.autograd.grad(loss, leaves)

    def leaves(seed: int) -> list[torch.Tensor]:
        return [t.clone().requires_grad_() for t in _inputs(kern, seed)[:3]]

    a, b = leaves(5), leaves(6)
    first = step(a)  # records the forward and the backward
    hits, fwd_hits = bwd_fastpath.stats["hits"], fastpath.stats["hits"]
    for t in first:
        _stale(t)
    fast = step(b)
    assert bwd_fastpath.stats["hits"] == hits + 1 and fastpath.stats["hits"] == fwd_hits + 1
    kern._bwd_recipes.clear()
    kern._recipes.clear()
    full = step(b)
    assert bwd_fastpath.stats["hits"] == hits + 1
    assert_recorded_grads(fast, full, first, det)
    idle = slice(0, SEQ_K[0])  # keys of the sequence without queries: zero gradients
    assert not fast[1][idle].any() and not fast[2][idle].any()


@needs_cuda
def test_gpu_capture_after_a_recording_takes_the_full_path() -> None:
    """An eager call records; the same call captured in a CUDA graph does not launch from the recording (the graph
    needs the full path's clamped views and error word), and its replays follow new offsets."""
    kern = ac.compile(presets.causal(128))
    q, k, v, cu_q, cu_k = _inputs(kern, 7)
    mx = max(max(SEQ_Q), max(SEQ_K))
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mx, max_seqlen_k=mx)
    eager = kern(q, k, v, **kw)
    kern(q, k, v, **kw)
    hits = fastpath.stats["hits"]
    g, out = capture(lambda: kern(q, k, v, **kw))  # (its side-stream warm-up is eager: a recorded launch)
    assert fastpath.stats["hits"] == hits + 1
    replay(g, (out,), None)
    assert torch.equal(out, eager)
    cu_q[3] += 50  # sequence 2 longer, 3 shorter: within the captured max_seqlen
    cu_k[3] += 50
    replay(g, (out,), None)
    assert torch.equal(out, kern(q, k, v, **kw))
    kern(q, k, v, **kw)  # (recorded for the new version)
    cu_q[3] -= 100  # sequence 3 now longer than the captured max_seqlen: the replay reports it
    cu_k[3] -= 100
    replay(g, (out,), None)
    cu_q[3] += 100
    cu_k[3] += 100
    with pytest.raises(InputError, match="replayed from a CUDA graph"):
        kern(q, k, v, **kw)  # the next eager call raises it, recorded launch or not
