"""Common attention variants.

Design: **every preset returns a complete AttentionSpec**.  The variant's own parameter comes first,
then ``head_dim``, then any other AttentionSpec field as a keyword::

    presets.alibi(slopes, head_dim=128, causal=True, dtype="fp16")
    presets.sliding_window(256, head_dim=64)
    presets.causal(128)
    presets.relative_bias(table, head_dim=64)      # table: (num_heads, 2R + 1) float

A preset sets one modifier (``score_mod`` or ``mask_mod``); passing the same field again is an
error rather than a silent override.  To combine variants, use the modifier factories and the
mask combinators, which are plain FlexAttention-style functions::

    presets.document(doc_ids, head_dim=128, score_mod=presets.alibi_score_mod(slopes))
    AttentionSpec(128, mask_mod=presets.and_masks(presets.document_mask(doc_ids),
                                                  presets.sliding_window_mask(256)))

Modifiers work when traced *and* when called eagerly on torch tensors (broadcast index tensors),
so a reference can evaluate them directly.  Buffer names come from the closure variables:
``slopes`` (alibi), ``doc_ids`` (document) and ``bias_table`` (relative_bias).

Mask modifiers have no access to the sequence lengths, so the causal parts of ``sliding_window``
and ``prefix_lm`` are top-left aligned (``q_idx >= kv_idx``, as in FlexAttention); the
``causal=True`` flag is bottom-right aligned (they agree when q_len == kv_len).

:data:`PRESETS` / :func:`get_preset` build zero-configuration specs by name for the CLI.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import torch

from . import ops
from .spec import AttentionSpec, SpecError

__all__ = [
    "plain", "causal", "sliding_window", "alibi", "softcap", "prefix_lm", "document", "relative_bias",
    "causal_mask", "sliding_window_mask", "prefix_lm_mask", "document_mask", "alibi_score_mod",
    "softcap_score_mod", "relative_bias_score_mod", "and_masks", "or_masks", "alibi_slopes", "document_ids",
    "relative_bias_table",
    "PRESETS", "get_preset",
]

MaskMod = Callable[[Any, Any, Any, Any], Any]
ScoreMod = Callable[[Any, Any, Any, Any, Any], Any]


# ----------------------------------------------------------------------------------- modifiers
def causal_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    """Top-left causal mask_mod (prefer ``causal=True``, which is bottom-right aligned)."""
    return q_idx >= kv_idx


def _int_arg(what: str, v: Any, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < lo:
        raise SpecError(f"{what}: expected an int >= {lo}, got {v!r}")
    return int(v)


def _tensor_arg(what: str, t: Any, floating: bool) -> torch.Tensor:
    kind = "floating" if floating else "integer"
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.is_floating_point() != floating or t.dtype.is_complex \
            or t.dtype == torch.bool:
        got = f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise SpecError(f"{what}: expected a 1-D {kind} torch.Tensor, got {got}")
    return t


def sliding_window_mask(window: int) -> MaskMod:
    """Causal window: key kv is visible from query q iff q - window <= kv <= q."""
    w = _int_arg("window", window)

    def sliding_window_mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= w)
    return sliding_window_mask_mod


def prefix_lm_mask(prefix: int) -> MaskMod:
    """The first ``prefix`` keys are visible to every query; the rest causally."""
    n = _int_arg("prefix", prefix)

    def prefix_lm_mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (kv_idx < n) | (q_idx >= kv_idx)
    return prefix_lm_mask_mod


def document_mask(doc_ids: torch.Tensor) -> MaskMod:
    """Packed sequences: a query sees only keys of its own document (``doc_ids``: (seqlen,) int)."""
    doc_ids = _tensor_arg("doc_ids", doc_ids, floating=False)

    def document_mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return doc_ids[q_idx] == doc_ids[kv_idx]
    return document_mask_mod


def alibi_score_mod(slopes: torch.Tensor) -> ScoreMod:
    """ALiBi: ``score + slopes[h] * (kv_idx - q_idx)`` (``slopes``: (num_heads,) float)."""
    slopes = _tensor_arg("slopes", slopes, floating=True)

    def alibi_score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return score + slopes[h] * (kv_idx - q_idx)
    return alibi_score_mod


def softcap_score_mod(cap: float) -> ScoreMod:
    """Logit soft-capping (Gemma 2, Grok): ``cap * tanh(score / cap)``."""
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not float(cap) > 0 or cap == float("inf"):
        raise SpecError(f"cap: expected a finite number > 0, got {cap!r}")
    c = float(cap)

    def softcap_score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return c * torch.tanh(score / c)
    return softcap_score_mod


def _table_arg(table: Any) -> torch.Tensor:
    ok = (isinstance(table, torch.Tensor) and table.dim() == 2 and table.is_floating_point()
          and table.shape[0] >= 1 and table.shape[1] % 2 == 1)
    if not ok:
        got = f"{table.dtype} tensor of shape {tuple(table.shape)}" if isinstance(table, torch.Tensor) \
            else type(table).__name__
        raise SpecError(f"table: expected a 2-D floating torch.Tensor of shape (num_heads, 2R + 1) (an odd "
                        f"number of relative distances -R..R), got {got}")
    return table


def relative_bias_score_mod(table: torch.Tensor) -> ScoreMod:
    """Learned relative position bias: ``score + table[h, clamp(kv_idx - q_idx + R, 0, 2R)]``.

    ``table``: (num_heads, 2R + 1) float; column ``R + d`` is the bias of distance ``d = kv_idx -
    q_idx``, distances beyond +-R share the edge columns.  The buffer is named ``bias_table``; make
    it learnable with ``requires_grad_()`` (or pass ``buffers={"bias_table": t}`` at call time) and
    its gradient is scatter-added at the clamped index."""
    bias_table = _table_arg(table)
    r = (int(bias_table.shape[1]) - 1) // 2

    def relative_bias_score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return score + bias_table[h, ops.clamp(kv_idx - q_idx + r, 0, 2 * r)]
    return relative_bias_score_mod


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    """A mask_mod visible where all of ``mask_mods`` are."""
    if not mask_mods:
        raise SpecError("and_masks: expected at least one mask_mod, got none")

    def and_mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        out = mask_mods[0](b, h, q_idx, kv_idx)
        for m in mask_mods[1:]:
            out = out & m(b, h, q_idx, kv_idx)
        return out
    return and_mask_mod


def or_masks(*mask_mods: MaskMod) -> MaskMod:
    """A mask_mod visible where any of ``mask_mods`` is."""
    if not mask_mods:
        raise SpecError("or_masks: expected at least one mask_mod, got none")

    def or_mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        out = mask_mods[0](b, h, q_idx, kv_idx)
        for m in mask_mods[1:]:
            out = out | m(b, h, q_idx, kv_idx)
        return out
    return or_mask_mod


# ----------------------------------------------------------------------------------- presets
def _build(preset: str, head_dim: int, kw: dict[str, Any], **fields: Any) -> AttentionSpec:
    for k in fields:
        if k in kw:
            raise SpecError(
                f"presets.{preset}: expected no `{k}` (the preset sets it), got {k}={kw[k]!r}; combine "
                "modifiers with presets.and_masks / or_masks or build AttentionSpec directly"
            )
    kw.setdefault("name", preset)
    return AttentionSpec(head_dim, **fields, **kw)


def plain(head_dim: int, **kw: Any) -> AttentionSpec:
    """Plain softmax attention (any AttentionSpec field may be passed)."""
    return _build("plain", head_dim, kw)


def causal(head_dim: int, **kw: Any) -> AttentionSpec:
    """Causal attention (bottom-right aligned)."""
    return _build("causal", head_dim, kw, causal=True)


def sliding_window(window: int, head_dim: int, **kw: Any) -> AttentionSpec:
    """Causal sliding window: ``(q_idx >= kv_idx) & (q_idx - kv_idx <= window)``."""
    return _build("sliding_window", head_dim, kw, mask_mod=sliding_window_mask(window))


def alibi(slopes: torch.Tensor, head_dim: int, **kw: Any) -> AttentionSpec:
    """ALiBi bias ``score + slopes[h] * (kv_idx - q_idx)``; pass causal=True for the usual LM form."""
    return _build("alibi", head_dim, kw, score_mod=alibi_score_mod(slopes))


def softcap(cap: float, head_dim: int, **kw: Any) -> AttentionSpec:
    """Soft-capped scores ``cap * tanh(score / cap)``."""
    return _build("softcap", head_dim, kw, score_mod=softcap_score_mod(cap))


def prefix_lm(prefix: int, head_dim: int, **kw: Any) -> AttentionSpec:
    """Prefix LM: ``(kv_idx < prefix) | (q_idx >= kv_idx)``."""
    return _build("prefix_lm", head_dim, kw, mask_mod=prefix_lm_mask(prefix))


def document(doc_ids: torch.Tensor, head_dim: int, **kw: Any) -> AttentionSpec:
    """Document (packed-sequence) masking ``doc_ids[q_idx] == doc_ids[kv_idx]``."""
    return _build("document", head_dim, kw, mask_mod=document_mask(doc_ids))


def relative_bias(table: torch.Tensor, head_dim: int, **kw: Any) -> AttentionSpec:
    """Relative position bias from a (num_heads, 2R + 1) float table (buffer ``bias_table``):
    ``score + table[h, clamp(kv_idx - q_idx + R, 0, 2R)]`` (T5 / Swin style, learnable)."""
    return _build("relative_bias", head_dim, kw, score_mod=relative_bias_score_mod(table))


# ----------------------------------------------------------------------------------- registry
def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes 2^(-8 (i + 1) / H), float32 of shape (H,)."""
    h = _int_arg("num_heads", num_heads, lo=1)
    return torch.exp2(-8.0 * torch.arange(1, h + 1, dtype=torch.float64) / h).to(torch.float32)


def document_ids(seqlen: int, num_docs: int = 4) -> torch.Tensor:
    """int32 ids of ``num_docs`` equal-length documents packed into ``seqlen`` positions."""
    n, d = _int_arg("seqlen", seqlen, lo=1), _int_arg("num_docs", num_docs, lo=1)
    return (torch.arange(n, dtype=torch.int64) * d // n).to(torch.int32)


def relative_bias_table(num_heads: int, max_distance: int = 128) -> torch.Tensor:
    """A deterministic (num_heads, 2 * max_distance + 1) float32 table: ALiBi's symmetric decay
    ``-slope_h * |d|`` for distance d in [-max_distance, max_distance] (a starting point to learn)."""
    r = _int_arg("max_distance", max_distance)
    d = torch.arange(-r, r + 1, dtype=torch.float64).abs()
    return (-alibi_slopes(num_heads).double()[:, None] * d[None, :]).to(torch.float32)


def _reg_plain(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return plain(head_dim, **kw)


def _reg_causal(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return causal(head_dim, **kw)


def _reg_sliding_window(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return sliding_window(256, head_dim, **kw)


def _reg_alibi(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return alibi(alibi_slopes(num_heads), head_dim, **kw)


def _reg_softcap(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return softcap(30.0, head_dim, **kw)


def _reg_prefix_lm(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return prefix_lm(seqlen // 4, head_dim, **kw)


def _reg_document(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return document(document_ids(seqlen, 4), head_dim, **kw)


def _reg_relative_bias(head_dim: int, num_heads: int, seqlen: int, **kw: Any) -> AttentionSpec:
    return relative_bias(relative_bias_table(num_heads, 128), head_dim, **kw)


PRESETS: dict[str, Callable[..., AttentionSpec]] = {
    "plain": _reg_plain,
    "causal": _reg_causal,
    "sliding_window": _reg_sliding_window,  # window 256
    "alibi": _reg_alibi,                    # slopes 2^(-8(i+1)/H), not causal (add causal=True)
    "softcap": _reg_softcap,                # cap 30
    "prefix_lm": _reg_prefix_lm,            # prefix seqlen // 4
    "document": _reg_document,              # 4 equal documents over seqlen
    "relative_bias": _reg_relative_bias,    # (H, 257) table, R = 128, ALiBi-like symmetric decay
}
"""name -> f(head_dim, num_heads, seqlen, **AttentionSpec fields) with zero-config defaults."""


def get_preset(name: str, head_dim: int = 128, dtype: Any = "bf16", num_heads: int = 16,
               seqlen: int = 1024, **kw: Any) -> AttentionSpec:
    """A preset by name with CLI defaults; ``kw`` are further AttentionSpec fields (e.g. causal=True)."""
    if name not in PRESETS:
        raise SpecError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name](head_dim, num_heads, seqlen, dtype=dtype, **kw)
