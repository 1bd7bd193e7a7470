// attncompiler/mma_bwd.cuh -- PTX helpers the backward kernels add to mma.cuh.
//
//   red_add_f32x4        fire-and-forget fp32 reduction of 4 consecutive floats into global memory
//                        (one red.global.add.v4.f32 on sm_90+, four scalar reds before)
//   red_add_f32x2        the same for 2 consecutive floats (red.global.add.v2.f32 on sm_90+)
//   atomic_add_c_tile    adds one m16n8 fp32 accumulator tile (C layout, mma.cuh) into a row-major
//                        fp32 matrix. VEC = 4: lanes t and t^1 swap halves with one shuffle so that
//                        each lane holds 4 consecutive columns of one row, then one 16-byte red per
//                        lane (selects, no divergent branch); VEC = 2: two 8-byte reds per lane, no
//                        shuffle. The caller passes a per-lane base pointer (atomic_add_lane_base) so
//                        that tile offsets are compile-time immediates.
//   mma_ab               acc[MT][NT] (+)= A x B over KT k16 steps with A and B read from shared memory
//                        by ldmatrix, each either row-major in (m, k) / (k, n) or stored transposed
//   st_shared_u32        32-bit store to a shared-state-space byte address
//   cp_async_16 ...      (mma.cuh)
#pragma once

#include "attncompiler/bulk_copy.cuh"

namespace ac {

__device__ __forceinline__ void st_shared_u32(unsigned int addr, unsigned int v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v));
}

// *addr += (a, b, c, d) for 16-byte aligned addr, without returning the old value.
__device__ __forceinline__ void red_add_f32x4(float* addr, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(addr + 0, a);
  atomicAdd(addr + 1, b);
  atomicAdd(addr + 2, c);
  atomicAdd(addr + 3, d);
#endif
}

__device__ __forceinline__ void st_shared_f32x2(unsigned int addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b));
}
__device__ __forceinline__ void ld_shared_f32x4(unsigned int addr, float (&v)[4]) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(addr));
}
__device__ __forceinline__ void st_shared_f32x4(unsigned int addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// sm_90 bulk asynchronous reduction (TMA) of `bytes` (multiple of 16) fp32 from shared memory into
// global memory, in this thread's bulk group; the fence makes this thread's generic-proxy shared
// writes visible to the async proxy.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gdst, unsigned int ssrc, unsigned int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gdst), "r"(ssrc),
               "r"(bytes)
               : "memory");
}
// (bulk_commit, bulk_wait_read_all, bulk_wait_all, bulk_fence_proxy_async_smem: bulk_copy.cuh)

// *addr += (a, b) for 8-byte aligned addr, without returning the old value.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(addr + 0, a);
  atomicAdd(addr + 1, b);
#endif
}

// This lane's element of an m16n8 tile at (row0, col0) of a row-major fp32 matrix (row stride ld):
// VEC = 4: lane t even owns row g, columns 2t..2t+3; lane t odd row g + 8, columns 2t-2..2t+1.
// VEC = 2: row g, columns 2t, 2t+1 (and row g + 8 at + 8 * ld).
template <int VEC>
__device__ __forceinline__ int atomic_add_lane_row() {
  const int lane = threadIdx.x & 31;
  return (lane >> 2) + ((VEC == 4 && (lane & 1)) ? 8 : 0);
}
template <int VEC>
__device__ __forceinline__ int atomic_add_lane_col() {
  const int t = threadIdx.x & 3;
  return VEC == 4 ? 2 * (t & ~1) : 2 * t;
}

// Adds the m16n8 C tile `c` (rows g and g + 8, columns 2t, 2t+1 of the tile) into global fp32
// memory at `lane_ptr` = matrix + (row0 + atomic_add_lane_row<VEC>()) * ld + col0 +
// atomic_add_lane_col<VEC>(). kCheck: rows with lane_row (the lane's row index in the matrix,
// before + 8 for VEC = 2) >= rows_valid are skipped.
template <int VEC, bool kCheck>
__device__ __forceinline__ void atomic_add_c_tile(float* lane_ptr, long long ld, int lane_row, int rows_valid,
                                                  const float (&c)[4]) {
  if constexpr (VEC == 4) {
    const bool even = ((threadIdx.x & 1) == 0);
    const float s0 = even ? c[2] : c[0];
    const float s1 = even ? c[3] : c[1];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    const float v0 = even ? c[0] : r0;
    const float v1 = even ? c[1] : r1;
    const float v2 = even ? r0 : c[2];
    const float v3 = even ? r1 : c[3];
    if (!kCheck || lane_row < rows_valid) red_add_f32x4(lane_ptr, v0, v1, v2, v3);
  } else {
    static_assert(VEC == 2, "VEC is 2 or 4");
    if (!kCheck || lane_row < rows_valid) red_add_f32x2(lane_ptr, c[0], c[1]);
    if (!kCheck || lane_row + 8 < rows_valid) red_add_f32x2(lane_ptr + 8 * ld, c[2], c[3]);
  }
}

// Per-lane ldmatrix byte offsets (elements are 2 bytes), for a tile whose first row / column is 0:
//   A operand, row-major (m, k):             row lane & 15,                     column (lane >> 4) * 8
//   A operand stored transposed, (k, m):     row (lane & 7) + (lane >> 4) * 8,  column ((lane >> 3) & 1) * 8
//   B operand stored as (n, k) rows:         the same as "A transposed"
//   B operand stored as (k, n) rows (.trans): row (lane & 7) + ((lane >> 3) & 1) * 8, column (lane >> 4) * 8
template <bool kTrans, int STRIDE>
__device__ __forceinline__ unsigned int ldsm_a_lane_off() {
  const int lane = threadIdx.x & 31;
  if constexpr (kTrans) return (((lane & 7) + (lane >> 4) * 8) * STRIDE + ((lane >> 3) & 1) * 8) * 2;
  else return ((lane & 15) * STRIDE + (lane >> 4) * 8) * 2;
}
template <bool kTrans, int STRIDE>
__device__ __forceinline__ unsigned int ldsm_b_lane_off() {
  const int lane = threadIdx.x & 31;
  if constexpr (kTrans) return (((lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + (lane >> 4) * 8) * 2;
  else return (((lane & 7) + (lane >> 4) * 8) * STRIDE + ((lane >> 3) & 1) * 8) * 2;
}

// acc[MT][NT][4] (= or +=) A x B over KT k16 steps (kZero: the first step writes instead of adding).
// a_addr / b_addr: this lane's ldmatrix byte addresses of the tiles' origin (tile base +
// ldsm_a_lane_off<kATrans, AS>() / ldsm_b_lane_off<kBTrans, BS>()).
//   kATrans = false: A is MT*16 rows (m) x KT*16 (k), row-major, row stride AS elements;
//   kATrans = true:  A is stored as KT*16 rows (k) x MT*16 (m) (ldmatrix.trans).
//   kBTrans = false: B is stored as NT*8 rows (n) x KT*16 (k) ("rows times rows", S = Q K^T);
//   kBTrans = true:  B is stored as KT*16 rows (k) x NT*8 (n) (ldmatrix.trans, P V style).
template <int MT, int NT, int KT, int AS, int BS, bool kATrans, bool kBTrans, bool kZero>
__device__ __forceinline__ void mma_ab(float (&acc)[MT][NT][4], unsigned int a_addr, unsigned int b_addr) {
  using Tr = ac_type_traits<ac_elem_t>;
  static_assert(NT % 2 == 0, "NT must be even (x4 ldmatrix of B covers two n8 tiles)");
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    unsigned int a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (kATrans) ldmatrix_x4_trans(a[mt], a_addr + (kk * 16 * AS + mt * 16) * 2);
      else ldmatrix_x4(a[mt], a_addr + (mt * 16 * AS + kk * 16) * 2);
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned int bq[4];
      if constexpr (kBTrans) ldmatrix_x4_trans(bq, b_addr + (kk * 16 * BS + np * 16) * 2);
      else ldmatrix_x4(bq, b_addr + (np * 16 * BS + kk * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (kZero && kk == 0) {
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

// out[MT][NT][4] += A x B over KQ k16 steps, A from registers: x[mt][nt] holds the element-type
// pairs (row g, columns 2t..2t+1) and (row g + 8, ...) of n8 tile nt of an m16 x (2*KQ*8) C-layout
// tile, so n8 tiles 2kq and 2kq+1 form the A fragment of k-step kq; B is KQ*16 rows x NT*8 at b_addr
// (this lane's ldmatrix.trans address, row stride BS elements).
template <int MT, int NT, int KQ, int BS, int NX>
__device__ __forceinline__ void mma_regs_a(float (&out)[MT][NT][4], const unsigned int (&x)[MT][NX][2],
                                           unsigned int b_addr) {
  using Tr = ac_type_traits<ac_elem_t>;
  static_assert(NX >= 2 * KQ && NT % 2 == 0, "A from registers: 2*KQ n8 tiles, NT even");
#pragma unroll
  for (int kq = 0; kq < KQ; ++kq) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned int bv[4];
      ldmatrix_x4_trans(bv, b_addr + (kq * 16 * BS + np * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const unsigned int a[4] = {x[mt][2 * kq][0], x[mt][2 * kq][1], x[mt][2 * kq + 1][0], x[mt][2 * kq + 1][1]};
        mma_16816<Tr::kIsBf16>(out[mt][2 * np], a, bv[0], bv[1]);
        mma_16816<Tr::kIsBf16>(out[mt][2 * np + 1], a, bv[2], bv[3]);
      }
    }
  }
}

}  // namespace ac
