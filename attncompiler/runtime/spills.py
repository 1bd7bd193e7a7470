"""Plans checked against the machine code: a v3 or v2 kernel whose ptxas report shows local-memory spills is planned
again with a narrower key tile.

The planners' register models (``plan/v3.py`` ``v3_register_estimate``, v2's constraints) count the accumulators,
not what a score_mod or a mask keeps live per element. The presets fit them, but composed mods need not: 39 of 480
random specs of the fuzz grammar (seeds 200000-200479) spilled 4-344 B of stores at the v3 planner's BLOCK_N on
sm_90a (nvcc 13.0), most of them with a mask or a score_mod that reads buffers at d = 64 (BLOCK_N 176 or 192), and
every one was spill-free at some narrower width, 16 to 80 keys narrower; v2's 128 x 128 tiles at d = 32 / 64 spill
on sm_80 for 29 of 80 of the same specs (8-348 B of stores). ptxas's own report (NVRTC with
``--ptxas-options=-v``, the runtime's compiler; no GPU needed) decides where no register model can: the first
narrower BLOCK_N the planner accepts (the schedule's ``replan_widths``) that spills nothing is taken, else the one
that spills least, and the plan's reasons say why.

Small spills are left alone (:data:`MIN_SPILL_BYTES`). Measured on an H200 (thirty-seventh session,
``benchmarks/spill_ab.py``, N = 4096, model's width against the re-planned one): v3 spills of 56-688 B (stores +
loads) ran 1.04-1.27x faster re-planned, 32 B tied (0.996x) and 24 B lost (0.93x: 12 B of spills cost less than 16
fewer keys per block). Where the re-plan runs it still takes the first width that spills nothing: for a 688 B spill,
BLOCK_N 128 (none) beat 176 (32 B) by 1.13x. v2 (forty-first session, its kernels compiled for sm_90a): 128 -> 64
ran 1.005-1.36x for seven of eight spills of 32-348 B (0.92x for the eighth, a document mask), so v2 re-plans down
to 64 only (:data:`MIN_REPLAN_BLOCK_N`). :func:`replan_spilling` is the whole mechanism and runs on the CPU.
"""
from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..plan.model import PlanError
from .compiler import PtxasReport, ptxas_report

__all__ = ["SPILL_REPLAN", "MAX_REPLANS", "MIN_REPLAN_BLOCK_N", "MIN_SPILL_BYTES", "narrower_by_16", "replan_spilling"]

#: api.compile re-plans a kernel it builds whose ptxas report spills (schedules with ``replan_widths``: v2, v3),
#: unless block_n was asked for
SPILL_REPLAN = True
#: spills (stores + loads, bytes) below this are kept: the narrower tile cost more than they did (24 B: 0.93x)
MIN_SPILL_BYTES = 32
#: narrower widths tried at most (each is one NVRTC compile, ~1-2 s, all of them at once; the fuzz's worst case
#: needed five)
MAX_REPLANS = 5
#: no narrower key tile than this. v3: a 64-wide tile already halves the S accumulator of BLOCK_N 128. v2 (H200,
#: sm_90a code, forty-first session, ``spill_ab.py --schedule v2``): 128 -> 64 ran 0.92-1.36x (seven of eight spills
#: of 32-348 B faster), 64 -> 32 lost in all four cases, 0.81-0.95x, even at 132-216 B of spills
MIN_REPLAN_BLOCK_N = 64


def narrower_by_16(block_n: int) -> tuple[int, ...]:
    """v3's re-plan widths below ``block_n``: steps of 16 (its BLOCK_N is any multiple of 16), widest first, at most
    :data:`MAX_REPLANS`, none below :data:`MIN_REPLAN_BLOCK_N`."""
    return tuple(range(block_n - 16, MIN_REPLAN_BLOCK_N - 1, -16))[:MAX_REPLANS]


def _describe(bn: int, rep: PtxasReport | None) -> str:
    if rep is None:
        return f"{bn}: not compiled"
    return f"{bn}: {rep.spill_stores} B stores / {rep.spill_loads} B loads" if rep.spill_bytes else f"{bn}: none"


def replan_spilling(schedule: Any, ir: Any, target: Any, options: dict[str, Any], plan: Any, source: Any) -> Any | None:
    """None when the kernel of ``source`` (``schedule.render(ir, plan, target)``'s KernelSource) spills less than
    :data:`MIN_SPILL_BYTES`, or NVRTC is missing, or ``options`` fix ``block_n``, or ``schedule`` has no
    ``replan_widths(plan)`` (the narrower key-tile widths it can run, widest first: v3 steps of 16, v2 its BLOCK_N
    choices). Otherwise the plan to use instead: the first of those widths that ``schedule`` accepts with ``options``
    and whose kernel spills nothing, or failing that the one that spills least (``plan`` itself where none spills
    less), its first reason saying why. The candidates compile in parallel threads. The caller renders the plan
    returned."""
    widths = getattr(schedule, "replan_widths", None)
    if "block_n" in options or widths is None:
        return None
    first = ptxas_report(source.source, source.arch)
    if first is None or first.spill_bytes < MIN_SPILL_BYTES:
        return None
    # the narrower widths the planner accepts, compiled side by side in waves of one per core (NVRTC runs without
    # the GIL): a spilling variant costs about one compile of wall time where one at a time took up to MAX_REPLANS
    cands: list[tuple[int, Any]] = []
    for bn in widths(plan):
        try:
            cands.append((bn, schedule.make_plan(ir, target, **options, block_n=bn)))
        except PlanError as e:
            cands.append((bn, f"{bn}: refused ({str(e)[:80]})"))
    plans = [(w, c) for w, c in cands if not isinstance(c, str)]
    by_width: dict[int, PtxasReport | None] = {}
    wave = max(1, min(len(plans), os.cpu_count() or 1))  # as many at once as there are cores, widest first
    for i in range(0, len(plans), wave):
        srcs = [schedule.render(ir, c, target) for _, c in plans[i:i + wave]]
        with ThreadPoolExecutor(max_workers=wave) as pool:
            reps = list(pool.map(lambda src: ptxas_report(src.source, src.arch), srcs))
        by_width.update((w, rep) for (w, _), rep in zip(plans[i:i + wave], reps))
        if any(rep is not None and rep.spill_bytes == 0 for rep in reps):
            break
    best = (first.spill_bytes, plan)
    tried = [_describe(plan.block_n, first)]
    for w, c in cands:  # in order, up to the first width that spills nothing (as a search one at a time would)
        if isinstance(c, str):
            tried.append(c)
            continue
        if w not in by_width:  # (a later wave than the one that found a width without spills)
            break
        rep = by_width[w]
        tried.append(_describe(w, rep))
        if rep is not None and rep.spill_bytes < best[0]:
            best = (rep.spill_bytes, c)
            if rep.spill_bytes == 0:
                break
    chosen = best[1]
    if chosen is plan:
        why = f"BLOCK_N {plan.block_n} kept, though it spills: no narrower width spilled less ({'; '.join(tried)})"
    else:
        why = (f"BLOCK_N {plan.block_n} -> {chosen.block_n}: the machine code spilled at the model's width (ptxas "
               f"through NVRTC, {first.arch}; spills by BLOCK_N {'; '.join(tried)})")
    return dataclasses.replace(chosen, reasons=(why, *chosen.reasons))
