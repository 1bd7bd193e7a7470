// attncompiler/v2_fwd.cuh -- FlashAttention-2 forward schedule (sm_80+, mma.sync).
//
// Grid (num_q_blocks, H, B): one CTA per BLOCK_M query rows of one (batch, head); the K/V loop runs
// inside the CTA. NUM_WARPS warps each own 16*MT consecutive query rows (MT = 1 or 2 m16 tiles), so
// warps never exchange data: the online softmax statistics (m, l) of a row live in the 4 lanes of a
// quad, and O stays in registers until the single final rescale by 1/l.
//
// STAGES = 1 (FlashAttention-2's pipelining with one K and one V buffer), per K/V tile j:
//   1. cp.async V_j                 (overlaps the QK^T below)
//   2. S = Q K_j^T                  (mma.sync m16n8k16, fp32 accumulators)
//   3. wait V_j; barrier; cp.async K_{j+1}   (overlaps softmax and PV)
//   4. score_mod, mask, online softmax in the log2 domain, dropout
//   5. O += P V_j                   (P re-used straight from the S accumulators as A fragments)
//   6. wait K_{j+1}; barrier
// STAGES = 2 (two K/V buffers, one barrier per tile), per K/V tile j in buffer s:
//   2. S = Q K_j^T
//   3. cp.async K_{j+1}, V_{j+1} into buffer s^1 (they land under the softmax and P V of tile j)
//   4-5. as above, V_j from buffer s
//   6. wait K_{j+1}, V_{j+1}; barrier (also retires every read of buffer s before it is refilled)
// Step 4 computes the row statistics and rescales O (skipped, by a warp-uniform branch, when no row
// of the warp changed its max); step 5 then interleaves, per k16 step of P, the exponentials with
// the P V mma.sync in one basic block. The K/V loop runs over the blocks that meet the mask's K/V
// range of the CTA's rows (Variant::kv_range: a window visits ~(BLOCK_M + w) / BLOCK_N blocks and
// never looks at the others); inside it, tiles the tile classifier proves EMPTY are skipped. The
// statistics are instantiated twice: without any mask code (FULL tiles) and with it (PARTIAL tiles
// and the ragged last tile), so the common path carries no index arithmetic.
//
// Requires (from the prelude): ac_elem_t, AttnParams, AttnBuffers, Variant; Cfg supplies
// D, DV, BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGS, STAGES, SCORE_SKIP (score_skip.cuh).
#pragma once

#include "attncompiler/ranges.cuh"
#include "attncompiler/score_skip.cuh"

namespace ac {

template <class Cfg>
struct V2Layout {
  static constexpr int D = Cfg::D;
  static constexpr int DV = Cfg::DV;
  static constexpr int BM = Cfg::BLOCK_M;
  static constexpr int BN = Cfg::BLOCK_N;
  static constexpr int W = Cfg::NUM_WARPS;
  static constexpr int STAGES = Cfg::STAGES;   // K/V buffers
  static constexpr int NTHREADS = 32 * W;
  static constexpr int MT = BM / (16 * W);     // m16 tiles per warp
  static constexpr int DQO = (D > DV ? D : DV);
  static constexpr int QS = DQO + 8;           // padded row strides (elements): +16 bytes keeps
  static constexpr int KS = D + 8;             // ldmatrix's 8 row addresses in distinct banks
  static constexpr int VS = DV + 8;
  static constexpr int NT_S = BN / 8;          // n8 tiles of S
  static constexpr int NT_O = DV / 8;          // n8 tiles of O
  static constexpr int KT_QK = D / 16;         // k16 steps of Q K^T
  static constexpr int KT_PV = BN / 16;        // k16 steps of P V
  // Byte offsets in shared memory: Q (also the output staging area), then per stage K and V.
  static constexpr int kQBytes = BM * QS * 2;
  static constexpr int kKBytes = BN * KS * 2;
  static constexpr int kVBytes = BN * VS * 2;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kSmemBytes = (BM * QS + STAGES * BN * (KS + VS)) * 2;

  static_assert(BM % (16 * W) == 0 && (MT == 1 || MT == 2), "each warp owns 16 or 32 query rows");
  static_assert(D % 16 == 0 && DV % 16 == 0, "head dims must be multiples of 16");
  static_assert(BN % 16 == 0, "BLOCK_N must be a multiple of 16");
  static_assert(D <= 256 && DV <= 256, "head dims above 256 are not planned");
  static_assert(STAGES == 1 || STAGES == 2, "STAGES is 1 or 2");
  static_assert(kSmemBytes == kQBytes + STAGES * kStageBytes, "layout");
};

// Per-thread state and constants of one CTA; the tile body is a member template so the masked and
// unmasked instantiations share everything else.
template <class Cfg>
struct V2Cta {
  using L = V2Layout<Cfg>;
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  static constexpr int BM = L::BM, BN = L::BN, MT = L::MT, D = L::D, DV = L::DV;

  float acc_o[MT][L::NT_O][4];
  float row_max[MT][2];  // running max, log2 domain
  float row_sum[MT][2];  // running sum, per-thread partial (reduced over the quad at the end)
  unsigned int q_frag[Cfg::Q_IN_REGS ? MT : 1][Cfg::Q_IN_REGS ? L::KT_QK : 1][4];

  // S = Q K^T for one tile, k16 steps [KK0, KK1) (KK0 == 0 starts from zero); K fragments from the
  // K buffer at k_addr (this thread's ldmatrix base).
  template <int KK0 = 0, int KK1 = L::KT_QK>
  __device__ __forceinline__ void qk(float (&acc_s)[MT][L::NT_S][4], unsigned int q_addr, unsigned int k_addr) {
#pragma unroll
    for (int kk = KK0; kk < KK1; ++kk) {
      unsigned int a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (Cfg::Q_IN_REGS) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[mt][kk][e];
        } else {
          ldmatrix_x4(a[mt], q_addr + (mt * 16 * L::QS + kk * 16) * 2);
        }
      }
#pragma unroll
      for (int np = 0; np < L::NT_S / 2; ++np) {
        unsigned int bk[4];
        ldmatrix_x4(bk, k_addr + (np * 16 * L::KS + kk * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (kk == 0) {
            mma_16816_zc<Tr::kIsBf16>(acc_s[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_16816_zc<Tr::kIsBf16>(acc_s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          } else {
            mma_16816<Tr::kIsBf16>(acc_s[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_16816<Tr::kIsBf16>(acc_s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
    }
  }

  // score_mod, mask (kMasked only) and the online-softmax statistics of one tile: the new row max
  // m, its exp2 reference m_ref, alpha = 2^(m_old - m_ref) (l is rescaled here, O by rescale_o).
  // Returns whether any row of this thread changed its max (else every alpha is exactly 1).
  // With a bounded score_mod (Variant::kStaticMax, ir/scorerange.py) only the first visited tile
  // (`first`) takes a row maximum: clamped into the safe window it fixes the row's offset, and later
  // tiles skip the reduction and the rescale.
  template <bool kMasked>
  __device__ __forceinline__ bool softmax_stats(float (&acc_s)[MT][L::NT_S][4], float (&m_ref)[MT][2],
                                                float (&alpha)[MT][2], int kv0, int q_row0, float exp_scale, int b,
                                                int h, const AttnParams& p, const AttnBuffers& buf, bool first) {
    const int t = threadIdx.x & 3;
    const int g = (threadIdx.x & 31) >> 2;
    bool changed = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int q_idx = q_row0 + mt * 16 + g + 8 * hf;
#pragma unroll
        for (int nt = 0; nt < L::NT_S; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int kv_idx = kv0 + nt * 8 + 2 * t + e;
            float x = acc_s[mt][nt][2 * hf + e];
            if constexpr (Variant::kHasScoreMod) {
              x = Variant::score_mod_log2(x, b, h, q_idx, kv_idx, p, buf);
            }
            if constexpr (kMasked) {
              bool visible = kv_idx < p.Nk;
              if constexpr (Variant::kHasMask) visible = visible && Variant::mask(b, h, q_idx, kv_idx, p, buf);
              if (!visible) x = AC_NEG_INF;
            }
            acc_s[mt][nt][2 * hf + e] = x;
          }
        }
        if constexpr (Variant::kStaticMax) {
          if (!first) {  // the row's offset is fixed: no reduction, alpha = 1
            m_ref[mt][hf] = row_max[mt][hf];
            alpha[mt][hf] = 1.f;
            continue;
          }
        }
        // Row max as a tree (short dependency chain), then over the quad.
        float mx[L::NT_S];
#pragma unroll
        for (int nt = 0; nt < L::NT_S; ++nt) mx[nt] = fmaxf(acc_s[mt][nt][2 * hf], acc_s[mt][nt][2 * hf + 1]);
#pragma unroll
        for (int w = 1; w < L::NT_S; w *= 2) {
#pragma unroll
          for (int nt = 0; nt + w < L::NT_S; nt += 2 * w) mx[nt] = fmaxf(mx[nt], mx[nt + w]);
        }
        float m = mx[0];
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        if constexpr (Variant::kStaticMax) {
          // the first tile's maximum clamped into the window where exp2(E - m) stays in range for every
          // later score (a row with no visible key yet takes the low end): the row's fixed offset
          const float m_fix = Variant::static_offset(m * exp_scale);
          m_ref[mt][hf] = m_fix;
          alpha[mt][hf] = 1.f;
          row_max[mt][hf] = m_fix;
          continue;
        }
        // Scores are kept raw (x * exp_scale is the log2-domain score): the scale folds into the
        // exp2's FFMA. Scale > 0, so the max commutes with it.
        const float m_old = row_max[mt][hf];
        const float m_new = fmaxf(m_old, m * exp_scale);
        // A row that has seen no visible key keeps m = -inf; use 0 as the reference so that
        // exp2(-inf - ref) = 0 and never NaN.
        m_ref[mt][hf] = (m_new == AC_NEG_INF) ? 0.f : m_new;
        alpha[mt][hf] = fast_exp2(m_old - m_ref[mt][hf]);
        // Unchanged max: alpha = 2^0 = 1 exactly (and a row still at -inf has O = l = 0), so the
        // rescale may be skipped; tested on the max, not on alpha, to stay off the MUFU latency.
        changed = changed || (m_new != m_old);
        row_max[mt][hf] = m_new;
        row_sum[mt][hf] *= alpha[mt][hf];
      }
    }
    return changed;
  }

  // O *= alpha only when some row of the warp changed its max (after the first tiles of a long
  // sequence, most tiles change none): a warp-uniform branch around MT * DV / 2 multiplies.
  __device__ __forceinline__ void rescale_o(const float (&alpha)[MT][2], bool changed) {
    if (__any_sync(0xffffffffu, changed)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < L::NT_O; ++nt) {
          acc_o[mt][nt][0] *= alpha[mt][0];
          acc_o[mt][nt][1] *= alpha[mt][0];
          acc_o[mt][nt][2] *= alpha[mt][1];
          acc_o[mt][nt][3] *= alpha[mt][1];
        }
      }
    }
  }

  // P = 2^(S * exp_scale - m_ref) for the n8 tiles [nt0, nt0 + NT) (summed into l), then dropout.
  // round_p (a bounded score_mod's first tile, without dropout): l sums P rounded to the element type,
  // the weights P V multiplies. That tile's row maximum may lie outside the offset window, so no P
  // need be 1, and a row whose keys all lie in it then gets the same P on both sides of sum(P v) /
  // sum(P) (one key gives exactly v). Later tiles sum unrounded P.
  template <int NT>
  __device__ __forceinline__ void exp_tiles(float (&acc_s)[MT][L::NT_S][4], const float (&m_ref)[MT][2],
                                            float exp_scale, int nt0, int kv0, int q_row0, int b, int h,
                                            const AttnParams& p, bool round_p) {
    const int t = threadIdx.x & 3;
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float* c = acc_s[mt][nt0 + n];
        c[0] = fast_exp2(fmaf(c[0], exp_scale, -m_ref[mt][0]));
        c[1] = fast_exp2(fmaf(c[1], exp_scale, -m_ref[mt][0]));
        c[2] = fast_exp2(fmaf(c[2], exp_scale, -m_ref[mt][1]));
        c[3] = fast_exp2(fmaf(c[3], exp_scale, -m_ref[mt][1]));
        if constexpr (Variant::kStaticMax && !Variant::kHasDropout) {
          if (round_p) {
            Tr::round2(c[0], c[1]);
            Tr::round2(c[2], c[3]);
          }
        }
        row_sum[mt][0] += c[0] + c[1];
        row_sum[mt][1] += c[2] + c[3];
        if constexpr (Variant::kHasDropout) {
          // One Philox call per (m16, n8) tile and thread covers its four elements
          // (docs/architecture.md); l above is the sum before dropout.
          const ac_u32x4 w = ac_dropout_words(p, b, h, q_row0 + mt * 16 + g, kv0 + (nt0 + n) * 8 + 2 * t);
          c[0] *= (w.x < p.dropout_threshold) ? p.dropout_rescale : 0.f;
          c[1] *= (w.y < p.dropout_threshold) ? p.dropout_rescale : 0.f;
          c[2] *= (w.z < p.dropout_threshold) ? p.dropout_rescale : 0.f;
          c[3] *= (w.w < p.dropout_threshold) ? p.dropout_rescale : 0.f;
        }
      }
    }
  }

  // O += P V for the k16 steps [kk0, kk0 + KK) of P; P's A fragments are the S accumulators (C
  // layout of two n8 tiles = A layout of k16).
  template <int KK>
  __device__ __forceinline__ void pv(float (&acc_s)[MT][L::NT_S][4], unsigned int v_addr, int kk0) {
#pragma unroll
    for (int k = 0; k < KK; ++k) {
      const int kk = kk0 + k;
      unsigned int a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = Tr::pack2(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        a[mt][1] = Tr::pack2(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        a[mt][2] = Tr::pack2(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        a[mt][3] = Tr::pack2(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < L::NT_O / 2; ++np) {
        unsigned int bv[4];
        ldmatrix_x4_trans(bv, v_addr + (kk * 16 * L::VS + np * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Tr::kIsBf16>(acc_o[mt][2 * np], a[mt], bv[0], bv[1]);
          mma_16816<Tr::kIsBf16>(acc_o[mt][2 * np + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }

  // P = exp2(S - m), dropout and O += P V of one tile after softmax_stats: the O-rescale branch,
  // then per k16 step of P its exponentials and its mma.sync, in one basic block, so the
  // exponentials of step kk + 1 issue while the tensor cores run step kk.
  __device__ __forceinline__ void exp_pv(float (&acc_s)[MT][L::NT_S][4], const float (&m_ref)[MT][2],
                                         const float (&alpha)[MT][2], bool changed, unsigned int v_addr, int kv0,
                                         int q_row0, float exp_scale, int b, int h, const AttnParams& p,
                                         bool first) {
    rescale_o(alpha, changed);
#pragma unroll
    for (int kk = 0; kk < L::KT_PV; ++kk) {
      exp_tiles<2>(acc_s, m_ref, exp_scale, 2 * kk, kv0, q_row0, b, h, p, first);
      pv<1>(acc_s, v_addr, kk);
    }
  }
};

template <class Cfg>
__device__ __forceinline__ void v2_fwd(const AttnParams& p, const AttnBuffers& buf) {
  using L = V2Layout<Cfg>;
  using T = ac_elem_t;
  constexpr int BM = L::BM, BN = L::BN, MT = L::MT, D = L::D, DV = L::DV;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  const unsigned int smem0 = smem_u32(smem_raw);
  const unsigned int sK0 = smem0 + L::kQBytes;       // K of stage s: sK0 + s * kStageBytes
  const unsigned int sV0 = sK0 + L::kKBytes;         // V of stage s: sV0 + s * kStageBytes

  // Heaviest (for causal: last) query blocks first, so the tail of the grid is short.
  const int q_block = gridDim.x - 1 - blockIdx.x;
  const int bh = ac_grid_bh();
  const int b = bh / p.H;
  const int h = bh % p.H;
  const int h_kv = h / (p.H / p.H_kv);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  const int q0 = q_block * BM;
  const int q_rows = min(BM, p.Nq - q0);
  const int q_hi = q0 + q_rows - 1;
  const T* gQ = reinterpret_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (long long)q0 * p.q_sn;
  const T* gK = reinterpret_cast<const T*>(p.k) + b * p.k_sb + h_kv * p.k_sh;
  const T* gV = reinterpret_cast<const T*>(p.v) + b * p.v_sb + h_kv * p.v_sh;
  T* gO = reinterpret_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh + (long long)q0 * p.o_sn;

  // The K/V blocks [j, j_end) that can hold a key visible from this CTA's rows.
  int j = 0, j_end = (p.Nk + BN - 1) / BN;
  if constexpr (Variant::kHasMask) {
    kv_block_range<BN>(b, h, q0, q_hi, p, buf, j, j_end);
    j = kv_next_block<BN>(j, j_end, b, h, q0, q_hi, p, buf);
  }

  // Prologue: Q and the first K tile (and, with two stages, the first V tile).
  load_tile_rows_async<BM, D, L::QS, L::NTHREADS>(smem0, gQ, p.q_sn, q_rows, tid);
  if constexpr (Cfg::SCORE_SKIP) {
    // The score skip (score_skip.cuh; its two global loads run while Q's copies fly): the ascending walk
    // starts above the blocks whose every P is below 2^-136 of the row's final offset. Here they would
    // come first, at lower running maxima, and be scaled down to that later, so leaving them out changes
    // the sums by less than their fp32 rounding. Every thread computes the same value.
    const int j_skip = score_skip_begin<BN>(b, h, q0, q_hi, p, buf, j, j_end, 0.f);
    if (j_skip > j) j = Variant::kHasMask ? kv_next_block<BN>(j_skip, j_end, b, h, q0, q_hi, p, buf) : j_skip;
  }
  if (j < j_end) {
    load_tile_rows_async<BN, D, L::KS, L::NTHREADS>(sK0, gK + (long long)j * BN * p.k_sn, p.k_sn,
                                                    p.Nk - j * BN, tid);
    if constexpr (L::STAGES == 2) {
      load_tile_rows_async<BN, DV, L::VS, L::NTHREADS>(sV0, gV + (long long)j * BN * p.v_sn, p.v_sn,
                                                       p.Nk - j * BN, tid);
    }
  }
  cp_async_commit();
  V2Cta<Cfg> st;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < L::NT_O; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st.acc_o[mt][nt][e] = 0.f;
    }
    st.row_max[mt][0] = st.row_max[mt][1] = Variant::kStaticMax ? Variant::kStaticMaxLo : AC_NEG_INF;
    st.row_sum[mt][0] = st.row_sum[mt][1] = 0.f;
  }

  const int warp_row0 = warp * 16 * MT;
  const int q_row0 = q0 + warp_row0;  // first query row of this warp
  // Multiplier taking an S value to the log2-domain score: the softmax scale * log2(e), or 1 when
  // score_mod already produced the log2-domain score.
  const float exp_scale = Variant::kHasScoreMod ? 1.f : p.scale * AC_LOG2E;

  cp_async_wait<0>();
  __syncthreads();

  // Per-thread ldmatrix base addresses (bytes, shared state space); loops add constants.
  const unsigned int q_base = smem0 + ((warp_row0 + (lane & 15)) * L::QS + (lane >> 4) * 8) * 2;
  const unsigned int k_base = sK0 + (((lane & 7) + (lane >> 4) * 8) * L::KS + ((lane >> 3) & 1) * 8) * 2;
  const unsigned int v_base = sV0 + (((lane & 7) + ((lane >> 3) & 1) * 8) * L::VS + (lane >> 4) * 8) * 2;

  if constexpr (Cfg::Q_IN_REGS) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int kk = 0; kk < L::KT_QK; ++kk) ldmatrix_x4(st.q_frag[mt][kk], q_base + (mt * 16 * L::QS + kk * 16) * 2);
    }
  }

  unsigned int stage_off = 0;  // byte offset of the current K/V stage
  bool first = true;           // the first visited K/V tile (fixes the softmax offset of a bounded score_mod)
  while (j < j_end) {
    const int kv0 = j * BN;
    const int kv_rows = min(BN, p.Nk - kv0);
    const int kv_hi = kv0 + kv_rows - 1;
    const int j_next = kv_next_block<BN>(j + 1, j_end, b, h, q0, q_hi, p, buf);
    int tile = AC_TILE_FULL;
    if constexpr (Variant::kHasMask) tile = Variant::tile_class(b, h, q0, q_hi, kv0, kv_hi, p, buf);
    const bool need_mask = (tile != AC_TILE_FULL) || (kv_rows < BN);

    if constexpr (L::STAGES == 1) {
      // (1) V_j in flight while Q K_j^T runs.
      load_tile_rows_async<BN, DV, L::VS, L::NTHREADS>(sV0, gV + (long long)kv0 * p.v_sn, p.v_sn, kv_rows, tid);
      cp_async_commit();
    }

    // (2) S = Q K_j^T.
    float acc_s[MT][L::NT_S][4];
    st.qk(acc_s, q_base, k_base + stage_off);

    if constexpr (L::STAGES == 2) {
      // (3) The next K/V tile into the other buffer (the barrier that ended the previous tile
      //     retired every read of it). Issued after Q K_j^T, not before: measured faster at
      //     BLOCK_N = 64 (the copies then drain under the softmax instead of competing with the
      //     ldmatrix traffic of Q K^T).
      if (j_next < j_end) {
        const unsigned int nxt = stage_off ^ L::kStageBytes;
        const int rows = p.Nk - j_next * BN;
        load_tile_rows_async<BN, D, L::KS, L::NTHREADS>(sK0 + nxt, gK + (long long)j_next * BN * p.k_sn, p.k_sn,
                                                        rows, tid);
        load_tile_rows_async<BN, DV, L::VS, L::NTHREADS>(sV0 + nxt, gV + (long long)j_next * BN * p.v_sn,
                                                         p.v_sn, rows, tid);
      }
      cp_async_commit();
    } else {
      // (3) V_j has landed once every thread's copies completed; the barrier also retires all reads
      //     of K_j, so K_{j+1} may overwrite it while the softmax and PV run.
      cp_async_wait<0>();
      __syncthreads();
      if (j_next < j_end) {
        load_tile_rows_async<BN, D, L::KS, L::NTHREADS>(sK0, gK + (long long)j_next * BN * p.k_sn, p.k_sn,
                                                        p.Nk - j_next * BN, tid);
      }
      cp_async_commit();
    }

    // (4) score_mod, mask, online-softmax statistics (log2 domain), masked and unmasked bodies.
    float m_ref[MT][2], alpha[MT][2];
    bool changed;
    if (need_mask) {
      changed = st.template softmax_stats<true>(acc_s, m_ref, alpha, kv0, q_row0, exp_scale, b, h, p, buf, first);
    } else {
      changed = st.template softmax_stats<false>(acc_s, m_ref, alpha, kv0, q_row0, exp_scale, b, h, p, buf, first);
    }
    // (5) P = exp2(S - m), dropout, O += P V_j.
    st.exp_pv(acc_s, m_ref, alpha, changed, v_base + stage_off, kv0, q_row0, exp_scale, b, h, p, first);
    first = false;

    // (6) The next tile landed; every warp is done with this tile's buffers.
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (L::STAGES == 2) stage_off ^= L::kStageBytes;
    j = j_next;
  }

  // Epilogue: one rescale by 1/l, stage each warp's own rows through its own rows of sQ, then
  // 16-byte coalesced stores. LSE = (m + log2 l) * ln 2; empty rows give O = 0, LSE = -inf.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = st.row_sum[mt][hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = (l > 0.f) ? 1.f / l : 0.f;
      const int r = warp_row0 + mt * 16 + g + 8 * hf;
#pragma unroll
      for (int nt = 0; nt < L::NT_O; ++nt) {
        const unsigned int v = V2Cta<Cfg>::Tr::pack2(st.acc_o[mt][nt][2 * hf] * inv, st.acc_o[mt][nt][2 * hf + 1] * inv);
        *reinterpret_cast<unsigned int*>(sQ + r * L::QS + nt * 8 + 2 * t) = v;
      }
      if (p.lse != nullptr && t == 0 && r < q_rows) {
        const float m = st.row_max[mt][hf];
        const float lse = (l > 0.f && m != AC_NEG_INF) ? (m + __log2f(l)) * AC_LN2 : AC_NEG_INF;
        p.lse[(long long)bh * p.Nq + q0 + r] = lse;
      }
    }
  }
  __syncwarp();
  constexpr int kChunksPerRow = DV / 8;
  constexpr int kWarpRows = 16 * MT;
#pragma unroll
  for (int c = lane; c < kWarpRows * kChunksPerRow; c += 32) {
    const int r = warp_row0 + c / kChunksPerRow;
    const int cc = c % kChunksPerRow;
    if (r < q_rows) {
      *reinterpret_cast<uint4*>(gO + r * p.o_sn + cc * 8) = *reinterpret_cast<const uint4*>(sQ + r * L::QS + cc * 8);
    }
  }
}

}  // namespace ac
