// attncompiler/bulk_copy.cuh -- sm_90+ bulk copies: non-tensor (cp.async.bulk, global -> shared) and
// tensor-map (cp.async.bulk.tensor) loads that complete on a shared-memory mbarrier, the mbarrier
// operations they need, and tensor-map stores (shared -> global) that complete in this thread's bulk
// groups (bulk_commit, bulk_wait_read_all, bulk_wait_all; also the backward's bulk reductions).
//
// Used by the decode split kernel's "bulk" K/V loader (decode.cuh): one warp issues one bulk copy
// per K row and per V row of a tile; every thread waits on the stage's mbarrier. Its "tma" loader
// issues tensor-map copies (cp.async.bulk.tensor) on the same barriers. Written from the
// PTX ISA (cp.async.bulk, mbarrier, fence.proxy.async; PTX ISA 8.0, sm_90). Every function is a
// template so that nothing here reaches the PTX of a translation unit that does not call it (the
// header is included by decode.cuh for every target, sm_80 included).
//
// Rules a caller must follow (PTX ISA):
//   * a bulk copy's global source and shared destination are 16-byte aligned and its size is a
//     positive multiple of 16 bytes;
//   * an mbarrier is 8 bytes, 8-byte aligned, in shared memory, initialized (bulk_mbar_init, one
//     thread) and made visible to the async proxy (bulk_mbar_init_fence) before any copy signals it;
//   * the phase a waiter names (parity 0, 1, 0, ...) is the one its copies complete: each stage's
//     barrier completes one phase per fill (one expect_tx arrival + the copies' bytes).
#pragma once

namespace ac {

// Barrier at the shared-state-space byte address `bar`, expecting `count` arrivals per phase.
template <int = 0>
__device__ __forceinline__ void bulk_mbar_init(unsigned int bar, unsigned int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// After the initializing thread's mbarrier.init: the async proxy (the bulk-copy unit) sees the
// initialized state before it completes bytes on the barrier.
template <int = 0>
__device__ __forceinline__ void bulk_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Orders this thread's earlier generic-proxy accesses of shared memory (and those ordered before it
// by a CTA barrier) before its later async-proxy operations on shared memory.
template <int = 0>
__device__ __forceinline__ void bulk_fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One arrival on `bar` that also raises the barrier's pending transaction count by `bytes`: the
// current phase then completes when the bulk copies naming this barrier have written those bytes.
template <int = 0>
__device__ __forceinline__ void bulk_mbar_arrive_expect_tx(unsigned int bar, unsigned int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Spin until the phase of `bar` with parity `parity` has completed (try_wait suspends the thread for
// a hardware-chosen time between polls). The copies' shared-memory writes are visible to this
// thread afterwards.
template <int = 0>
__device__ __forceinline__ void bulk_mbar_wait(unsigned int bar, unsigned int parity) {
  asm volatile(
      "{\n"
      "  .reg .pred p_done;\n"
      "BULK_WAIT_%=:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 p_done, [%0], %1;\n"
      "  @!p_done bra BULK_WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// `bytes` (multiple of 16) from global `src` to the shared-state-space byte address `dst` (both
// 16-byte aligned); the write completes `bytes` transactions on the barrier `bar`. The executing
// CTA's shared::cta addresses are valid shared::cluster addresses of itself (no cluster needed).
template <int = 0>
__device__ __forceinline__ void bulk_copy_g2s(unsigned int dst, const void* src, unsigned int bytes, unsigned int bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

// A 4-d box (c0 innermost) of the tensor map `desc` (a 128-byte CUtensorMap in param / const / global
// memory, 64-byte aligned) into shared memory at `dst` (aligned as the map's swizzle needs), completing
// the box's bytes on `bar`; elements outside the tensor are written as zeros and still counted.
template <class Desc>
__device__ __forceinline__ void bulk_tensor_g2s_4d(unsigned int dst, const Desc* desc, int c0, int c1, int c2, int c3,
                                                   unsigned int bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(desc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// A 4-d box of the tensor map `desc` from shared memory at `src` (laid out as a loaded box: aligned and
// swizzled as the map says) to global memory, in this thread's current bulk group (bulk_commit closes
// it). Box elements outside the tensor are not written. Before the call, the shared-memory writes of
// every thread that staged the box must be fenced to the async proxy (bulk_fence_proxy_async_smem, each
// writing thread) and ordered by a barrier before the issuing thread's copy.
template <class Desc>
__device__ __forceinline__ void bulk_tensor_s2g_4d(const Desc* desc, int c0, int c1, int c2, int c3, unsigned int src) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
          reinterpret_cast<unsigned long long>(desc)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}

// Bulk groups of this thread (per thread: the thread that issued the copies waits for them).
// Close the current group.
template <int = 0>
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Wait until every committed group has finished reading its shared-memory source (it may be rewritten).
template <int = 0>
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Wait until at most N of the committed groups have not yet read their shared memory (a ring of N + 1 buffers).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Wait until every committed group is complete (its global writes done).
template <int = 0>
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Fetch the tensor map `desc` into the descriptor cache ahead of its first copy.
template <class Desc>
__device__ __forceinline__ void bulk_prefetch_tensormap(const Desc* desc) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(desc)) : "memory");
}

}  // namespace ac
