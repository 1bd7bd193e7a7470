"""Attention specs: what to compute, with score / mask modifiers traced to sympy."""
from __future__ import annotations

from . import ops, presets
from .presets import (
    PRESETS,
    alibi,
    alibi_score_mod,
    and_masks,
    causal,
    causal_mask,
    document,
    document_mask,
    get_preset,
    or_masks,
    plain,
    prefix_lm,
    prefix_lm_mask,
    relative_bias,
    relative_bias_score_mod,
    sliding_window,
    sliding_window_mask,
    softcap,
    softcap_score_mod,
)
from .spec import AttentionSpec, TracedSpec, causal_mask_expr
from .trace import SpecError, Sym, TraceError, trace_mask_mod, trace_score_mod

__all__ = [
    "AttentionSpec", "TracedSpec", "SpecError", "TraceError", "Sym", "trace_score_mod",
    "trace_mask_mod", "causal_mask_expr", "ops", "presets", "PRESETS", "get_preset",
    "plain", "causal", "sliding_window", "alibi", "softcap", "prefix_lm", "document",
    "causal_mask", "sliding_window_mask", "prefix_lm_mask", "document_mask", "alibi_score_mod",
    "softcap_score_mod", "and_masks", "or_masks", "relative_bias", "relative_bias_score_mod",
]
