"""GPU: packed sequences (cu_seqlens) in CUDA graphs.

A call that gives max_seqlen_q and max_seqlen_k reads nothing on the host once captured: the kernels read cu_seqlens
on the device, so a replay after ``cu_seqlens.copy_(...)`` attends over the new packing. Each replay here is compared
bit for bit with an eager call on the same inputs (the eager path checks cu_seqlens on the host; the kernels are the
same). Offsets that disagree with the launch (a sequence longer than the captured max_seqlen, offsets out of range or
decreasing) are clamped by the kernels -- no access leaves the tensors -- and reported by ``check_replays`` and by the
next eager packed call (attncompiler/runtime/varlen.py)."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.runtime.launch import InputError
from attncompiler.spec import presets
from attncompiler.varlen import check_replays

from _graphs import capture, replay  # shared with test_gpu_cuda_graphs.py

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

H, D, TOTAL, MAX = 4, 64, 512, 320
# packings of TOTAL rows (the tensors' shapes are the graph's): 1, 37, 113 rows -- multiples of no block size
PACKINGS = [(100, 37, 300, 75), (300, 12, 1, 199), (1, 113, 200, 198)]
# queries per sequence for the keys above (cross attention; 0: keys without queries, whose dK, dV must be 0)
QUERIES = [(100, 0, 300, 112), (12, 300, 0, 200), (256, 0, 255, 1)]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


SCHEDULES = ["v2", pytest.param("v3", marks=pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU"))]


def _offsets(lens) -> torch.Tensor:
    return torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(torch.int32).cuda()


def _spec(name: str) -> ac.AttentionSpec:
    return {"causal": presets.causal(D), "window": presets.sliding_window(100, D),
            "dropout": ac.AttentionSpec(head_dim=D, causal=True, dropout_p=0.2, name="dropout")}[name]


def _inputs(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(TOTAL, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]


@needs_cuda
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", ["causal", "window", "dropout"])
def test_gpu_captured_packed_forward_follows_new_cu_seqlens(schedule: str, name: str) -> None:
    kern = ac.compile(_spec(name), schedule)
    q, k, v = _inputs(0)
    cu = _offsets(PACKINGS[0])
    g, out = capture(lambda: kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=MAX, max_seqlen_k=MAX))
    state = kern.last_rng_state if name == "dropout" else None
    assert name != "dropout" or (kern.last_seed is None and state is not None and state.is_cuda)
    for i, lens in enumerate(PACKINGS):
        cu.copy_(_offsets(lens))
        for t, new in zip((q, k, v), _inputs(i + 1)):
            t.copy_(new)
        kw = replay(g, (out,), state)
        want = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, **kw)  # eager: host-checked, max from cu_seqlens
        assert torch.equal(out, want), f"{schedule} {name} packing {lens}: the replay differs from the eager call"
    check_replays()


@needs_cuda
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("dropout", [False, True])
def test_gpu_captured_packed_training_step_follows_new_cu_seqlens(schedule: str, dropout: bool) -> None:
    """Forward and backward captured together over cross-attention packings with sequences of keys but no queries:
    each replay's output and gradients equal an eager step's (at the seed the replay drew, for dropout)."""
    kern = ac.compile(_spec("dropout" if dropout else "causal"), schedule)
    leaves = [t.requires_grad_() for t in _inputs(10)]
    go = torch.randn(TOTAL, H, D, device="cuda", dtype=torch.bfloat16)
    cu_q, cu_k = _offsets(QUERIES[0]), _offsets(PACKINGS[0])

    def step(**kw):
        out = kern(*leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, deterministic=True, **kw)
        return (out, *torch.autograd.grad(out, leaves, go))

    g, res = capture(lambda: step(max_seqlen_q=MAX, max_seqlen_k=MAX))
    state = kern.last_rng_state if dropout else None
    for i, (lq, lk) in enumerate(zip(QUERIES, PACKINGS)):
        cu_q.copy_(_offsets(lq))
        cu_k.copy_(_offsets(lk))
        with torch.no_grad():
            for t, new in zip(leaves, _inputs(20 + i)):
                t.copy_(new)
        want = step(**replay(g, res, state))
        for j, (a, b) in enumerate(zip(res, want)):
            assert torch.equal(a, b), f"{schedule} dropout={dropout} packing {i} tensor {j}: differs from eager"
        idle = [b for b in range(len(lq)) if lq[b] == 0 and lk[b] > 0]
        assert idle, "the packings must hold a sequence of keys without queries"
    check_replays()


@needs_cuda
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_gpu_inconsistent_cu_seqlens_in_a_replay_are_clamped_and_reported(schedule: str) -> None:
    """Replays whose cu_seqlens break the captured launch -- a sequence longer than max_seqlen, offsets out of range
    or decreasing -- touch no memory outside the tensors (the forward and backward run to the end), and the error is
    raised by check_replays, or by the next eager packed call, once; valid offsets then replay correctly again."""
    kern = ac.compile(_spec("causal"), schedule)
    leaves = [t.requires_grad_() for t in _inputs(30)]
    go = torch.randn(TOTAL, H, D, device="cuda", dtype=torch.bfloat16)
    cu = _offsets(PACKINGS[0])

    def step():
        out = kern(*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=MAX, max_seqlen_k=MAX)
        return (out, *torch.autograd.grad(out, leaves, go))

    g, res = capture(step)
    bad = [(400, 37, 50, 25), None, None]  # longer than MAX = 320; then raw offsets below
    raw = [None, [0, -5, 9999, 3, TOTAL], [7, 100, 90, 2**31 - 1, -2**31]]
    for i, (lens, offs) in enumerate(zip(bad, raw)):
        cu.copy_(_offsets(lens) if lens is not None else torch.tensor(offs, dtype=torch.int32).cuda())
        g.replay()
        torch.cuda.synchronize()  # an access outside the tensors would fail here
        if i == 1:  # reported by the next eager call
            with pytest.raises(InputError, match="replayed from a CUDA graph"):
                kern(*(t.detach() for t in leaves), cu_seqlens_q=_offsets(PACKINGS[1]),
                     cu_seqlens_k=_offsets(PACKINGS[1]))
        else:
            with pytest.raises(InputError, match="replayed from a CUDA graph"):
                check_replays()
        check_replays()  # raised once, then cleared
    cu.copy_(_offsets(PACKINGS[2]))
    g.replay()
    torch.cuda.synchronize()
    check_replays()
    out = kern(*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu)
    want = (out, *torch.autograd.grad(out, leaves, go))
    for j, (a, b) in enumerate(zip(res, want)):
        assert torch.isfinite(a).all() and torch.equal(a, b), f"{schedule} tensor {j}: wrong after the bad replays"


@needs_cuda
def test_gpu_capture_without_max_seqlen_is_refused() -> None:
    """A packed call captured without max_seqlen would need cu_seqlens on the host: a clear error, not a failed
    capture inside the driver."""
    kern = ac.compile(_spec("causal"), "v2")
    q, k, v = _inputs(40)
    cu = _offsets(PACKINGS[0])
    kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)  # compiled and loaded outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(InputError, match="max_seqlen_q: expected an int under CUDA graph capture"):
        with torch.cuda.graph(g):
            kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_k=MAX)
    out = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)  # the device is still usable
    assert torch.isfinite(out).all()


@needs_cuda
def test_gpu_settled_zeros_inside_a_capture_stay_out_of_the_graph() -> None:
    """The error word's allocation (runtime/persistent.py settled_zeros) inside a capture in torch's default global
    mode: the capture survives, the zeros are there when it returns, and the graph holds no node of them."""
    from attncompiler.runtime.persistent import settled_zeros

    x = torch.ones(8, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        z = settled_zeros(4, torch.int32, x.device)
        y = x * 2
    assert z.dtype == torch.int32 and z.tolist() == [0, 0, 0, 0]
    z.fill_(7)
    g.replay()
    torch.cuda.synchronize()
    assert z.tolist() == [7, 7, 7, 7] and y.tolist() == [2.0] * 8  # (a captured memset would have zeroed z)


@needs_cuda
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_gpu_capture_may_be_the_first_packed_call(schedule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture without an eager packed call before it on the device (as in a process whose first packed call is
    captured: the error word does not exist yet) makes the word itself; replays then report bad offsets as usual."""
    from attncompiler.runtime import varlen as rv

    kern = ac.compile(_spec("causal"), schedule)
    q, k, v = _inputs(50)
    cu = _offsets(PACKINGS[0])
    kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=MAX, max_seqlen_k=MAX)  # (kernels loaded)
    torch.cuda.synchronize()
    monkeypatch.setattr(rv, "_error_words", {})
    monkeypatch.setattr(rv, "_replayed", set())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=MAX, max_seqlen_k=MAX)
    assert len(rv._error_words) == 1
    for lens in PACKINGS[1:]:
        cu.copy_(_offsets(lens))
        replay(g, (out,), None)
        assert torch.equal(out, kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)), f"{schedule} packing {lens}"
    cu.copy_(_offsets((400, 37, 50, 25)))  # longer than MAX
    replay(g, (out,), None)
    with pytest.raises(InputError, match="replayed from a CUDA graph"):
        check_replays()
