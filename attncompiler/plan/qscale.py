"""The v3 plan option ``q_prescale``: multiply the Q tile by the score_mod's inner scale once per tile.

Soft-capping's softmax input is ``cap log2(e) tanh(scale / cap * s)`` for the dot product ``s = q . k``. The
factor form (``ir/scoreform.py``) folds ``cap log2(e)`` into the exponential's multiply-add, which leaves
one multiply per score in front of the MUFU tanh, on the dependent chain from the S GEMM to the exponential.
When the inner term is ``G(c * s)`` with ``c`` a function of ``p.scale``, b and h only
(:func:`attncompiler.codegen.hooks.q_scale_of`), ``c * s = (c q) . k``: each consumer warpgroup multiplies
its 64 rows of the Q tile by ``c`` in shared memory after Q lands (``v3_scale_q`` in ``v3_fwd.cuh``), and the
softmax takes ``G`` of the accumulator.

Precision, and why the option is opt-in: ``c q`` is rounded to bf16, so the kernel computes the attention
of ``q~ = bf16(c q) / c``, one more bf16 rounding of each q element -- a perturbation of the input at its own
precision. The score then errs by about ``2^-9 scale ||q o k||`` (the elementwise products' norm), where the
plain path errs only by fp32 rounding and eager bf16 by ``2^-9`` of ``|scale q . k|``. On random inputs that
passes the error-ratio rule; where the products cancel (keys sharing one direction, a query nearly orthogonal
to it, ``|q| |k| scale`` far beyond the cap) it does not: ``tests/test_gpu_qscale.py`` measured 1.3e-2 against
eager's 3.0e-3 there. fp16 is refused outright: ``c q`` with ``c = scale / cap`` ~ 3e-3 would put q's small
elements among fp16's subnormals. The conversion is ``satfinite``, so ``c q`` never becomes inf; for
``|c| <= 1`` (any cap at least the softmax scale) it cannot reach bf16's largest value either.

Measured on an H100 (2026-11-22, N = 16k, bf16, softcap 30, ``benchmarks/v3_sweep.py``, medians of 3
interleaved rounds, TFLOP/s, off -> on): d = 128 561 -> 593 (plain 649: 0.865 -> 0.914 of plain); d = 256
738 -> 744; d = 64 375 -> 355 at the planner's BN 144 / EXP2_POLY 4, 355 -> 377 with three consumers (BN 96,
EXP2_POLY 2), 370 at BN 128 / EXP2_POLY 2. An earlier temporary A/B: d = 128 571 -> 604 and 582 -> 603.
"""
from __future__ import annotations

from typing import Any

from .model import PlanError

__all__ = ["q_prescale_available", "q_prescale_choice"]


def q_prescale_available(ir_or_dims: Any) -> str:
    """Why the IR cannot take ``q_prescale``, or "" when it can."""
    if getattr(ir_or_dims, "score_expr", None) is None:
        return "no score_mod"
    if getattr(ir_or_dims, "dtype", "bf16") != "bf16":
        return f"dtype {ir_or_dims.dtype} (c * q would fall among fp16's subnormals; bf16 only)"
    from ..codegen.hooks import q_scale_of  # lazy: codegen imports the planner

    if q_scale_of(ir_or_dims) is None:
        return "a score_mod whose inner term is not G(c * score) with c free of the positions and buffers"
    return ""


def q_prescale_choice(ir_or_dims: Any, forced: bool | None) -> tuple[bool, str]:
    """The setting of ``q_prescale`` (off unless forced on) and its reason line. Raises PlanError when forced on
    where it cannot run."""
    if forced is not None and not isinstance(forced, bool):
        raise PlanError(f"v3: expected q_prescale a bool, got {forced!r}")
    why_not = q_prescale_available(ir_or_dims)
    if forced and why_not:
        raise PlanError(f"v3: q_prescale=True needs a bf16 score_mod of the form G(c * score), got {why_not}")
    if forced:
        return True, ("Q prescale: on (forced): each consumer warpgroup multiplies its Q rows by the score_mod's "
                      "inner scale c once per tile, and the softmax takes G of the S accumulator (one multiply "
                      "less per score; c q is rounded to bf16: plan/qscale.py)")
    if forced is False:
        return False, "Q prescale: off (forced)"
    if why_not:
        return False, f"Q prescale: off ({why_not})"
    return False, ("Q prescale: off (opt-in, q_prescale=True: one multiply less per score, measured 0.865 -> 0.914 "
                   "of plain for softcap at d=128, but c q is rounded to bf16, which errs beyond eager where the "
                   "products q_i k_i cancel: plan/qscale.py)")
