// attncompiler/v3_fwd.cuh -- FlashAttention-3 style forward (sm_90a): TMA + wgmma + warp specialization.
//
// Grid (num_q_blocks, B*H), or with PERSISTENT one CTA per SM looping over (query block, batch*head)
// tiles (heaviest first, round robin; the K/V ring and the ping-pong run on across tiles, Q is
// reloaded once the consumers' S GEMMs of the previous tile are done). A CTA of (1 + NC) warpgroups
// owns BLOCK_M = 64*NC query rows of one (batch, head) at a time:
//   * warpgroup 0, the producer, gives registers back (setmaxnreg.dec); one thread issues the TMA
//     copies: the Q tile once, then K_j and V_j of every visited K/V block into a ring of STAGES
//     shared-memory stages. Each stage has two "full" mbarriers (K, V: the copies complete their
//     bytes on them) and two "empty" ones (every consumer thread arrives once its Q K^T, resp. its
//     P V, of the stage is done), so K slots free up a whole softmax earlier than V slots.
//   * warpgroups 1..NC, the consumers (setmaxnreg.inc), each own 64 query rows; S = Q K^T and
//     O += P V run on wgmma with the accumulators in registers (S: BLOCK_N/2, O: DV/2 floats per
//     thread) and P fed to the second GEMM from registers.
// Consumer loop (per warpgroup), for visited block i (K/V stage s_i):
//     wait K_i;  [turn]  issue S_i = Q K_i^T;  wait V_{i-1};  issue O += P_{i-1} V_{i-1};  [grant]
//     wgmma.wait 1 (S_i done) -> score_mod, mask, online softmax of S_i in fp32 (exp2, scale folded)
//     wgmma.wait 0 (PV done)  -> release stage s_{i-1}; O *= alpha_i; P_i = bf16(exp(S_i - m_i))
// so the softmax of block i overlaps the P V GEMM of block i-1 inside a warpgroup, and with two
// consumers the [turn]/[grant] named barriers (ping-pong) make the warpgroups issue their GEMMs
// in alternation: one warpgroup's softmax runs while the other's GEMMs occupy the tensor cores.
// Visited blocks: those meeting Variant::kv_range of the CTA's rows, minus the ones tile_class
// proves EMPTY; a block is run through the masked softmax only when the warpgroup's rows make it
// PARTIAL or it is the ragged last block (TMA zero-fills rows >= Nk; their scores are masked).
//
// Shared memory (from a 1024-byte aligned base; 128-byte swizzle, so every tile is made of
// 64-column boxes of rows x 128 bytes, 8-row / 1024-byte swizzle atoms):
//   Q: D/64 boxes of BLOCK_M rows | per stage: K (D/64 boxes of BLOCK_N rows), V (DV/64 boxes) |
//   mbarriers: Q, fullK[STAGES], fullV[STAGES], emptyK[STAGES], emptyV[STAGES], Q free.
// wgmma operands: Q and K are K-major (the head dim is contiguous; descriptor SBO = 1024 between
// 8-row groups, a k16 step advances the start address 32 bytes inside the 128-byte row); V is
// MN-major for O += P V (transposed B: LBO = BLOCK_N*128 between 64-column boxes, SBO = 1024
// between 8-row groups of keys, a k16 step advances 2048 bytes).
//
// Requires (from the prelude and the TU): ac_elem_t, AttnParams, AttnBuffers, Variant; ac::wgmma_qk
// and ac::wgmma_pv (generated for this BLOCK_N / DV and element type); Cfg supplies D, DV,
// BLOCK_M, BLOCK_N, STAGES, NC, PRODUCER_REGS, CONSUMER_REGS, PERSISTENT, EXP2_POLY (of every 8 n8
// tiles of S, how many take their exponentials on the FMA pipes: 0..8).
#pragma once

#include "attncompiler/ranges.cuh"

// Phase timestamps for benchmarks/v3_trace.py: compiled in only with -DAC_V3_TRACE (the benchmark
// prepends the define to the generated source); each mark is one %globaltimer read and a store by one
// thread, placed where no wgmma is in flight. Slots per tile: see kTrace* below.
#ifdef AC_V3_TRACE
#ifndef AC_V3_TRACE_TILES
#define AC_V3_TRACE_TILES 8192
#endif
__device__ unsigned long long ac_v3_trace[AC_V3_TRACE_TILES * 16];
#define AC_TRACE(tile, slot, cond)                                                        \
  do {                                                                                    \
    unsigned long long ac_t_;                                                             \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ac_t_));                             \
    if ((cond) && (tile) < AC_V3_TRACE_TILES) ac_v3_trace[(tile) * 16 + (slot)] = ac_t_;   \
  } while (0)
#define AC_TRACE_VALUE(tile, slot, cond, value)                                                        \
  do {                                                                                                 \
    if ((cond) && (tile) < AC_V3_TRACE_TILES) ac_v3_trace[(tile) * 16 + (slot)] = (unsigned long long)(value); \
  } while (0)
#else
#define AC_TRACE(tile, slot, cond) do { } while (0)
#define AC_TRACE_VALUE(tile, slot, cond, value) do { } while (0)
#endif

namespace ac {

// Trace slots (AC_V3_TRACE): 0 SM id, 1 CTA start, 2 Q landed (consumer 0), 3 first S done, 4 first
// softmax done, 5 main loop done, 6 last P V done, 7 consumer 0 epilogue done, 8 consumer 1 epilogue
// done, 9 visited K/V blocks, 10 producer issued the tile's first copy; inside consumer 0's
// epilogue: 11 LSE and 1/l done, 12 staged O written to shared memory, 13 past the warpgroup barrier.
enum : int { kTraceSm = 0, kTraceStart, kTraceQ, kTraceS0, kTraceSoftmax0, kTraceLoop, kTracePv, kTraceEpi0,
             kTraceEpi1, kTraceBlocks, kTraceIssue, kTraceEpiScale, kTraceEpiSts, kTraceEpiBar };

struct V3Maps {
  TmaDesc q, k, v;  // 4-d tensor maps (head dim, seqlen, heads, batch) of q, k, v
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
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kKBytes = BN * D * 2;
  static constexpr int kVBytes = BN * DV * 2;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kBarOffset = kQBytes + STAGES * kStageBytes;
  static constexpr int kNumBars = 2 + 4 * STAGES;
  static constexpr int kAlignSlack = 1024;            // dynamic smem is only 16-byte aligned
  static constexpr int kSmemBytes = kAlignSlack + kBarOffset + 8 * kNumBars;
  static constexpr int NS = BN / 2;                   // S accumulator floats per thread
  static constexpr int NO = DV / 2;                   // O accumulator floats per thread
  static constexpr int KT_PV = BN / 16;               // k16 steps of P V

  static_assert(D % 64 == 0 && DV % 64 == 0, "v3 tiles head dims in 64-column (128-byte) TMA boxes");
  static_assert(D <= 256 && DV <= 256, "wgmma N and TMA box rows are at most 256");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "BLOCK_N: a multiple of 16 in [16, 256]");
  static_assert(BM == 64 * NC && (NC == 1 || NC == 2), "each consumer warpgroup owns 64 query rows");
  static_assert(STAGES >= 1 && STAGES <= 4, "K/V stages");
  static_assert(Cfg::EXP2_POLY >= 0 && Cfg::EXP2_POLY <= 8, "EXP2_POLY: polynomial exponentials per 8 n8 tiles");
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0, "1024-byte aligned tiles");
  static_assert(kSmemBytes <= 232448, "227 KB per block on sm_90");
};

// Per-thread state of one consumer warpgroup.
template <class Cfg>
struct V3Consumer {
  using L = V3Layout<Cfg>;
  using Tr = ac_type_traits<ac_elem_t>;
  static constexpr int NS = L::NS, NO = L::NO, BN = L::BN;

  float acc_o[NO];
  float acc_s[NS];
  unsigned int p_frag[L::KT_PV][4];
  float row_max[2];  // log2 domain
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
      wgmma_qk(acc_s, dq + ((box * L::BM * 128 + off) >> 4), dk + ((box * BN * 128 + off) >> 4), kk > 0 ? 1 : 0);
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

  // The score_mod's separable form (Variant::kScoreSeparable, ir/scoreform.py): x = coef * s + col,
  // col = slope * (kv - q_ref) (linear) or score_sep_col; q_ref = this warp's first row. Set per tile.
  float sep_coef, sep_slope;

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

  template <int NT, int HF>
  __device__ __forceinline__ void exp_pair(float exp_scale, float m_ref, float& sum) {
    float* c = &acc_s[4 * NT + 2 * HF];
    c[0] = exp2_sel<NT>(c[0], exp_scale, m_ref);
    c[1] = exp2_sel<NT>(c[1], exp_scale, m_ref);
    sum += c[0] + c[1];
    if constexpr (NT + 1 < BN / 8) exp_pair<NT + 1, HF>(exp_scale, m_ref, sum);
  }

  // score_mod, then the mask (only when `masked`: a branch around the mask pass alone, see
  // softmax_dispatch), the online-softmax update of one S tile, then S <- exp2(S - m) in place (summed
  // into l; dropout comes in convert_p). alpha: the rescale of the previous O and l.
  __device__ __forceinline__ void softmax(bool masked, int kv0, int row0, float exp_scale, int b, int h,
                                          const AttnParams& p, const AttnBuffers& buf, float (&alpha)[2]) {
    const int t = threadIdx.x & 3;
    const int g = (threadIdx.x & 31) >> 2;
    constexpr bool kSep = Variant::kHasScoreMod && Variant::kScoreSeparable;
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
          } else if constexpr (Variant::kHasScoreMod) {
            x = Variant::score_mod_log2_inner(x, b, h, q_idx, kv_idx, p, buf);
          }
          acc_s[4 * nt + 2 * hf + e] = x;
        }
      }
    }
    if (masked) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kv_idx = kv0 + nt * 8 + 2 * t + e;
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int q_idx = row0 + g + 8 * hf;
            bool visible = kv_idx < p.Nk;
            if constexpr (Variant::kHasMask) visible = visible && Variant::mask(b, h, q_idx, kv_idx, p, buf);
            if (!visible) acc_s[4 * nt + 2 * hf + e] = AC_NEG_INF;
          }
        }
      }
    }
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
      const float m_old = row_max[hf];
      const float m_new = fmaxf(m_old, m * exp_scale);
      // A row with no visible key so far keeps m = -inf; 0 as the reference keeps exp2 NaN-free.
      const float m_ref = (m_new == AC_NEG_INF) ? 0.f : m_new;
      alpha[hf] = fast_exp2(m_old - m_ref);
      row_max[hf] = m_new;
      float sum = 0.f;
      if (hf == 0) {
        exp_pair<0, 0>(exp_scale, m_ref, sum);
      } else {
        exp_pair<0, 1>(exp_scale, m_ref, sum);
      }
      row_sum[hf] = row_sum[hf] * alpha[hf] + sum;
    }
  }

  // Without a mask the masked softmax only serves the ragged last block: two copies (the branch
  // outside the softmax) schedule better there, except for a separable score_mod (ALiBi) below d = 256.
  // With a mask, one copy with the branch around the mask pass alone. Measured on the H200 (same
  // process, N = 16k), two copies vs one, TFLOP/s: plain d256 722 vs 693, softcap d128 535 vs 510,
  // plain d128 636 vs 633; ALiBi d64 412 vs 432, d128 562 vs 581, d256 663 vs 647; causal d128 459 vs
  // 602, sliding window 344 vs 444, causal d64 411 vs 446.
  static constexpr bool kTwoSoftmaxCopies =
      !Variant::kHasMask && (!(Variant::kHasScoreMod && Variant::kScoreSeparable) || L::DV >= 256);
  __device__ __forceinline__ void softmax_dispatch(bool masked, int kv0, int row0, float exp_scale, int b, int h,
                                                   const AttnParams& p, const AttnBuffers& buf, float (&alpha)[2]) {
    if constexpr (kTwoSoftmaxCopies) {
      if (masked) {
        softmax(true, kv0, row0, exp_scale, b, h, p, buf, alpha);
      } else {
        softmax(false, kv0, row0, exp_scale, b, h, p, buf, alpha);
      }
    } else {
      softmax(masked, kv0, row0, exp_scale, b, h, p, buf, alpha);
    }
  }

  __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
#pragma unroll
    for (int nt = 0; nt < NO / 4; ++nt) {
      acc_o[4 * nt + 0] *= alpha[0];
      acc_o[4 * nt + 1] *= alpha[0];
      acc_o[4 * nt + 2] *= alpha[1];
      acc_o[4 * nt + 3] *= alpha[1];
    }
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

// The named barriers of the ping-pong: warpgroup w waits on kTurnBar + w for its turn to issue;
// kEpilogueBar + w: warpgroup w's staged O is in shared memory.
constexpr int kTurnBar = 1;
constexpr int kEpilogueBar = 3;

// Work tile -> (query block, batch*head). Non-persistent: one tile per CTA from blockIdx (heaviest,
// for causal the last, query blocks first). Persistent: tiles in the same heaviest-first order,
// CTA c takes tiles c, c + gridDim.x, ... (a static round robin over a descending order).
template <bool kPersistent>
__device__ __forceinline__ void v3_tile(int tile, int num_qb, const AttnParams& p, int& q_block, int& bh) {
  if constexpr (kPersistent) {
    const int nbh = p.B * p.H;
    q_block = num_qb - 1 - tile / nbh;
    bh = tile % nbh;
  } else {
    q_block = gridDim.x - 1 - blockIdx.x;
    bh = blockIdx.y;
  }
}

// The epilogue of one consumer warpgroup: O / l to global memory, and the LSE.
// Staged (non-persistent kernels with DV <= D and 16-byte aligned output rows): the warpgroup's
// fragments go to its own 64 rows of the Q tile -- free once its last S GEMM is done, and never
// reloaded without PERSISTENT -- in Q's layout (64-column boxes, 16-byte chunks swizzled by the row:
// chunk k of row r at k ^ (r & 7), so the 4-byte fragment stores of a warp hit 32 distinct banks),
// then each thread copies 16-byte chunks, consecutive threads along a row, to global memory. A warp
// store then covers 512 contiguous bytes instead of 8 rows x 16 bytes: 4 cache lines instead of 8 per
// instruction, at an eighth of the store instructions (benchmarks/v3_trace.py measured the direct
// stores at 1.5 us per tile on the H100).
template <class Cfg>
__device__ __forceinline__ void v3_epilogue(V3Consumer<Cfg>& st, const AttnParams& p, const AttnBuffers& buf,
                                            unsigned int sQ, int wg, int row0, int wq_lo, int b, int h, int bh,
                                            int trace_tile) {
  using L = V3Layout<Cfg>;
  using Tr = ac_type_traits<ac_elem_t>;
  constexpr int NO = L::NO;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  ac_elem_t* gO = reinterpret_cast<ac_elem_t*>(p.o) + b * p.o_sb + h * p.o_sh;
  float inv[2];
  bool seen[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = st.row_sum[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // (a row with no visible key has m = -inf; its l may hold ac_exp2_poly's 2^-126 terms)
    seen[hf] = l > 0.f && st.row_max[hf] != AC_NEG_INF;
    inv[hf] = seen[hf] ? 1.f / l : 0.f;
    const int r = row0 + g + 8 * hf;
    if (p.lse != nullptr && t == 0 && r < p.Nq) {
      float m = st.row_max[hf];
      if constexpr (Variant::kHasScoreMod && Variant::kScoreSeparable) {
        m += Variant::score_sep_row(b, h, r, row0, p, buf);  // the row term the softmax dropped
      }
      p.lse[(long long)bh * p.Nq + r] = seen[hf] ? (m + __log2f(l)) * AC_LN2 : AC_NEG_INF;
    }
  }
  AC_TRACE(trace_tile, kTraceEpiScale, threadIdx.x == 128);
  constexpr bool kCanStage = !Cfg::PERSISTENT && L::DV <= L::D;
  const bool staged = kCanStage && ((reinterpret_cast<unsigned long long>(gO) | (unsigned long long)(p.o_sn * 2)) & 15) == 0;
  if (staged) {
    // this warpgroup's rows of the Q tile: box c at sQ + c * BM * 128, its row r at (64 wg + r) * 128
    const unsigned int sO = sQ + wg * 64 * 128;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // wgmma (async proxy) read Q here
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 16 * ((threadIdx.x >> 5) & 3) + g + 8 * hf;  // row within the warpgroup's 64
#pragma unroll
      for (int nt = 0; nt < NO / 4; ++nt) {
        const unsigned int addr = sO + (nt / 8) * L::BM * 128 + r * 128 + (((nt % 8) ^ (r & 7)) << 4) + 4 * t;
        const unsigned int v = Tr::pack2(st.acc_o[4 * nt + 2 * hf] * inv[hf], st.acc_o[4 * nt + 2 * hf + 1] * inv[hf]);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
      }
    }
    AC_TRACE(trace_tile, kTraceEpiSts, threadIdx.x == 128);
    named_bar_sync(kEpilogueBar + wg, 128);
    AC_TRACE(trace_tile, kTraceEpiBar, threadIdx.x == 128);
    constexpr int kChunksPerRow = L::DV / 8;  // 16-byte chunks
    constexpr int kIters = 64 * kChunksPerRow / 128;
    static_assert((64 * kChunksPerRow) % 128 == 0, "whole 16-byte chunks per thread");
    const int tid = threadIdx.x & 127;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int id = tid + 128 * it;
      const int r = id / kChunksPerRow, ch = id % kChunksPerRow;
      const unsigned int addr = sO + (ch / 8) * L::BM * 128 + r * 128 + (((ch % 8) ^ (r & 7)) << 4);
      unsigned int x, y, z, w;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"(addr) : "memory");
      if (wq_lo + r < p.Nq) {
        uint4* dst = reinterpret_cast<uint4*>(gO + (long long)(wq_lo + r) * p.o_sn + ch * 8);
        *dst = make_uint4(x, y, z, w);
      }
    }
  } else {
    // direct: this thread's fragments as 4-byte stores (8 rows x 16 bytes per warp instruction)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = row0 + g + 8 * hf;
      if (r < p.Nq) {
        ac_elem_t* orow = gO + (long long)r * p.o_sn;
#pragma unroll
        for (int nt = 0; nt < NO / 4; ++nt) {
          *reinterpret_cast<unsigned int*>(orow + nt * 8 + 2 * t) =
              Tr::pack2(st.acc_o[4 * nt + 2 * hf] * inv[hf], st.acc_o[4 * nt + 2 * hf + 1] * inv[hf]);
        }
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void v3_fwd(const AttnParams& p, const AttnBuffers& buf, const V3Maps& maps) {
  using L = V3Layout<Cfg>;
  constexpr int BM = L::BM, BN = L::BN, STAGES = L::STAGES, NC = L::NC;
  constexpr bool kPersistent = Cfg::PERSISTENT;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned int base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const unsigned int sQ = base;
  const unsigned int sKV0 = base + L::kQBytes;  // K of stage s: sKV0 + s*kStageBytes, V: + kKBytes
  const unsigned int bars = base + L::kBarOffset;
  const unsigned int barQ = bars;                           // Q landed (phase = tile count & 1)
  const unsigned int barQfree = bars + 8u * (1 + 4 * STAGES);  // consumers done with Q's S GEMMs
  auto full_k = [&](int s) { return bars + 8u * (1 + s); };
  auto full_v = [&](int s) { return bars + 8u * (1 + STAGES + s); };
  auto empty_k = [&](int s) { return bars + 8u * (1 + 2 * STAGES + s); };
  auto empty_v = [&](int s) { return bars + 8u * (1 + 3 * STAGES + s); };

  const int num_qb = (p.Nq + BM - 1) / BM;
  const int num_tiles = kPersistent ? num_qb * p.B * p.H : 1;
  const int tile0 = kPersistent ? blockIdx.x : 0;
  const int tile_step = kPersistent ? gridDim.x : 1;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
#define AC_TRACE_TILE(tile) (kPersistent ? (tile) : (int)(blockIdx.y * gridDim.x + blockIdx.x))
#ifdef AC_V3_TRACE
  {
    unsigned int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    AC_TRACE(AC_TRACE_TILE(tile0), kTraceStart, threadIdx.x == 0);
    AC_TRACE_VALUE(AC_TRACE_TILE(tile0), kTraceSm, threadIdx.x == 0, smid);
  }
#endif

  if (threadIdx.x == 0) {
    mbar_init(barQ, 1);
    mbar_init(barQfree, NC * 128);
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), NC * 128);
      mbar_init(empty_v(s), NC * 128);
    }
    mbar_init_fence();
    // The first tile's Q copy goes out before anything else (setmaxnreg, the K/V range, the
    // descriptor prefetches): its round trip is the CTA's start-up latency (benchmarks/v3_trace.py).
    if (tile0 < num_tiles) {
      int q_block, bh;
      v3_tile<kPersistent>(tile0, num_qb, p, q_block, bh);
      const int b = bh / p.H, h = bh % p.H;
      mbar_arrive_expect_tx(barQ, L::kQBytes);
#pragma unroll
      for (int c = 0; c < L::D / 64; ++c) tma_load_4d(sQ + c * BM * 128, &maps.q, c * 64, q_block * BM, h, b, barQ);
    }
  }
  __syncthreads();

  if (warp < 4) {
    // ---------------- producer warpgroup ----------------
    setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (warp == 0 && lane == 0) {
      tma_prefetch_desc(&maps.q);
      tma_prefetch_desc(&maps.k);
      tma_prefetch_desc(&maps.v);
      // Ring state runs on across tiles: block number i (over the CTA's lifetime) takes slot
      // i % STAGES of the K and the V ring; a slot is refilled once every consumer thread released it.
      int s = 0, i = 0;
      unsigned int phase = 0;
      auto load_v = [&](int jv, int b, int h_kv, int sv, unsigned int ph, int iv) {
        if (iv >= STAGES) mbar_wait(empty_v(sv), ph ^ 1u);
        const unsigned int sV = sKV0 + sv * L::kStageBytes + L::kKBytes;
        mbar_arrive_expect_tx(full_v(sv), L::kVBytes);
#pragma unroll
        for (int c = 0; c < L::DV / 64; ++c) tma_load_4d(sV + c * BN * 128, &maps.v, c * 64, jv * BN, h_kv, b, full_v(sv));
      };
      int it = 0;
      for (int tile = tile0; tile < num_tiles; tile += tile_step, ++it) {
        int q_block, bh;
        v3_tile<kPersistent>(tile, num_qb, p, q_block, bh);
        const int b = bh / p.H, h = bh % p.H, h_kv = h / (p.H / p.H_kv);
        const int q0 = q_block * BM, q_hi = min(q0 + BM, p.Nq) - 1;
        int j_begin, j_end;
        kv_block_range<BN>(b, h, q0, q_hi, p, buf, j_begin, j_end);
        j_begin = kv_next_block<BN>(j_begin, j_end, b, h, q0, q_hi, p, buf);
        // The first tile's Q went out at the start (thread 0 above); a later tile's Q goes after its
        // K_0 (which only needs a ring slot), so that K_0 is in flight while the previous tile's last
        // S GEMMs finish and free Q.
        auto load_q = [&]() {
          mbar_wait(barQfree, (it - 1) & 1);  // the previous tile's S GEMMs are done
          mbar_arrive_expect_tx(barQ, L::kQBytes);
#pragma unroll
          for (int c = 0; c < L::D / 64; ++c) tma_load_4d(sQ + c * BM * 128, &maps.q, c * 64, q0, h, b, barQ);
        };
        // Copies in the order the consumers use them: K_0, then K_i before V_{i-1} (iteration i
        // issues S_i = Q K_i^T before O += P_{i-1} V_{i-1}), then the last V.
        int s_prev = 0, j_prev = -1;
        unsigned int phase_prev = 0;
        if (it > 0 && j_begin >= j_end) load_q();
        for (int j = j_begin; j < j_end; j = kv_next_block<BN>(j + 1, j_end, b, h, q0, q_hi, p, buf), ++i) {
          if (i >= STAGES) mbar_wait(empty_k(s), phase ^ 1u);
          const unsigned int sK = sKV0 + s * L::kStageBytes;
          mbar_arrive_expect_tx(full_k(s), L::kKBytes);
#pragma unroll
          for (int c = 0; c < L::D / 64; ++c) tma_load_4d(sK + c * BN * 128, &maps.k, c * 64, j * BN, h_kv, b, full_k(s));
          if (it > 0 && j == j_begin) load_q();
          AC_TRACE(AC_TRACE_TILE(tile), kTraceIssue, j == j_begin);
          if (j_prev >= 0) load_v(j_prev, b, h_kv, s_prev, phase_prev, i - 1);
          j_prev = j;
          s_prev = s;
          phase_prev = phase;
          if (++s == STAGES) {
            s = 0;
            phase ^= 1u;
          }
        }
        if (j_prev >= 0) load_v(j_prev, b, h_kv, s_prev, phase_prev, i - 1);
      }
    }
    return;
  }

  // ---------------- consumer warpgroups ----------------
  setmaxnreg_inc<Cfg::CONSUMER_REGS>();
  const int wg = (threadIdx.x >> 7) - 1;
  const int warp_wg = warp & 3;
  // exp2's multiplier of the softmax input: log2e * scale (plain), the score_mod's positive factor, or
  // 1 (separable: x = coef * s + col already is log2e * score_mod up to the row term)
  const float exp_scale = !Variant::kHasScoreMod ? p.scale * AC_LOG2E
                          : (Variant::kScoreSeparable ? 1.f : Variant::kScoreLog2Factor);
  constexpr bool kPingPong = (NC == 2);
  // Ping-pong: before each of its turns (one GEMM issue) warpgroup w waits on bar[w]; after it,
  // it grants the other one's turn. Warpgroup 1 grants warpgroup 0's first turn at the start, and
  // warpgroup 0 takes that one extra grant back at the end, so arrivals and waits always balance.
  auto turn_wait = [&]() {
    if constexpr (kPingPong) named_bar_sync(kTurnBar + wg, 256);
  };
  auto turn_grant = [&]() {
    if constexpr (kPingPong) named_bar_arrive(kTurnBar + (wg ^ 1), 256);
  };
  if (kPingPong && wg == 1) named_bar_arrive(kTurnBar + 0, 256);

  V3Consumer<Cfg> st;
  int s = 0;  // ring slot and phase of the next K/V block (runs on across tiles, as the producer's)
  unsigned int phase = 0;
  int it = 0;
  for (int tile = tile0; tile < num_tiles; tile += tile_step, ++it) {
    int q_block, bh;
    v3_tile<kPersistent>(tile, num_qb, p, q_block, bh);
    const int b = bh / p.H, h = bh % p.H;
    const int q0 = q_block * BM, q_hi = min(q0 + BM, p.Nq) - 1;
    int j_begin, j_end;
    kv_block_range<BN>(b, h, q0, q_hi, p, buf, j_begin, j_end);
    j_begin = kv_next_block<BN>(j_begin, j_end, b, h, q0, q_hi, p, buf);
    const int wq_lo = q0 + 64 * wg;                 // this warpgroup's query rows [wq_lo, wq_hi]
    const int wq_hi = min(wq_lo + 63, p.Nq - 1);
    const int row0 = wq_lo + 16 * warp_wg;          // this warp's first query row

#pragma unroll
    for (int i = 0; i < L::NO; ++i) st.acc_o[i] = 0.f;
    st.row_max[0] = st.row_max[1] = AC_NEG_INF;
    st.row_sum[0] = st.row_sum[1] = 0.f;
    if constexpr (Variant::kHasScoreMod && Variant::kScoreSeparable) {
      st.sep_coef = Variant::score_sep_coef(b, h, p, buf);
      st.sep_slope = Variant::score_sep_slope(b, h, p, buf);
    }

    // Whether block j needs the masked softmax for this warpgroup's rows.
    auto needs_mask = [&](int j) -> bool {
      const int kv0 = j * BN;
      if (kv0 + BN > p.Nk) return true;
      if constexpr (Variant::kHasMask) {
        if (wq_lo > wq_hi) return true;  // no valid rows (results unused)
        return Variant::tile_class(b, h, wq_lo, wq_hi, kv0, kv0 + BN - 1, p, buf) != AC_TILE_FULL;
      }
      return false;
    };

    mbar_wait(barQ, it & 1);  // always: the Q copy must land before Q is reused or the CTA exits
    AC_TRACE(AC_TRACE_TILE(tile), kTraceQ, threadIdx.x == 128);
#ifdef AC_V3_TRACE
    int trace_blocks = 0;
#endif
    if (j_begin < j_end) {
      int j = j_begin;
      // Block 0: S_0 only.
      mbar_wait(full_k(s), phase);
      turn_wait();
      wgmma_fence();
      st.issue_qk(sQ, sKV0 + s * L::kStageBytes, wg);
      wgmma_commit();
      turn_grant();
      // The block walk runs while the GEMMs do: off the path from S to the next issue.
      bool masked = needs_mask(j);
      int j_next = kv_next_block<BN>(j + 1, j_end, b, h, q0, q_hi, p, buf);
      wgmma_wait<0>();
      reg_fence(st.acc_s);
      AC_TRACE(AC_TRACE_TILE(tile), kTraceS0, threadIdx.x == 128);
      mbar_arrive(empty_k(s));
      {
        float alpha[2];
        st.softmax_dispatch(masked, j * BN, row0, exp_scale, b, h, p, buf, alpha);
        st.convert_p(j * BN, row0, b, h, p);
      }
      AC_TRACE(AC_TRACE_TILE(tile), kTraceSoftmax0, threadIdx.x == 128);
      int s_prev = s;
      unsigned int phase_prev = phase;
      if (++s == STAGES) {
        s = 0;
        phase ^= 1u;
      }
      j = j_next;
      while (j < j_end) {
        mbar_wait(full_k(s), phase);
        turn_wait();
        wgmma_fence();
        st.issue_qk(sQ, sKV0 + s * L::kStageBytes, wg);
        wgmma_commit();
        mbar_wait(full_v(s_prev), phase_prev);
        st.issue_pv(sKV0 + s_prev * L::kStageBytes + L::kKBytes);
        wgmma_commit();
        turn_grant();
        masked = needs_mask(j);
        j_next = kv_next_block<BN>(j + 1, j_end, b, h, q0, q_hi, p, buf);
        wgmma_wait<1>();
        reg_fence(st.acc_s);
        mbar_arrive(empty_k(s));  // S_i is done: K_i's slot may be refilled
        float alpha[2];
        st.softmax_dispatch(masked, j * BN, row0, exp_scale, b, h, p, buf, alpha);
        wgmma_wait<0>();
        reg_fence(st.acc_o);
        reg_fence(st.p_frag);  // P is read by the in-flight wgmma until here: keep its registers live
        mbar_arrive(empty_v(s_prev));  // P_{i-1} V_{i-1} is done
        st.rescale_o(alpha);
        st.convert_p(j * BN, row0, b, h, p);
        s_prev = s;
        phase_prev = phase;
        if (++s == STAGES) {
          s = 0;
          phase ^= 1u;
        }
        j = j_next;
#ifdef AC_V3_TRACE
        ++trace_blocks;
#endif
      }
      AC_TRACE(AC_TRACE_TILE(tile), kTraceLoop, threadIdx.x == 128);
      AC_TRACE_VALUE(AC_TRACE_TILE(tile), kTraceBlocks, threadIdx.x == 128, trace_blocks + 1);
      mbar_arrive(barQfree);  // every S GEMM of this tile is done: Q may be reloaded
      // The last block's P V.
      mbar_wait(full_v(s_prev), phase_prev);
      turn_wait();
      wgmma_fence();
      st.issue_pv(sKV0 + s_prev * L::kStageBytes + L::kKBytes);
      wgmma_commit();
      turn_grant();
      wgmma_wait<0>();
      reg_fence(st.acc_o);
      reg_fence(st.p_frag);
      mbar_arrive(empty_v(s_prev));
      AC_TRACE(AC_TRACE_TILE(tile), kTracePv, threadIdx.x == 128);
    } else {
      mbar_arrive(barQfree);
    }

    // Epilogue: O / l, LSE = (m + log2 l) * ln 2; rows with no visible key get O = 0 and LSE = -inf;
    // rows >= Nq are not written.
    v3_epilogue<Cfg>(st, p, buf, sQ, wg, row0, wq_lo, b, h, bh, AC_TRACE_TILE(tile));
    AC_TRACE(AC_TRACE_TILE(tile), kTraceEpi0, threadIdx.x == 128);
    AC_TRACE(AC_TRACE_TILE(tile), kTraceEpi1, threadIdx.x == 256);
  }
  if (kPingPong && wg == 0) named_bar_sync(kTurnBar + 0, 256);  // the extra grant (see above)
#undef AC_TRACE_TILE
}

}  // namespace ac
