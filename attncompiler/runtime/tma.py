"""TMA tensor maps (CUtensorMap) for the v3 kernels, built with cuTensorMapEncodeTiled.

The driver entry point is called through ctypes on ``libcuda.so.1`` (no CUDA Python dependency).
A map describes one (B, H, N, D) attention tensor as a 4-d tensor (D innermost, then N, H, B)
with its byte strides, and the box one TMA copy moves: 64 columns (128 bytes, the 128-byte swizzle's
row) x ``box_rows`` rows of one (batch, head).  Rows past N are zero-filled by the copy engine.
Maps depend only on the pointer, shape, strides and box, so they are cached.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from .launch import InputError

__all__ = ["TmaMap", "encode_attn_map", "tma_maps_struct", "maps_struct", "attn_maps", "TMA_BOX_COLS", "TmaError",
           "tma_layout_error", "O_BOX_ROWS"]

TMA_BOX_COLS = 64  # 64 x 2 bytes = 128 bytes: the inner box extent SWIZZLE_128B allows

# cuda.h enums (CUDA 12 driver API)
_DTYPE = {"bf16": 9, "fp16": 6}  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 / FLOAT16
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_OOB_FILL_ZERO = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements read as zeros
_STRIDE_LIMIT = 1 << 40


class TmaError(InputError):
    """The driver refused to describe a tensor as a TMA map."""


class TmaMap(ctypes.Structure):
    """CUtensorMap: 128 opaque bytes (64-byte aligned on the device; the launch copies it)."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


@functools.lru_cache(maxsize=1)
def _encode_fn():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]
    return fn


_lock = threading.Lock()
_cache: dict[tuple, bytes] = {}
_CACHE_MAX = 512


def _geometry(name: str, shape: tuple[int, int, int, int], strides: tuple[int, int, int],
              es: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(dims innermost first, byte strides of dims 1..3); size-1 dims get a harmless stride."""
    B, H, N, D = shape
    sb, sh, sn = strides
    bn = sn * es if N > 1 else D * es
    bh = sh * es if H > 1 else N * bn
    bb = sb * es if B > 1 else H * bh
    for label, s in (("seqlen", bn), ("heads", bh), ("batch", bb)):
        if s <= 0 or s % 16 or s >= _STRIDE_LIMIT:
            raise TmaError(f"{name}: expected a {label} stride the copy engine can address (a positive multiple of "
                           f"16 bytes below 2^40), got {s} bytes (element strides {strides}); call .contiguous() "
                           f"first")
    return (D, N, H, B), (bn, bh, bb)


def tma_layout_error(name: str, t: Any) -> str | None:
    """Why the strides of a (B, H, N, D) tensor ``t`` cannot be described as a TMA map (e.g. heads
    broadcast by ``.expand()``: stride 0), or None when they can.  No driver call; the answer is cached
    per (shape, strides, element size), so a launch path may ask it on every call."""
    return _layout_error(name, t.shape, t.stride()[:3], t.element_size())


@functools.lru_cache(maxsize=1024)
def _layout_error(name: str, shape: tuple[int, ...], strides: tuple[int, ...], es: int) -> str | None:
    try:
        _geometry(name, tuple(int(x) for x in shape), tuple(int(x) for x in strides), int(es))
    except TmaError as e:
        return str(e)
    return None


def encode_attn_map(name: str, ptr: int, shape: tuple[int, int, int, int], strides: tuple[int, int, int],
                    dtype: str, box_rows: int) -> bytes:
    """The 128-byte CUtensorMap of a (B, H, N, D) tensor at ``ptr`` with element strides (s_b, s_h, s_n)
    (the head dim contiguous), ``dtype`` "bf16" / "fp16", boxes of 64 columns x ``box_rows`` rows."""
    if dtype not in _DTYPE:
        raise TmaError(f"{name}: expected dtype bf16 or fp16, got {dtype!r}")
    dims, bstrides = _geometry(name, tuple(int(x) for x in shape), tuple(int(x) for x in strides), 2)
    key = (int(ptr), dims, bstrides, dtype, box_rows)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    if not 1 <= box_rows <= 256:
        raise TmaError(f"{name}: expected box rows in [1, 256], got {box_rows}")
    if ptr % 16:
        raise TmaError(f"{name}: expected a 16-byte aligned base address, got {ptr:#x}")
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) & ~63
    gdim = (ctypes.c_uint64 * 4)(*dims)
    gstride = (ctypes.c_uint64 * 3)(*bstrides)
    box = (ctypes.c_uint32 * 4)(TMA_BOX_COLS, box_rows, 1, 1)
    estride = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    rc = _encode_fn()(addr, _DTYPE[dtype], 4, ptr, gdim, gstride, box, estride, _INTERLEAVE_NONE,
                      _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZERO)
    if rc != 0:
        raise TmaError(f"{name}: cuTensorMapEncodeTiled failed (CUresult {rc}) for dims {dims}, byte strides "
                       f"{bstrides}, box ({TMA_BOX_COLS}, {box_rows}); expected a tensor the copy engine can "
                       f"address -- call .contiguous() first")
    out = ctypes.string_at(addr, 128)
    with _lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = out
    return out


def tma_maps_struct(maps: tuple[bytes, ...]) -> ctypes.Structure:
    """A by-value kernel argument holding the given maps in order (``struct V3Maps``)."""
    cls = _maps_type(len(maps))
    s = cls()
    for i, m in enumerate(maps):
        ctypes.memmove(ctypes.addressof(s) + 128 * i, m, 128)
    return s


@functools.lru_cache(maxsize=None)
def _maps_type(n: int) -> type[ctypes.Structure]:
    return type(f"TmaMaps{n}", (ctypes.Structure,), {"_fields_": [(f"m{i}", TmaMap) for i in range(n)]})


_struct_cache: dict[tuple, ctypes.Structure] = {}


def maps_struct(entries: tuple[tuple[str, int, tuple, tuple, str, int], ...]) -> ctypes.Structure:
    """:func:`tma_maps_struct` of ``encode_attn_map(*e)`` for each entry (name, ptr, shape, strides, dtype,
    box_rows), cached whole by the entries: a repeated launch costs one dictionary lookup instead of a
    geometry check, a map lookup and a 128-byte copy per tensor (py-spy, fifteenth session: the per-map
    path was 7 % of a small training step's main thread).  The struct is only ever read (the launch copies
    it), so one object serves every call with the same key."""
    with _lock:
        hit = _struct_cache.get(entries)
    if hit is not None:
        return hit
    s = tma_maps_struct(tuple(encode_attn_map(*e) for e in entries))
    with _lock:
        if len(_struct_cache) >= _CACHE_MAX:
            _struct_cache.clear()
        _struct_cache[entries] = s
    return s


#: rows of the o map's box (``attn_maps(with_o=True)``): one consumer warpgroup's rows, the TMA stores' unit
O_BOX_ROWS = 64


def attn_maps(params: ctypes.Structure, dims, dtype: str, box_q: int, box_kv: int,
              with_o: bool = False) -> ctypes.Structure:
    """``struct V3Maps`` (q, k, v) from packed AttnParams (pointers, element strides) and sizes; ``with_o``:
    ``struct V3MapsO`` (q, k, v, o; o in boxes of :data:`O_BOX_ROWS` rows)."""
    P = params
    entries = (
        ("q", P.q, (dims.B, dims.H, dims.Nq, dims.D), (P.q_sb, P.q_sh, P.q_sn), dtype, box_q),
        ("k", P.k, (dims.B, dims.H_kv, dims.Nk, dims.D), (P.k_sb, P.k_sh, P.k_sn), dtype, box_kv),
        ("v", P.v, (dims.B, dims.H_kv, dims.Nk, dims.DV), (P.v_sb, P.v_sh, P.v_sn), dtype, box_kv),
    )
    if with_o:
        entries += (("o", P.o, (dims.B, dims.H, dims.Nq, dims.DV), (P.o_sb, P.o_sh, P.o_sn), dtype, O_BOX_ROWS),)
    return maps_struct(entries)
