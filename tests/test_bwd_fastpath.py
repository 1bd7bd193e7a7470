"""CPU: the pieces of the recorded backward launch (runtime/bwd_fastpath.py) that need no GPU: its signatures, the
checks that send a call back to the full path, the TMA maps remembered by pointers. The launches themselves:
tests/test_gpu_fastpath.py (``test_gpu_backward_*``)."""
from __future__ import annotations

import ctypes

import torch

from attncompiler.runtime import bwd_fastpath


def _tensors(N: int = 17) -> tuple[torch.Tensor, ...]:
    q, k, v, out, dout = (torch.randn(2, 3, N, 64) for _ in range(5))
    return dout, q, k, v, out, torch.randn(2, 3, N)


def test_signature_fixes_everything_but_pointers() -> None:
    dout, q, k, v, out, lse = _tensors()
    sig = bwd_fastpath.signature(dout, q, k, v, out, lse, None, 0.125, 0.0, False, None)
    assert sig is not None
    assert sig == bwd_fastpath.signature(*_tensors(), None, 0.125, 0.0, False, None)
    assert sig == bwd_fastpath.signature(dout, q, k, v, out, lse, None, 0.125, 0.0, False, {})
    others = [
        bwd_fastpath.signature(*_tensors(18), None, 0.125, 0.0, False, None),  # seqlen
        bwd_fastpath.signature(dout, q, k, v, out, lse, torch.randn(2, 3, 17), 0.125, 0.0, False, None),  # dL/dlse
        bwd_fastpath.signature(dout, q, k, v, out, lse, None, 0.5, 0.0, False, None),  # scale
        bwd_fastpath.signature(dout, q, k, v, out, lse, None, 0.125, 0.1, False, None),  # dropout
        bwd_fastpath.signature(dout, q, k, v, out, lse, None, 0.125, 0.0, True, None),  # deterministic
        bwd_fastpath.signature(dout, q, k, v, out, lse, None, 0.125, 0.0, False, {"schedule": "v2"}),  # options
        bwd_fastpath.signature(dout.transpose(1, 2).contiguous().transpose(1, 2), q, k, v, out, lse, None, 0.125,
                               0.0, False, None),  # dO's layout
        bwd_fastpath.signature(dout, q, k, v, out, lse.double(), None, 0.125, 0.0, False, None),  # lse's dtype
    ]
    assert all(o is not None and o != sig for o in others)
    assert len(set(others)) == len(others)


def test_no_signature_for_subclasses_or_unhashable_options() -> None:
    class Sub(torch.Tensor):
        pass

    dout, q, k, v, out, lse = _tensors()
    assert bwd_fastpath.signature(dout, q.as_subclass(Sub), k, v, out, lse, None, 0.1, 0.0, False, None) is None
    assert bwd_fastpath.signature(dout, q, k, v, out, lse, None, 0.1, 0.0, False, {"x": [1, 2]}) is None
    param = torch.nn.Parameter(q)  # autograd saves leaves that may be Parameters: those are plain
    assert bwd_fastpath.signature(dout, param, k, v, out, lse, None, 0.1, 0.0, False, None) is not None


def test_no_recorded_launch_under_capture_misalignment_or_changed_buffers(monkeypatch) -> None:
    """run() hands back to the full path before touching CUDA: a misaligned base (that path copies dO / out or
    refuses q, k, v), a captured buffer changed in place, CUDA graph capture."""
    dout, q, k, v, out, lse = _tensors(8)
    slopes = torch.ones(3)
    recipe = type("R", (), {"buffer_versions": (slopes._version,)})()  # nothing past the checks is reached
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert bwd_fastpath.run(recipe, dout, q, k, v, out, lse, None, 0, 0, {"s": slopes}) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    flat = torch.randn(2 * 3 * 8 * 64 + 1)
    for i in range(5):
        args = [dout, q, k, v, out]
        args[i] = flat[1:].view(2, 3, 8, 64)
        assert bwd_fastpath.run(recipe, *args, lse, None, 0, 0, {"s": slopes}) is None
    slopes.mul_(2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: (_ for _ in ()).throw(AssertionError("launched")))
    assert bwd_fastpath.run(recipe, dout, q, k, v, out, lse, None, 0, 0, {"s": slopes}) is None


def test_maps_remembered_by_q_k_v_and_dout_pointers() -> None:
    class P(ctypes.Structure):
        _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p)]

    class BP(ctypes.Structure):
        _fields_ = [("dout", ctypes.c_void_p), ("dk", ctypes.c_void_p)]

    built: list[tuple] = []
    maps = bwd_fastpath._maps_by_pointers(lambda p, b: built.append((p.q, b.dout)) or object())
    first = maps(P(16, 32, 48), BP(64, 80))
    assert maps(P(16, 32, 48), BP(64, 96)) is first and len(built) == 1  # dK's pointer is not in the maps
    assert maps(P(16, 32, 48), BP(112, 80)) is not first and len(built) == 2


def test_like_layout_keeps_heads_inner() -> None:
    ref = torch.randn(2, 5, 3, 64).transpose(1, 2)  # (B, H, N, d) view of (B, N, H, d) storage
    t = bwd_fastpath.like_layout(ref, (2, 3, 5, 32), torch.float16)
    assert t.shape == (2, 3, 5, 32) and t.stride(1) < t.stride(2) and t.dtype == torch.float16
    c = bwd_fastpath.like_layout(torch.randn(2, 3, 5, 64), (2, 3, 5, 32), torch.float32)
    assert c.is_contiguous()


def test_preprocess_zeroes_the_dq_accumulator() -> None:
    """The dQ accumulator is allocated uninitialized: every backward's preprocess kernel zeroes the floats that
    AttnBwdParams::dq_accum_floats names (first thing, with the launch's own bp, packed sequences included), and
    bwd_params names all of them. (The GPU tests poison the accumulator with NaN before the kernels run.)"""
    from attncompiler.ir import build_ir
    from attncompiler.plan.targets import get_target
    from attncompiler.runtime.backward import bwd_params, bwd_source
    from attncompiler.spec import presets

    ir = build_ir(presets.causal(64))
    for target, opts in ((get_target("sm_90"), {}), (get_target("sm_90"), {"schedule": "v2"}),
                         (get_target("sm_80"), {})):
        for varlen in (False, True):
            src = bwd_source(ir, target, options=opts, varlen=varlen).source
            pre = src[src.index("attn_bwd_pre(const AttnParams p, const AttnBwdParams bp) {"):]
            first = pre.split("\n")[1].strip()
            assert first == "ac::bwd_zero_dq_accum(bp);", (target.name, opts, varlen, first)
    acc = torch.empty(2, 3, 17, 64)
    t = torch.empty(2, 3, 17, 64)
    bp = bwd_params(t, None, t, t, acc, None, torch.empty(2, 96), 48)
    assert bp.dq_accum == acc.data_ptr() and bp.dq_accum_floats == acc.numel()
    assert bwd_params(t, t, t, t, None, None, torch.empty(2, 96), 48).dq_accum_floats == 0
