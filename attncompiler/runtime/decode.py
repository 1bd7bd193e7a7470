"""Launching the decode kernels: the split kernel, then (with more than one split) the combine kernel.

Both kernels take ``(AttnParams, AttnBuffers, DecodeParams)``; :data:`DECODE_PARAM_FIELDS` defines
``struct DecodeParams`` once for C (emitted into the translation unit) and ctypes.  The workspace
(``AttnParams.workspace``, allocated by the caller from :func:`workspace_floats`) holds the partial
results: ``num_splits * R * DV`` floats of normalized partial O, then ``num_splits * R`` partial LSEs,
R = B*H*Nq rows (docs/architecture.md, "Decode").
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

from ..plan.decode import DecodePlan, SplitChoice, choose_splits
from .params import CField, ctypes_struct

__all__ = ["DECODE_PARAM_FIELDS", "COMBINE_ENTRY", "split_choice", "workspace_floats", "pack_decode_params",
           "launch_decode"]

COMBINE_ENTRY = "attn_decode_combine"

DECODE_PARAM_FIELDS: tuple[CField, ...] = (
    CField("num_splits", "int", "K/V chunks (gridDim.x of the split kernel)"),
    CField("group", "int", "query heads per K/V head (H / H_kv)"),
    CField("rows", "int", "rows of one K/V head's group: group * Nq"),
    CField("total_rows", "int", "rows of the output: B * H * Nq"),
)


@functools.lru_cache(maxsize=1)
def _decode_params_type() -> type[ctypes.Structure]:
    return ctypes_struct("DecodeParams", DECODE_PARAM_FIELDS)


def split_choice(plan: DecodePlan, dims: Any, num_splits: int | None = None) -> SplitChoice:
    return choose_splits(plan, B=dims.B, H=dims.H, H_kv=dims.H_kv, Nq=dims.Nq, Nk=dims.Nk,
                         num_splits=num_splits)


def workspace_floats(choice: SplitChoice, dims: Any) -> int:
    """Floats of workspace the split kernel writes (0 with one split: it writes the output directly)."""
    if choice.num_splits == 1:
        return 0
    return choice.num_splits * dims.B * dims.H * dims.Nq * (dims.DV + 1)


def pack_decode_params(choice: SplitChoice, dims: Any) -> ctypes.Structure:
    dp = _decode_params_type()()
    dp.num_splits = choice.num_splits
    dp.group = dims.H // dims.H_kv
    dp.rows = dp.group * dims.Nq
    dp.total_rows = dims.B * dims.H * dims.Nq
    return dp


def launch_decode(ks: Any, split_fn: int, combine_fn: int, choice: SplitChoice, dims: Any,
                  params: ctypes.Structure, buffers: ctypes.Structure, device: Any) -> None:
    """The split kernel, then the combine kernel when there is more than one split."""
    from .launch import launch_structs

    dp = pack_decode_params(choice, dims)
    grid = (choice.num_splits, dims.B * dims.H_kv, choice.row_blocks)
    launch_structs(split_fn, grid, ks.threads, ks.smem_bytes, (params, buffers, dp), device)
    if choice.num_splits > 1:
        warps = ks.plan.combine_warps
        rows = dp.total_rows
        launch_structs(combine_fn, (-(-rows // warps), 1, 1), 32 * warps, 0, (params, buffers, dp), device)
