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

:func:`settled_zeros` is for the one tensor that a CUDA graph capture may be the first to need (the packed kernels'
error word): it allocates and zeroes outside the capture even while one runs.
"""
from __future__ import annotations

import ctypes
import functools
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = ["persistent_copy", "persistent_zeros", "settled_zeros", "relaxed_capture_mode"]

#: CUstreamCaptureMode's CU_STREAM_CAPTURE_MODE_RELAXED (cuda.h)
_CAPTURE_MODE_RELAXED = 2

_CUPY_DTYPES = {torch.float32: "float32", torch.int32: "int32", torch.int64: "int64", torch.float16: "float16",
                torch.uint8: "uint8"}


def _cupy_target(dtype: torch.dtype, device: Any) -> tuple[str, int]:
    """CuPy's name for ``dtype`` and the CUDA device index of ``device`` (the current one when it names none)."""
    name = _CUPY_DTYPES.get(dtype)
    if name is None:
        raise TypeError(f"persistent tensors: expected a dtype among {sorted(map(str, _CUPY_DTYPES))}, got {dtype}")
    dev = torch.device(device)
    return name, dev.index if dev.index is not None else torch.cuda.current_device()


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    import cupy

    name, index = _cupy_target(dtype, device)
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


@functools.lru_cache(maxsize=1)
def _exchange_capture_mode() -> Any:
    fn = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return fn


@contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """The calling thread's stream-capture mode set to relaxed for the block, then restored
    (``cuThreadExchangeStreamCaptureMode``). While a capture runs in the default global mode, the driver refuses the
    calls that do not enqueue on a stream (an allocation, a stream synchronization) and invalidates the capture;
    relaxed, it lets them through, and they stay out of the graph."""
    fn = _exchange_capture_mode()
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    rc = fn(ctypes.byref(mode))
    if rc != 0:
        raise RuntimeError(f"cuThreadExchangeStreamCaptureMode: expected CUDA_SUCCESS, got error {rc}")
    try:
        yield
    finally:
        fn(ctypes.byref(mode))  # (mode now holds the previous one)


def settled_zeros(n: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``n`` zeros of ``dtype`` on ``device`` outside torch's allocator, zeroed when this returns, also while a CUDA
    graph capture runs on the thread: the memory comes from CuPy's pool and the memset runs on a private stream that
    is then synchronized, all in the relaxed capture mode, so neither enters a graph."""
    import cupy

    name, index = _cupy_target(dtype, device)
    with relaxed_capture_mode():
        side = torch.cuda.Stream(index)
        # cupy's memset and the DLPack hand-over on the side stream: nothing waits on, or records into, another one
        with torch.cuda.stream(side), cupy.cuda.Device(index), cupy.cuda.ExternalStream(side.cuda_stream):
            out = torch.from_dlpack(cupy.zeros((n,), dtype=name))
        side.synchronize()
    return out
