"""The v3 autotuner's search space: the plan options :func:`attncompiler.runtime.autotune.autotune` benchmarks for
the v3 forward, ranked by their distance from the model's choice (:func:`attncompiler.plan.v3.plan_v3`), and that
space as a table (``attncompiler plan SPEC --schedule v3 --all``)."""
from __future__ import annotations

from typing import Any

from .model import PlanError, resolve_target
from .targets import Target
from .v3 import (CONSUMER_REGS_BY_WGS, MAX_STAGES, MIN_STAGES, WGMMA_M, plan_v3, v3_register_estimate)

__all__ = ["candidates_v3", "format_candidates_v3"]


def candidates_v3(ir_or_dims: Any, target: Target | str | None, *, max_steps: int = 4) -> list[dict[str, Any]]:
    """Feasible v3 plan options for the autotuner, the model's choice (:func:`plan_v3`) first.

    The space is what :func:`plan_v3` exposes: BLOCK_M (128 or 192: two or three consumer warpgroups),
    BLOCK_N (multiples of 16 from 64 to 256, at most ``max_steps`` steps of 16 from the model's), K/V
    stages (:data:`MIN_STAGES`..:data:`MAX_STAGES`), and the grid: one CTA per tile, persistent, or persistent
    with TMA stores of O (``tma_store_o``); and the model's tile with the other number of softmax copies, on the
    persistent grid with the other tile order (``tiles_by_head``) and with the next Q a tile ahead
    (``q_prefetch``, or without where the model's has it), with a mask on the persistent grid the other tile dealing
    (``tile_list``), and with a mask its half-block plan
    (``half_blocks``, at the model's grid).  Each is checked by :func:`plan_v3` (registers, shared memory);
    ranked by distance from the model's choice: steps of 16 in BLOCK_N (+1 above the model's width: wider S
    tiles risk spills) + stages fewer than the model's + 1 for each of ``persistent`` / ``tma_store_o`` that
    differs from the model's + 1 for the other BLOCK_M; ties the model's BLOCK_M, wider, then deeper first.
    Raises :class:`PlanError` where v3 cannot run at all (not sm_90, head dims).
    """
    base = plan_v3(ir_or_dims, target)
    ranked: list[tuple[tuple[int, int, int, int, int], dict[str, Any]]] = []
    for bm in (WGMMA_M * n for n in CONSUMER_REGS_BY_WGS):
        for bn in range(64, 257, 16):
            steps = abs(bn - base.block_n) // 16
            if steps > max_steps:
                continue
            for st in range(MAX_STAGES, MIN_STAGES - 1, -1):
                for persistent, tso in ((False, False), (True, False), (True, True)):
                    try:
                        p = plan_v3(ir_or_dims, target, block_n=bn, stages=st, persistent=persistent, block_m=bm,
                                    tma_store_o=tso)
                    except PlanError:
                        continue
                    grid = int(persistent != base.persistent) + int(tso != base.tma_store_o)
                    dist = (steps + int(bn > base.block_n) + max(0, base.stages - st) + grid
                            + int(bm != base.block_m))
                    ranked.append(((dist, int(bm != base.block_m), -bn, -st, grid), p.options))
    # the model's tile with the other softmax layout (plan/v3_softmax.py: measured per head dim and BLOCK_N)
    flipped = plan_v3(ir_or_dims, target, **{**base.options, "softmax_copies": 3 - base.softmax_copies})
    ranked.append(((1, 0, -base.block_n, -base.stages, 0), flipped.options))
    if base.persistent:  # the other tile order (plan/v3_grid.py tiles_by_head_choice)
        order = plan_v3(ir_or_dims, target, **{**base.options, "tiles_by_head": not base.tiles_by_head})
        ranked.append(((1, 0, -base.block_n, -base.stages, 0), order.options))
    if base.tma_store_o:  # the next Q a tile ahead, or not (plan/v3_grid.py q_prefetch_choice)
        try:
            flip = {"q_prefetch": True, "score_skip": False} if not base.q_prefetch else {"q_prefetch": False}
            ahead = plan_v3(ir_or_dims, target, **{**base.options, **flip})
            ranked.append(((1, 0, -ahead.block_n, -ahead.stages, 0), ahead.options))
        except PlanError:
            pass
    if base.persistent and getattr(ir_or_dims, "mask_expr", None) is not None:
        # tiles of different lengths dealt by a host list, or the round robin (plan/v3_grid.py tile_list_choice)
        dealt = plan_v3(ir_or_dims, target, **{**base.options, "tile_list": not base.tile_list})
        ranked.append(((1, 0, -dealt.block_n, -dealt.stages, 0), dealt.options))
    if getattr(ir_or_dims, "mask_expr", None) is not None:  # half blocks, at the model's grid (BLOCK_N may narrow)
        try:
            half = plan_v3(ir_or_dims, target, half_blocks=True, persistent=base.persistent,
                           tma_store_o=base.tma_store_o)
            ranked.append(((1, 0, -half.block_n, -half.stages, 0), half.options))
        except PlanError:
            pass
    ranked.sort(key=lambda r: r[0])
    out = [base.options]
    out += [o for _, o in ranked if o != base.options]
    return out


def format_candidates_v3(ir_or_dims: Any, target: Target | str | None) -> str:
    """The autotuner's v3 space (:func:`candidates_v3`) as a table: rank, BLOCK_M, BLOCK_N, stages, grid, smem,
    registers, and the other options that differ from the model's choice (rank 1)."""
    t = resolve_target(target)
    rows = [("rank", "BLOCK_M", "BLOCK_N", "stages", "persistent", "smem B", "registers/thread (est.)",
             "other options")]
    shown = ("block_m", "block_n", "stages", "persistent")
    cands = candidates_v3(ir_or_dims, t)
    for i, o in enumerate(cands, 1):
        p = plan_v3(ir_or_dims, t, **o)
        regs = v3_register_estimate(p.block_n, p.head_dim_v)["total"]
        other = " ".join(f"{k}={v}" for k, v in o.items() if k not in shown and v != cands[0].get(k))
        rows.append((str(i), str(p.block_m), str(p.block_n), str(p.stages), "yes" if p.persistent else "no",
                     str(p.smem_bytes), f"{regs} <= {p.consumer_regs}", other or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    head = (f"v3 candidates on {t.name} (the autotuner's space; rank 1 = the model's choice; BLOCK_M = 64 rows x "
            f"consumer warpgroups):")
    last = len(widths) - 1  # the options column reads left to right
    return "\n".join([head] + ["  " + "  ".join(v.ljust(w) if c == last else v.rjust(w)
                                                  for c, (v, w) in enumerate(zip(r, widths))).rstrip() for r in rows])
