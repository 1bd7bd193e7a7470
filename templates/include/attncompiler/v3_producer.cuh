// attncompiler/v3_producer.cuh -- the v3 forward's load warp (producer warp 0, one thread): the TMA copies of Q and
// of every visited K/V block into the ring of STAGES shared-memory stages, in the order the consumers use them, over
// every tile of the CTA (v3_load_warp). The store warp of Cfg::Q_PREFETCH is v3_epilogue.cuh's v3_store_warp.
// v3_fwd.cuh drives it and documents the shared-memory layout and the mbarriers (V3Bars).
//
// Requires (from the prelude and the TU): AttnParams, AttnBuffers, Variant; v3_consumer.cuh (V3Layout, V3Bars,
// v3_skip_begin), v3_sm90.cuh (mbarriers, TMA), ranges.cuh (KvWalk, kv_block_range), v3_rows.cuh (v3_tile,
// V3Rows), v3_trace.cuh.
#pragma once

namespace ac {

// Ring state runs on across tiles: block number i (over the CTA's lifetime) takes slot i % STAGES of the K and the V
// ring; a slot is refilled once every consumer thread released it. Without Q_PREFETCH a tile's Q (after the first
// tile's, which thread 0 issued at the start) goes out after its K_0, once the previous tile's S GEMMs freed the Q
// tile; with it, the store warp loads every Q from the second tile's on.
template <class Cfg, bool kPersistent, bool kTileByHead, class Maps>
__device__ __forceinline__ void v3_load_warp(const AttnParams& p, const AttnBuffers& buf, const Maps& maps,
                                             unsigned int sQ, unsigned int sKV0, const V3Bars<Cfg::STAGES>& bars,
                                             unsigned int sTileWord, int tile0, int tile_step, int num_tiles,
                                             int num_qb, const int* tile_list) {
  using L = V3Layout<Cfg>;
  constexpr int BM = L::BM, BN = L::BN, STAGES = L::STAGES;
  constexpr bool kQPrefetch = Cfg::Q_PREFETCH;
  const unsigned int barQ = bars.q(), barQfree = bars.q_free();
  auto full_k = [&](int s) { return bars.full_k(s); };
  auto full_v = [&](int s) { return bars.full_v(s); };
  auto empty_k = [&](int s) { return bars.empty_k(s); };
  auto empty_v = [&](int s) { return bars.empty_v(s); };
  tma_prefetch_desc(&maps.q);
  tma_prefetch_desc(&maps.k);
  tma_prefetch_desc(&maps.v);
  int s = 0, i = 0;
  unsigned int phase = 0;
  auto load_v = [&](int jv, const V3Rows<Cfg>& rows, int h_kv, int sv, unsigned int ph, int iv) {
    if (iv >= STAGES) mbar_wait(empty_v(sv), ph ^ 1u);
    const unsigned int sV = sKV0 + sv * L::kStageBytes + L::kKBytes;
    mbar_arrive_expect_tx(full_v(sv), L::kVBytes);
#pragma unroll
    for (int c = 0; c < L::DVB; ++c)
      tma_load_4d(sV + c * BN * 128, &maps.v, c * 64, rows.k_start + jv * BN, h_kv, rows.batch, full_v(sv));
  };
  int it = 0;
  for (int tile = tile0; tile < num_tiles; tile += tile_step, ++it) {
    int q_block, bh;
    v3_tile<kPersistent, kTileByHead, Cfg::TILE_LIST>(tile, num_qb, p, q_block, bh, tile_list);
    const int b = bh / p.H, h = bh % p.H, h_kv = h / (p.H / p.H_kv);
    const V3Rows<Cfg> rows(p, b);
    const int q0 = q_block * BM, q_hi = min(q0 + BM, p.Nq) - 1;
    KvWalk<BN, Cfg::KV_DESCENDING> walk;
    kv_block_range<BN>(b, h, q0, q_hi, p, buf, walk.j_begin, walk.j_end);
    const int j_first = walk.first(b, h, q0, q_hi, p, buf);
    // The first tile's Q went out at the start (thread 0 above); a later tile's Q goes after its
    // K_0 (which only needs a ring slot), so that K_0 is in flight while the previous tile's last
    // S GEMMs finish and free Q.
    auto load_q = [&]() {
      mbar_wait(barQfree, (it - 1) & 1);  // the previous tile's S GEMMs are done
#ifdef AC_V3_Q_ONCE  // timing only (wrong results): every tile reuses the first tile's Q, no reload
      if constexpr (!Cfg::SCORE_SKIP) {
        mbar_arrive(barQ);
        return;
      }
#endif
      if constexpr (Cfg::SCORE_SKIP) {
        mbar_expect_tx(barQ, L::kQBytes);  // arrival: publish_walk
      } else {
        mbar_arrive_expect_tx(barQ, L::kQBytes);
      }
#pragma unroll
      for (int c = 0; c < L::DB; ++c)
        tma_load_4d(sQ + c * BM * 128, &maps.q, c * 64, rows.q_start + q0, h, rows.batch, barQ);
    };
    // SCORE_SKIP: the walk's first block (v3_skip_begin; its global load runs while the first
    // copies fly) goes to the tile word, and this thread's arrival on barQ releases it with Q, so
    // the consumers walk exactly the blocks copied here. The first block never moves.
    auto publish_walk = [&]() {
      if constexpr (Cfg::SCORE_SKIP) {
        walk.j_begin = v3_skip_begin<Cfg>(b, h, q0, q_hi, p, buf, walk.j_begin, walk.j_end);
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(sTileWord), "r"(walk.j_begin) : "memory");
        mbar_arrive(barQ);
      }
    };
    // Copies in the order the consumers use them: K_0, then K_i before V_{i-1} (iteration i
    // issues S_i = Q K_i^T before O += P_{i-1} V_{i-1}), then the last V.
    int s_prev = 0, j_prev = -1;
    unsigned int phase_prev = 0;
    if (!walk.valid(j_first)) {
      if (!kQPrefetch && it > 0) load_q();
      publish_walk();
    }
    for (int j = j_first; walk.valid(j); j = walk.next(j, b, h, q0, q_hi, p, buf), ++i) {
      if (i >= STAGES) mbar_wait(empty_k(s), phase ^ 1u);
      const unsigned int sK = sKV0 + s * L::kStageBytes;
      mbar_arrive_expect_tx(full_k(s), L::kKBytes);
#pragma unroll
      for (int c = 0; c < L::DB; ++c)
        tma_load_4d(sK + c * BN * 128, &maps.k, c * 64, rows.k_start + j * BN, h_kv, rows.batch, full_k(s));
      if (j == j_first) {
        if (!kQPrefetch && it > 0) load_q();
        publish_walk();
      }
      AC_TRACE(v3_trace_tile<kPersistent>(tile), kTraceIssue, j == j_first);
      if (j_prev >= 0) load_v(j_prev, rows, h_kv, s_prev, phase_prev, i - 1);
      j_prev = j;
      s_prev = s;
      phase_prev = phase;
      ring_advance<STAGES>(s, phase);
    }
    if (j_prev >= 0) load_v(j_prev, rows, h_kv, s_prev, phase_prev, i - 1);
  }
}

}  // namespace ac
