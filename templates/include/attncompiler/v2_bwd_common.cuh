// attncompiler/v2_bwd_common.cuh -- what the v2 and v3 backward kernels share (sm_80+): the preprocess kernel
// v2_bwd_pre (lse2 and dsum per query row; v2_bwd.cuh describes the three backward kernels), the "rows times
// rows" mma.sync product mma_rows_rows, and the elementwise code of a score (bwd_element: p recomputed from lse2,
// dropout, dS) and of a transposed tile (bwd_tile_elementwise).
//
// Requires (from the prelude): ac_elem_t, AttnParams, AttnBwdParams, AttnBuffers, Variant (with score_mod_grad and
// kScoreModGradIsOne); mma.cuh, mma_bwd.cuh, philox.cuh.
#pragma once

namespace ac {

// ------------------------------------------------------------------------------------ preprocess
// Zero the fp32 dQ accumulator (bp.dq_accum_floats floats from a 16-byte aligned bp.dq_accum) over the whole
// preprocess grid, a float4 per thread and step; the main kernel, queued after it on the same stream, adds into it.
// Called first, with the launch's own bp (packed sequences move bp's pointers to their sequence afterwards).
__device__ __forceinline__ void bwd_zero_dq_accum(const AttnBwdParams& bp) {
  const long long n = bp.dq_accum_floats;
  if (n <= 0) return;
  const long long threads = (long long)gridDim.x * gridDim.y * gridDim.z * blockDim.x;
  const long long tid = ((long long)ac_grid_bh() * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  float4* a4 = reinterpret_cast<float4*>(bp.dq_accum);
  for (long long i = tid; i < n / 4; i += threads) a4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (tid < n % 4) bp.dq_accum[n / 4 * 4 + tid] = 0.f;
}

template <int DV, int NUM_WARPS, int ROWS_PER_WARP>
__device__ __forceinline__ void v2_bwd_pre(const AttnParams& p, const AttnBwdParams& bp) {
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  constexpr int kChunks = DV / 8;  // 16-byte chunks per row
  static_assert(DV % 8 == 0 && kChunks <= 32, "DV must be a multiple of 8 and <= 256");
  // A row takes kLanes lanes (the power of two covering its chunks), so a warp reads 32 / kLanes rows at once, and
  // all of its ROWS_PER_WARP rows are loaded before the first sum: the loads of every row are in flight together
  // (one row per warp at a time left the kernel latency-bound: H200, 32 packed sequences, 156 us for 313 MB).
  constexpr int kLanes = kChunks > 16 ? 32 : kChunks > 8 ? 16 : kChunks > 4 ? 8 : kChunks > 2 ? 4 : kChunks > 1 ? 2 : 1;
  constexpr int kRowsAtOnce = 32 / kLanes;
  constexpr int kIters = (ROWS_PER_WARP + kRowsAtOnce - 1) / kRowsAtOnce;
  static_assert(kIters <= 8, "rows of one warp held in registers at once");
  const int b = ac_grid_b();
  const int h = ac_grid_h();
  const int bh = ac_grid_bh();  // b * H + h
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int sub = lane / kLanes;  // this lane's row among the kRowsAtOnce
  const int c = lane % kLanes;    // its 16-byte chunk of the row
  const int row_base = (blockIdx.x * NUM_WARPS + warp) * ROWS_PER_WARP;
  const T* gO = reinterpret_cast<const T*>(p.o) + b * p.o_sb + h * p.o_sh;
  const T* gdO = reinterpret_cast<const T*>(bp.dout) + b * bp.do_sb + h * bp.do_sh;
  uint4 o4[kIters], d4[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int r = it * kRowsAtOnce + sub;
    const int q = row_base + r;
    o4[it] = make_uint4(0u, 0u, 0u, 0u);  // zeros: rows past Nq and chunks past DV add 0
    d4[it] = o4[it];
    if (r < ROWS_PER_WARP && q < p.Nq && c < kChunks) {
      o4[it] = *reinterpret_cast<const uint4*>(gO + q * p.o_sn + c * 8);
      d4[it] = *reinterpret_cast<const uint4*>(gdO + q * bp.do_sn + c * 8);
    }
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    // (unpacked from the words, not through the vectors' addresses, which put them on the stack at fp16, d = 256)
    const unsigned int ow[4] = {o4[it].x, o4[it].y, o4[it].z, o4[it].w};
    const unsigned int dw[4] = {d4[it].x, d4[it].y, d4[it].z, d4[it].w};
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float o0, o1, d0, d1;
      Tr::unpack2(ow[e], o0, o1);
      Tr::unpack2(dw[e], d0, d1);
      dot = fmaf(o1, d1, fmaf(o0, d0, dot));
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const int r = it * kRowsAtOnce + sub;
    const int q = row_base + r;
    if (c == 0 && r < ROWS_PER_WARP && q < bp.Nq_pad) {
      float l2 = -AC_NEG_INF;  // +inf: padded rows recompute P = 0
      float ds = 0.f;
      if (q < p.Nq) {
        const float lse = p.lse[(long long)bh * p.Nq + q];
        l2 = (lse == AC_NEG_INF) ? -AC_NEG_INF : lse * AC_LOG2E;
        ds = dot - (bp.dlse != nullptr ? bp.dlse[(long long)bh * p.Nq + q] : 0.f);
      }
      bp.lse2[(long long)bh * bp.Nq_pad + q] = l2;
      bp.dsum[(long long)bh * bp.Nq_pad + q] = ds;
    }
  }
}

// ------------------------------------------------------------------------------------ shared pieces
// acc[MT][NT] = A x B^T over KT k16 steps, A = MT*16 rows of a row-major tile at a_addr (this lane's
// ldmatrix base, row stride AS elements), B = NT*8 rows of a row-major tile at b_addr (row stride BS):
// both operands are "rows times rows" (S = Q K^T, dP = dO V^T and their transposes).
template <int MT, int NT, int KT, int AS, int BS>
__device__ __forceinline__ void mma_rows_rows(float (&acc)[MT][NT][4], unsigned int a_addr, unsigned int b_addr) {
  using Tr = ac_type_traits<ac_elem_t>;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    unsigned int a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], a_addr + (mt * 16 * AS + kk * 16) * 2);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned int bq[4];
      ldmatrix_x4(bq, b_addr + (np * 16 * BS + kk * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (kk == 0) {
          mma_16816_zc<Tr::kIsBf16>(acc[mt][2 * np], a[mt], bq[0], bq[1]);
          mma_16816_zc<Tr::kIsBf16>(acc[mt][2 * np + 1], a[mt], bq[2], bq[3]);
        } else {
          mma_16816<Tr::kIsBf16>(acc[mt][2 * np], a[mt], bq[0], bq[1]);
          mma_16816<Tr::kIsBf16>(acc[mt][2 * np + 1], a[mt], bq[2], bq[3]);
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------ elementwise
// One score element of the backward: p (undropped, recomputed from lse2) and the gradient of the
// loss w.r.t. the *scaled* score times the scale (what dQ = dS K and dK = dS^T Q need).
// kMasked: also evaluates the seqlen bounds and the mask (p = ds = 0 where not visible).
template <bool kMasked, bool kNeedDs>
__device__ __forceinline__ void bwd_element(float& s_io, float& dp_io, int b, int h, int q, int k, float lse2,
                                            float dsum, bool keep, float scale_log2, const AttnParams& p,
                                            const AttnBuffers& buf) {
  const float s = s_io;
  float pr;
  float gr = 1.f;
  if constexpr (Variant::kHasScoreMod) {
    const float sc = s * p.scale;
    pr = fast_exp2(fmaf(Variant::score_mod(sc, b, h, q, k, p, buf), AC_LOG2E, -lse2));
    if constexpr (kNeedDs && !Variant::kScoreModGradIsOne) gr = Variant::score_mod_grad(sc, b, h, q, k, p, buf);
  } else {
    pr = fast_exp2(fmaf(s, scale_log2, -lse2));
  }
  bool visible = true;
  if constexpr (kMasked) {
    visible = k < p.Nk && q < p.Nq;
    if constexpr (Variant::kHasMask) visible = visible && Variant::mask(b, h, q, k, p, buf);
  }
  if constexpr (kNeedDs) {
    float dp = dp_io;
    if constexpr (Variant::kHasDropout) dp = keep ? dp * p.dropout_rescale : 0.f;
    float ds = pr * (dp - dsum);
    if constexpr (Variant::kHasScoreMod && !Variant::kScoreModGradIsOne) ds *= gr;
    ds *= p.scale;
    if constexpr (kMasked) ds = visible ? ds : 0.f;
    dp_io = ds;
  }
  if constexpr (Variant::kHasDropout) pr = keep ? pr * p.dropout_rescale : 0.f;
  if constexpr (kMasked) pr = visible ? pr : 0.f;
  s_io = pr;
}

// P^T and dS^T of one transposed tile (keys x queries: MT m16 key tiles from key0, NTQ n8 query
// tiles from q0; s_lse2 / s_dsum point at query q0's entry), in place: acc_s -> z P^T, acc_dp ->
// dS^T * scale (kNeedDs). Dropout: one Philox call at (q, k) serves (q, k) and (q + 8, k) of the
// thread's two n8 query tiles (q0 must be a multiple of 16).
template <int MT, int NTQ, bool kMasked, bool kNeedDs>
__device__ __forceinline__ void bwd_tile_elementwise(float (&acc_s)[MT][NTQ][4], float (&acc_dp)[MT][NTQ][4],
                                                     const float* s_lse2, const float* s_dsum, int key0, int q0,
                                                     int b, int h, float scale_log2, const AttnParams& p,
                                                     const AttnBuffers& buf) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int np = 0; np < NTQ / 2; ++np) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int k = key0 + mt * 16 + g + 8 * hf;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int ql = np * 16 + 2 * t + e;  // query of n8 tile 2*np; tile 2*np+1 holds ql + 8
          ac_u32x4 w;
          if constexpr (Variant::kHasDropout) w = ac_dropout_words(p, b, h, q0 + ql, k);
#pragma unroll
          for (int sub = 0; sub < 2; ++sub) {
            const int nt = 2 * np + sub;
            const int qq = ql + 8 * sub;
            bool keep = true;
            if constexpr (Variant::kHasDropout) {
              const unsigned int word = sub ? ((g & 1) ? w.w : w.z) : ((g & 1) ? w.y : w.x);
              keep = word < p.dropout_threshold;
            }
            bwd_element<kMasked, kNeedDs>(acc_s[mt][nt][2 * hf + e], acc_dp[mt][nt][2 * hf + e], b, h, q0 + qq, k,
                                          s_lse2[qq], s_dsum[qq], keep, scale_log2, p, buf);
          }
        }
      }
    }
  }
}

}  // namespace ac
