"""CPU: the keys and guards of recorded packed-sequence launches (runtime/varlen_fastpath.py): a recording applies
only to the very cu_seqlens tensors it was made from, unchanged since."""
from __future__ import annotations

import gc

import torch

from attncompiler.runtime.bwd_fastpath import like_layout
from attncompiler.runtime.varlen_fastpath import CuSeqlens, backward_key, forward_key


def _cu(*lens: int) -> torch.Tensor:
    return torch.tensor([0, *lens]).cumsum(0).to(torch.int32)


def _qkv(rows: int = 12) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(rows, 2, 8) for _ in range(3))


def test_cu_seqlens_guard_takes_the_same_unchanged_tensors_only() -> None:
    cu_q, cu_k = _cu(5, 7), _cu(4, 8)
    rec = CuSeqlens.of(cu_q, cu_k)
    assert rec.matches(cu_q, cu_k)
    assert not rec.matches(cu_k, cu_q)
    assert not rec.matches(cu_q.clone(), cu_k)  # equal values, another tensor: the full path reads them
    cu_k[1] = 5  # in place: torch's version counter moves
    assert not rec.matches(cu_q, cu_k)
    assert CuSeqlens.of(cu_q, cu_k).matches(cu_q, cu_k)


def test_cu_seqlens_guard_refuses_a_successor_of_a_dead_tensor() -> None:
    """A batch's cu_seqlens freed, the next one allocated: it may get the same id and address, never the identity."""
    cu_q, cu_k = _cu(5, 7), _cu(5, 7)
    rec = CuSeqlens.of(cu_q, cu_k)
    del cu_q
    gc.collect()
    assert rec.refs[0]() is None  # (the recording holds no strong reference)
    fresh = _cu(5, 7)
    assert not rec.matches(fresh, cu_k)


def test_forward_key_names_the_cu_tensors_and_max_seqlen() -> None:
    q, k, v = _qkv()
    cu_q, cu_k = _cu(5, 7), _cu(5, 7)
    base = forward_key(q, k, v, cu_q, cu_k, None, None, 0.5, 0.0, None)
    assert base is not None and base[0] == "packed"
    assert forward_key(q, k, v, cu_q, cu_k, None, None, 0.5, 0.0, None) == base
    assert forward_key(q, k, v, cu_q.clone(), cu_k, None, None, 0.5, 0.0, None) != base
    assert forward_key(q, k, v, cu_q, cu_k, 7, 7, 0.5, 0.0, None) != base
    assert forward_key(q, k, v, cu_q, cu_k, None, None, 0.25, 0.0, None) != base
    out = torch.empty(12, 2, 8)
    assert forward_key(q, k, v, cu_q, cu_k, None, None, 0.5, 0.0, out) != base
    assert forward_key(q, k, v, [0, 5, 12], cu_k, None, None, 0.5, 0.0, None) is None  # not a tensor: full path
    assert forward_key(q, k, v, cu_q, cu_k, 7.0, None, 0.5, 0.0, None) is None  # not an int: full path's error
    assert forward_key(torch.nn.Parameter(q), k, v, cu_q, cu_k, None, None, 0.5, 0.0, None) is None


def test_backward_key_extends_the_padded_signature() -> None:
    q, k, v = _qkv()
    do, o = torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    lse = torch.randn(2, 12)
    cu = _cu(5, 7)
    key = backward_key(do, q, k, v, o, lse, None, cu, cu, None, None, 0.5, 0.0, False, None)
    assert key is not None and key[0] == "packed"
    assert backward_key(do, q, k, v, o, lse, None, cu, cu, None, None, 0.5, 0.0, True, None) != key
    assert backward_key(do, q, k, v, o, lse, None, cu, cu, None, None, 0.5, 0.0, False, {"schedule": "v2"}) != key
    assert backward_key(do, q, k, v, o, lse, None, cu, _cu(5, 7), None, None, 0.5, 0.0, False, None) != key


def test_like_layout_allocates_packed_rows_contiguous() -> None:
    ref = torch.randn(12, 2, 8)
    t = like_layout(ref, (12, 2, 8), torch.float16)
    assert t.shape == (12, 2, 8) and t.is_contiguous() and t.dtype == torch.float16


def test_inference_mode_tensors_are_read_every_call_and_never_recorded() -> None:
    """Inference-mode tensors have no version counter (``_version`` raises): cu_seqlens made under
    ``torch.inference_mode()`` are read on every call, record nothing, and buffers made there make every call take
    the full path -- instead of a RuntimeError from torch."""
    from attncompiler.runtime.fastpath import buffer_versions
    from attncompiler.runtime.varlen import _host_values

    with torch.inference_mode():
        cu = _cu(5, 7)
        slopes = torch.rand(4)
        assert _host_values(cu) == [0, 5, 12]
        cu[1] = 3  # in place, no version bump: still seen
        assert _host_values(cu) == [0, 3, 12]
    assert _host_values(cu) == [0, 3, 12]
    q, k, v = _qkv()
    assert forward_key(q, k, v, cu, cu, None, None, 0.5, 0.0, None) is None
    assert forward_key(q, k, v, _cu(3, 9), cu, None, None, 0.5, 0.0, None) is None
    assert buffer_versions({"slopes": slopes}) is None
    assert buffer_versions({"slopes": torch.rand(4)}) == (0,)
    assert buffer_versions({}) == ()
