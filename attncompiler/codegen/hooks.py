"""The variant's hook functions, printed from the IR's sympy expressions.

Emits the *prelude* every schedule's translation unit starts with (after common.cuh):
``ac_elem_t``, ``struct AttnParams``, ``struct AttnBuffers`` and ``struct Variant`` whose static
members ``score_mod``, ``mask`` and ``tile_class`` are the FlashInfer-style hooks the kernels call
(docs/architecture.md, "Hooks"), plus ``kv_range`` / ``q_range``: the K/V rows a query block can
see and the query rows a K/V block can be seen from (:mod:`attncompiler.ir.ranges`).  With
``backward=True`` (the backward translation units) the Variant also gets ``score_mod_grad`` --
d score_mod / d score, evaluated at the scaled score, derived symbolically by
:mod:`attncompiler.ir.grad` -- and ``kScoreModGradIsOne``; the forward's prelude is unchanged (byte
for byte, so cached forward kernels stay valid).
"""
from __future__ import annotations

import functools

import sympy

from ..ir.bounds import tile_classifier
from ..ir.grad import GradError, score_grad_expr
from ..ir.ranges import kv_dense, kv_range, q_range
from ..ir.scoreform import DIST_KV, DIST_Q, Q_REF, ScoreForm, q_scale_form, score_form
from ..ir.scorerange import static_offset_window
from ..ir.types import AttentionIR
from ..spec.symbols import B, H, SCORE
from ..runtime.params import PARAM_FIELDS, buffer_fields, c_struct
from .cuda_printer import (
    FAST_INDEX_LIMIT, SYMBOL_NAMES, CudaPrinter, PrinterError, _buffer_kinds, print_cuda, uses_fast_index,
)

__all__ = ["render_prelude", "fast_index_limit", "score_form_of", "static_offset_of", "q_scale_of", "ELEM_TYPES"]

ELEM_TYPES = {"bf16": "__nv_bfloat16", "fp16": "__half"}

_HOOK_ARGS = "const AttnParams& p, const AttnBuffers& buf"


def _bool(x: bool) -> str:
    return "true" if x else "false"


def _print(expr: object, kind: str, ir: AttentionIR) -> str:
    """A hook body expression in the printer's fast mode (cuda_printer's docstring)."""
    return print_cuda(expr, kind=kind, buffers=ir.buffers, fast=True)  # type: ignore[arg-type]


_ACC = sympy.Symbol("ac_acc", real=True)  # the raw Q K^T dot product (before the scale)
_SCALE = sympy.Symbol("aa_scale", positive=True)  # p.scale; sorts (and prints) before the per-element factors
_LOG2E = sympy.Float(1.4426950408889634)


def _log2_printer(ir: AttentionIR) -> CudaPrinter:
    names = SYMBOL_NAMES + ((_ACC, "s"), (_SCALE, "p.scale"), (Q_REF, "q_ref"), (DIST_KV, "ac_dkv"),
                            (DIST_Q, "ac_dq"))
    return CudaPrinter(names=names, float_symbols=frozenset({SCORE, _ACC, _SCALE}),
                       buffers=_buffer_kinds(ir.buffers), fast=True)


def _score_log2_sympy(ir: AttentionIR) -> sympy.Expr:
    """``log2(e) * score_mod(acc * p.scale)`` with the constant distributed over the top-level terms,
    so that the loop-invariant products (log2e * p.scale, log2e * slope[h]) are hoisted by the
    compiler and the per-element work is one multiply-add per term (C cannot reassociate this)."""
    expr = _LOG2E * ir.score_expr.subs(SCORE, _ACC * _SCALE)  # type: ignore[union-attr]
    if isinstance(expr, sympy.Mul) and any(isinstance(a, sympy.Add) for a in expr.args):
        expr = sympy.expand(expr, deep=False)
    return expr


def _score_log2_expr(ir: AttentionIR) -> str:
    return _log2_printer(ir).print(_score_log2_sympy(ir), "float")


@functools.lru_cache(maxsize=256)
def score_form_of(ir: AttentionIR) -> ScoreForm:
    """The factor / separable form (:mod:`attncompiler.ir.scoreform`) of the kernels' softmax input
    ``log2(e) * score_mod(acc * p.scale)``; without a score_mod: ``acc * p.scale * log2(e)``."""
    if ir.score_expr is None:
        return ScoreForm(factor=sympy.Integer(1), inner=_ACC * _SCALE * _LOG2E)
    return score_form(_score_log2_sympy(ir), _ACC)


@functools.lru_cache(maxsize=256)
def q_scale_of(ir: AttentionIR) -> tuple[sympy.Expr, sympy.Expr] | None:
    """``(c, G)`` when the score_mod's inner term (the factor form's, not a separable one) is ``G(c * acc)``
    with ``c`` a function of ``p.scale``, b and h only (:func:`attncompiler.ir.scoreform.q_scale_form`):
    the v3 forward may then scale its Q tile by ``c`` (plan option ``q_prescale``); else None."""
    if ir.score_expr is None:
        return None
    form = score_form_of(ir)
    if form.separable:
        return None
    return q_scale_form(form.inner, _ACC, frozenset({_SCALE, B, H}))


@functools.lru_cache(maxsize=256)
def static_offset_of(ir: AttentionIR) -> tuple[float, float] | None:
    """The window ``(m_lo, m_hi)`` (log2 units) of fixed softmax offsets a bounded score_mod allows in
    place of the running row maximum (:mod:`attncompiler.ir.scorerange`), or None."""
    if ir.score_expr is None:
        return None
    return static_offset_window(_score_log2_sympy(ir), ir.dtype)


def _score_form_lines(ir: AttentionIR) -> list[str]:
    """The hooks of :mod:`attncompiler.ir.scoreform`: the score_mod's positive factor and its
    separable form (defaults that the kernels never take without a score_mod)."""
    form = score_form_of(ir)
    pr = _log2_printer(ir)
    sep = form.separable
    linear = sep and form.col_slope is not None
    zero = "0.f"
    coef = pr.print(form.coef, "float") if sep else zero
    slope = pr.print(form.col_slope, "float") if linear else zero
    col = pr.print(form.col, "float") if sep else zero
    row = pr.print(form.row, "float") if sep else zero
    dkv = "    const int ac_dkv = kv_idx - q_ref;\n" if linear else ""
    dq = "    const int ac_dq = q_ref - q_idx;\n" if linear else ""
    args = "int b, int h"
    static = static_offset_of(ir)
    qs = q_scale_of(ir)
    q_scale, inner_qs = (pr.print(qs[0], "float"), pr.print(qs[1], "float")) if qs else ("1.f", "s")
    return [
        "  // log2(e) * score_mod(s * p.scale) = kScoreLog2Factor * score_mod_log2_inner(...), kScoreLog2Factor > 0",
        f"  static constexpr float kScoreLog2Factor = {pr.print(form.factor, 'float')};",
        "  static __device__ __forceinline__ float score_mod_log2_inner(float s, int b, int h, int q_idx, int kv_idx,",
        f"                                                               {_HOOK_ARGS}) {{",
        f"    return {pr.print(form.inner, 'float')};",
        "  }",
        "  // inner = G(c * s) with c a function of p.scale, b and h only (ir/scoreform.py, q_scale_form): the v3",
        "  // forward may multiply its Q tile by c = score_q_scale (plan option q_prescale) and take G of the dot",
        "  // products, score_mod_log2_inner_qscaled",
        f"  static constexpr bool kScoreQScale = {_bool(qs is not None)};",
        f"  static __device__ __forceinline__ float score_q_scale({args}, {_HOOK_ARGS}) {{ return {q_scale}; }}",
        "  static __device__ __forceinline__ float score_mod_log2_inner_qscaled(float s, int b, int h, int q_idx,",
        f"                                                                      int kv_idx, {_HOOK_ARGS}) {{",
        f"    return {inner_qs};",
        "  }",
        "  // separable: log2(e) * score_mod(s * p.scale) = coef * s + col(kv_idx, q_ref) + row(q_idx, q_ref) for any",
        "  // reference row q_ref; the row term drops out of the softmax (the kernels add it to the LSE).",
        "  // kScoreSepLinear: col = slope * (kv_idx - q_ref)",
        f"  static constexpr bool kScoreSeparable = {_bool(sep)};",
        f"  static constexpr bool kScoreSepLinear = {_bool(linear)};",
        "  // coef > 0 for every input (sympy, with p.scale > 0): the v3 forward may start the S GEMM from col / coef",
        f"  static constexpr bool kScoreSepCoefPositive = {_bool(sep and bool(form.coef.is_positive))};",
        f"  static __device__ __forceinline__ float score_sep_coef({args}, {_HOOK_ARGS}) {{ return {coef}; }}",
        f"  static __device__ __forceinline__ float score_sep_slope({args}, {_HOOK_ARGS}) {{ return {slope}; }}",
        f"  static __device__ __forceinline__ float score_sep_col({args}, int kv_idx, int q_ref, {_HOOK_ARGS}) {{",
        f"{dkv}    return {col};",
        "  }",
        f"  static __device__ __forceinline__ float score_sep_row({args}, int q_idx, int q_ref, {_HOOK_ARGS}) {{",
        f"{dq}    return {row};",
        "  }",
        "  // bounded score_mod (ir/scorerange.py): with any offset m in [kStaticMaxLo, kStaticMaxHi], exp2(E - m)",
        "  // neither overflows nor underflows for any input, so the softmax may fix a row's offset at its first K/V",
        "  // block's maximum clamped into this window instead of keeping a running maximum (bf16 P only)",
        f"  static constexpr bool kStaticMax = {_bool(static is not None)};",
        f"  static constexpr float kStaticMaxLo = {repr(float(static[0] if static else 0.0))}f;",
        f"  static constexpr float kStaticMaxHi = {repr(float(static[1] if static else 0.0))}f;",
        "  // a row's fixed offset from its first block's maximum m (log2 units; -inf for a row with no visible key)",
        "  static __device__ __forceinline__ float static_offset(float m) {",
        "    return fminf(fmaxf(m, kStaticMaxLo), kStaticMaxHi);",
        "  }",
    ]


def fast_index_limit(ir: AttentionIR) -> int | None:
    """The largest sequence length (and batch, heads) this variant's hooks are exact for, or None
    when they convert no index to float with ``ac_i2f`` (then no limit beyond the kernels' own).
    The score_mod's derivative (backward) is included."""
    texts = []
    if ir.score_expr is not None:
        texts.append(_print(ir.score_expr, "float", ir))
        try:
            texts.append(_print(score_grad_expr(ir.score_expr), "float", ir))
        except (GradError, PrinterError):  # no derivative: the backward refuses this variant on its own
            pass
    if ir.mask_expr is not None:
        texts.append(_print(ir.mask_expr, "bool", ir))
    return FAST_INDEX_LIMIT if any(uses_fast_index(t) for t in texts) else None


def render_prelude(ir: AttentionIR, *, backward: bool = False) -> str:
    """C++ for the element type, the parameter structs and the ``Variant`` hooks of ``ir``.

    ``backward`` adds the ``score_mod_grad`` hook (raises :class:`attncompiler.ir.grad.GradError`
    when the derivative has no closed form)."""
    has_score = ir.score_expr is not None
    has_mask = ir.mask_expr is not None
    has_dropout = ir.dropout_p > 0.0
    score_body = f"return {_print(ir.score_expr, 'float', ir)};" if has_score else "return score;"
    mask_body = f"return {_print(ir.mask_expr, 'bool', ir)};" if has_mask else "return true;"
    tile_body = tile_classifier(ir.mask_expr, ir.buffers).to_cuda() if has_mask else "return AC_TILE_FULL;"
    lines = [
        f"typedef {ELEM_TYPES[ir.dtype]} ac_elem_t;",
        "",
        c_struct("AttnParams", PARAM_FIELDS),
        "",
        c_struct("AttnBuffers", buffer_fields(ir.buffers)),
        "",
        "// The variant's hooks (generated from the spec's score_mod / mask_mod).",
        "struct Variant {",
        f"  static constexpr bool kHasScoreMod = {_bool(has_score)};",
        f"  static constexpr bool kHasMask = {_bool(has_mask)};",
        f"  static constexpr bool kHasDropout = {_bool(has_dropout)};",
        "",
        "  // score_mod: the scaled score -> the modified score",
        "  static __device__ __forceinline__ float score_mod(float score, int b, int h, int q_idx, int kv_idx,",
        f"                                                    {_HOOK_ARGS}) {{",
        f"    {score_body}",
        "  }",
        "  // log2(e) * score_mod(s * p.scale) for the raw dot product s: the forward kernels' softmax input",
        "  static __device__ __forceinline__ float score_mod_log2(float s, int b, int h, int q_idx, int kv_idx,",
        f"                                                         {_HOOK_ARGS}) {{",
        f"    return {_score_log2_expr(ir) if has_score else 's * p.scale * AC_LOG2E'};",
        "  }",
    ]
    lines += _score_form_lines(ir)
    lines += [
        "  // mask_mod: true = the key is visible to the query",
        "  static __device__ __forceinline__ bool mask(int b, int h, int q_idx, int kv_idx, " + _HOOK_ARGS + ") {",
        f"    {mask_body}",
        "  }",
        "  // tile [q_lo, q_hi] x [kv_lo, kv_hi] (inclusive): AC_TILE_EMPTY / AC_TILE_PARTIAL / AC_TILE_FULL",
        "  static __device__ __forceinline__ int tile_class(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi,",
        f"                                                   {_HOOK_ARGS}) {{",
    ]
    lines += ["    " + ln for ln in tile_body.strip().splitlines()]
    lines += ["  }"]
    mask = ir.mask_expr if has_mask else None
    lines += [
        "  // no EMPTY K/V block inside kv_range of any query rows (ir/ranges.py kv_dense): the walk visits them",
        "  // all without searching for EMPTY ones",
        f"  static constexpr bool kKvDense = {_bool(kv_dense(mask))};",
        "  // K/V rows [lo, hi] that query rows [q_lo, q_hi] (inclusive) can see: no visible key lies",
        "  // outside (sound; exact for linear masks); lo > hi: none",
        "  static __device__ __forceinline__ void kv_range(int b, int h, int q_lo, int q_hi, " + _HOOK_ARGS + ",",
        "                                                  int& lo, int& hi) {",
    ]
    lines += ["    " + ln for ln in kv_range(mask).to_cuda().splitlines()]
    lines += [
        "  }",
        "  // query rows [lo, hi] from which K/V rows [kv_lo, kv_hi] (inclusive) can be seen; lo > hi: none",
        "  static __device__ __forceinline__ void q_range(int b, int h, int kv_lo, int kv_hi, " + _HOOK_ARGS + ",",
        "                                                 int& lo, int& hi) {",
    ]
    lines += ["    " + ln for ln in q_range(mask).to_cuda().splitlines()]
    lines += ["  }"]
    if backward:
        grad = score_grad_expr(ir.score_expr)
        grad_body = f"return {_print(grad, 'float', ir)};"
        lines += [
            f"  // d score_mod / d score at the scaled score: {grad}",
            f"  static constexpr bool kScoreModGradIsOne = {_bool(grad == 1)};",
            "  static __device__ __forceinline__ float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx,",
            f"                                                         {_HOOK_ARGS}) {{",
            f"    {grad_body}",
            "  }",
        ]
    lines += ["};"]
    return "\n".join(lines)
