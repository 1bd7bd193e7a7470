"""The v3 forward's grid and epilogue: one CTA per tile, or the persistent grid writing O by TMA stores.

With one CTA per (query block, batch*head) tile, each CTA pays its start (barrier setup, the Q copy's round trip,
the first S GEMM and softmax with nothing to overlap) and its drain (the last P V, the O stores) once; short K/V
loops (sliding windows) pay them per few blocks of work. The persistent grid (``persistent``: one CTA per SM
looping over the tiles) overlaps the next tile's Q and first K copies with the current tile's end, but its epilogue
cannot stage O through Q's buffer (the next Q lands there), so it wrote O with direct 4-byte stores. With
``tma_store_o`` each consumer warpgroup stages its rows in an O tile of its own and one thread writes them by TMA
stores that run on under the next tile (``templates/include/attncompiler/v3_epilogue.cuh`` ``v3_epilogue_tma``).

Measured on an H200 (2026-11-29, ``benchmarks/v3_sweep.py``, bf16, N = 16k, H * d = 2048, d = 128, 3 interleaved
rounds, TFLOP/s, one CTA per tile / persistent / persistent + TMA stores): sliding window 1024 441.6 / 436.2 /
**470.8**; plain 643.3 / 651.9 / **669.3**; causal 605.6 / - / 517.2. ``benchmarks/clock_power.py --set cudnn``,
same call: dense attention over 1152 keys per pair over full attention 1.189x (one CTA per tile), 1.144x (persistent
+ TMA stores), SDPA cuDNN 1.088x; an epilogue without any O store (timing only) 1.094x.

So the planner takes the persistent grid with TMA stores where every tile visits about the same number of K/V
blocks (no mask, or a band such as a sliding window: the static round robin over tiles is then balanced) and the O
tile keeps the plan's BLOCK_N and at least :data:`MIN_STAGES_WITH_O_TILE` stages; causal and other growing masks keep
one CTA per tile, whose hardware scheduling balances tiles of different lengths (causal above: 606 vs 517).

The persistent grid's tile order (``tiles_by_head``, :func:`tiles_by_head_choice`): balanced tiles run the query
blocks of one batch*head on neighbouring CTAs (their K/V shared in L2); others every head's heaviest query blocks
first (the static round robin's balance for tiles of different lengths).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy

__all__ = ["PERSISTENT_MAX_IMBALANCE", "MIN_STAGES_WITH_O_TILE", "Q_PREFETCH_BANDS", "TILE_LIST_MASKS",
           "balanced_tiles", "q_prefetch_choice", "q_prefetch_default", "tile_list_choice", "tiles_by_head_choice",
           "without_persistent_grid"]

#: the heaviest query block's visited K/V rows over the mean (at plan/band.py's BAND_REP_LEN) up to which the
#: static round robin of the persistent grid counts as balanced (sliding window 1024 at BLOCK_M 128: 1.03;
#: causal and prefix-LM: 1.98)
PERSISTENT_MAX_IMBALANCE = 1.10
#: the O tile must leave at least this many K/V stages (d = 128: 3 -> 2, measured faster above)
MIN_STAGES_WITH_O_TILE = 2
#: q_prefetch on by default on the persistent grid of a band mask (9 key blocks per tile at window 1024, d = 128):
#: same-call A/B on an H200 (2026-11-29, v3_sweep.py, bf16, N = 16k unless noted, TFLOP/s, off -> on): window 1024
#: d128 486.1 -> 493.0, 472.8 -> 488.0, 471.7 -> 486.1; N = 4096 473.6 -> 482.8, 465.2 -> 472.2; d64 343.9 -> 350.2
#: (docs/perf-notes.md, thirty-third and thirty-fourth sessions). The full GPU suite with it and TILE_LIST_MASKS on:
#: 1123 passed, 1 skipped in 420 s (H200, 2026-11-29, thirty-fifth session).
Q_PREFETCH_BANDS = True
#: ... at these head dims (D = DV; the GPU-tested ones), and where BLOCK_N >= BLOCK_M (plan/v3.py)
Q_PREFETCH_HEAD_DIMS = (64, 128)
#: tile_list on by default on the persistent grid of a mask with a derivable K/V range (tiles of different lengths):
#: same call, H200, 7 rounds, round robin -> list dealt in order: window 1024 d128 N = 16k 471.7 -> 484.4, N = 4096
#: 462.2 -> 475.3, N = 2048 444.9 -> 464.7, d64 340.3 -> 337.2 (runtime/tile_list.py; thirty-fourth session).
#: Both on: window d128 476.8 -> 487.1, N = 2048 442.6 -> 451.7, d64 339.3 -> 351.9 (same call, thirty-fourth session).
TILE_LIST_MASKS = True


def balanced_tiles(ir_or_dims: Any, block_m: int, block_n: int) -> tuple[bool, str]:
    """(whether every query block visits about the same K/V rows, why), from the mask's K/V range."""
    from .band import BAND_REP_LEN, visited_keys_per_block

    mask = getattr(ir_or_dims, "mask_expr", None)
    if mask is None:
        return True, "no mask: every tile visits the same K/V blocks"
    if not isinstance(mask, sympy.Basic):
        return False, "the mask's K/V range is unknown"
    rows = visited_keys_per_block(mask, block_m, block_n)
    if not rows:
        return False, "the mask has no derivable K/V range (every tile may visit every block)"
    imbalance = max(rows) / (sum(rows) / len(rows))
    ok = imbalance <= PERSISTENT_MAX_IMBALANCE
    return ok, (f"the heaviest query block visits {imbalance:.2f}x the mean K/V rows at N = {BAND_REP_LEN} "
                f"({'<=' if ok else '>'} PERSISTENT_MAX_IMBALANCE {PERSISTENT_MAX_IMBALANCE})")


def tiles_by_head_choice(ir_or_dims: Any, persistent: bool, block_m: int, block_n: int,
                         tiles_by_head: bool | None) -> tuple[bool, str]:
    """(the persistent grid's tile order, why): by head -- the query blocks of one batch*head on neighbouring CTAs,
    sharing their K/V in L2 -- where the tiles are balanced (:func:`balanced_tiles`), else every head's heaviest
    query blocks first (the static round robin then balances tiles of different lengths, as causal's).  Only the
    persistent grid has an order to choose; ``tiles_by_head`` forces it.

    Measured on an H200 (2026-11-29, ``benchmarks/run_tile_order.sh``, bf16, H * d = 2048, 9 interleaved rounds,
    TFLOP/s, heaviest first -> by head): sliding window 1024 d128 at N = 4096 (B = 4: 64 batch*heads, whose K/V do
    not fit L2 together) 410.0 -> 466.1; at N = 16k d128 467.3 -> 461.7, d64 342.7 -> 340.5, window 2048 d128
    528.5 -> 518.1, window 256 d64 174.8 -> 176.2 (within the rounds' spread)."""
    from .model import PlanError

    if tiles_by_head is not None and not isinstance(tiles_by_head, bool):
        raise PlanError(f"v3: expected tiles_by_head a bool, got {tiles_by_head!r}")
    if not persistent:
        if tiles_by_head:
            raise PlanError("v3: expected tiles_by_head with persistent=True (the persistent grid's tile order), got "
                            "persistent=False")
        return False, "one tile per CTA: the hardware schedules the grid (heaviest query blocks first)"
    if tiles_by_head is not None:
        return tiles_by_head, "forced"
    return balanced_tiles(ir_or_dims, block_m, block_n)


def q_prefetch_default(ir_or_dims: Any, *, head_dim: int, head_dim_v: int, ctas_per_sm: int,
                       score_skip_asked: bool | None) -> bool:
    """Whether ``q_prefetch`` is on by default, should the plan take the persistent grid with the O tile: for a mask
    whose tiles are balanced (:func:`balanced_tiles`: a band, whose tiles are short; :data:`Q_PREFETCH_BANDS`),
    without a score_mod (its score skip needs the tile word), one CTA per SM and D = DV in
    :data:`Q_PREFETCH_HEAD_DIMS`."""
    mask = getattr(ir_or_dims, "mask_expr", None)
    if not Q_PREFETCH_BANDS or mask is None or getattr(ir_or_dims, "score_expr", None) is not None:
        return False
    if score_skip_asked or ctas_per_sm > 1 or head_dim != head_dim_v or head_dim not in Q_PREFETCH_HEAD_DIMS:
        return False
    return balanced_tiles(ir_or_dims, 128, 128)[0]  # a band: every query block visits about as many keys


def q_prefetch_choice(q_prefetch: bool | None, o_tile: bool, *, score_skip_asked: bool | None, d_padded: int,
                      dv_padded: int, ctas_per_sm: int = 1, default_on: bool = False) -> tuple[bool, str | None]:
    """Whether the persistent grid's tiles take their Q a tile ahead (``q_prefetch``), and the reason line (None
    when off by default). With it the Q tile and the O tile take turns: tile number i of a CTA has its Q in buffer
    i mod 2, its consumers stage O there once their S GEMMs are done, and a producer warp writes it by TMA stores and
    then loads the Q of tile i + 2 into it (``templates/include/attncompiler/v3_fwd.cuh`` ``Q_PREFETCH``). So no
    tile waits for its Q and no consumer thread for a store. Needs the O tile (``tma_store_o``), Q and O tiles of one
    size, no score skip (whose tile word travels with the Q copy) and one CTA per SM. On by default where
    :func:`q_prefetch_default` says (``default_on``) and the plan has the O tile, else off unless asked."""
    from .model import PlanError

    if q_prefetch is not None and not isinstance(q_prefetch, bool):
        raise PlanError(f"v3: expected q_prefetch a bool, got {q_prefetch!r}")
    if q_prefetch is None and default_on and o_tile:
        return True, ("Q a tile ahead (q_prefetch): a band mask's tiles are short (Q_PREFETCH_BANDS); the Q tile and "
                      "the O tile take turns, O stored by a producer warp, which then loads tile i + 2's Q")
    if not q_prefetch:
        return False, ("Q a tile ahead: off (forced)" if q_prefetch is False else None)
    if not o_tile:
        raise PlanError("v3: expected q_prefetch with the persistent grid's TMA stores of O (persistent=True, "
                        "tma_store_o=True), got a plan without the O tile")
    if ctas_per_sm > 1:
        raise PlanError(f"v3: expected q_prefetch with one CTA per SM (two or three consumer warpgroups: the kernels "
                        f"the GPU tests ran), got {ctas_per_sm} CTAs per SM (block_m=64)")
    if score_skip_asked:
        raise PlanError("v3: expected q_prefetch without score_skip (the skip's tile word travels with the Q copy), "
                        "got score_skip=True")
    if d_padded != dv_padded:
        raise PlanError(f"v3: expected q_prefetch with Q and O tiles of one width (they take turns in one buffer), "
                        f"got D padded to {d_padded} and DV to {dv_padded} columns")
    return True, ("Q a tile ahead (q_prefetch, forced): the Q tile and the O tile take turns; tile i's Q in buffer "
                  "i mod 2, O staged there, stored by a producer warp, which then loads tile i + 2's Q into it")


def without_persistent_grid(plan: Any) -> Any:
    """``plan`` (a V3Plan) for one CTA per tile without the score skip (the packed-sequence kernel): no persistent
    grid, no TMA stores of O, and the shared memory without the O tile (the same tiles and stages: the kernel the
    GPU suite ran; the stage the O tile took is not given back)."""
    from .model import elem_bytes
    from .v3 import v3_smem_bytes

    smem = plan.smem_bytes
    if plan.tma_store_o:
        smem = v3_smem_bytes(plan.block_m, plan.block_n, plan.head_dim, plan.head_dim_v, plan.stages,
                             elem_bytes(plan.dtype))
    return dataclasses.replace(plan, persistent=False, score_skip=False, tma_store_o=False, tiles_by_head=False,
                               q_prefetch=False, tile_list=False, smem_bytes=smem)


def tile_list_choice(ir_or_dims: Any, tile_list: bool | None, persistent: bool, block_m: int,
                     block_n: int) -> tuple[bool, str | None]:
    """Whether the persistent grid's tiles are dealt to the CTAs by a host-built list (``tile_list``), and the reason
    line (None when off by default). Without it CTA c runs tiles c, c + G, ... (G CTAs); with it the host deals them
    longest first onto the least-loaded CTA (``attncompiler/runtime/tile_list.py``, LPT scheduling), so that tiles of
    different lengths (a band's first query blocks see fewer keys) do not leave the CTAs that draw one more long tile
    finishing alone. Only the persistent grid has tiles to deal. On by default on the persistent grid of a mask with a
    derivable K/V range (:data:`TILE_LIST_MASKS`)."""
    from .model import PlanError

    if tile_list is not None and not isinstance(tile_list, bool):
        raise PlanError(f"v3: expected tile_list a bool, got {tile_list!r}")
    mask = getattr(ir_or_dims, "mask_expr", None)
    if tile_list is None and TILE_LIST_MASKS and persistent and mask is not None:
        from .band import visited_keys_per_block

        if visited_keys_per_block(mask, block_m, block_n):  # a derivable K/V range: tiles of different lengths
            return True, ("tiles dealt by a host list (tile_list): the mask's tiles differ in length; each, in the "
                          "kernel's order, to the least-loaded CTA (runtime/tile_list.py, TILE_LIST_MASKS)")
    if not tile_list:
        return False, ("tiles dealt by a host list: off (forced)" if tile_list is False else None)
    if not persistent:
        raise PlanError("v3: expected tile_list with persistent=True (the persistent grid's tiles), got "
                        "persistent=False")
    return True, ("tiles dealt by a host list (tile_list, forced): each, in the kernel's order, to the least-loaded "
                  "CTA, costs from the mask's K/V range (runtime/tile_list.py)")
