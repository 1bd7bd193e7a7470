// attncompiler/mma.cuh -- thin wrappers over the sm_80+ PTX the v2 schedule is built from:
//   cp.async (16-byte global->shared copies with zero fill), ldmatrix (x4, optionally transposed),
//   mma.sync m16n8k16 with fp32 accumulators, and ex2.approx.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4*g + t:
//   A (16x16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8,  "col"):     b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
//   C (16x8,  fp32):      c0,c1 = C[g][2t..2t+1],  c2,c3 = C[g+8][2t..2t+1]
// so the C fragments of two adjacent n-tiles of S are exactly the A fragment of P for the next mma.
#pragma once

namespace ac {

__device__ __forceinline__ unsigned int smem_u32(const void* ptr) {
  return static_cast<unsigned int>(__cvta_generic_to_shared(ptr));
}

// 16-byte async copy to the shared-state-space byte address dst: src_bytes (16 or 0) are read and the
// rest of the 16 zero-filled (0: nothing read), with an L2 prefetch-size hint: L2_HINT = 0 (none),
// 128 or 256 bytes (`.L2::256B`: the L2 fetches whole 256-byte lines from DRAM).
template <int L2_HINT = 0>
__device__ __forceinline__ void cp_async_16_zfill(unsigned int dst, const void* src, int src_bytes) {
  static_assert(L2_HINT == 0 || L2_HINT == 128 || L2_HINT == 256, "L2_HINT is 0, 128 or 256");
  if constexpr (L2_HINT == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  } else if constexpr (L2_HINT == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  }
}
// 16-byte async copy; when !valid the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  cp_async_16_zfill(smem_u32(smem_dst), gmem_src, valid ? 16 : 0);
}
// The same with all 16 bytes read (no source-size operand).
template <int L2_HINT = 0>
__device__ __forceinline__ void cp_async_16_all(unsigned int dst, const void* src) {
  static_assert(L2_HINT == 0 || L2_HINT == 128 || L2_HINT == 256, "L2_HINT is 0, 128 or 256");
  if constexpr (L2_HINT == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  } else if constexpr (L2_HINT == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ldmatrix from a shared-state-space byte address (keep a per-thread base and add compile-time
// offsets, so the unrolled loops fold them into the instruction's immediate).
__device__ __forceinline__ void ldmatrix_x4(unsigned int (&r)[4], unsigned int smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int (&r)[4], unsigned int smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// D = A * B + D for one m16n8k16 tile, fp32 accumulate.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned int (&a)[4], unsigned int b0,
                                          unsigned int b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// D = A * B for one m16n8k16 tile (C = 0): the first k-step of a product needs no zeroed
// accumulators (ptxas feeds RZ as C).
template <bool kBf16>
__device__ __forceinline__ void mma_16816_zc(float (&d)[4], const unsigned int (&a)[4], unsigned int b0,
                                             unsigned int b1) {
  const float z = 0.f;
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  }
}

// 2^x with flush-to-zero; ex2(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FMA / ALU pipes, for a share of a softmax's exponentials when MUFU (ex2, tanh) is the
// bottleneck (FlashAttention-4's trick): x = n + f with n = rint(x) (the 1.5 * 2^23 rounding add),
// 2^f for f in [-1/2, 1/2] by a cubic (minimax in relative error, max 7.5e-5 -- far below the bf16 /
// fp16 rounding of P), times 2^n built in the exponent field.  Inputs are clamped to >= -127 with a
// NaN-propagating max: n = -127 makes the exponent field 0, so every x < -126.5 (-inf included) gives
// exactly 0 (ex2.approx.ftz flushes there too) and NaN stays NaN.  9 instructions
// (sm_90a: FMNMX.NAN, 3 FADD, 3 FFMA, LEA, FMUL), none on the MUFU pipe.
__device__ __forceinline__ float ac_exp2_poly(float x) {
  float xc;
  asm("max.NaN.f32 %0, %1, 0fC2FE0000;\n" : "=f"(xc) : "f"(x));  // max(x, -127), NaN-propagating
  const float t = xc + 12582912.f;                                 // rint(xc) in t's low mantissa bits
  const float f = xc - (t - 12582912.f);                           // in [-0.5, 0.5]
  float poly = fmaf(0.05517132f, f, 0.24261054f);
  poly = fmaf(poly, f, 0.69326097f);
  poly = fmaf(poly, f, 0.99992812f);
  // 2^n = (n + 127) << 23; the rounding constant's own bits shift out of the word (low 9 bits zero);
  // n = -127 wraps to the word 0: +0.0
  const float scale = __int_as_float((__float_as_int(t) << 23) + (127 << 23));
  return poly * scale;
}

// Cooperative async copy of a ROWS x COLS tile (COLS % 8 == 0) into padded shared memory
// (row stride SSTRIDE elements). Rows >= rows_valid are zero-filled.
template <int ROWS, int COLS, int SSTRIDE, int NTHREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, long long gstride, int rows_valid,
                                                int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  static_assert(COLS % 8 == 0, "tile width must be a multiple of 8 elements (16 bytes)");
  constexpr int kIters = (kChunks + NTHREADS - 1) / NTHREADS;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = tid + it * NTHREADS;
    if (kChunks % NTHREADS != 0 && c >= kChunks) break;
    const int r = c / kChunksPerRow;
    const int cc = c % kChunksPerRow;
    const bool valid = r < rows_valid;
    const T* src = valid ? gmem + r * gstride + cc * 8 : gmem;
    cp_async_16(smem + r * SSTRIDE + cc * 8, src, valid);
  }
}

// Cooperative async copy of a ROWS x COLS tile into padded shared memory at the shared-state-space
// byte address smem_addr (row stride SSTRIDE elements); rows >= rows_valid are zero-filled.
// Each thread owns one 16-byte column chunk and walks the rows with a constant step, so its
// addresses are one shared base plus immediates and one global pointer advanced by a fixed stride
// (the empty asm keeps the compiler from precomputing, and holding in registers, one 64-bit address
// per chunk across the caller's loop). FULL_BRANCH: full tiles (rows_valid >= ROWS) take a branch
// with no checks; false: one loop whose copies all carry the row check (`full ||` short-cuts it),
// half the copy code (decode's K/V ring). L2_HINT: the copies' L2 prefetch-size hint
// (cp_async_16_zfill; decode streams K/V with 256).
template <int ROWS, int COLS, int SSTRIDE, int NTHREADS, int L2_HINT = 0, bool FULL_BRANCH = true, typename T>
__device__ __forceinline__ void load_tile_rows_async(unsigned int smem_addr, const T* gmem, long long gstride,
                                                     int rows_valid, int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  static_assert(COLS % 8 == 0, "tile width must be a multiple of 8 elements (16 bytes)");
  if constexpr (NTHREADS % kChunksPerRow != 0) {
    // Threads do not divide a row evenly: the generic chunk walk.
    constexpr int kChunks = ROWS * kChunksPerRow;
    constexpr int kIters = (kChunks + NTHREADS - 1) / NTHREADS;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int c = tid + it * NTHREADS;
      if (kChunks % NTHREADS != 0 && c >= kChunks) break;
      const int r = c / kChunksPerRow;
      const int cc = c % kChunksPerRow;
      const bool valid = r < rows_valid;
      const T* src = valid ? gmem + r * gstride + cc * 8 : gmem;
      cp_async_16_zfill<L2_HINT>(smem_addr + (r * SSTRIDE + cc * 8) * 2, src, valid ? 16 : 0);
    }
  } else {
    constexpr int kRowStep = NTHREADS / kChunksPerRow;
    constexpr int kIters = (ROWS + kRowStep - 1) / kRowStep;
    const int r0 = tid / kChunksPerRow;
    const int cc = tid % kChunksPerRow;
    const unsigned int dst = smem_addr + (r0 * SSTRIDE + cc * 8) * 2;
    const T* src = gmem + r0 * gstride + cc * 8;
    const long long step = kRowStep * gstride;
    const bool full = rows_valid >= ROWS;
    if (FULL_BRANCH && full) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        if (ROWS % kRowStep != 0 && r0 + it * kRowStep >= ROWS) break;
        cp_async_16_all<L2_HINT>(dst + it * kRowStep * SSTRIDE * 2, src);
        src += step;
        asm("" : "+l"(src));
      }
    } else {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        if (ROWS % kRowStep != 0 && r0 + it * kRowStep >= ROWS) break;
        const bool valid = full || r0 + it * kRowStep < rows_valid;
        cp_async_16_zfill<L2_HINT>(dst + it * kRowStep * SSTRIDE * 2, valid ? src : gmem, valid ? 16 : 0);
        src += step;
        asm("" : "+l"(src));
      }
    }
  }
}

}  // namespace ac
