"""CPU: the pieces of the recorded forward launch (runtime/fastpath.py) that need no GPU: signatures, the recipe
table's bound, the TMA maps remembered by pointers. The launches themselves: tests/test_gpu_fastpath.py."""
from __future__ import annotations

import ctypes

import torch

from attncompiler.runtime import fastpath


def test_signature_fixes_everything_but_pointers() -> None:
    q, k, v = (torch.randn(2, 3, 17, 64) for _ in range(3))
    sig = fastpath.signature(q, k, v, False, None, None)
    assert sig == fastpath.signature(*(torch.randn(2, 3, 17, 64) for _ in range(3)), False, None, None)
    assert sig != fastpath.signature(q, k, v, True, None, None)  # return_lse
    assert sig != fastpath.signature(q, k, v, False, 0.5, None)  # scale
    assert sig != fastpath.signature(q, k, v, False, None, 0.1)  # dropout
    assert sig != fastpath.signature(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, False, None, None)
    assert sig != fastpath.signature(q.half(), k, v, False, None, None)


def test_signature_of_calls_with_out() -> None:
    """``out=`` is part of the key: its shape, strides, dtype and device, never its pointer."""
    q, k, v = (torch.randn(2, 3, 17, 64) for _ in range(3))
    out = torch.empty(2, 3, 17, 64)
    sig = fastpath.signature(q, k, v, False, None, None, out)
    assert sig == fastpath.signature(q, k, v, False, None, None, torch.empty(2, 3, 17, 64))
    assert sig != fastpath.signature(q, k, v, False, None, None)  # no out: the output is allocated per call
    heads_inner = torch.empty(2, 17, 3, 64).transpose(1, 2)
    assert sig != fastpath.signature(q, k, v, False, None, None, heads_inner)
    assert sig != fastpath.signature(q, k, v, False, None, None, out.half())

    class Sub(torch.Tensor):
        pass

    assert fastpath.signature(q, k, v, False, None, None, out.as_subclass(Sub)) is None


def test_buffer_versions_follow_in_place_changes() -> None:
    a, b = torch.ones(3), torch.zeros(2, dtype=torch.int32)
    before = fastpath.buffer_versions({"a": a, "b": b})
    assert before == fastpath.buffer_versions({"a": a, "b": b}) and fastpath.buffer_versions({}) == ()
    b.add_(1)
    assert before != fastpath.buffer_versions({"a": a, "b": b})


def test_inference_mode_buffers_are_not_recordable() -> None:
    with torch.inference_mode():
        frozen = torch.ones(3)
    a = torch.ones(3)
    assert fastpath.recordable({}) and fastpath.recordable({"a": a})
    assert fastpath.buffer_versions({"a": a, "f": frozen}) is None
    assert not fastpath.recordable({"a": a, "f": frozen})


def test_no_signature_for_tensor_subclasses() -> None:
    class Sub(torch.Tensor):
        pass

    q = torch.randn(1, 1, 8, 64).as_subclass(Sub)
    k, v = torch.randn(1, 1, 8, 64), torch.randn(1, 1, 8, 64)
    assert fastpath.signature(q, k, v, False, None, None) is None
    assert fastpath.signature(k, q, v, False, None, None) is None


def test_recipe_table_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    table: dict = {}
    for i in range(fastpath.MAX_RECIPES + 3):
        fastpath.remember(table, ("sig", i), object())
    assert 0 < len(table) <= fastpath.MAX_RECIPES and ("sig", fastpath.MAX_RECIPES + 2) in table
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    fastpath.remember(table, ("captured",), object())
    assert ("captured",) not in table  # nothing is recorded while a graph is captured


def test_maps_remembered_by_pointers() -> None:
    class P(ctypes.Structure):
        _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p)]

    built: list[tuple] = []
    maps = fastpath.maps_by_pointers(lambda p: built.append((p.q, p.k, p.v, p.o)) or object())
    a, b = P(16, 32, 48, 64), P(16, 32, 48, 80)
    first = maps(a)
    assert maps(P(16, 32, 48, 64)) is first and len(built) == 1
    assert maps(b) is not first and len(built) == 2


def test_no_recorded_launch_under_capture_or_misalignment(monkeypatch) -> None:
    """run() hands back to the full path before touching CUDA: a misaligned base (whose error that path gives) and
    CUDA graph capture (whose graph must hold the full path's per-call GPU work, e.g. buffer tables)."""
    q, k, v = (torch.randn(1, 1, 8, 64) for _ in range(3))
    recipe = type("R", (), {"buffer_versions": ()})()  # nothing past the checks is reached
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert fastpath.run(recipe, q, k, v, None, 0, {}) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    flat = torch.randn(8 * 64 + 1)
    assert fastpath.run(recipe, flat[1:].view(1, 1, 8, 64), k, v, None, 0, {}) is None
    assert fastpath.run(recipe, q, k, v, None, 0, {}, out=flat[1:].view(1, 1, 8, 64)) is None  # a misaligned out


def test_device_index_of_indexed_and_bare_devices(monkeypatch) -> None:
    from attncompiler.runtime.launch import device_index

    assert device_index(torch.device("cuda", 3)) == 3
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    assert device_index(torch.device("cuda")) == 5
