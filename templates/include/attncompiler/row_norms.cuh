// attncompiler/row_norms.cuh -- the largest squared row norm of q per (b, h) and of k per (b, h_kv): the
// per-call input of the score skip (attncompiler/runtime/scoreskip.py, score_skip_begin in score_skip.cuh).
//
// out (float32, zeroed by the caller): out[b * H + h] = max_i |q[b, h, i]|^2, then
// out[B * H + b * H_kv + h] = max_j |k[b, h, j]|^2. Grid (B * H + B * H_kv, row chunks of kRowsPerCta rows, at
// most 65535 of them: a CTA takes every gridDim.y-th chunk),
// kThreads threads: a group of kGroup consecutive lanes (D / 8 rounded up to a power of two) shares a
// row, its first D / 8 lanes loading 16 bytes (8 elements) each (the launcher's checks give a contiguous
// head dim and 16-byte aligned rows); kPasses rows per group in flight.
// The maxima run on the floats' bit patterns as ints (non-negative floats order like their bits) with
// every NaN made 0x7fffffff, so a NaN or inf anywhere in a head's rows reaches its entry (fmaxf would
// drop a NaN) and the skip then stays off for that head.
//
// Requires (from the prelude): ac_elem_t, AttnParams.
#pragma once

namespace ac {

template <int D>
struct RowNorms {
  static constexpr int kThreads = 256;
  static constexpr int kChunks = D / 8;                          // 16-byte chunks per row
  static constexpr int kGroup = kChunks <= 1 ? 1 : kChunks <= 2 ? 2 : kChunks <= 4 ? 4 : kChunks <= 8 ? 8
                                : kChunks <= 16 ? 16 : 32;       // lanes per row: a power of two
  static constexpr int kRowsPerPass = kThreads / kGroup;
  static constexpr int kPasses = 8;
  static constexpr int kRowsPerCta = kRowsPerPass * kPasses;
  static_assert(D % 8 == 0 && D >= 8 && D <= 256, "rows of 8..256 elements in 16-byte chunks, inside one warp");
};

__device__ __forceinline__ int ac_norm_bits(float x) { return x != x ? 0x7fffffff : __float_as_int(x); }

template <int D>
__device__ __forceinline__ void row_norms(const AttnParams& p, float* out) {
  using R = RowNorms<D>;
  using Tr = ac_type_traits<ac_elem_t>;
  const int nq = p.B * p.H;
  const bool is_q = blockIdx.x < nq;
  const int bh = is_q ? blockIdx.x : blockIdx.x - nq;
  const int heads = is_q ? p.H : p.H_kv;
  const int b = bh / heads, h = bh % heads;
  const int rows = is_q ? p.Nq : p.Nk;
  const ac_elem_t* base = reinterpret_cast<const ac_elem_t*>(is_q ? p.q : p.k) +
                          b * (is_q ? p.q_sb : p.k_sb) + h * (is_q ? p.q_sh : p.k_sh);
  const long long sn = is_q ? p.q_sn : p.k_sn;
  const int lane_in_row = threadIdx.x % R::kGroup;
  int best = 0;
  for (int chunk = blockIdx.y; chunk * R::kRowsPerCta < rows; chunk += gridDim.y) {
    const int row0 = chunk * R::kRowsPerCta + threadIdx.x / R::kGroup;
#pragma unroll
    for (int it = 0; it < R::kPasses; ++it) {
      const int r = row0 + it * R::kRowsPerPass;
      float ss = 0.f;
      if (r < rows && lane_in_row < R::kChunks) {
        const uint4 c = *reinterpret_cast<const uint4*>(base + r * sn + 8 * lane_in_row);
        const ac_elem_t* e = reinterpret_cast<const ac_elem_t*>(&c);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float f = Tr::to_float(e[i]);
          ss = fmaf(f, f, ss);
        }
      }
#pragma unroll
      for (int o = R::kGroup / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      best = max(best, ac_norm_bits(ss));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  __shared__ int warp_best[R::kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < R::kThreads / 32; ++w) best = max(best, warp_best[w]);
    atomicMax(reinterpret_cast<int*>(out) + blockIdx.x, best);
  }
}

}  // namespace ac
