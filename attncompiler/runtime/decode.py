"""Launching the decode kernels: the split kernel, then (with more than one split) the combine kernel.

Both kernels take ``(AttnParams, AttnBuffers, DecodeParams)``; :data:`DECODE_PARAM_FIELDS` defines
``struct DecodeParams`` once for C (emitted into the translation unit) and ctypes.  The workspace
(``AttnParams.workspace``, allocated by the caller from :func:`workspace_floats`) holds the partial
results: ``num_splits * R * DV`` floats of normalized partial O, then ``num_splits * R`` partial LSEs,
R = B*H*Nq rows (docs/architecture.md, "Decode").  With the plan's ``fold_combine`` the split kernel
counts its splits in on one int32 counter per (batch, K/V head, row block), ``DecodeParams.counters``,
which must be zero when it starts and which its last CTA per unit leaves zero again: the counters come
from :mod:`attncompiler.runtime.counters` (zeroed once, per stream or per captured launch), or, inside
a graph capture that finds no room there, from the workspace's tail (:func:`counter_slice`), zeroed on
the launch stream first.  With ``fold_combine`` only the split kernel is launched.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from ..plan.decode import DecodePlan, SplitChoice, choose_splits
from .params import CField, ctypes_struct

__all__ = ["DECODE_PARAM_FIELDS", "COMBINE_ENTRY", "split_choice", "split_grid", "workspace_floats", "counter_slice",
           "kv_tensor_maps", "pack_decode_params", "launch_decode", "DecodeLaunch"]

COMBINE_ENTRY = "attn_decode_combine"

DECODE_PARAM_FIELDS: tuple[CField, ...] = (
    CField("num_splits", "int", "K/V chunks (gridDim.x of the split kernel)"),
    CField("group", "int", "query heads per K/V head (H / H_kv)"),
    CField("rows", "int", "rows of one K/V head's group: group * Nq"),
    CField("total_rows", "int", "rows of the output: B * H * Nq"),
    CField("counters", "int*", "fold_combine: B * H_kv * row_blocks zeroed int32 counters (left zero)"),
)


@functools.lru_cache(maxsize=1)
def _decode_params_type() -> type[ctypes.Structure]:
    return ctypes_struct("DecodeParams", DECODE_PARAM_FIELDS)


def split_choice(plan: DecodePlan, dims: Any, num_splits: int | None = None) -> SplitChoice:
    return choose_splits(plan, B=dims.B, H=dims.H, H_kv=dims.H_kv, Nq=dims.Nq, Nk=dims.Nk,
                         num_splits=num_splits)


def split_grid(choice: SplitChoice, dims: Any) -> tuple[int, int, int]:
    """The split kernel's grid: (num_splits * row_blocks, H_kv, B), blockIdx.x = split + num_splits * row block."""
    return (choice.num_splits * choice.row_blocks, dims.H_kv, dims.B)


def counter_slice(plan: DecodePlan, choice: SplitChoice, dims: Any) -> tuple[int, int]:
    """(offset, count) in 4-byte words of the fold_combine counters in the workspace: one int32 per
    (batch, K/V head, row block) after the partial LSEs; (0, 0) without fold_combine or with one split."""
    if not plan.fold_combine or choice.num_splits == 1:
        return 0, 0
    return choice.num_splits * dims.B * dims.H * dims.Nq * (dims.DV + 1), dims.B * dims.H_kv * choice.row_blocks


def workspace_floats(choice: SplitChoice, dims: Any, plan: DecodePlan | None = None) -> int:
    """Floats of workspace the split kernel uses (0 with one split: it writes the output directly):
    partial O and LSE, plus (``plan.fold_combine``) the int32 counters, one float slot each."""
    if choice.num_splits == 1:
        return 0
    n = choice.num_splits * dims.B * dims.H * dims.Nq * (dims.DV + 1)
    if plan is not None:
        n += counter_slice(plan, choice, dims)[1]
    return n


def pack_decode_params(choice: SplitChoice, dims: Any) -> ctypes.Structure:
    dp = _decode_params_type()()
    dp.num_splits = choice.num_splits
    dp.group = dims.H // dims.H_kv
    dp.rows = dp.group * dims.Nq
    dp.total_rows = dims.B * dims.H * dims.Nq
    return dp


def _check_bulk_alignment(params: ctypes.Structure) -> None:
    """The bulk loader copies whole K / V rows with cp.async.bulk: 16-byte aligned bases and row strides
    (``check_inputs`` already requires both for every schedule; checked again here, where it is assumed)."""
    from .launch import InputError

    for name in ("k", "v"):
        base = getattr(params, name) or 0
        strides = tuple(getattr(params, f"{name}_s{a}") for a in ("b", "h", "n"))
        if base % 16 or any(st % 8 for st in strides):
            raise InputError(f"{name}: the decode loader 'bulk' needs a 16-byte aligned base and row strides that are "
                             f"multiples of 8 elements (16 bytes), got address {base:#x} and strides {strides}; call "
                             f".contiguous() first or plan with loader='cp_async'")


def _zero_counters(params: ctypes.Structure, offset: int, count: int, device: Any) -> None:
    """cudaMemsetAsync of the fold_combine counters on torch's current stream (captured into a CUDA graph
    as a memset node, so every replay starts from zero too)."""
    import torch
    from cupy.cuda import runtime

    stream = torch.cuda.current_stream(device).cuda_stream
    runtime.memsetAsync(int(params.workspace) + 4 * offset, 0, 4 * count, stream)


def _counters(device: Any, count: int) -> int | None:
    """An arena's zeroed counters, or None: more than an arena holds, or a capture that finds no room."""
    from .counters import ARENA_INTS, counters

    return counters(device, count) if count <= ARENA_INTS else None


def kv_tensor_maps(params: ctypes.Structure, dims: Any, plan: DecodePlan) -> ctypes.Structure:
    """``struct DecodeMaps`` of the "tma" loader: the K and V tensor maps (boxes of 64 columns x BLOCK_N
    rows) from the packed pointers and element strides; a layout the copy engine cannot address is an
    InputError that says so."""
    from .launch import InputError
    from .tma import TmaError, encode_attn_map, tma_maps_struct

    P = params
    try:
        return tma_maps_struct((
            encode_attn_map("k", P.k, (dims.B, dims.H_kv, dims.Nk, dims.D), (P.k_sb, P.k_sh, P.k_sn), plan.dtype,
                            plan.block_n),
            encode_attn_map("v", P.v, (dims.B, dims.H_kv, dims.Nk, dims.DV), (P.v_sb, P.v_sh, P.v_sn), plan.dtype,
                            plan.block_n),
        ))
    except TmaError as e:
        raise InputError(f"decode loader 'tma': {e} (or plan with loader='cp_async')") from None


def launch_decode(ks: Any, split_fn: int, combine_fn: int, choice: SplitChoice, dims: Any,
                  params: ctypes.Structure, buffers: ctypes.Structure, device: Any,
                  maps: Callable[[ctypes.Structure], ctypes.Structure] | None = None,
                  dp: ctypes.Structure | None = None) -> None:
    """The split kernel, then the combine kernel when there is more than one split (none with the
    plan's ``fold_combine``: the split kernel merges; its counters are zeroed first).  ``maps(params)``: the
    "tma" loader's K/V maps (default: :func:`kv_tensor_maps`, encoded anew); ``dp``: the call's
    :func:`pack_decode_params` (its counters are set here; the launch copies it)."""
    from .launch import launch_structs

    plan = ks.plan
    loader = getattr(plan, "loader", "cp_async")
    if loader == "bulk":
        _check_bulk_alignment(params)
    if dp is None:
        dp = pack_decode_params(choice, dims)
    structs: tuple[ctypes.Structure, ...] = (params, buffers, dp)
    if loader == "tma":  # before any GPU work: a refused layout launches nothing
        structs += ((maps or (lambda P: kv_tensor_maps(P, dims, plan)))(params),)
    off, cnt = counter_slice(plan, choice, dims)
    if cnt:
        if not params.workspace:
            raise ValueError(f"decode fold_combine: expected a workspace of {workspace_floats(choice, dims, plan)} "
                             f"floats, got none")
        addr = _counters(device, cnt)
        if addr is None:  # a capture with no arena room, or more than an arena: the workspace's own, zeroed here
            addr = int(params.workspace) + 4 * off
            _zero_counters(params, off, cnt, device)
        dp.counters = addr
    grid = split_grid(choice, dims)
    launch_structs(split_fn, grid, ks.threads, ks.smem_bytes, structs, device)
    if choice.num_splits > 1 and not plan.fold_combine:
        warps = ks.plan.combine_warps
        rows = dp.total_rows
        launch_structs(combine_fn, (-(-rows // warps), 1, 1), 32 * warps, 0, (params, buffers, dp), device)


@dataclass
class DecodeLaunch:
    """A decode call's launches for one shape (the split and combine functions, the split choice, the buffers
    struct), with :class:`attncompiler.runtime.fastpath.FastLaunch`'s ``launch(params, device)``: a forward call
    that repeats a signature takes it from its recipe.  Per launch it still checks the "bulk" loader's alignment,
    takes the fold_combine counters of the current stream, and looks up the "tma" loader's K/V maps by the
    (k, v) pointers (encoded on a miss)."""

    ks: Any
    split_fn: int
    combine_fn: int
    choice: SplitChoice
    dims: Any
    buffers: ctypes.Structure
    keep: tuple[Any, ...] = ()
    _maps: Callable[[ctypes.Structure], ctypes.Structure] | None = field(default=None, repr=False)
    _dp: ctypes.Structure | None = field(default=None, repr=False)

    def launch(self, params: ctypes.Structure, device: Any) -> None:
        if self._dp is None:
            from .fastpath import maps_by_pointers

            self._dp = pack_decode_params(self.choice, self.dims)
            dims, plan = self.dims, self.ks.plan
            self._maps = maps_by_pointers(lambda P: kv_tensor_maps(P, dims, plan), ("k", "v"))
        launch_decode(self.ks, self.split_fn, self.combine_fn, self.choice, self.dims, params, self.buffers, device,
                      maps=self._maps, dp=type(self._dp).from_buffer_copy(self._dp))  # (a copy per launch: threads)
