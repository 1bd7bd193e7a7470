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

// Clamp a buffer index into [0, n): a mod that indexes out of range reads the edge element.
AC_HOST_DEVICE __forceinline__ int ac_clamp(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

// Floor division and modulo with Python semantics (the tracer's // and %).
AC_HOST_DEVICE __forceinline__ int ac_floordiv(int a, int b) {
  int q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
AC_HOST_DEVICE __forceinline__ int ac_mod(int a, int b) {
  int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

template <typename T> struct ac_type_traits;
template <> struct ac_type_traits<__nv_bfloat16> {
  static __device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&v);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static constexpr bool kIsBf16 = true;
};
template <> struct ac_type_traits<__half> {
  static __device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&v);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static constexpr bool kIsBf16 = false;
};
