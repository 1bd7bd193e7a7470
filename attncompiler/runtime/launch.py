"""Checks inputs and launches a compiled kernel on torch's current stream.

Everything the kernel assumes is checked here first, with an error that names what was expected
and what was got, so that bad input never reaches the driver as an illegal memory access.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Mapping

import torch

from ..ir.types import AttentionIR
from ..philox import dropout_threshold
from . import blockstats
from .params import PARAM_FIELDS, buffer_fields, ctypes_struct, set_strides

__all__ = ["InputError", "AttnInputs", "check_inputs", "check_index_limit", "check_out", "prepare_buffers", "pack_params",
           "launch", "launch_structs", "raw_stream", "device_index"]

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_MAX_GRID_YZ = 65535  # the launch grid's y and z limits: the heads go on y, the batch on z (common.cuh: ac_grid_bh)


class InputError(ValueError):
    """The tensors given do not fit the compiled kernel."""


@dataclass(frozen=True)
class AttnInputs:
    """Validated problem sizes."""

    B: int
    H: int
    H_kv: int
    Nq: int
    Nk: int
    D: int
    DV: int


def _desc(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {t.dtype} on {t.device}"


@functools.lru_cache(maxsize=512)
def _index_limit(ir: AttentionIR) -> int | None:
    from ..codegen.hooks import fast_index_limit
    return fast_index_limit(ir)


def check_index_limit(ir: AttentionIR, **dims: int) -> None:
    """Refuse sizes beyond what the variant's hooks are exact for: hooks that turn token indices into
    floats use a fast conversion exact up to :data:`attncompiler.codegen.cuda_printer.FAST_INDEX_LIMIT`."""
    limit = _index_limit(ir)
    if limit is not None and max(dims.values(), default=0) > limit:
        got = ", ".join(f"{k}={v}" for k, v in dims.items())
        raise InputError(f"sizes: expected every one of {', '.join(dims)} <= {limit} for this variant, whose "
                         f"score/mask hooks convert token indices to float (exact up to {limit}), got {got}")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ir: AttentionIR) -> AttnInputs:
    """Validate q (B, H, Nq, D), k (B, H_kv, Nk, D), v (B, H_kv, Nk, DV) for ``ir``.

    Order: type, rank and dtype of each tensor, then the shapes, then the device (so a shape or
    dtype mistake is reported even for CPU tensors, and nothing touches CUDA before every check
    has passed), then the launch limits and the memory layout."""
    want = _TORCH_DTYPES[ir.dtype]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name}: expected 4 dims (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
        if t.dtype != want:
            hint = (f"cast the input or compile a spec with dtype={t.dtype}" if t.dtype in _TORCH_DTYPES.values()
                    else f"cast the input with .to({want}) (the kernels take bf16 or fp16, with float32 accumulation)")
            raise InputError(f"{name}: expected dtype {want} (the spec's dtype {ir.dtype!r}), got {t.dtype}; {hint}")
    B, H, Nq, D = q.shape
    Bk, H_kv, Nk, Dk = k.shape
    Bv, H_v, Nv, DV = v.shape
    if D != ir.head_dim:
        raise InputError(f"q: expected head_dim {ir.head_dim} (compiled), got {D} in shape {tuple(q.shape)}")
    if Dk != ir.head_dim:
        raise InputError(f"k: expected head_dim {ir.head_dim} (compiled), got {Dk} in shape {tuple(k.shape)}")
    if DV != ir.head_dim_v:
        raise InputError(f"v: expected head_dim_v {ir.head_dim_v} (compiled), got {DV} in shape {tuple(v.shape)}")
    if not (B == Bk == Bv):
        raise InputError(f"batch: expected q, k, v to share it, got {B}, {Bk}, {Bv}")
    if H_kv != H_v or Nk != Nv:
        raise InputError(f"k and v: expected the same heads and seqlen, got k {_desc(k)} and v {_desc(v)}")
    if H_kv == 0 or H % H_kv != 0:
        raise InputError(f"heads: expected q heads ({H}) to be a multiple of k/v heads ({H_kv})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda:
            raise InputError(f"{name}: expected a CUDA tensor, got a tensor on {t.device}; move it with .cuda()")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}")
    if B > _MAX_GRID_YZ or H > _MAX_GRID_YZ:
        raise InputError(f"batch and heads: expected each at most {_MAX_GRID_YZ} (the launch grid's z and y limits), "
                         f"got B={B}, H={H}")
    if B * H >= 2**31:
        raise InputError(f"batch*heads: expected < 2^31 (the kernels' int (batch, head) index), got {B * H}")
    if max(Nq, Nk) >= 2**31 - 1024:
        raise InputError(f"seqlen: expected < 2^31, got Nq={Nq}, Nk={Nk}")
    check_index_limit(ir, B=B, H=H, Nq=Nq, Nk=Nk)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() == 0:
            continue
        st = t.stride()
        if st[3] != 1:
            raise InputError(
                f"{name}: expected a contiguous head dimension (stride 1), got strides {st}; "
                f"call .contiguous() first"
            )
        if st[0] % 8 or st[1] % 8 or st[2] % 8 or t.data_ptr() % 16:
            raise InputError(
                f"{name}: expected 16-byte aligned rows (strides multiples of 8 elements, 16-byte aligned "
                f"base), got strides {st} and address {t.data_ptr():#x}; call .contiguous() first"
            )
    return AttnInputs(B, H, H_kv, Nq, Nk, D, DV)


def check_out(out: torch.Tensor, want: tuple[int, ...], q: torch.Tensor) -> torch.Tensor:
    """A caller's ``out`` tensor, checked: shape ``want`` (the head dim last), q's dtype and device, a
    contiguous head dim and 16-byte aligned rows (the other strides multiples of 8 elements, 16-byte
    aligned base)."""
    if tuple(out.shape) != want or out.dtype != q.dtype or out.device != q.device:
        raise InputError(f"out: expected {want} {q.dtype} on {q.device}, got {tuple(out.shape)} {out.dtype} "
                         f"on {out.device}")
    if out.numel() and (out.stride(-1) != 1 or any(s % 8 for s in out.stride()[:-1]) or out.data_ptr() % 16):
        raise InputError(f"out: expected a contiguous head dim and 16-byte aligned rows, got strides "
                         f"{out.stride()}")
    return out


def prepare_buffers(ir: AttentionIR, values: Mapping[str, torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Contiguous float32 / int32 copies of the captured buffers, in the IR's order, on ``device``."""
    out: list[torch.Tensor] = []
    for info in ir.buffers:
        if info.name not in values:
            raise InputError(f"buffer {info.name!r}: expected a tensor for it (captured by the spec), got none")
        t = values[info.name]
        if not isinstance(t, torch.Tensor):
            raise InputError(f"buffer {info.name!r}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != info.ndim:
            raise InputError(f"buffer {info.name!r}: expected {info.ndim} dims, got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise InputError(f"buffer {info.name!r}: expected a non-empty tensor, got shape {tuple(t.shape)}")
        if t.dtype.is_complex or (info.kind == "int" and t.is_floating_point()):
            kind = "a float or int" if info.kind == "float" else "an int or bool"
            raise InputError(f"buffer {info.name!r}: expected {kind} tensor (the spec captured a {info.kind} buffer), "
                             f"got dtype {t.dtype}")
        want = torch.float32 if info.kind == "float" else torch.int32
        out.append(blockstats.device_copy(t, device, want))  # cached per buffer version
    return out


@functools.lru_cache(maxsize=None)
def _params_type() -> type[ctypes.Structure]:
    return ctypes_struct("AttnParams", PARAM_FIELDS)


@functools.lru_cache(maxsize=256)
def _buffers_type(buffers: tuple) -> type[ctypes.Structure]:
    return ctypes_struct("AttnBuffers", buffer_fields(buffers))


def pack_params(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    workspace: torch.Tensor | None,
    dims: AttnInputs,
    *,
    scale: float,
    dropout_p: float,
    seed: int,
    offset: int,
    ir: AttentionIR,
    buffers: list[torch.Tensor],
    rng_state: torch.Tensor | None = None,
) -> tuple[ctypes.Structure, ctypes.Structure]:
    """The two by-value kernel arguments.  ``rng_state``: dropout's int64 [seed, offset] on the device, which the
    kernels read in place of ``seed`` and ``offset`` (runtime/rng.py)."""
    P = _params_type()()
    P.q, P.k, P.v, P.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    P.lse = lse.data_ptr() if lse is not None else None
    P.workspace = workspace.data_ptr() if workspace is not None else None
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        set_strides(P, name, t.stride())
    P.B, P.H, P.H_kv, P.Nq, P.Nk = dims.B, dims.H, dims.H_kv, dims.Nq, dims.Nk
    P.scale = scale
    P.dropout_p = dropout_p
    P.dropout_threshold = dropout_threshold(dropout_p)
    P.dropout_rescale = 1.0 / (1.0 - dropout_p)
    P.seed = seed & (2**64 - 1)
    P.offset = offset & (2**64 - 1)
    P.rng_state = rng_state.data_ptr() if rng_state is not None else None
    Bf = _buffers_type(ir.buffers)()
    for info, t in zip(ir.buffers, buffers):
        setattr(Bf, info.name, t.data_ptr())
        for i in range(info.ndim):
            setattr(Bf, f"{info.name}_d{i}", t.shape[i])
    Bf._ac_keep = blockstats.fill_tables(Bf, ir, buffers)  # granule tables of the tile classifier's reads
    return P, Bf


def launch(
    function_ptr: int,
    grid: tuple[int, int, int],
    block: int,
    smem_bytes: int,
    params: ctypes.Structure,
    buffers: ctypes.Structure,
    device: torch.device,
) -> None:
    """cuLaunchKernel on torch's current stream of ``device``."""
    launch_structs(function_ptr, grid, block, smem_bytes, (params, buffers), device)


def launch_structs(
    function_ptr: int,
    grid: tuple[int, int, int],
    block: int,
    smem_bytes: int,
    structs: tuple[ctypes.Structure, ...],
    device: torch.device | int,
) -> None:
    """cuLaunchKernel with the by-value struct arguments ``structs`` (in order) on torch's current stream of
    ``device`` (a device or its index)."""
    from cupy.cuda import driver

    idx = device if isinstance(device, int) else device.index
    args = (ctypes.c_void_p * len(structs))(*(ctypes.addressof(s) for s in structs))
    driver.launchKernel(function_ptr, grid[0], grid[1], grid[2], block, 1, 1, smem_bytes, raw_stream(idx),
                        ctypes.addressof(args), 0)


def device_index(device: torch.device) -> int:
    """The CUDA device index of ``device`` (a bare ``cuda`` device: the current one)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def raw_stream(device_index: int | None) -> int:
    """torch's current stream on ``device_index`` (None: the current device) as a CUstream handle, through torch's
    C accessor (no Stream object: ~0.2 µs where ``torch.cuda.current_stream(...).cuda_stream`` took 4-6 µs on an
    H200's host)."""
    if device_index is None:
        device_index = torch.cuda.current_device()
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return int(getter(device_index))
    return int(torch.cuda.current_stream(device_index).cuda_stream)
