"""Device tensors that outlive the call that made them (caches, counter arenas), in memory torch's allocator does not
own.

The runtime keeps a few device tensors across calls: the device copies and range tables of captured buffers
(:mod:`.blockstats`), the sliding window's tile lists (:mod:`.tile_list`) and the zeroed counter arenas
(:mod:`.counters`). ``torch.compile(mode="reduce-overhead")`` runs a step once before it captures it, and while it
does, every allocation of the thread comes from the CUDA graph's memory pool; a cached tensor made then would be a
live block in that pool that is no output of the graph, which inductor refuses ("tensor(s) in the cudagraph pool not
tracked as outputs") and which a later replay could overwrite. So these tensors take their memory from CuPy's pool
(CuPy is the runtime's compiler and driver binding already) and are wrapped by DLPack; the copy or fill that gives
them their contents runs on torch's current stream, ordered before the launch that reads them.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["persistent_copy", "persistent_zeros"]

_CUPY_DTYPES = {torch.float32: "float32", torch.int32: "int32", torch.int64: "int64", torch.float16: "float16",
                torch.uint8: "uint8"}


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    import cupy

    name = _CUPY_DTYPES.get(dtype)
    if name is None:
        raise TypeError(f"persistent tensors: expected a dtype among {sorted(map(str, _CUPY_DTYPES))}, got {dtype}")
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with cupy.cuda.Device(index):
        arr = cupy.empty(shape, dtype=name)
    return torch.from_dlpack(arr)


def persistent_copy(t: torch.Tensor, device: Any = None) -> torch.Tensor:
    """A contiguous copy of ``t`` on ``device`` (default: t's, a CUDA device) in memory outside torch's allocator
    (see the module)."""
    out = _empty(tuple(t.shape), t.dtype, t.device if device is None else device)
    return out.copy_(t)


def persistent_zeros(n: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``n`` zeros of ``dtype`` on ``device``, in memory outside torch's allocator (see the module)."""
    return _empty((n,), dtype, device).zero_()
