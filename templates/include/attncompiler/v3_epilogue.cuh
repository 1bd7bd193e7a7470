// attncompiler/v3_epilogue.cuh -- a v3 forward consumer warpgroup's own rows of the Q tile on the way in
// (v3_scale_q: Q pre-scaled for a score_mod G(c * s), Cfg::Q_PRESCALE) and of O on the way out (v3_epilogue:
// O / l and the LSE, staged through the Q tile's shared memory; v3_epilogue_tma: the persistent grid's,
// staged in an O tile of its own and written by TMA stores, Cfg::TMA_STORE_O; with Cfg::Q_PREFETCH staged in the
// buffer of the tile's Q, v3_epilogue_handoff, and written by producer warp 1, v3_store_warp), and the named barriers
// they share with the ping-pong. v3_fwd.cuh drives them and documents the shared-memory layout.
//
// Requires (from the prelude and the TU): ac_elem_t, AttnParams, AttnBuffers, Variant; v3_consumer.cuh
// (V3Layout, V3Consumer), v3_sm90.cuh (named_bar_sync; it includes bulk_copy.cuh: the TMA stores and bulk
// groups), v3_trace.cuh (AC_TRACE); v3_rows.cuh (v3_tile, V3Rows).
#pragma once

namespace ac {

// The named barriers of the ping-pong: warpgroup w waits on kTurnBar + w for its turn to issue;
// kEpilogueBar + w: warpgroup w's staged O is in shared memory, or its scaled Q rows (Q_PRESCALE) are
// (w < 3 consumers; ids 1..6 of 16).
constexpr int kTurnBar = 1;
constexpr int kEpilogueBar = 4;

// Q_PRESCALE (plan/qscale.py): the score_mod's inner term is G(c * s) with c per (batch, head), so
// c * (q . k) = (c q) . k. Warpgroup wg multiplies its own 64 rows of the Q tile (every 64-column box;
// the swizzle only permutes 16-byte chunks within a row, so the chunks are scaled wherever they lie) by c
// in fp32 and rounds back to bf16 (satfinite: never inf), then makes the generic-proxy writes visible to
// its wgmmas (async proxy) and syncs the warpgroup: its S GEMMs read all 64 rows. Once per tile, after
// the Q barrier (the persistent grid reloads Q for every tile).
template <class Cfg>
__device__ __forceinline__ void v3_scale_q(unsigned int sQ, int wg, float c) {
  using L = V3Layout<Cfg>;
  static_assert(ac_type_traits<ac_elem_t>::kIsBf16, "Q_PRESCALE is bf16 only (c * q would be fp16 subnormals)");
  static_assert(Variant::kHasScoreMod && Variant::kScoreQScale && !Variant::kScoreSeparable,
                "Q_PRESCALE needs a score_mod of the form G(c * score)");
  constexpr int kChunks = 64 * 128 / 16;  // 16-byte chunks of one box's 64 rows
  static_assert(kChunks % 128 == 0, "whole chunks per thread");
  const int tid = threadIdx.x & 127;
#pragma unroll
  for (int box = 0; box < L::DB; ++box) {
#pragma unroll
    for (int it = 0; it < kChunks / 128; ++it) {
      const unsigned int addr = sQ + box * L::BM * 128 + wg * 64 * 128 + (tid + 128 * it) * 16;
      unsigned int w[4];
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(addr));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lo = __uint_as_float(w[e] << 16) * c, hi = __uint_as_float(w[e] & 0xffff0000u) * c;
        asm("cvt.rn.satfinite.bf16x2.f32 %0, %1, %2;" : "=r"(w[e]) : "f"(hi), "f"(lo));
      }
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  named_bar_sync(kEpilogueBar + wg, 128);
}

// The row statistics' end: 1/l of this thread's two rows (0 for a row with no visible key) in inv, and the
// LSE of its rows < Nq to p.lse (when asked for).
template <class Cfg>
__device__ __forceinline__ void v3_row_finish(V3Consumer<Cfg>& st, const AttnParams& p, const AttnBuffers& buf,
                                              int row0, int b, int h, int bh, float (&inv)[2]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = st.row_sum[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // a row with no visible key has l = 0 (exp2(-inf) is 0 on MUFU and in ac_exp2_poly) and, without a
    // fixed offset, m = -inf
    const bool seen = l > 0.f && st.row_max[hf] != AC_NEG_INF;
    inv[hf] = seen ? 1.f / l : 0.f;
    const int r = row0 + g + 8 * hf;
    if (p.lse != nullptr && t == 0 && r < p.Nq) {
      float m = st.row_max[hf];
      if constexpr (Variant::kHasScoreMod && Variant::kScoreSeparable) {
        m += Variant::score_sep_row(b, h, r, row0, p, buf);  // the row term the softmax dropped
      }
      p.lse[(long long)bh * p.Nq + r] = seen ? (m + __log2f(l)) * AC_LN2 : AC_NEG_INF;
    }
  }
}

// This thread's fragments of O / l, as 16-bit pairs, into the warpgroup's 64 rows of a staging tile in
// the layout of a loaded TMA box: box c (64 columns) at sO + c * BM * 128, row r at r * 128, its 16-byte
// chunk k at k ^ (r & 7) (the 128-byte swizzle; sO is 1024-byte aligned), so the 4-byte stores of a warp
// hit 32 distinct banks.
template <class Cfg>
__device__ __forceinline__ void v3_stage_o(V3Consumer<Cfg>& st, unsigned int sO, const float (&inv)[2]) {
  using L = V3Layout<Cfg>;
  using Tr = ac_type_traits<ac_elem_t>;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = 16 * ((threadIdx.x >> 5) & 3) + g + 8 * hf;  // row within the warpgroup's 64
#pragma unroll
    for (int nt = 0; nt < L::NO / 4; ++nt) {
      const unsigned int addr = sO + (nt / 8) * L::BM * 128 + r * 128 + (((nt % 8) ^ (r & 7)) << 4) + 4 * t;
      const unsigned int v = Tr::pack2(st.acc_o[4 * nt + 2 * hf] * inv[hf], st.acc_o[4 * nt + 2 * hf + 1] * inv[hf]);
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
    }
  }
}

// The epilogue of one consumer warpgroup: O / l to global memory, and the LSE.
// Staged (non-persistent kernels with DV <= D and 16-byte aligned output rows): the warpgroup's
// fragments go to its own 64 rows of the Q tile -- free once its last S GEMM is done, and never
// reloaded without PERSISTENT -- in Q's layout (v3_stage_o), then each thread copies 16-byte chunks,
// consecutive threads along a row, to global memory. A warp store then covers 512 contiguous bytes
// instead of 8 rows x 16 bytes: 4 cache lines instead of 8 per instruction, at an eighth of the store
// instructions (benchmarks/v3_trace.py measured the direct stores at 1.5 us per tile on the H100).
// The persistent grid stages through its own O tile instead: v3_epilogue_tma (Cfg::TMA_STORE_O).
template <class Cfg>
__device__ __forceinline__ void v3_epilogue(V3Consumer<Cfg>& st, const AttnParams& p, const AttnBuffers& buf,
                                            unsigned int sQ, int wg, int row0, int wq_lo, int b, int h, int bh,
                                            int trace_tile) {
  using L = V3Layout<Cfg>;
  using Tr = ac_type_traits<ac_elem_t>;
  constexpr int NO = L::NO;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  ac_elem_t* gO = reinterpret_cast<ac_elem_t*>(p.o) + b * p.o_sb + h * p.o_sh;
  float inv[2];
  v3_row_finish<Cfg>(st, p, buf, row0, b, h, bh, inv);
  AC_TRACE(trace_tile, kTraceEpiScale, threadIdx.x == 128);
  constexpr bool kCanStage = !Cfg::PERSISTENT && L::DVB <= L::DB;  // O's boxes fit in Q's
  const bool staged = kCanStage && ((reinterpret_cast<unsigned long long>(gO) | (unsigned long long)(p.o_sn * 2)) & 15) == 0;
  if (staged) {
    // this warpgroup's rows of the Q tile: box c at sQ + c * BM * 128, its row r at (64 wg + r) * 128
    const unsigned int sO = sQ + wg * 64 * 128;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // wgmma (async proxy) read Q here
    v3_stage_o<Cfg>(st, sO, inv);
    AC_TRACE(trace_tile, kTraceEpiSts, threadIdx.x == 128);
    named_bar_sync(kEpilogueBar + wg, 128);
    AC_TRACE(trace_tile, kTraceEpiBar, threadIdx.x == 128);
    constexpr int kChunksPerRow = L::DV / 8;  // 16-byte chunks
    constexpr int kIters = 64 * kChunksPerRow / 128;
    static_assert((64 * kChunksPerRow) % 128 == 0, "whole 16-byte chunks per thread");
    const int tid = threadIdx.x & 127;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int id = tid + 128 * it;
      const int r = id / kChunksPerRow, ch = id % kChunksPerRow;
      const unsigned int addr = sO + (ch / 8) * L::BM * 128 + r * 128 + (((ch % 8) ^ (r & 7)) << 4);
      unsigned int x, y, z, w;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"(addr) : "memory");
#ifdef AC_V3_NO_O_STORE  // timing-only (benchmarks): the bound of an epilogue whose stores cost nothing
      if (wq_lo + r < 0) {
#else
      if (wq_lo + r < p.Nq) {
#endif
        uint4* dst = reinterpret_cast<uint4*>(gO + (long long)(wq_lo + r) * p.o_sn + ch * 8);
        *dst = make_uint4(x, y, z, w);
      }
    }
  } else {
    // direct: this thread's fragments as 4-byte stores (8 rows x 16 bytes per warp instruction)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = row0 + g + 8 * hf;
#ifdef AC_V3_NO_O_STORE
      if (r < 0) {
#else
      if (r < p.Nq) {
#endif
        ac_elem_t* orow = gO + (long long)r * p.o_sn;
#pragma unroll
        for (int nt = 0; nt < NO / 4; ++nt) {
          *reinterpret_cast<unsigned int*>(orow + nt * 8 + 2 * t) =
              Tr::pack2(st.acc_o[4 * nt + 2 * hf] * inv[hf], st.acc_o[4 * nt + 2 * hf + 1] * inv[hf]);
        }
      }
    }
  }
}

// The persistent grid's epilogue with Cfg::TMA_STORE_O: the warpgroup stages O / l in its 64 rows of the
// O tile (sOt: V3Layout::kOOffset, its own buffer, so the next tile's Q can land meanwhile) and its first
// thread writes them with one TMA store per 64-column box of the o map (omap: boxes of 64 x 64; rows >= Nq
// and columns >= DV lie outside the tensor, and the copy engine drops them). The stores run on while the
// warpgroup starts its next tile. Before the staging rewrites the rows, the same thread waits until the
// previous tile's stores have read them (bulk groups are per thread), and the warpgroup's barrier passes
// that on; the kernel's end waits for completion (v3_fwd). Order of one tile:
//   LSE, 1/l | leader: wait reads | barrier | stage O / l, fence to the async proxy | barrier | leader: stores
template <class Cfg, class Desc>
__device__ __forceinline__ void v3_epilogue_tma(V3Consumer<Cfg>& st, const AttnParams& p, const AttnBuffers& buf,
                                                unsigned int sOt, const Desc* omap, int wg, int row0, int wq_lo,
                                                int b, int h, int bh, int trace_tile) {
  using L = V3Layout<Cfg>;
  static_assert(Cfg::TMA_STORE_O && L::kOBytes == L::BM * L::DVB * 128, "the O tile");
  float inv[2];
  v3_row_finish<Cfg>(st, p, buf, row0, b, h, bh, inv);
  AC_TRACE(trace_tile, kTraceEpiScale, threadIdx.x == 128);
  const bool leader = (threadIdx.x & 127) == 0;
  if (leader) bulk_wait_read_all();  // the previous tile's stores have read these rows
  named_bar_sync(kEpilogueBar + wg, 128);
  const unsigned int sO = sOt + wg * 64 * 128;  // 1024-byte aligned: the swizzle's rows are the box's
  v3_stage_o<Cfg>(st, sO, inv);
  bulk_fence_proxy_async_smem();  // each thread's st.shared before the copy engine's reads
  AC_TRACE(trace_tile, kTraceEpiSts, threadIdx.x == 128);
  named_bar_sync(kEpilogueBar + wg, 128);
  AC_TRACE(trace_tile, kTraceEpiBar, threadIdx.x == 128);
#ifndef AC_V3_NO_O_STORE
  if (leader && wq_lo < p.Nq) {
#pragma unroll
    for (int c = 0; c < L::DVB; ++c) bulk_tensor_s2g_4d(omap, c * 64, wq_lo, h, b, sO + c * L::BM * 128);
    bulk_commit();
  }
#endif
}

// Cfg::Q_PREFETCH: where the CTA's tile number it has its Q (and then its staged O): buffer it & 1, the Q tile or the
// O tile, its copy landing on barQ or on barQ1 (in phase (it >> 1) & 1), its staging announced on oStaged0 + 8 (it & 1).
// Without the option: the Q tile and barQ, phase it & 1. Shared by the consumers and v3_store_warp.
template <bool kQPrefetch>
struct V3QBuffers {
  unsigned int sQ, sOt, barQ, barQ1, oStaged0;
  __device__ __forceinline__ unsigned int buf(int it) const { return (kQPrefetch && (it & 1)) ? sOt : sQ; }
  __device__ __forceinline__ unsigned int bar(int it) const { return (kQPrefetch && (it & 1)) ? barQ1 : barQ; }
  __device__ __forceinline__ unsigned int parity(int it) const { return kQPrefetch ? ((it >> 1) & 1) : (it & 1); }
  __device__ __forceinline__ unsigned int staged(int it) const { return oStaged0 + 8u * (it & 1); }
};

// Cfg::Q_PREFETCH, producer warp 1 (one thread): the O stores and the Q copies from the CTA's second tile on. Tile
// number it has its Q in qb.buf(it), landed on qb.bar(it); its consumers stage O there and arrive on qb.staged(it);
// this thread then stores each warpgroup's 64 rows (those below Nq; the copy engine drops rows
// past the tensor) and, once the stores have read the buffer, loads the Q of tile number it + 2 into it. One barrier
// per buffer: a consumer can be at most one arrival ahead on either, since tile it + 2 needs its Q from here.
template <class Cfg, bool kPersistent, bool kTileByHead, class Maps>
__device__ __forceinline__ void v3_store_warp(const AttnParams& p, const Maps& maps, const V3QBuffers<true>& qb,
                                              int tile0, int tile_step, int num_tiles, int num_qb,
                                              const int* tile_list) {
  using L = V3Layout<Cfg>;
  constexpr int BM = L::BM, NC = L::NC;
  auto buf_of = [&](int it) { return qb.buf(it); };
  auto bar_of = [&](int it) { return qb.bar(it); };
  auto load_q_into = [&](int it, int tile) {
    int q_block, bh;
    v3_tile<kPersistent, kTileByHead, Cfg::TILE_LIST>(tile, num_qb, p, q_block, bh, tile_list);
    const int b = bh / p.H, h = bh % p.H;
    const V3Rows<Cfg> rows(p, b);
    mbar_arrive_expect_tx(bar_of(it), L::kQBytes);
#pragma unroll
    for (int c = 0; c < L::DB; ++c)
      tma_load_4d(buf_of(it) + c * BM * 128, &maps.q, c * 64, rows.q_start + q_block * BM, h, rows.batch, bar_of(it));
  };
  if (tile0 + tile_step < num_tiles) load_q_into(1, tile0 + tile_step);
  int it = 0;
  for (int tile = tile0; tile < num_tiles; tile += tile_step, ++it) {
    int q_block, bh;
    v3_tile<kPersistent, kTileByHead, Cfg::TILE_LIST>(tile, num_qb, p, q_block, bh, tile_list);
    const int b = bh / p.H, h = bh % p.H;
#ifdef AC_V3_STORE_WARP_SLEEP  // timing only: poll the barrier with a 256 ns back-off (does the poll take issue slots?)
    for (unsigned int done = 0;;) {
      asm volatile("{\n.reg .pred d;\nmbarrier.test_wait.parity.shared::cta.b64 d, [%1], %2;\nselp.u32 %0, 1, 0, d;\n}"
                   : "=r"(done) : "r"(qb.staged(it)), "r"(qb.parity(it)) : "memory");
      if (done) break;
      __nanosleep(256);
    }
#elif defined(AC_V3_STORE_WARP_HINT)  // timing only: try_wait with a suspend-time hint (sleep until the phase)
    asm volatile("{\n.reg .pred d;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1, 1000000;\n"
                 "@!d bra WAIT_%=;\n}" ::"r"(qb.staged(it)), "r"(qb.parity(it)) : "memory");
#else
    mbar_wait(qb.staged(it), qb.parity(it));  // every consumer thread staged its rows of O / l
#endif
#ifndef AC_V3_NO_O_STORE
#pragma unroll
    for (int w = 0; w < NC; ++w) {
      const int wq_lo = q_block * BM + 64 * w;
      if (wq_lo < p.Nq) {
#pragma unroll
        for (int c = 0; c < L::DVB; ++c)
          bulk_tensor_s2g_4d(&maps.o, c * 64, wq_lo, h, b, buf_of(it) + c * BM * 128 + w * 64 * 128);
      }
    }
    bulk_commit();
#endif
    if (tile + 2 * tile_step < num_tiles) {
      bulk_wait_read_all();  // the stores have read the buffer
      load_q_into(it, tile + 2 * tile_step);
    }
  }
  bulk_wait_all();
}

// Cfg::Q_PREFETCH: the warpgroup stages O / l (inv: 1/l of this thread's rows, taken with the LSE by v3_row_finish
// while the tile's last P V ran) in its 64 rows of the buffer that held the tile's Q (sBuf: its own S GEMMs are
// done; the fence orders their async-proxy reads before these writes), makes the writes visible to the async proxy
// and arrives on the tile's o_staged mbarrier (release); producer warp 1 waits on it and issues the TMA stores
// (v3_fwd), so no consumer thread waits for a store.
template <class Cfg>
__device__ __forceinline__ void v3_epilogue_handoff(V3Consumer<Cfg>& st, const float (&inv)[2], unsigned int sBuf,
                                                    unsigned int o_staged, int wg, int trace_tile) {
  using L = V3Layout<Cfg>;
  static_assert(Cfg::Q_PREFETCH && L::kOBytes == L::kQBytes, "the Q tile's buffer holds the O tile");
  AC_TRACE(trace_tile, kTraceEpiScale, threadIdx.x == 128);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  v3_stage_o<Cfg>(st, sBuf + wg * 64 * 128, inv);
  bulk_fence_proxy_async_smem();  // each thread's st.shared before the copy engine's reads
  AC_TRACE(trace_tile, kTraceEpiSts, threadIdx.x == 128);
  mbar_arrive(o_staged);
}

}  // namespace ac
