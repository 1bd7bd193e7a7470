// attncompiler/common.cuh -- small helpers shared by every schedule.
//
// Included after the generated prelude, which defines:
//   ac_elem_t             __nv_bfloat16 or __half (the input/output element type)
//   struct AttnParams     run-time parameters (attncompiler/runtime/params.py)
//   struct AttnBuffers    captured buffers (pointers + dims)
//   struct Variant        score_mod / mask / tile_class hooks (attncompiler/codegen/hooks.py)
#pragma once

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#endif
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define AC_TILE_EMPTY 0
#define AC_TILE_PARTIAL 1
#define AC_TILE_FULL 2

#ifndef AC_HOST_DEVICE
#define AC_HOST_DEVICE __host__ __device__
#endif

#define AC_NEG_INF (-__int_as_float(0x7f800000))
#define AC_LOG2E 1.4426950408889634f
#define AC_LN2 0.6931471805599453f

// A CTA's batch (or packed sequence) and head, and their flattened index b * heads + h. Launches put the heads (query
// or K/V heads, as the kernel works) on the grid's y and the batch on its z, each at most 65535, so that B * H is not
// bound by one grid limit (runtime/launch.py checks both).
#ifdef __CUDACC__  // (device builtins; the host tests compile this header with g++)
__device__ __forceinline__ int ac_grid_b() { return (int)blockIdx.z; }
__device__ __forceinline__ int ac_grid_h() { return (int)blockIdx.y; }
__device__ __forceinline__ int ac_grid_bh() { return (int)(blockIdx.z * gridDim.y + blockIdx.y); }
#endif

// Clamp a buffer index into [0, n): a mod that indexes out of range reads the edge element.
AC_HOST_DEVICE __forceinline__ int ac_clamp(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

// A packed sequence's first row, clamped into the packed rows [0, total] (varlen.cuh's views and v3_rows.cuh's
// TMA rows: a CUDA graph replay may see any cu_seqlens, and no address may leave the packed tensors).
__device__ __forceinline__ int varlen_start(int start, int total) {
  const int s = start > 0 ? start : 0;  // max, then min (spelt out: the host tests compile this header)
  return s < total ? s : total;
}

// Floor division and modulo with Python semantics (the tracer's // and %).
AC_HOST_DEVICE __forceinline__ int ac_floordiv(int a, int b) {
  int q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
AC_HOST_DEVICE __forceinline__ int ac_mod(int a, int b) {
  int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

// Hook math of the printer's fast mode (attncompiler/codegen/cuda_printer.py, fast=True).
// int -> float for |i| < 2^22 on the FMA pipes: i added into the mantissa of 1.5 * 2^23, then the
// offset subtracted (exact); I2F would share the quarter-rate pipe with the softmax's exp2.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float ac_i2f(int i) { return __int_as_float(0x4B400000 + i) - 12582912.0f; }
// tanh in one MUFU op (tanh.approx.f32, max relative error ~2^-11).
__device__ __forceinline__ float ac_tanhf(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#else  // host builds of this header (the printer's g++ tests): the same values
#include <math.h>
inline float ac_i2f(int i) {
  const unsigned int u = 0x4B400000u + static_cast<unsigned int>(i);
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f - 12582912.0f;
}
inline float ac_tanhf(float x) { return tanhf(x); }
#endif

template <typename T> struct ac_type_traits;
template <> struct ac_type_traits<__nv_bfloat16> {
  static __device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&v);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
#ifdef __CUDACC__
  // lo, hi <- the two elements packed in w (lo in the low half), exactly, without taking w's address
  static __device__ __forceinline__ void unpack2(unsigned int w, float& lo, float& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  }
#endif
  // lo, hi <- their values rounded as pack2 rounds them
  static __device__ __forceinline__ void round2(float& lo, float& hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    lo = __bfloat162float(v.x);
    hi = __bfloat162float(v.y);
  }
  static constexpr bool kIsBf16 = true;
};
template <> struct ac_type_traits<__half> {
  static __device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&v);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
#ifdef __CUDACC__
  static __device__ __forceinline__ void unpack2(unsigned int w, float& lo, float& hi) {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
#endif
  static __device__ __forceinline__ void round2(float& lo, float& hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    lo = __half2float(v.x);
    hi = __half2float(v.y);
  }
  static constexpr bool kIsBf16 = false;
};
