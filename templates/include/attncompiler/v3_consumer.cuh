// attncompiler/v3_consumer.cuh -- the v3 forward's shared-memory layout (V3Layout), its TMA maps
// (V3Maps) and the per-thread state and math of one consumer warpgroup (V3Consumer: the wgmma
// issues, the softmax with its score_mod and mask hooks, the O rescale, P packing with dropout), and two helpers of
// the consumer loop (v3_skip_begin: the score skip's first block; v3_by_part: a half block's GEMM arm).
// v3_fwd.cuh has the schedule that drives them and documents the layout.
//
// Requires (from the prelude and the TU): ac_elem_t, AttnParams, AttnBuffers, Variant; ac::wgmma_qk
// and ac::wgmma_pv; v3_sm90.cuh, mma.cuh (fast_exp2, ac_exp2_poly), philox.cuh (dropout), score_skip.cuh.
#pragma once

namespace ac {

struct V3Maps {
  TmaDesc q, k, v;  // 4-d tensor maps (head dim, seqlen, heads, batch) of q, k, v
};
// Cfg::TMA_STORE_O: the output's map too, boxes of 64 columns x 64 rows (one consumer warpgroup's rows)
struct V3MapsO {
  TmaDesc q, k, v, o;
};

template <class Cfg>
struct V3Layout {
  static constexpr int D = Cfg::D;
  static constexpr int DV = Cfg::DV;
  static constexpr int BM = Cfg::BLOCK_M;
  static constexpr int BN = Cfg::BLOCK_N;
  static constexpr int STAGES = Cfg::STAGES;
  static constexpr int NC = Cfg::NC;                  // consumer warpgroups
  static constexpr int NTHREADS = 128 * (NC + 1);
  static constexpr int BOX_COLS = 64;                 // 128 bytes: the 128-byte swizzle's row
  // 64-column boxes per row of Q / K (DB) and of V (DVB). A head dim that is not a multiple of 64
  // (96, 80, ...) takes a last box whose columns >= D lie outside the tensor: TMA writes them as zeros
  // (and counts their bytes), the Q K^T wgmma's k16 steps stop at D, and the P V wgmma's N is DV.
  static constexpr int DB = (D + BOX_COLS - 1) / BOX_COLS;
  static constexpr int DVB = (DV + BOX_COLS - 1) / BOX_COLS;
  static constexpr int kQBytes = BM * DB * 128;
  static constexpr int kKBytes = BN * DB * 128;
  static constexpr int kVBytes = BN * DVB * 128;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  // Cfg::TMA_STORE_O: the O tile the epilogue stages for its TMA stores, after the K/V ring (DVB boxes of BM rows)
  static constexpr int kOOffset = kQBytes + STAGES * kStageBytes;
  static constexpr int kOBytes = Cfg::TMA_STORE_O ? BM * DVB * 128 : 0;
  static constexpr int kBarOffset = kOOffset + kOBytes;
  // Q_PREFETCH: two more (the O tiles staged, one per buffer; v3_fwd.cuh)
  static constexpr int kNumBars = 2 + 4 * STAGES + (Cfg::Q_PREFETCH ? 2 : 0);
  static constexpr int kAlignSlack = 1024;            // dynamic smem is only 16-byte aligned
  static constexpr int kTileWordBytes = 8;           // after the barriers: the walk's first block (SCORE_SKIP)
  static constexpr int kSmemBytes = kAlignSlack + kBarOffset + 8 * kNumBars + kTileWordBytes;
  static constexpr int NS = BN / 2;                   // S accumulator floats per thread
  static constexpr int NO = DV / 2;                   // O accumulator floats per thread
  static constexpr int KT_PV = BN / 16;               // k16 steps of P V

  static_assert(D % 16 == 0 && DV % 16 == 0, "head dims: k16 steps of Q K^T, 16-byte rows of the O copy");
  static_assert(D <= 256 && DV <= 256, "wgmma N and TMA box rows are at most 256");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "BLOCK_N: a multiple of 16 in [16, 256]");
  static_assert(BM == 64 * NC && NC >= 1 && NC <= 3, "each consumer warpgroup owns 64 query rows (1..3 of them)");
  static_assert(STAGES >= 1 && STAGES <= 4, "K/V stages");
  static_assert(Cfg::EXP2_POLY >= 0 && Cfg::EXP2_POLY <= 8, "EXP2_POLY: polynomial exponentials per 8 n8 tiles");
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0 && kOBytes % 1024 == 0,
                "1024-byte aligned tiles");
  static_assert(!Cfg::TMA_STORE_O || Cfg::PERSISTENT, "the O tile's TMA stores are the persistent grid's epilogue");
  static_assert(!Cfg::Q_PREFETCH || (Cfg::TMA_STORE_O && !Cfg::SCORE_SKIP && kOBytes == kQBytes),
                "Q_PREFETCH: Q tiles alternate between the Q and the O tile (of one size); no tile word");
  static_assert(kSmemBytes <= 232448, "227 KB per block on sm_90");
};

// The mbarriers after V3Layout::kBarOffset (8 bytes each): Q landed, full K[STAGES], full V[STAGES], empty K[STAGES],
// empty V[STAGES], Q free (Cfg::Q_PREFETCH: the Q of buffer 1 landed), then Q_PREFETCH's two "O staged" (extra(0..1)).
template <int STAGES>
struct V3Bars {
  unsigned int base;
  __device__ __forceinline__ unsigned int q() const { return base; }
  __device__ __forceinline__ unsigned int full_k(int s) const { return base + 8u * (1 + s); }
  __device__ __forceinline__ unsigned int full_v(int s) const { return base + 8u * (1 + STAGES + s); }
  __device__ __forceinline__ unsigned int empty_k(int s) const { return base + 8u * (1 + 2 * STAGES + s); }
  __device__ __forceinline__ unsigned int empty_v(int s) const { return base + 8u * (1 + 3 * STAGES + s); }
  __device__ __forceinline__ unsigned int q_free() const { return base + 8u * (1 + 4 * STAGES); }
  __device__ __forceinline__ unsigned int extra(int i) const { return base + 8u * (2 + 4 * STAGES + i); }
};

// Per-thread state of one consumer warpgroup.
template <class Cfg>
struct V3Consumer {
  using L = V3Layout<Cfg>;
  using Tr = ac_type_traits<ac_elem_t>;
  static constexpr int NS = L::NS, NO = L::NO, BN = L::BN;
  static constexpr bool kStatic = Variant::kStaticMax;  // a fixed softmax offset per row (ir/scorerange.py)
  // Lazy rescaling: log2 units a block's row maximum may exceed the running offset before the offset
  // (and O, l) move. P then stays <= 2^8 (in range for fp32, bf16 and fp16; rounded to 16 bits as any
  // P) and l <= 2^8 Nk. Measured on an H100 (2026-11-22, N = 16k, 3 interleaved rounds, TFLOP/s,
  // eager -> lazy): plain d256 700 -> 752, d128 653 -> 664, causal d128 599 -> 615, plain d64 509 ->
  // 515; ALiBi unchanged with the ascending walk (its row maximum grows with the key position), hence
  // its descending walk (KvWalk, plan/v3.py KV_DESCENDING_SEPARABLE).
  static constexpr float kRescaleSlack = 8.f;
  // A separable score_mod whose coefficient is positive (ALiBi: coef = log2(e) * scale) enters the S
  // GEMM: the accumulator starts at col / coef instead of 0, so acc = s + col / coef and x = coef * acc.
  // The softmax then runs plain's per-score code (max, one multiply-add into exp2 with coef as its
  // scale): one multiply-add per score less, and one dependent step less before the row maximum; the
  // start value costs one register move per score, issued before the GEMM.
  static constexpr bool kSepInAcc =
      Variant::kHasScoreMod && Variant::kScoreSeparable && Variant::kScoreSepCoefPositive;

  float acc_o[NO];
  float acc_s[NS];
  // HALF_BLOCKS: S of one half of a block (its own registers: a half-width wgmma into half of acc_s, mixed
  // with whole-width ones, makes ptxas serialize every wgmma, C7511); take_half moves it into acc_s.
  float acc_h[Cfg::HALF_BLOCKS ? NS / 2 : 1];
  unsigned int p_frag[L::KT_PV][4];
  float row_max[2];  // log2 domain (with a fixed offset: set by the first block, then constant)
  float row_sum[2];  // this thread's partial sums (reduced over the quad in the epilogue)

  // S = Q K^T (issued, not waited): Q rows [64*wg, 64*wg + 64) of the Q tile, K of one stage.
  // Descriptors are a base descriptor plus the byte offset >> 4 (the start address field is the
  // low 14 bits and never carries: shared addresses < 256 KB); the base goes through an opaque move
  // so the compiler recomputes the per-step descriptors (uniform adds) instead of keeping D/8 of them
  // live across the loop.
  __device__ __forceinline__ void issue_qk(unsigned int sQ, unsigned int sK, int wg) {
    reg_fence(acc_s);
    const unsigned long long dq = opaque_u64(wgmma_desc_sw128(sQ + wg * 64 * 128, 16, 1024));
    const unsigned long long dk = opaque_u64(wgmma_desc_sw128(sK, 16, 1024));
#pragma unroll
    for (int kk = 0; kk < L::D / 16; ++kk) {
      const unsigned int box = kk / 4, off = (kk % 4) * 32;
      wgmma_qk(acc_s, dq + ((box * L::BM * 128 + off) >> 4), dk + ((box * BN * 128 + off) >> 4),
               (kk > 0 || kSepInAcc) ? 1 : 0);
    }
    reg_fence(acc_s);
  }

  // O += P V (issued, not waited): P from registers, V of one stage as the transposed B.
  __device__ __forceinline__ void issue_pv(unsigned int sV) {
    reg_fence(acc_o);
    const unsigned long long dv = opaque_u64(wgmma_desc_sw128(sV, BN * 128, 1024));
#pragma unroll
    for (int kk = 0; kk < L::KT_PV; ++kk) wgmma_pv(acc_o, p_frag[kk], dv + ((kk * 16 * 128) >> 4));
    reg_fence(acc_o);
  }

  // HALF_BLOCKS: the GEMMs of one block over a part of its keys. part 0: all of them (issue_qk / issue_pv);
  // 1: the low half only, 2: the high half only (the other half EMPTY for this warpgroup's rows: its S
  // registers keep stale values, which the masked softmax sets to -inf, so its P are 0 and P V skips them).
  // The K rows of the high half start BN/2 rows into each 64-column box (BN/2 * 128 bytes: whole 8-row
  // swizzle atoms); its P V k16 steps are the upper KT_PV / 2. `part` must be warp-uniform (a branch around
  // wgmma).
  __device__ __forceinline__ void issue_qk_part(int part, unsigned int sQ, unsigned int sK, int wg) {
    if constexpr (Cfg::HALF_BLOCKS) {
      if (part != 0) {
        reg_fence(acc_h);
        const unsigned long long dq = opaque_u64(wgmma_desc_sw128(sQ + wg * 64 * 128, 16, 1024));
        const unsigned long long dk = opaque_u64(wgmma_desc_sw128(sK, 16, 1024));
        const unsigned int k_off = part == 1 ? 0u : (BN / 2) * 128u;  // the high half: BN/2 rows on
#pragma unroll
        for (int kk = 0; kk < L::D / 16; ++kk) {
          const unsigned int box = kk / 4, off = (kk % 4) * 32;
          wgmma_qk_half(acc_h, dq + ((box * L::BM * 128 + off) >> 4), dk + ((box * BN * 128 + k_off + off) >> 4),
                        kk > 0 ? 1 : 0);
        }
        reg_fence(acc_h);
        return;
      }
    }
    issue_qk(sQ, sK, wg);
  }
  // After the wait for a half S: acc_h into the low (kHi false) or high half of acc_s (kSepInAcc: added to
  // the column terms init_s put there).
  template <bool kHi>
  __device__ __forceinline__ void take_half() {
    if constexpr (Cfg::HALF_BLOCKS) {
#pragma unroll
      for (int i = 0; i < NS / 2; ++i) {
        if constexpr (kSepInAcc) {
          acc_s[i + (kHi ? NS / 2 : 0)] += acc_h[i];
        } else {
          acc_s[i + (kHi ? NS / 2 : 0)] = acc_h[i];
        }
      }
    }
  }
  __device__ __forceinline__ void issue_pv_part(int part, unsigned int sV) {
    if constexpr (Cfg::HALF_BLOCKS) {
      if (part != 0) {
        static_assert(L::KT_PV % 2 == 0, "half blocks: an even number of P V k16 steps");
        reg_fence(acc_o);
        const unsigned long long dv = opaque_u64(wgmma_desc_sw128(sV, BN * 128, 1024));
        if (part == 1) {
#pragma unroll
          for (int kk = 0; kk < L::KT_PV / 2; ++kk) wgmma_pv(acc_o, p_frag[kk], dv + ((kk * 16 * 128) >> 4));
        } else {
#pragma unroll
          for (int kk = L::KT_PV / 2; kk < L::KT_PV; ++kk) wgmma_pv(acc_o, p_frag[kk], dv + ((kk * 16 * 128) >> 4));
        }
        reg_fence(acc_o);
        return;
      }
    }
    issue_pv(sV);
  }

  // The score_mod's separable form (Variant::kScoreSeparable, ir/scoreform.py): x = coef * s + col,
  // col = slope * (kv - q_ref) (linear) or score_sep_col; q_ref = this warp's first row. Set per tile
  // (set_score_mod); with kSepInAcc also 1 / coef and slope / coef.
  float sep_coef, sep_slope, sep_inv_coef, sep_slope_acc;

  // The score_mod's per-tile constants (separable forms).
  __device__ __forceinline__ void set_score_mod(int b, int h, const AttnParams& p, const AttnBuffers& buf) {
    if constexpr (Variant::kHasScoreMod && Variant::kScoreSeparable) {
      sep_coef = Variant::score_sep_coef(b, h, p, buf);
      sep_slope = Variant::score_sep_slope(b, h, p, buf);
      if constexpr (kSepInAcc) {
        sep_inv_coef = 1.f / sep_coef;
        sep_slope_acc = sep_slope * sep_inv_coef;
      }
    }
  }

  // kSepInAcc: S's start value for the K/V block at kv0, col / coef per column (both rows of a pair).
  __device__ __forceinline__ void init_s(int kv0, int row0, int b, int h, const AttnParams& p, const AttnBuffers& buf) {
    if constexpr (kSepInAcc) {
      const int t = threadIdx.x & 3;
      const float c0 = Variant::kScoreSepLinear ? sep_slope_acc * __int2float_rn(kv0 + 2 * t - row0) : 0.f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float c;
          if constexpr (Variant::kScoreSepLinear) {
            c = fmaf(sep_slope_acc, float(nt * 8 + e), c0);
          } else {
            c = Variant::score_sep_col(b, h, kv0 + nt * 8 + 2 * t + e, row0, p, buf) * sep_inv_coef;
          }
          acc_s[4 * nt + e] = c;
          acc_s[4 * nt + 2 + e] = c;
        }
      }
    }
  }

  // exp2's multiplier of the softmax input for this tile: coef with kSepInAcc, else the kernel's.
  __device__ __forceinline__ float tile_exp_scale(float exp_scale) const {
    if constexpr (kSepInAcc) {
      return sep_coef;
    } else {
      return exp_scale;
    }
  }

  // One of this thread's exponentials: exp2(a * b - m), on MUFU or, for the first EXP2_POLY of every
  // 8 n8 tiles, on the FMA pipes (mma.cuh, ac_exp2_poly).
  template <int NT>
  static __device__ __forceinline__ float exp2_sel(float a, float b, float m) {
    if constexpr (NT % 8 < Cfg::EXP2_POLY) {
      return ac_exp2_poly(fmaf(a, b, -m));
    } else {
      return fast_exp2(fmaf(a, b, -m));
    }
  }

  // kRoundP: P is rounded to the element type here, so that l sums the very weights P V multiplies
  // (convert_p's rounding is then exact).
  template <int NT, int HF, bool kRoundP = false>
  __device__ __forceinline__ void exp_pair(float exp_scale, float m_ref, float& sum) {
    float* c = &acc_s[4 * NT + 2 * HF];
    c[0] = exp2_sel<NT>(c[0], exp_scale, m_ref);
    c[1] = exp2_sel<NT>(c[1], exp_scale, m_ref);
    if constexpr (kRoundP) Tr::round2(c[0], c[1]);
    sum += c[0] + c[1];
    if constexpr (NT + 1 < BN / 8) exp_pair<NT + 1, HF, kRoundP>(exp_scale, m_ref, sum);
  }

  // With a fixed offset the first block's P are summed as rounded: its row maximum may lie outside the
  // offset window, so no P need be exactly 1, and a row whose keys all lie in this block then gets
  // O = sum(P v) / sum(P) with the same P on both sides (one key gives exactly v, as eager does). Later
  // blocks sum unrounded P (rounding them all cost 8 % at d = 128); dropout scales P after this sum
  // anyway, so it keeps the unrounded one.
  static constexpr bool kRoundFirstP = kStatic && !Variant::kHasDropout;

  // S <- -inf where the mask hides the key (and, with kRagged, where kv_idx >= Nk: TMA zero-filled rows).
  template <bool kRagged>
  __device__ __forceinline__ void mask_pass(int kv0, int row0, int b, int h, const AttnParams& p,
                                            const AttnBuffers& buf) {
#ifdef AC_V3_NO_MASK_PASS  // timing only (wrong results): what evaluating the mask costs a PARTIAL block
    return;
#endif
    const int t = threadIdx.x & 3;
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kv_idx = kv0 + nt * 8 + 2 * t + e;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int q_idx = row0 + g + 8 * hf;
          bool visible = !kRagged || kv_idx < p.Nk;
          if constexpr (Variant::kHasMask) visible = visible && Variant::mask(b, h, q_idx, kv_idx, p, buf);
          if (!visible) acc_s[4 * nt + 2 * hf + e] = AC_NEG_INF;
        }
      }
    }
  }

  // score_mod, then the mask (only when `masked`: a branch around the mask pass alone, see
  // softmax_dispatch), the online-softmax update of one S tile, then S <- exp2(S - m) in place (summed
  // into l; dropout comes in convert_p). alpha: the rescale of the previous O and l.
  // kFirst: the tile's first visited K/V block (with a fixed offset, kStatic, the only one that takes a
  // row maximum).
  template <bool kFirst>
  __device__ __forceinline__ void softmax(bool masked, int kv0, int row0, float exp_scale, int b, int h,
                                          const AttnParams& p, const AttnBuffers& buf, float (&alpha)[2]) {
    const int t = threadIdx.x & 3;
    const int g = (threadIdx.x & 31) >> 2;
    constexpr bool kSep = Variant::kHasScoreMod && Variant::kScoreSeparable && !kSepInAcc;  // else in acc
    // column term of this thread's first column (kv0 + 2t); the others add slope * (8 nt + e)
    const float col0 = kSep && Variant::kScoreSepLinear ? sep_slope * __int2float_rn(kv0 + 2 * t - row0) : 0.f;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kv_idx = kv0 + nt * 8 + 2 * t + e;
        float col = 0.f;
        if constexpr (kSep) {
          if constexpr (Variant::kScoreSepLinear) {
            col = fmaf(sep_slope, float(nt * 8 + e), col0);
          } else {
            col = Variant::score_sep_col(b, h, kv_idx, row0, p, buf);
          }
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int q_idx = row0 + g + 8 * hf;
          float x = acc_s[4 * nt + 2 * hf + e];
          if constexpr (kSep) {
            x = fmaf(x, sep_coef, col);
          } else if constexpr (Variant::kHasScoreMod && Cfg::Q_PRESCALE) {
            x = Variant::score_mod_log2_inner_qscaled(x, b, h, q_idx, kv_idx, p, buf);  // Q holds c q
          } else if constexpr (Variant::kHasScoreMod && !kSepInAcc) {
            x = Variant::score_mod_log2_inner(x, b, h, q_idx, kv_idx, p, buf);
          }
          acc_s[4 * nt + 2 * hf + e] = x;
        }
      }
    }
    if (masked) {
      // A block inside the sequence needs no kv_idx < Nk test per element. Measured on the H100 (N = 16k,
      // 7 interleaved rounds, with vs without the test): document d = 64 2.41 -> 2.29 ms at BN 176 (the
      // planner's cap for masks that read buffers: at BN 192 the two copies spill); sliding window d = 64 /
      // 128, causal, document and prefix-LM d = 128 within 1 % (docs/perf-notes.md, thirteenth session).
      if (kv0 + BN <= p.Nk) {
        mask_pass<false>(kv0, row0, b, h, p, buf);
      } else {
        mask_pass<true>(kv0, row0, b, h, p, buf);
      }
    }
    if constexpr (kStatic && !kFirst) {
      // A bounded score_mod (softcap) after the first block: the row's offset stays fixed
      // (ir/scorerange.py), so the exponentials need no row reduction first and O, l keep their scale.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) alpha[hf] = 1.f;
      float sum0 = 0.f, sum1 = 0.f;
      exp_pair<0, 0>(exp_scale, row_max[0], sum0);
      exp_pair<0, 1>(exp_scale, row_max[1], sum1);
      row_sum[0] += sum0;
      row_sum[1] += sum1;
    } else {
      row_stats(exp_scale, alpha);
    }
  }

  // The row maxima of one S tile (a tree, then over the quad), the offsets and alpha, then S <- exp2(S - m)
  // summed into l: the running maximum, or with kStatic the first block's clamped maximum.
  __device__ __forceinline__ void row_stats(float exp_scale, float (&alpha)[2]) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx[BN / 8];
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) mx[nt] = fmaxf(acc_s[4 * nt + 2 * hf], acc_s[4 * nt + 2 * hf + 1]);
#pragma unroll
      for (int w = 1; w < BN / 8; w *= 2) {
#pragma unroll
        for (int nt = 0; nt + w < BN / 8; nt += 2 * w) mx[nt] = fmaxf(mx[nt], mx[nt + w]);
      }
      float m = mx[0];
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      float m_ref;
      if constexpr (kStatic) {
        // The first block: its row maximum, clamped into the window where exp2(E - m) stays in range
        // for every later score, fixes the row's offset (a row without a visible key here takes the
        // window's low end). A row whose keys all lie in this block keeps P = 1 for its largest score.
        m_ref = Variant::static_offset(m * exp_scale);
        alpha[hf] = 1.f;
        row_max[hf] = m_ref;
      } else {
        // Lazy rescaling (FlashAttention-4's): the offset moves only when the block's maximum exceeds it
        // by more than kRescaleSlack, so P may reach 2^kRescaleSlack and most blocks keep alpha = 1 and
        // skip rescale_o. The first visited block always moves it (m_old = -inf).
        const float m_old = row_max[hf];
        const float m_tile = m * exp_scale;
        const float m_new = (m_tile > m_old + kRescaleSlack) ? m_tile : m_old;
        // A row with no visible key so far keeps m = -inf; 0 as the reference keeps exp2 NaN-free.
        m_ref = (m_new == AC_NEG_INF) ? 0.f : m_new;
        alpha[hf] = (m_new == m_old) ? 1.f : fast_exp2(m_old - m_ref);
        row_max[hf] = m_new;
      }
      float sum = 0.f;
      if (hf == 0) {
        exp_pair<0, 0, kRoundFirstP>(exp_scale, m_ref, sum);
      } else {
        exp_pair<0, 1, kRoundFirstP>(exp_scale, m_ref, sum);
      }
      row_sum[hf] = row_sum[hf] * alpha[hf] + sum;
    }
  }

  // Two copies of the softmax (the branch on `masked` outside it) or one (the branch around the mask pass
  // alone): the planner's choice, plan/v3_softmax.py. With one copy ptxas waits for the previous block's P V
  // before the exponentials (unless LATE_PV_WAIT); two need `masked` warp-uniform to ptxas (v3_fwd.cuh
  // needs_mask votes it), else it guards every shuffle of the row reductions as divergent.
  static constexpr bool kTwoSoftmaxCopies = Cfg::SOFTMAX_COPIES == 2;
  template <bool kFirst = false>
  __device__ __forceinline__ void softmax_dispatch(bool masked, int kv0, int row0, float exp_scale, int b, int h,
                                                   const AttnParams& p, const AttnBuffers& buf, float (&alpha)[2]) {
    if constexpr (kTwoSoftmaxCopies) {
      if (masked) {
        softmax<kFirst>(true, kv0, row0, exp_scale, b, h, p, buf, alpha);
      } else {
        softmax<kFirst>(false, kv0, row0, exp_scale, b, h, p, buf, alpha);
      }
    } else {
      softmax<kFirst>(masked, kv0, row0, exp_scale, b, h, p, buf, alpha);
    }
  }

  // Lazy rescaling: most blocks leave every row's offset alone, so O is rescaled only where some row of the
  // warp moved it (a warp-uniform vote; with a fixed offset alpha is 1 and there is nothing to do).
  __device__ __forceinline__ bool needs_rescale(const float (&alpha)[2]) const {
    if constexpr (kStatic) return false;
    return __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f);
  }
  __device__ __forceinline__ void scale_o(const float (&alpha)[2]) {
#pragma unroll
    for (int nt = 0; nt < NO / 4; ++nt) {
      acc_o[4 * nt + 0] *= alpha[0];
      acc_o[4 * nt + 1] *= alpha[0];
      acc_o[4 * nt + 2] *= alpha[1];
      acc_o[4 * nt + 3] *= alpha[1];
    }
  }
  __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
    if (needs_rescale(alpha)) scale_o(alpha);
  }

  // P's A fragments for the k16 steps of P V: the C layout of two adjacent n8 tiles of S is the
  // A layout of one k16 step (per warp, as for mma.sync m16n8k16).
  // Dropout is applied here, after the previous P V retired its P registers (fewer live registers
  // than during the softmax): one Philox call per (m16, n8) tile covers this thread's four elements
  // (docs/architecture.md).
  __device__ __forceinline__ void convert_p(int kv0, int row0, int b, int h, const AttnParams& p) {
    if constexpr (Variant::kHasDropout) {
      const int t = threadIdx.x & 3;
      const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        const ac_u32x4 w = ac_dropout_words(p, b, h, row0 + g, kv0 + nt * 8 + 2 * t);
        acc_s[4 * nt + 0] *= (w.x < p.dropout_threshold) ? p.dropout_rescale : 0.f;
        acc_s[4 * nt + 1] *= (w.y < p.dropout_threshold) ? p.dropout_rescale : 0.f;
        acc_s[4 * nt + 2] *= (w.z < p.dropout_threshold) ? p.dropout_rescale : 0.f;
        acc_s[4 * nt + 3] *= (w.w < p.dropout_threshold) ? p.dropout_rescale : 0.f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < L::KT_PV; ++kk) {
      p_frag[kk][0] = Tr::pack2(acc_s[8 * kk + 0], acc_s[8 * kk + 1]);
      p_frag[kk][1] = Tr::pack2(acc_s[8 * kk + 2], acc_s[8 * kk + 3]);
      p_frag[kk][2] = Tr::pack2(acc_s[8 * kk + 4], acc_s[8 * kk + 5]);
      p_frag[kk][3] = Tr::pack2(acc_s[8 * kk + 6], acc_s[8 * kk + 7]);
    }
  }
};

// K/V blocks whose every P underflows (Cfg::SCORE_SKIP: plan/scoreskip.py; score_skip.cuh has the
// argument). Here the offset is the lazy one (kRescaleSlack), and with slope > 0 the descending walk
// visits the reference key's block before every lower one, so a skipped key's exp2 would have been
// exactly 0 when its block came: O, l and the LSE are bit-identical without it.
template <class Cfg>
__device__ __forceinline__ int v3_skip_begin(int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                             const AttnBuffers& buf, int j_begin, int j_end) {
  static_assert(Cfg::SCORE_SKIP && Cfg::KV_DESCENDING, "v3's score skip runs on the descending walk");
  return score_skip_begin<Cfg::BLOCK_N>(b, h, q_lo, q_hi, p, buf, j_begin, j_end, V3Consumer<Cfg>::kRescaleSlack);
}

// HALF_BLOCKS with a mask: `issue_and_wait(part)` (a block's GEMM issue up to the wait for its S) runs in an arm
// of its own per part, then a half S moves into acc_s. So no merge point has wgmmas of different shapes in flight
// (merged, ptxas serializes every wgmma: C7515), and the markers keep the arms from being merged again; the half
// GEMMs write acc_h (into half of acc_s: C7511). Otherwise `issue_and_wait(0)`.
template <class Cfg, class F>
__device__ __forceinline__ void v3_by_part(V3Consumer<Cfg>& st, int part, F& issue_and_wait) {
  if constexpr (Cfg::HALF_BLOCKS && Variant::kHasMask) {
    if (part == 0) {
      issue_and_wait(0);
      asm volatile("// half_blocks: the whole block" ::: "memory");
    } else if (part == 1) {
      issue_and_wait(1);
      st.template take_half<false>();
      asm volatile("// half_blocks: the low half" ::: "memory");
    } else {
      issue_and_wait(2);
      st.template take_half<true>();
      asm volatile("// half_blocks: the high half" ::: "memory");
    }
  } else {
    issue_and_wait(0);
  }
}

}  // namespace ac
