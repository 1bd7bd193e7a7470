// attncompiler/philox.cuh -- Philox4x32-10 and the dropout keep rule (docs/architecture.md,
// "Dropout RNG"); bit-identical to attncompiler/philox.py.
//
// Needs, from the including translation unit: AC_HOST_DEVICE (common.cuh) and struct AttnParams
// with fields seed (unsigned long long), offset (unsigned long long), rng_state (const unsigned
// long long*), H (int) and dropout_threshold (unsigned int).  No standard headers (NVRTC).
//
// AC_DROPOUT_RNG_ON_DEVICE (defined ahead of the translation unit by runtime/rng.py): the key and
// counter offset come from the device pair rng_state[0], rng_state[1] instead.  A launch captured
// in a CUDA graph keeps its parameters, and the graph's own random-number kernel refills that pair
// on every replay, so each replay drops a fresh mask.  A compile-time switch, not a test of
// rng_state per call: with the branch, the key stopped being a uniform value and every Philox
// call recomputed its round keys per thread (dropout forwards 17-25 % slower, H200, 2026-11-30).
//
// Counter of element (b, h, q, k):
//   c0 = q & ~8   c1 = k >> 1   c2 = b * H + h   c3 = offset & 0xffffffff
//   key = (seed & 0xffffffff, seed >> 32)
//   word(q, k) = philox(c, key)[((q >> 3) & 1) * 2 + (k & 1)]    -> .x .y .z .w
//   keep = word < dropout_threshold
// One call serves (q, k), (q, k^1), (q^8, k), (q^8, k^1): the four accumulator values one thread
// holds in an m16n8 mma tile (rows r and r+8, columns c and c+1 with c even).
#pragma once

#ifndef AC_HOST_DEVICE
#define AC_HOST_DEVICE __host__ __device__
#endif

struct ac_u32x4 {
  unsigned int x, y, z, w;
};

#define AC_PHILOX_M0 0xD2511F53u
#define AC_PHILOX_M1 0xCD9E8D57u
#define AC_PHILOX_W0 0x9E3779B9u
#define AC_PHILOX_W1 0xBB67AE85u

// hi/lo 32-bit halves of the 64-bit product a * b.
AC_HOST_DEVICE __forceinline__ void ac_mulhilo32(unsigned int a, unsigned int b, unsigned int& hi,
                                                 unsigned int& lo) {
#ifdef __CUDA_ARCH__
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const unsigned long long prod = static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b);
  lo = static_cast<unsigned int>(prod);
  hi = static_cast<unsigned int>(prod >> 32);
#endif
}

AC_HOST_DEVICE __forceinline__ ac_u32x4 ac_philox4x32_round(ac_u32x4 c, unsigned int k0, unsigned int k1) {
  unsigned int hi0, lo0, hi1, lo1;
  ac_mulhilo32(AC_PHILOX_M0, c.x, hi0, lo0);
  ac_mulhilo32(AC_PHILOX_M1, c.z, hi1, lo1);
  ac_u32x4 r;
  r.x = hi1 ^ c.y ^ k0;
  r.y = lo1;
  r.z = hi0 ^ c.w ^ k1;
  r.w = lo0;
  return r;
}

// Philox4x32-10 (Salmon et al. 2011): ten rounds, the key bumped by (W0, W1) between rounds.
AC_HOST_DEVICE __forceinline__ ac_u32x4 ac_philox4x32_10(ac_u32x4 ctr, unsigned int key0, unsigned int key1) {
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key0 += AC_PHILOX_W0;
      key1 += AC_PHILOX_W1;
    }
    ctr = ac_philox4x32_round(ctr, key0, key1);
  }
  return ctr;
}

#ifdef AC_DROPOUT_RNG_ON_DEVICE
// A 32-bit word of the device pair, the same for every lane: the OR over the active lanes (REDUX,
// sm_80+) returns it in a uniform register, as a by-value field is, so that the Philox key schedule
// stays on the uniform datapath (measured: within 1-4 % of the by-value key).
__device__ __forceinline__ unsigned int ac_rng_word(unsigned long long w, int shift) {
#ifdef __CUDA_ARCH__
  return __reduce_or_sync(__activemask(), static_cast<unsigned int>(w >> shift));
#else
  return static_cast<unsigned int>(w >> shift);
#endif
}

__device__ __forceinline__ unsigned long long ac_rng_load(const unsigned long long* w) {
#ifdef __CUDA_ARCH__
  return __ldg(w);  // read-only while the kernel runs: the non-coherent cache
#else
  return *w;
#endif
}
#endif

// The four Philox words of the counter that element (b, h, q, k) belongs to (shared by (q, k),
// (q, k^1), (q^8, k), (q^8, k^1)); pick the element's word with ac_dropout_select.
__device__ __forceinline__ ac_u32x4 ac_dropout_words(const AttnParams& p, int b, int h, int q, int k) {
  ac_u32x4 c;
  c.x = static_cast<unsigned int>(q) & ~8u;
  c.y = static_cast<unsigned int>(k) >> 1;
  c.z = static_cast<unsigned int>(b) * static_cast<unsigned int>(p.H) + static_cast<unsigned int>(h);
#ifdef AC_DROPOUT_RNG_ON_DEVICE
  const unsigned long long seed = ac_rng_load(p.rng_state);
  c.w = ac_rng_word(ac_rng_load(p.rng_state + 1), 0);
  return ac_philox4x32_10(c, ac_rng_word(seed, 0), ac_rng_word(seed, 32));
#else
  c.w = static_cast<unsigned int>(p.offset & 0xffffffffull);
  return ac_philox4x32_10(c, static_cast<unsigned int>(p.seed & 0xffffffffull),
                          static_cast<unsigned int>(p.seed >> 32));
#endif
}

// The word of element (q, k) among the four words of its counter: index ((q >> 3) & 1) * 2 + (k & 1).
AC_HOST_DEVICE __forceinline__ unsigned int ac_dropout_select(const ac_u32x4& w, int q, int k) {
  const bool upper = (q >> 3) & 1;
  const bool odd = k & 1;
  return upper ? (odd ? w.w : w.z) : (odd ? w.y : w.x);
}

// true = element (b, h, q, k) survives dropout.
__device__ __forceinline__ bool ac_dropout_keep(const AttnParams& p, int b, int h, int q, int k) {
  return ac_dropout_select(ac_dropout_words(p, b, h, q, k), q, k) < p.dropout_threshold;
}
