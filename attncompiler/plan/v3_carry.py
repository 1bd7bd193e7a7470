"""v3 planning: carried tiles (plan option ``carry_tiles``) on the persistent grid.

On the persistent grid a consumer warpgroup runs tile after tile.  Without carrying, each tile starts with its
first S GEMM alone (nothing else on the tensor cores for this warpgroup, then a wait) and its first softmax with
no GEMM under it, and ends with its last P V alone and the epilogue: a fixed cost per tile that short K/V loops
(sliding windows: 9 blocks per tile at W = 1024) pay often.  With ``carry_tiles`` the tail of tile t issues the
first S GEMM of tile t + 1 in the same GEMM turn as t's last P V, runs t + 1's first softmax while that P V
does, and only then writes t's O (``templates/include/attncompiler/v3_fwd.cuh``, ``kCarry``).  The next tile's Q
must have landed by then, so the kernel keeps two Q tiles (the producer loads tile t + 1's Q while t runs).

Where it applies: the persistent grid (one CTA per tile has no next tile), every consumer warpgroup running every
block of the CTA's walk (no ``half_blocks``; with a mask and two or more consumers, BLOCK_N >= BLOCK_M, else each
warpgroup walks its own run of blocks), and shared memory for the second Q tile.

Pure functions over named constants; the numbers behind each constant are in its comment.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .model import PlanError

__all__ = ["CARRY_TILES_DEFAULT", "carry_blocker", "with_carry"]

#: ``carry_tiles`` by default where it applies and the second Q tile leaves the plan's BLOCK_N and K/V stages
#: (measured: docs/perf-notes.md, thirty-second session).
CARRY_TILES_DEFAULT = False


def carry_blocker(plan: Any, masked: bool) -> str | None:
    """Why ``plan`` (a V3Plan) cannot carry tiles (None: it can)."""
    if not plan.persistent:
        return "one CTA per tile (carried tiles run on the persistent grid)"
    if plan.half_blocks:
        return "half_blocks (a warpgroup's GEMMs over part of a block)"
    if masked and plan.consumers >= 2 and plan.block_n < plan.block_m:
        return (f"a mask with BLOCK_N {plan.block_n} < BLOCK_M {plan.block_m} (each consumer warpgroup walks its own "
                f"run of blocks)")
    return None


def with_carry(plan: Any, ir_or_dims: Any, target: Any, carry_tiles: bool | None, *, stages_forced: bool) -> Any:
    """``plan`` with ``carry_tiles`` decided: forced on (refused with the reason where it cannot be; the second Q
    tile may cost K/V stages unless ``stages_forced``), forced off, or CARRY_TILES_DEFAULT where it applies and the
    second Q tile fits beside the plan's stages."""
    from .model import elem_bytes
    from .v3 import v3_smem_bytes, v3_smem_limit

    if carry_tiles is not None and not isinstance(carry_tiles, bool):
        raise PlanError(f"v3: expected carry_tiles a bool, got {carry_tiles!r}")
    if carry_tiles is False or (carry_tiles is None and not CARRY_TILES_DEFAULT):
        return plan
    masked = getattr(ir_or_dims, "mask_expr", None) is not None
    blocker = carry_blocker(plan, masked)
    if blocker is not None:
        if carry_tiles:
            raise PlanError(f"v3: carry_tiles expected the persistent grid with every warpgroup on every block, got "
                            f"{blocker}")
        return dataclasses.replace(plan, reasons=plan.reasons + (f"tiles not carried: {blocker}",))
    eb = elem_bytes(plan.dtype)
    limit = v3_smem_limit(target, plan.ctas_per_sm)

    def smem(st: int) -> int:
        return v3_smem_bytes(plan.block_m, plan.block_n, plan.head_dim, plan.head_dim_v, st, eb, plan.tma_store_o,
                             q_tiles=2)

    choices = [plan.stages] if (stages_forced or not carry_tiles) else list(range(plan.stages, 0, -1))
    fits = [st for st in choices if smem(st) <= limit]
    if not fits:
        why = f"smem {smem(choices[-1])} B with a second Q tile and {choices[-1]} stage(s) > {limit} B"
        if carry_tiles:
            raise PlanError(f"v3: carry_tiles does not fit: {why}")
        return dataclasses.replace(plan, reasons=plan.reasons + (f"tiles not carried: {why}",))
    st = fits[0]
    why = (f"carried tiles (carry_tiles{'' if carry_tiles else ', CARRY_TILES_DEFAULT'}): a tile's first S GEMM "
           f"goes out with the previous tile's last P V and its softmax runs under it, before that tile's epilogue; "
           f"two Q tiles, smem {smem(st)} B <= {limit} B with {st} K/V stage(s)")
    return dataclasses.replace(plan, carry_tiles=True, stages=st, smem_bytes=smem(st), reasons=plan.reasons + (why,))
