"""Short sequences: which query tile ``schedule="auto"`` runs when one 64-row tile holds all of a call's queries.

The v3 plans that ``auto`` takes on Hopper tile the queries by 128 or 192 rows (two or three consumer warpgroups,
one persistent CTA per SM). At Nq <= 64 most of those rows are empty: a 49-token window fills 26-38 % of them, and
every tile still pays its whole setup (Q copied in, the K/V ring started, O stored). One consumer warpgroup of 64 rows,
two CTAs per SM, fills 77-100 % of its rows and keeps two tiles in flight per SM.

Measured (``benchmarks/bench_many_heads.py --sweep``, H200, bf16, H = 16, B * N = 2^18 tokens, 2026-12-01), the time of
v3 at 64 rows over the ``auto`` plan's:

========================  =======  =======  =======  =======  ========
N                         49       64       96       113      128
========================  =======  =======  =======  =======  ========
d = 64, no mask           0.71     0.73     1.39     0.98     0.99
d = 64, causal            0.44     0.44     0.82     0.82     0.82
d = 128, no mask          0.70     0.76     1.44     1.38     1.35
d = 128, causal           0.43     0.47     0.88     0.88     0.91
========================  =======  =======  =======  =======  ========

So the 64-row tile is taken at Nq <= 64 only, where it wins in every case measured (1.3-2.3x). Above that it loses
at N = 96 for both head dims with no mask. Causal plans keep gaining up to N = 192 (0.73-0.91). That is left out of
the rule, which stays one threshold. A sibling kernel is compiled on first use, as decode's is (``api.py``). It runs
only when the caller left the query tile to ``auto``: no ``block_m`` forced, no tuned plan. Packed sequences
(``varlen.py``) take it when ``max_seqlen_q`` is given as an int of at most 64 (left None, it would cost a host read
of cu_seqlens to decide).

Pure Python.
"""
from __future__ import annotations

from typing import Any, Callable

from .model import PlanError

__all__ = ["SHORT_BLOCK_M", "SHORT_SCHEDULES", "short_applies", "short_reason"]

#: the query tile of the short-sequence sibling: one v3 consumer warpgroup (wgmma's M), two CTAs per SM
SHORT_BLOCK_M = 64
#: the schedules with a short-sequence sibling. v2 (the A100's auto schedule) is left out, unmeasured there: on the
#: H200 its 64-row plan took 0.69-0.71x the time of its 128-row default at N = 49 / 64 (bench_many_heads.py).
SHORT_SCHEDULES = ("v3",)


def short_applies(schedule: str, plan: Any, Nq: int) -> tuple[bool, str]:
    """Whether a call of ``Nq`` queries runs this schedule's 64-row sibling instead of ``plan`` (the module's
    rule: the kernel was compiled with ``schedule="auto"`` and no ``block_m``, which the caller checks), and why."""
    if schedule not in SHORT_SCHEDULES:
        return False, f"schedule {schedule}: no short-sequence sibling (only {', '.join(SHORT_SCHEDULES)})"
    bm = getattr(plan, "block_m", None)
    if bm is None or bm <= SHORT_BLOCK_M:
        return False, f"BLOCK_M={bm}: already at most {SHORT_BLOCK_M} query rows"
    if Nq > SHORT_BLOCK_M:
        return False, f"Nq={Nq} > {SHORT_BLOCK_M}: the plan's {bm}-row tiles"
    return True, f"Nq={Nq} <= {SHORT_BLOCK_M}: one {SHORT_BLOCK_M}-row tile holds every query (the plan's: {bm})"


def short_reason(make_plan: Callable[..., Any], schedule: str, plan: Any) -> str | None:
    """The line ``plan``'s reasons get when calls with few queries will run the 64-row sibling instead, or None
    (the rule does not apply to this plan, or ``make_plan(block_m=64)`` refuses this variant)."""
    if not short_applies(schedule, plan, SHORT_BLOCK_M)[0]:
        return None
    try:
        make_plan(block_m=SHORT_BLOCK_M)
    except PlanError:
        return None
    return (f"calls with Nq <= {SHORT_BLOCK_M} run {schedule} at BLOCK_M = {SHORT_BLOCK_M} instead (one tile holds "
            f"every query; compiled on first use: plan/short.py)")
