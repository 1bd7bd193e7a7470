"""Per-granule (min, max) tables of int buffers: the run-time half of tile classification by buffer.

A mask that reads an int buffer along ``q_idx`` / ``kv_idx`` (document ids: ``doc[q_idx] ==
doc[kv_idx]``) is classified per tile from the value range of each read over the tile's indices
(:mod:`attncompiler.ir.bufreads`).  The generated ``Variant::tile_class`` takes that range exactly:
raw entries up to / from a granule boundary and, for the whole granules between, the *range table*
``AttnBuffers.<name>_gminmax``: int32 of shape ``(*other dims, levels, ng, 2)`` -- the buffer's other
dims in order, then ``levels = floor(log2(ng)) + 1`` levels over the ``ng = ceil(n / GRANULE)``
granules of :data:`~attncompiler.ir.bufreads.GRANULE` (16) entries along the read's range axis
(length ``n``); level ``k`` at granule ``g`` holds the (min, max) of granules ``[g, g + 2^k)``
(clipped at the end), so a run of granules is two entries of one level.  The granule does not
depend on the plan, so any kernel's row ranges (per CTA, per warpgroup, per decode head) read the
same table.  There is no block-mask tensor; the table is ``O(n log n)`` int32s per buffer row.

Every launch fills the pointers through :func:`attncompiler.runtime.launch.pack_params` (forward
v1 / v2 / v3, decode, backward, varlen: all of them pack their ``AttnBuffers`` there); a null
pointer only makes the classifier say PARTIAL.

Cost.  The table is two torch reductions on the buffer's device, cached per buffer *version*: the
key is ``(data_ptr, _version, shape, strides, dtype, device)`` and the cache holds a reference to
the tensor (so its memory cannot be reused while the key lives); in-place updates bump
``_version`` and miss.  The device copy of every buffer (``prepare_buffers``: int32 or float32) is
cached the same way, so repeated calls with the same buffer launch nothing extra; a copy from the
CPU (a buffer captured there, ALiBi's slopes say) is also keyed by a hash of the contents, so that
edits through ``.data`` are seen there, and it no longer waits for the stream at every call.  Not cached (recomputed on
each call): inference-mode tensors (no version counter) and calls during CUDA-graph capture (the
captured graph must recompute the table from the buffer on replay).  Cached values live outside torch's allocator
(:mod:`.persistent`: a CUDA graph's pool must hold no tensor that outlives the graph's call).  Writes that bypass the
version counter (``.data``, DLPack, raw pointers) are not seen: call :func:`clear_cache` after them.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
from collections import OrderedDict
from typing import Any, Callable

import torch

from ..ir.bufreads import GRANULE, granule_count, level_count
from ..ir.types import AttentionIR

__all__ = ["CACHE_SIZE", "table_axes", "granule_minmax", "range_table", "device_int32", "granule_table",
           "fill_tables", "clear_cache"]

#: Cached entries (device copies and tables), least recently used first out.
CACHE_SIZE = 32

_lock = threading.Lock()
_cache: "OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]]" = OrderedDict()


@functools.lru_cache(maxsize=512)
def _axes(mask: Any, buffers: tuple) -> tuple[tuple[str, int], ...]:
    from ..ir.bounds import tile_classifier

    return tuple(sorted({(r.name, r.axis) for r in tile_classifier(mask, buffers).reads}))


def table_axes(ir: AttentionIR) -> dict[str, int]:
    """The int buffers ``ir``'s tile classifier reads, each with its range axis (cached per mask)."""
    if ir.mask_expr is None or not ir.buffers:
        return {}
    return dict(_axes(ir.mask_expr, tuple(ir.buffers)))


def granule_minmax(t: torch.Tensor, axis: int) -> torch.Tensor:
    """int32 ``(*other dims, ceil(n / GRANULE), 2)``: (min, max) of ``t``'s entries per granule of
    GRANULE along ``axis`` (computed on ``t``'s device; the last granule may be short)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.numel() == 0:
        raise ValueError(f"expected a non-empty tensor with at least one dim, got {getattr(t, 'shape', t)!r}")
    if t.is_floating_point() or t.is_complex():
        raise ValueError(f"expected an int or bool tensor, got dtype {t.dtype}")
    if not -t.dim() <= axis < t.dim():
        raise ValueError(f"axis: expected a dim of a {t.dim()}-d tensor, got {axis}")
    x = t.to(torch.int32).movedim(axis, -1)
    n = x.shape[-1]
    ng = granule_count(n)
    pad = ng * GRANULE - n
    if pad:  # repeat the last entry: the short last granule's min / max are unchanged
        x = torch.cat([x, x[..., -1:].expand(*x.shape[:-1], pad)], dim=-1)
    mn, mx = torch.aminmax(x.reshape(*x.shape[:-1], ng, GRANULE), dim=-1)
    return torch.stack([mn, mx], dim=-1).contiguous()


def range_table(t: torch.Tensor, axis: int) -> torch.Tensor:
    """int32 ``(*other dims, levels, ng, 2)``: level k at granule g = (min, max) of the granules
    ``[g, min(g + 2^k, ng))`` of :func:`granule_minmax` (the table the kernels read)."""
    level = granule_minmax(t, axis)
    ng = level.shape[-2]
    levels = [level]
    for k in range(1, level_count(ng)):
        s = 1 << (k - 1)
        tail = level[..., -1:, :].expand(*level.shape[:-2], s, 2)
        ahead = torch.cat([level[..., s:, :], tail], dim=-2)  # entry g + s, the last one past the end
        level = torch.stack([torch.minimum(level[..., 0], ahead[..., 0]), torch.maximum(level[..., 1], ahead[..., 1])],
                            dim=-1)
        levels.append(level)
    return torch.stack(levels, dim=-3).contiguous()


def _key(tag: str, t: torch.Tensor, extra: Any) -> tuple | None:
    """The cache key of ``t``'s current contents, or None where caching is unsafe."""
    if t.is_inference():
        return None
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return None  # a graph must compute from the buffer on replay, and own what it reads
    return (tag, t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), extra)


def _cached(tag: str, t: torch.Tensor, extra: Any, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    key = _key(tag, t, extra)
    if key is None:
        return make()
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit[1]
    value = make()
    if value.is_cuda:  # kept across calls: outside a CUDA graph's pool (runtime/persistent.py)
        from .persistent import persistent_copy

        value = persistent_copy(value)
    with _lock:
        _cache[key] = (t, value)  # t held: its address cannot be reused while the key lives
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return value


def device_copy(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous ``dtype`` copy of ``t`` on ``device`` (``t`` itself when it already is one), cached per
    version of ``t``: a buffer captured on the CPU (ALiBi's slopes, say) is copied once, not at every call,
    where the copy from pageable memory also waited for the stream."""
    if t.dtype == dtype and t.device == torch.device(device) and t.is_contiguous():
        return t
    extra: Any = str(device)
    if t.device.type == "cpu":  # keyed by the contents too: an edit through .data leaves the version alone
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        extra = (extra, hashlib.blake2b(raw.tobytes(), digest_size=16).hexdigest())
    return _cached(str(dtype), t, extra, lambda: t.detach().to(device=device, dtype=dtype).contiguous())


def device_int32(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A contiguous int32 copy of ``t`` on ``device`` (``t`` itself when it already is one), cached."""
    return device_copy(t, device, torch.int32)


def granule_table(t: torch.Tensor, axis: int) -> torch.Tensor:
    """:func:`range_table` of ``t`` along ``axis``, cached per version of ``t``."""
    return _cached("table", t, axis, lambda: range_table(t, axis))


def fill_tables(structure: ctypes.Structure, ir: AttentionIR, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Set ``<name>_gminmax`` of a packed ``AttnBuffers`` for the buffers the classifier reads
    (``tensors``: prepare_buffers' output, in ``ir.buffers`` order).  Returns the tables, which
    the caller keeps alive until the launch is issued."""
    axes = table_axes(ir)
    out: list[torch.Tensor] = []
    for info, t in zip(ir.buffers, tensors):
        axis = axes.get(info.name)
        if axis is None:
            continue
        if axis >= t.dim():
            raise ValueError(f"buffer {info.name!r}: expected {info.ndim} dims, got shape {tuple(t.shape)}")
        table = granule_table(t, axis)
        setattr(structure, f"{info.name}_gminmax", table.data_ptr())
        out.append(table)
    return out


def clear_cache() -> None:
    """Forget every cached device copy and table."""
    with _lock:
        _cache.clear()
