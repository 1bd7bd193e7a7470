// attncompiler/mma_bwd.cuh -- PTX helpers the backward kernels add to mma.cuh.
//
//   red_add_f32x4        fire-and-forget fp32 reduction of 4 consecutive floats into global memory
//                        (one red.global.add.v4.f32 on sm_90+, four scalar reds before)
//   atomic_add_c_tile    adds one m16n8 fp32 accumulator tile (C layout, mma.cuh) into a row-major
//                        fp32 matrix: lanes t and t^1 swap halves with one shuffle so that each lane
//                        holds 4 consecutive columns of one row, then one 16-byte red per lane
//   st_shared_u32        32-bit store to a shared-state-space byte address
//   cp_async_16 ...      (mma.cuh)
#pragma once

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

// Adds the m16n8 C tile `c` (rows row0 + g and row0 + g + 8, columns col0 + 2t, +1) into the
// row-major fp32 matrix `base` (row stride `ld` floats). Rows >= rows_valid are skipped.
// Lane t even ends up with row g, columns 2t..2t+3; lane t odd with row g+8, columns 2t-2..2t+1.
__device__ __forceinline__ void atomic_add_c_tile(float* base, long long ld, int row0, int col0, int rows_valid,
                                                  const float (&c)[4]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const bool even = (t & 1) == 0;
  const float s0 = even ? c[2] : c[0];
  const float s1 = even ? c[3] : c[1];
  const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
  const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
  const int row = row0 + g + (even ? 0 : 8);
  const int col = col0 + 2 * (t & ~1);
  if (row < rows_valid) {
    if (even) {
      red_add_f32x4(base + row * ld + col, c[0], c[1], r0, r1);
    } else {
      red_add_f32x4(base + row * ld + col, r0, r1, c[2], c[3]);
    }
  }
}

}  // namespace ac
