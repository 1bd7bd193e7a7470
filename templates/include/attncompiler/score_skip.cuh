// attncompiler/score_skip.cuh -- the first K/V block worth visiting when the score_mod's column term makes
// every P of the blocks below it underflow (the score skip: attncompiler/plan/scoreskip.py; the per-call
// input: attncompiler/runtime/scoreskip.py and row_norms.cuh).
//
// A separable score_mod with a linear column term (ALiBi) feeds the softmax, in log2 units,
//   x(q, kv) = coef * s + slope * kv + R(q)          (s = q . k, the raw dot product),
// and |s| <= S = |q|max |k|max (1 + 2^-10) by Cauchy-Schwarz, from the largest squared row norms of q and
// k that attn_row_norms leaves in p.row_norms_sq per call (the factor covers their fp32 rounding and that
// of the dot products). kv_ref is a key every row of the tile sees: Nk - 1 without a mask; with one, the
// first key of the highest of the top ScoreSkip::kRefSearch blocks that tile_class proves FULL for the tile's
// rows. Every row visits kv_ref, so its softmax offset ends at least at x(q, kv_ref) - slack (slack: how
// far the kernel lets the offset trail the largest x seen: the lazy rescale's, or 0 for a running
// maximum) >= slope kv_ref - |coef| S + R(q) - slack. A key with
//   slope (kv_ref - kv) >= 2 |coef| S + slack + kUnderflowLog2
// then has x - m <= -kUnderflowLog2 in every row, a weight of at most 2^-136 beside the row's largest
// (exactly 0 where exp2 meets it at that offset: ex2.approx.ftz flushes results below 2^-126,
// ac_exp2_poly clamps at -127), so the walk may start above its block. Like a key of an EMPTY block, a
// skipped key contributes nothing, not even a NaN of its v row (the full walk would add 0 * NaN). A NaN
// or infinite bound (a non-finite q or k), slope <= 0 or no FULL block skips nothing. Returns the walk's
// first block, in [j_begin, the reference block]: the highest non-EMPTY block is never skipped.
//
// Requires (from the prelude): AttnParams, AttnBuffers, Variant (kScoreSepLinear's hooks, tile_class).
#pragma once

namespace ac {

struct ScoreSkip {
  static constexpr float kUnderflowLog2 = 136.f;  // exp2's flush at 2^-127, plus 9 for x's and m's fp32 rounding
  static constexpr int kRefSearch = 4;            // top blocks searched for a FULL one (the diagonal's, with a mask)
  static constexpr float kBoundMargin = 1.f + 1.f / 1024.f;
};

template <int BN>
__device__ __forceinline__ int score_skip_begin(int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                                const AttnBuffers& buf, int j_begin, int j_end, float slack) {
  // Instantiated only by a kernel planned with SCORE_SKIP (v2_fwd.cuh, v3_skip_begin in v3_fwd.cuh).
  static_assert(Variant::kHasScoreMod && Variant::kScoreSeparable && Variant::kScoreSepLinear && !Variant::kStaticMax,
                "the score skip needs a separable score_mod with a linear column term and the running offset");
  constexpr float kUnderflowLog2 = ScoreSkip::kUnderflowLog2;
  constexpr int kSkipRefSearch = ScoreSkip::kRefSearch;
  constexpr float kScoreBoundMargin = ScoreSkip::kBoundMargin;
  if (p.row_norms_sq == nullptr || j_end - j_begin < 2) return j_begin;
  const float slope = Variant::score_sep_slope(b, h, p, buf);
  if (!(slope > 0.f)) return j_begin;
  int j_ref = j_end - 1, kv_ref = p.Nk - 1;
  if constexpr (Variant::kHasMask) {
    j_ref = -1;
    for (int j = j_end - 1; j >= j_begin && j >= j_end - kSkipRefSearch; --j) {
      if (Variant::tile_class(b, h, q_lo, q_hi, j * BN, min(j * BN + BN, p.Nk) - 1, p, buf) == AC_TILE_FULL) {
        j_ref = j;
        break;
      }
    }
    if (j_ref < 0) return j_begin;
    kv_ref = j_ref * BN;
  }
  const float coef = fabsf(Variant::score_sep_coef(b, h, p, buf));
  const float q_sq = p.row_norms_sq[b * p.H + h];
  const float k_sq = p.row_norms_sq[p.B * p.H + b * p.H_kv + h / (p.H / p.H_kv)];
  const float bound = sqrtf(q_sq) * sqrtf(k_sq) * kScoreBoundMargin;
  const float need = 2.f * coef * bound + (slack + kUnderflowLog2);
  const float dist = need / slope;  // keys below kv_ref - dist underflow
  if (!(dist < 1.0e9f)) return j_begin;
  const int keep = kv_ref - __float2int_ru(dist) + 1;  // keys < keep are skipped: blocks below keep / BN
  return keep > 0 ? min(max(j_begin, keep / BN), j_ref) : j_begin;
}

}  // namespace ac
