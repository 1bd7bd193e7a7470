"""The score skip: whether a plan takes it, and why (v2 and v3 forward).

A separable score_mod whose column term is linear in the key position (ALiBi: ``slope[h] * kv``) makes
the softmax weight of keys far below a key every row sees fall under 2^-136 of the row's largest,
whatever ``q . k`` is once it is bounded.  Each tile then starts its K/V walk above their blocks
(``templates/include/attncompiler/score_skip.cuh``).  The bound on ``|q . k|`` costs one pass over q
and k per call (``attn_row_norms``, :mod:`attncompiler.runtime.scoreskip`): ~2 (Nq + Nk) d bytes per
head, ~217 / N of the attention's time at 650 TFLOP/s and 3 TB/s, so it runs only from
:data:`SCORE_SKIP_MIN_KEYS` keys on, where nothing can be skipped (all slopes tiny) it costs at most ~5 %.
Measured on an H100 (2026-11-22, ``benchmarks/score_skip.py``, v3, no-skip / skip time): ALiBi slopes
1.41-1.50x at N = 4096 and 2.57-2.65x at 16k; flat slopes 2^-8 0.94-0.95x at 4096, 0.98-1.00x at 16k.
"""
from __future__ import annotations

from typing import Any

from .model import PlanError

__all__ = ["SCORE_SKIP_MIN_KEYS", "linear_separable", "score_skip_choice"]

SCORE_SKIP_MIN_KEYS = 4096


def linear_separable(ir_or_dims: Any) -> bool:
    """Whether the IR's score_mod is separable with a column term linear in kv (ALiBi), masked or not."""
    if getattr(ir_or_dims, "score_expr", None) is None:
        return False
    from ..codegen.hooks import score_form_of  # lazy: codegen imports the planner

    form = score_form_of(ir_or_dims)
    return form.separable and form.col_slope is not None


def score_skip_choice(ir_or_dims: Any, schedule: str, forced: bool | None, why_not: str = "") -> tuple[bool, str]:
    """The score skip's setting for ``schedule`` and its reason line; ``why_not``: the schedule's own reason
    against it (v3: an ascending walk).  Raises PlanError when forced on where it cannot run."""
    if forced is not None and not isinstance(forced, bool):
        raise PlanError(f"{schedule}: expected score_skip a bool, got {forced!r}")
    if not linear_separable(ir_or_dims):
        why_not = "no separable score_mod with a column term linear in kv"
    if forced and why_not:
        raise PlanError(f"{schedule}: score_skip=True needs a separable score_mod with a linear column term "
                        f"(ALiBi), got {why_not}")
    if forced is False:
        return False, "score skip: off (forced)"
    if why_not:
        return False, f"score skip: off ({why_not})"
    return True, (f"score skip: on when Nk >= {SCORE_SKIP_MIN_KEYS} (SCORE_SKIP_MIN_KEYS): each tile starts its walk "
                  f"above the blocks whose column term alone puts every P below 2^-136 of the row's offset "
                  f"(exactly 0 or below fp32's resolution of the row's sum), bounded per call from the largest "
                  f"row norms of q and k")
