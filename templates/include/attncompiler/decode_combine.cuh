// attncompiler/decode_combine.cuh -- the merge of split-KV decode's partial results (decode.cuh describes both
// kernels and the workspace): decode_fold_tail, run by the last split CTA of a (b, h_kv, row block) to finish
// (FOLD_COMBINE), and decode_combine, the body of the separate combine kernel. Both compute LSE = log sum_s
// exp(lse_s) and O = sum_s exp(lse_s - LSE) O_s; a row with no visible key in any split gets O = 0, LSE = -inf.
//
// Requires (from the prelude): ac_elem_t, AttnParams, DecodeParams; decode_tiles.cuh (the split kernel's layout).
#pragma once

namespace ac {

// FOLD_COMBINE tail of a split CTA (num_splits > 1), after every thread wrote its partial O / LSE rows:
// count this split in by the (b, h_kv, row block) counter; the last split to arrive merges the rows
// [R0, R0 + nrows) of the group over all splits (decode_combine's arithmetic: LSE = m + log sum exp(lse_s
// - m), O = sum_s exp(lse_s - LSE) O_s; no visible key in any split: O = 0, LSE = -inf) and resets the
// counter. Memory order: each writer fences before the CTA barrier; thread 0 fences, increments and
// fences again (release before, acquire after) before the barrier that tells the CTA it is last; the
// partials are then read with ld.global.cg (L2, never a stale L1 line).
template <class Cfg>
__device__ __forceinline__ void decode_fold_tail(const AttnParams& p, const DecodeParams& dp, int b, int h0, int R0,
                                                 int nrows) {
  using L = DecodeLayout<Cfg>;
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  constexpr int DV = L::DV;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int S = dp.num_splits;
  const long long R = dp.total_rows;
  // (b * H_kv + h_kv) * row_blocks + row block, in the split kernel's grid (num_splits * row_blocks, H_kv, B)
  int* counter = dp.counters + ((long long)ac_grid_bh() * (gridDim.x / S) + blockIdx.x / S);

  __threadfence();  // this thread's partial stores, ordered before the barrier
  __syncthreads();
  int prev = 0;
  if (tid == 0) {
    __threadfence();  // release (cumulative over the CTA's stores seen through the barrier)
    prev = atomicAdd(counter, 1);
    __threadfence();  // acquire: the splits counted before us fenced their partials first
  }
  if (!__syncthreads_or(tid == 0 && prev == S - 1)) return;  // CTA-uniform
  if (tid == 0) atomicExch(counter, 0);  // every split has counted: nothing else touches it this launch

  const float* part_lse = p.workspace + (long long)S * R * DV;
  for (int r = warp; r < nrows; r += L::W) {  // warp-uniform rows: the shuffles below see all 32 lanes
    const int Rg = R0 + r;
    const int h = h0 + Rg / p.Nq;
    const int qi = Rg % p.Nq;
    const long long row = ((long long)b * p.H + h) * p.Nq + qi;
    float m = AC_NEG_INF;
    for (int s = lane; s < S; s += 32) m = fmaxf(m, __ldcg(part_lse + (long long)s * R + row));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float sum = 0.f;
    if (m != AC_NEG_INF) {
      for (int s = lane; s < S; s += 32) sum += __expf(__ldcg(part_lse + (long long)s * R + row) - m);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const bool empty = !(m != AC_NEG_INF && sum > 0.f);
    const float lse = empty ? AC_NEG_INF : m + __logf(sum);

    T* gO = reinterpret_cast<T*>(p.o) + b * p.o_sb + (long long)h * p.o_sh + (long long)qi * p.o_sn;
    const float* part_o = p.workspace + row * DV;
    for (int cb = 0; cb < DV; cb += 128) {  // 4 columns per lane
      const int c0 = cb + lane * 4;
      const bool active = c0 < DV;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s0 = 0; s0 < S; s0 += 32) {
        // Lane u holds the weight of split s0 + u (0 past S, and for an empty row).
        const int sl = s0 + lane;
        const float w_lane = (sl < S && !empty) ? __expf(__ldcg(part_lse + (long long)sl * R + row) - lse) : 0.f;
        const int cnt = min(32, S - s0);
        for (int u0 = 0; u0 < cnt; u0 += 8) {
          float4 x[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            x[u] = (active && u0 + u < cnt)
                       ? __ldcg(reinterpret_cast<const float4*>(part_o + (long long)(s0 + u0 + u) * R * DV + c0))
                       : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const float wgt = __shfl_sync(0xffffffffu, w_lane, u0 + u);
            acc.x += wgt * x[u].x; acc.y += wgt * x[u].y; acc.z += wgt * x[u].z; acc.w += wgt * x[u].w;
          }
        }
      }
      if (active) {
        uint2 v;
        v.x = Tr::pack2(acc.x, acc.y);
        v.y = Tr::pack2(acc.z, acc.w);
        *reinterpret_cast<uint2*>(gO + c0) = v;
      }
    }
    if (lane == 0 && p.lse != nullptr) p.lse[row] = lse;
  }
}

// One warp per output row: merge the num_splits (<= MAX_SPLITS) partial results by their LSE. The
// splits' weights exp(lse_s - LSE) go through shared memory; the partial O rows are read 8 splits at a
// time (independent loads in flight: the reads hit L2, just written by the split kernel).
template <int DV, int WARPS, int MAX_SPLITS>
__device__ __forceinline__ void decode_combine(const AttnParams& p, const DecodeParams& dp) {
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  static_assert(DV % 4 == 0, "DV must be a multiple of 4");
  __shared__ float s_w[WARPS][MAX_SPLITS];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const long long row = (long long)blockIdx.x * WARPS + warp;
  if (row >= dp.total_rows) return;  // warp-uniform; no block-wide barrier follows
  const int S = min(dp.num_splits, MAX_SPLITS);
  const long long R = dp.total_rows;
  const float* part_lse = p.workspace + (long long)dp.num_splits * R * DV;

  float m = AC_NEG_INF;
  for (int s = lane; s < S; s += 32) m = fmaxf(m, part_lse[(long long)s * R + row]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float sum = 0.f;
  if (m != AC_NEG_INF) {
    for (int s = lane; s < S; s += 32) sum += __expf(part_lse[(long long)s * R + row] - m);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const bool empty = !(m != AC_NEG_INF && sum > 0.f);
  const float lse = empty ? AC_NEG_INF : m + __logf(sum);
  // exp(-inf - lse) = 0: a split with no visible key (its partial O is 0) contributes nothing.
  for (int s = lane; s < S; s += 32) s_w[warp][s] = empty ? 0.f : __expf(part_lse[(long long)s * R + row] - lse);
  __syncwarp();

  const int qi = static_cast<int>(row % p.Nq);
  const int h = static_cast<int>((row / p.Nq) % p.H);
  const int b = static_cast<int>(row / ((long long)p.Nq * p.H));
  T* gO = reinterpret_cast<T*>(p.o) + b * p.o_sb + (long long)h * p.o_sh + (long long)qi * p.o_sn;
  const float* part_o = p.workspace + row * DV;
  for (int c0 = lane * 4; c0 < DV; c0 += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < S; s0 += 8) {
      float4 x[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        x[u] = (s0 + u < S) ? *reinterpret_cast<const float4*>(part_o + (long long)(s0 + u) * R * DV + c0)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float wgt = (s0 + u < S) ? s_w[warp][s0 + u] : 0.f;
        acc.x += wgt * x[u].x; acc.y += wgt * x[u].y; acc.z += wgt * x[u].z; acc.w += wgt * x[u].w;
      }
    }
    uint2 v;
    v.x = Tr::pack2(acc.x, acc.y);
    v.y = Tr::pack2(acc.z, acc.w);
    *reinterpret_cast<uint2*>(gO + c0) = v;
  }
  if (lane == 0 && p.lse != nullptr) p.lse[row] = lse;
}

}  // namespace ac
