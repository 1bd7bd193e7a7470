// attncompiler/v3_fwd.cuh -- FlashAttention-3 style forward (sm_90a): TMA + wgmma + warp specialization.
//
// Grid (num_q_blocks, H, B), or with PERSISTENT one CTA per SM looping over (query block, batch*head)
// tiles (heaviest first, round robin; the K/V ring and the ping-pong run on across tiles, Q is
// reloaded once the consumers' S GEMMs of the previous tile are done). A CTA of (1 + NC) warpgroups
// owns BLOCK_M = 64*NC query rows of one (batch, head) at a time:
//   * warpgroup 0, the producer, gives registers back (setmaxnreg.dec); one thread (v3_producer.cuh v3_load_warp)
//     issues the TMA copies: the Q tile once, then K_j and V_j of every visited K/V block into a ring of STAGES
//     shared-memory stages. Each stage has two "full" mbarriers (K, V: the copies complete their
//     bytes on them) and two "empty" ones (every consumer thread arrives once its Q K^T, resp. its
//     P V, of the stage is done), so K slots free up a whole softmax earlier than V slots.
//   * warpgroups 1..NC, the consumers (setmaxnreg.inc), each own 64 query rows; S = Q K^T and
//     O += P V run on wgmma with the accumulators in registers (S: BLOCK_N/2, O: DV/2 floats per
//     thread) and P fed to the second GEMM from registers.
// Consumer loop (per warpgroup), for visited block i (K/V stage s_i):
//     wait K_i;  [turn]  issue S_i = Q K_i^T;  wait V_{i-1};  issue O += P_{i-1} V_{i-1};  [grant]
//     wgmma.wait 1 (S_i done) -> score_mod, mask, online softmax of S_i in fp32 (exp2, scale folded)
//     wgmma.wait 0 (PV done)  -> release stage s_{i-1}; O *= alpha_i; P_i = bf16(exp(S_i - m_i))
// so the softmax of block i overlaps the P V GEMM of block i-1 inside a warpgroup (in a kernel with one
// softmax copy ptxas hoists the wait 0 above the softmax unless LATE_PV_WAIT branches right after it), and with two or
// three consumers the [turn]/[grant] named barriers (ping-pong, round robin) make the warpgroups
// issue their GEMMs in turn: one warpgroup's softmax runs while another's GEMMs occupy the tensor cores.
// Visited blocks: those meeting Variant::kv_range of the CTA's rows, minus the ones tile_class
// proves EMPTY; a block is run through the masked softmax only when the warpgroup's rows make it
// PARTIAL or it is the ragged last block (TMA zero-fills rows >= Nk; their scores are masked).
// With a mask and BLOCK_N < BLOCK_M (kWgWalk), each consumer warpgroup multiplies only the blocks that
// meet the K/V range of its own 64 rows (a contiguous run of the CTA's walk); for the others it waits
// for the stage to land, releases it, and takes its turn without issuing (skip_block), so the ping-pong's
// turns and the ring's arrivals stay the same for every warpgroup.
//
// Shared memory (from a 1024-byte aligned base; 128-byte swizzle, so every tile is made of
// 64-column boxes of rows x 128 bytes, 8-row / 1024-byte swizzle atoms):
//   Q: ceil(D/64) boxes of BLOCK_M rows | per stage: K (ceil(D/64) boxes of BLOCK_N rows), V (ceil(DV/64)
//   boxes) | (a head dim that is not a multiple of 64 leaves its last box's upper columns zero-filled)
//   | TMA_STORE_O (persistent only): the O tile, ceil(DV/64) boxes of BLOCK_M rows, each consumer warpgroup's
//   64 rows staged by it for its TMA stores (v3_epilogue_tma) |
//   mbarriers: Q, fullK[STAGES], fullV[STAGES], emptyK[STAGES], emptyV[STAGES], Q free (Q_PREFETCH: the Q of buffer 1
//   landed) [, Q_PREFETCH: O staged in buffer 0, in buffer 1] | the tile word.
// wgmma operands: Q and K are K-major (the head dim is contiguous; descriptor SBO = 1024 between
// 8-row groups, a k16 step advances the start address 32 bytes inside the 128-byte row); V is
// MN-major for O += P V (transposed B: LBO = BLOCK_N*128 between 64-column boxes, SBO = 1024
// between 8-row groups of keys, a k16 step advances 2048 bytes; with DV = 96 the wgmma's N of 96 reads
// the first box and half of the second).
//
// Requires (from the prelude and the TU): ac_elem_t, AttnParams, AttnBuffers, Variant; ac::wgmma_qk
// and ac::wgmma_pv (generated for this BLOCK_N / DV and element type); Cfg supplies D, DV,
// BLOCK_M, BLOCK_N, STAGES, NC, PRODUCER_REGS, CONSUMER_REGS, PERSISTENT, TILES_BY_HEAD (v3_tile), EXP2_POLY (of every 8 n8
// tiles of S, how many take their exponentials on the FMA pipes: 0..8), KV_DESCENDING (the walk's
// order), SCORE_SKIP (skip the K/V blocks whose every P underflows: v3_skip_begin) and Q_PRESCALE
// (scale the Q tile by the score_mod's inner scale once per tile: v3_scale_q), VARLEN (packed sequences:
// TMA rows offset by the sequence's first row, V3Rows), TMA_STORE_O (the persistent grid's epilogue
// writes O by TMA stores from an O tile of its own: v3_epilogue_tma; with Q_PREFETCH the Q tile and the O tile take
// turns, tile number i of the CTA having its Q, then its staged O, in buffer i mod 2, and producer warp 1 stores O and
// loads the Q of tile i + 2 there: v3_store_warp, v3_epilogue_handoff), SOFTMAX_COPIES (1 or 2: V3Consumer::
// kTwoSoftmaxCopies) and HALF_BLOCKS (a block whose low or high half is EMPTY for a warpgroup's rows takes its
// GEMMs over the other half: part_of, v3_by_part, V3Consumer::issue_qk_part / issue_pv_part).
#pragma once

#include "attncompiler/ranges.cuh"
#include "attncompiler/v3_rows.cuh"
#include "attncompiler/score_skip.cuh"
#include "attncompiler/v3_consumer.cuh"
#include "attncompiler/v3_trace.cuh"
#include "attncompiler/v3_epilogue.cuh"
#include "attncompiler/v3_producer.cuh"

namespace ac {

// Maps: V3Maps, or V3MapsO with Cfg::TMA_STORE_O (the o map of the epilogue's TMA stores).
template <class Cfg, class Maps>
__device__ __forceinline__ void v3_fwd(const AttnParams& p, const AttnBuffers& buf, const Maps& maps,
                                       const int* tile_list = nullptr) {
  using L = V3Layout<Cfg>;
  constexpr int BM = L::BM, BN = L::BN, STAGES = L::STAGES, NC = L::NC;
  constexpr bool kPersistent = Cfg::PERSISTENT;
  constexpr bool kTileByHead = Cfg::TILES_BY_HEAD;  // the persistent grid's tile order (v3_tile)
  constexpr bool kList = Cfg::TILE_LIST;  // the host's tile list (tile_list; null: the round robin)
  static_assert(!Cfg::VARLEN || (!Cfg::PERSISTENT && !Cfg::SCORE_SKIP),
                "packed sequences: one tile per CTA (the entry takes the sequence's view), no score skip");
  static_assert(Cfg::TMA_STORE_O == (sizeof(Maps) == sizeof(V3MapsO)), "the o map comes with TMA_STORE_O");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned int base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const unsigned int sQ = base;
  const unsigned int sKV0 = base + L::kQBytes;  // K of stage s: sKV0 + s*kStageBytes, V: + kKBytes
  const unsigned int sOt = base + L::kOOffset;  // TMA_STORE_O: the epilogue's O tile
  const unsigned int bars = base + L::kBarOffset;
  const V3Bars<STAGES> vbars{bars};
  const unsigned int barQ = vbars.q();           // Q landed (phase = tile count & 1)
  const unsigned int barQfree = vbars.q_free();  // consumers done with Q's S GEMMs
  // the tile word (SCORE_SKIP): the walk's first block of the current tile, written by the producer
  // before its arrival on barQ, read by the consumers after their wait on it
  const unsigned int sTileWord = bars + 8u * L::kNumBars;
  // Q_PREFETCH: the CTA's tile number it has its Q in buffer it & 1 (0: the Q tile, 1: the O tile), landed on barQ
  // or on barQfree's slot (unused otherwise); its consumers stage O / l in the same buffer and arrive on
  // qbufs.staged(it), and producer warp 1 writes it by TMA stores, then loads Q of tile number it + 2 there.
  constexpr bool kQPrefetch = Cfg::Q_PREFETCH;
  const V3QBuffers<kQPrefetch> qbufs{sQ, sOt, barQ, barQfree, vbars.extra(0)};
  auto full_k = [&](int s) { return vbars.full_k(s); };
  auto full_v = [&](int s) { return vbars.full_v(s); };
  auto empty_k = [&](int s) { return vbars.empty_k(s); };
  auto empty_v = [&](int s) { return vbars.empty_v(s); };

  const int num_qb = (p.Nq + BM - 1) / BM;
  // The CTA's slots tile0, tile0 + tile_step, ... < num_tiles (v3_tile): the round robin over the grid, or with
  // TILE_LIST and a list its run tile_list[blockIdx.x] .. tile_list[blockIdx.x + 1], one by one.
  const bool listed = kList && tile_list != nullptr;
  const int num_tiles = listed ? tile_list[blockIdx.x + 1] : (kPersistent ? num_qb * p.B * p.H : 1);
  const int tile0 = listed ? tile_list[blockIdx.x] : (kPersistent ? blockIdx.x : 0);
  const int tile_step = listed ? 1 : (kPersistent ? gridDim.x : 1);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
#define AC_TRACE_TILE(tile) v3_trace_tile<kPersistent>(tile)
#ifdef AC_V3_TRACE
  {
    unsigned int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    AC_TRACE(AC_TRACE_TILE(tile0), kTraceStart, threadIdx.x == 0);
    AC_TRACE_VALUE(AC_TRACE_TILE(tile0), kTraceSm, threadIdx.x == 0, smid);
  }
#endif

  if (threadIdx.x == 0) {
    mbar_init(barQ, 1);
    mbar_init(barQfree, kQPrefetch ? 1 : NC * 128);  // Q_PREFETCH: Q of buffer 1 landed
    if constexpr (kQPrefetch) {
      mbar_init(qbufs.staged(0), NC * 128);
      mbar_init(qbufs.staged(1), NC * 128);
    }
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), NC * 128);
      mbar_init(empty_v(s), NC * 128);
    }
    mbar_init_fence();
    // The first tile's Q copy goes out before anything else (setmaxnreg, the K/V range, the
    // descriptor prefetches): its round trip is the CTA's start-up latency (benchmarks/v3_trace.py).
    if (tile0 < num_tiles) {
      int q_block, bh;
      v3_tile<kPersistent, kTileByHead, kList>(tile0, num_qb, p, q_block, bh, tile_list);
      const int b = bh / p.H, h = bh % p.H;
      const V3Rows<Cfg> rows(p, b);
      // SCORE_SKIP: the arrival comes later, with the tile word (the producer's publish_walk)
      if constexpr (Cfg::SCORE_SKIP) {
        mbar_expect_tx(barQ, L::kQBytes);
      } else {
        mbar_arrive_expect_tx(barQ, L::kQBytes);
      }
#pragma unroll
      for (int c = 0; c < L::DB; ++c)
        tma_load_4d(sQ + c * BM * 128, &maps.q, c * 64, rows.q_start + q_block * BM, h, rows.batch, barQ);
    }
  }
  __syncthreads();

  if (warp < 4) {
    // ---------------- producer warpgroup ----------------
    setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (warp == 0 && lane == 0) {
      v3_load_warp<Cfg, kPersistent, kTileByHead>(p, buf, maps, sQ, sKV0, vbars, sTileWord, tile0, tile_step,
                                                 num_tiles, num_qb, tile_list);
    }
    if constexpr (kQPrefetch) {
      if (warp == 1 && lane == 0)
        v3_store_warp<Cfg, kPersistent, kTileByHead>(p, maps, qbufs, tile0, tile_step, num_tiles, num_qb, tile_list);
    }
    return;
  }

  // ---------------- consumer warpgroups ----------------
  setmaxnreg_inc<Cfg::CONSUMER_REGS>();
  const int wg = (threadIdx.x >> 7) - 1;
  const int warp_wg = warp & 3;
  // exp2's multiplier of the softmax input: log2e * scale (plain), the score_mod's positive factor, or
  // 1 (separable: x = coef * s + col already is log2e * score_mod up to the row term; with the column
  // term in the S accumulator, kSepInAcc, coef per tile: V3Consumer::tile_exp_scale)
  const float exp_scale = !Variant::kHasScoreMod ? p.scale * AC_LOG2E
                          : (Variant::kScoreSeparable ? 1.f : Variant::kScoreLog2Factor);
  constexpr bool kPingPong = (NC >= 2);
  // LATE_PV_WAIT: where it applies, a kernel with one softmax copy (masks; ALiBi below d = 256) that may rescale
  constexpr bool kLatePvWait = Cfg::LATE_PV_WAIT && !V3Consumer<Cfg>::kTwoSoftmaxCopies && !V3Consumer<Cfg>::kStatic;
  // Ping-pong (round robin over the NC >= 2 consumers): before each of its turns (one GEMM issue)
  // warpgroup w waits on bar[w]; after it, it grants the next one's turn (w + 1 mod NC). Every
  // warpgroup takes the same turns (the CTA's K/V blocks). The last warpgroup grants warpgroup 0's
  // first turn at the start, and warpgroup 0 takes that one extra grant back at the end, so arrivals
  // and waits always balance.
  auto turn_wait = [&]() {
    if constexpr (kPingPong) named_bar_sync(kTurnBar + wg, 256);
  };
  auto turn_grant = [&]() {
    if constexpr (kPingPong) named_bar_arrive(kTurnBar + (wg + 1 == NC ? 0 : wg + 1), 256);
  };
  if (kPingPong && wg == NC - 1) named_bar_arrive(kTurnBar + 0, 256);
  // Per-warpgroup runs of the walk (see the header): a mask, and blocks narrower than the CTA's rows, so
  // that a warpgroup's 64 rows can miss whole blocks the CTA visits. Elsewhere the code is as without it.
  // (AC_V3_NO_WG_WALK turns it off: same-process A/B runs, benchmarks/v3_sweep.py define=.)
#ifdef AC_V3_NO_WG_WALK
  constexpr bool kWgWalk = false;
#else
  constexpr bool kWgWalk = Variant::kHasMask && NC >= 2 && BN < BM;
#endif

  // HALF_BLOCKS with a mask: a block's GEMMs over the half of its keys the warpgroup's rows can see (part_of)
  constexpr bool kHalf = Cfg::HALF_BLOCKS && Variant::kHasMask;

  V3Consumer<Cfg> st;
  int s = 0;  // ring slot and phase of the next K/V block (runs on across tiles, as the producer's)
  unsigned int phase = 0;
  // kWgWalk: a block of the CTA's walk outside this warpgroup's run. Its waits on both copies come first:
  // the producer issued them only after every arrival of the slot's previous use, so these arrivals count
  // towards this use (a warpgroup done with its run could otherwise arrive ahead of a slower one's release
  // of the same slot). Then the turn this block's S GEMM would have taken.
  auto skip_block = [&]() {
    mbar_wait(full_k(s), phase);
    mbar_wait(full_v(s), phase);
    mbar_arrive(empty_k(s));
    mbar_arrive(empty_v(s));
    turn_wait();
    turn_grant();
    ring_advance<STAGES>(s, phase);
  };
  int it = 0;
  for (int tile = tile0; tile < num_tiles; tile += tile_step, ++it) {
    int q_block, bh;
    v3_tile<kPersistent, kTileByHead, kList>(tile, num_qb, p, q_block, bh, tile_list);
    const int b = bh / p.H, h = bh % p.H;
    const int q0 = q_block * BM, q_hi = min(q0 + BM, p.Nq) - 1;
    KvWalk<BN, Cfg::KV_DESCENDING> walk;
    kv_block_range<BN>(b, h, q0, q_hi, p, buf, walk.j_begin, walk.j_end);
    const int j_first = walk.first(b, h, q0, q_hi, p, buf);
    const int wq_lo = q0 + 64 * wg;                 // this warpgroup's query rows [wq_lo, wq_hi]
    const int wq_hi = min(wq_lo + 63, p.Nq - 1);
    const int row0 = wq_lo + 16 * warp_wg;          // this warp's first query row

#pragma unroll
    for (int i = 0; i < L::NO; ++i) st.acc_o[i] = 0.f;
    st.row_max[0] = st.row_max[1] = V3Consumer<Cfg>::kStatic ? Variant::kStaticMaxLo : AC_NEG_INF;
    st.row_sum[0] = st.row_sum[1] = 0.f;
    st.set_score_mod(b, h, p, buf);
    const float tile_exp_scale = st.tile_exp_scale(exp_scale);

    // kWgWalk: the blocks [wj_begin, wj_end) that meet this warpgroup's own rows' K/V range (none for rows
    // past Nq); the CTA's walk visits them as one contiguous run, which this warpgroup multiplies.
    int wj_begin = 0, wj_end = 0;
    if constexpr (kWgWalk) {
      if (wq_lo <= wq_hi) kv_block_range<BN>(b, h, wq_lo, wq_hi, p, buf, wj_begin, wj_end);
    }
    // (the warp vote changes no value -- the run is the warpgroup's -- but tells ptxas the branch is
    // warp-uniform; on the range test alone it serializes every wgmma, C7520)
    auto in_wg = [&](int j) -> bool {
      if constexpr (kWgWalk) return __any_sync(0xffffffffu, j >= wj_begin && j < wj_end);
      return true;
    };

    // Whether block j needs the masked softmax for this warpgroup's rows: the ragged last block, or a tile
    // that is not FULL (or rows past Nq). Warpgroup-uniform; the warp vote changes no value but tells ptxas the
    // branch on it is warp-uniform (without it, two softmax copies guard every shuffle as divergent: BRA.DIV).
    auto needs_mask = [&](int j) -> bool {
      const int kv0 = j * BN;
      bool m = kv0 + BN > p.Nk;
      if constexpr (Variant::kHasMask) {
#ifndef AC_V3_MASK_OFF  // timing only (wrong results): every block inside the sequence runs the unmasked softmax
        // (tile_class only for a block inside the sequence and rows inside Nq: a buffer mask reads its rows)
        m = m || wq_lo > wq_hi || Variant::tile_class(b, h, wq_lo, wq_hi, kv0, kv0 + BN - 1, p, buf) != AC_TILE_FULL;
#endif
        m = __any_sync(0xffffffffu, m);
      }
      return m;
    };

    // HALF_BLOCKS: which keys of visited block j this warpgroup multiplies (V3Consumer::issue_qk_part): 0 all,
    // 1 the low half (the high one EMPTY for its rows), 2 the high half; voted warp-uniform (a branch around
    // wgmma). Classified only inside the sequence and for rows inside Nq (a buffer mask reads its rows); always
    // 0 when off or without a mask.
    auto part_of = [&](int j) -> int {
      if constexpr (kHalf) {
        const int kv0 = j * BN;
        bool lo_empty = false, hi_empty = false;
        if (walk.valid(j) && kv0 + BN <= p.Nk && wq_lo <= wq_hi) {
          lo_empty = Variant::tile_class(b, h, wq_lo, wq_hi, kv0, kv0 + BN / 2 - 1, p, buf) == AC_TILE_EMPTY;
          hi_empty = Variant::tile_class(b, h, wq_lo, wq_hi, kv0 + BN / 2, kv0 + BN - 1, p, buf) == AC_TILE_EMPTY;
        }
        hi_empty = __any_sync(0xffffffffu, hi_empty);
        lo_empty = __any_sync(0xffffffffu, lo_empty);
        return hi_empty ? 1 : (lo_empty ? 2 : 0);
      } else {
        return 0;
      }
    };

    mbar_wait(qbufs.bar(it), qbufs.parity(it));  // always: the Q copy must land before Q is reused or the CTA exits
    const unsigned int sQt = qbufs.buf(it);  // this tile's Q
    if constexpr (Cfg::SCORE_SKIP) {  // the producer's first block of the walk (j_first stays: it is above)
      asm volatile("ld.shared.u32 %0, [%1];" : "=r"(walk.j_begin) : "r"(sTileWord) : "memory");
    }
    if constexpr (Cfg::Q_PRESCALE) v3_scale_q<Cfg>(sQt, wg, Variant::score_q_scale(b, h, p, buf));
    AC_TRACE(AC_TRACE_TILE(tile), kTraceQ, threadIdx.x == 128);
    AC_TRACE_VALUE(AC_TRACE_TILE(tile), kTraceCta, threadIdx.x == 128, blockIdx.x + 1u);
#ifdef AC_V3_TRACE
    int trace_blocks = 0;
#endif
    int j = j_first;
    bool skipped = false;  // kWgWalk: some block before this warpgroup's run
    [[maybe_unused]] float inv[2];  // Q_PREFETCH: 1/l of this thread's rows, taken (with the LSE) while the last P V runs
    if constexpr (kWgWalk) {  // blocks before this warpgroup's run
      while (walk.valid(j) && !in_wg(j)) {
        skip_block();
        skipped = true;
        j = walk.next(j, b, h, q0, q_hi, p, buf);
      }
    }
    if (walk.valid(j)) {
      // Block 0: S_0 only.
      int part = part_of(j);
      st.init_s(j * BN, row0, b, h, p, buf);
      mbar_wait(full_k(s), phase);
      turn_wait();
      bool masked;
      int j_next, part_next;
      auto s0_step = [&](int pt) {
        wgmma_fence();
        st.issue_qk_part(pt, sQt, sKV0 + s * L::kStageBytes, wg);
        wgmma_commit();
        turn_grant();
        // The block walk runs while the GEMMs do: off the path from S to the next issue.
        masked = needs_mask(j);
        j_next = walk.next(j, b, h, q0, q_hi, p, buf);
        part_next = part_of(j_next);
        wgmma_wait<0>();
      };
      v3_by_part<Cfg>(st, part, s0_step);
      reg_fence(st.acc_s);
      AC_TRACE(AC_TRACE_TILE(tile), kTraceS0, threadIdx.x == 128);
      mbar_arrive(empty_k(s));
      {
        float alpha[2];
        st.template softmax_dispatch<true>(masked, j * BN, row0, tile_exp_scale, b, h, p, buf, alpha);
        st.convert_p(j * BN, row0, b, h, p);
      }
      AC_TRACE(AC_TRACE_TILE(tile), kTraceSoftmax0, threadIdx.x == 128);
      int s_prev = s;
      unsigned int phase_prev = phase;
      int part_prev = part;
      ring_advance<STAGES>(s, phase);
      j = j_next;
      part = part_next;
      while (walk.valid(j) && in_wg(j)) {
        st.init_s(j * BN, row0, b, h, p, buf);
        mbar_wait(full_k(s), phase);
        turn_wait();
        auto step = [&](int pt) {
          wgmma_fence();
          st.issue_qk_part(pt, sQt, sKV0 + s * L::kStageBytes, wg);
          wgmma_commit();
          mbar_wait(full_v(s_prev), phase_prev);
          st.issue_pv_part(part_prev, sKV0 + s_prev * L::kStageBytes + L::kKBytes);
          wgmma_commit();
          turn_grant();
          masked = needs_mask(j);
          j_next = walk.next(j, b, h, q0, q_hi, p, buf);
          part_next = part_of(j_next);
          wgmma_wait<1>();
        };
        v3_by_part<Cfg>(st, part, step);
        reg_fence(st.acc_s);
        mbar_arrive(empty_k(s));  // S_i is done: K_i's slot may be refilled
        float alpha[2];
        st.softmax_dispatch(masked, j * BN, row0, tile_exp_scale, b, h, p, buf, alpha);
        auto pv_done = [&]() {
          wgmma_wait<0>();
          reg_fence(st.acc_o);
          reg_fence(st.p_frag);  // P is read by the in-flight wgmma until here: keep its registers live
          mbar_arrive(empty_v(s_prev));  // P_{i-1} V_{i-1} is done
        };
        if constexpr (kLatePvWait) {
          // A branch right after the softmax keeps ptxas from hoisting the wait above it (plan/v3.py
          // LATE_PV_WAIT_DEFAULT). Its condition is this block's class for the warpgroup's rows, uniform over the
          // warpgroup (wgmma.wait_group is .aligned: every thread of the warpgroup must run the same one) and free;
          // the warp vote on it changes no value but tells ptxas the branch is warp-uniform (else it serializes
          // every wgmma, C7520). The arms differ only in a marker, which keeps them from being merged.
          if (__any_sync(0xffffffffu, masked)) {
            asm volatile("// late_pv_wait: a masked block" ::: "memory");
            pv_done();
            st.rescale_o(alpha);
          } else {
            asm volatile("// late_pv_wait: a full block" ::: "memory");
            pv_done();
            st.rescale_o(alpha);
          }
        } else {
          pv_done();
          st.rescale_o(alpha);
        }
        st.convert_p(j * BN, row0, b, h, p);
        s_prev = s;
        phase_prev = phase;
        part_prev = part;
        ring_advance<STAGES>(s, phase);
        j = j_next;
        part = part_next;
#ifdef AC_V3_TRACE
        ++trace_blocks;
#endif
      }
      AC_TRACE(AC_TRACE_TILE(tile), kTraceLoop, threadIdx.x == 128);
      AC_TRACE_VALUE(AC_TRACE_TILE(tile), kTraceBlocks, threadIdx.x == 128, trace_blocks + 1);
      if constexpr (!kQPrefetch) mbar_arrive(barQfree);  // every S GEMM of this tile is done: Q may be reloaded
      // The last block's P V.
      mbar_wait(full_v(s_prev), phase_prev);
      turn_wait();
      wgmma_fence();
      st.issue_pv_part(part_prev, sKV0 + s_prev * L::kStageBytes + L::kKBytes);
      wgmma_commit();
      turn_grant();
      // (the row statistics are final after the last softmax; the P V in flight reads P and writes O only)
      if constexpr (kQPrefetch) v3_row_finish<Cfg>(st, p, buf, row0, b, h, bh, inv);
      wgmma_wait<0>();
      reg_fence(st.acc_o);
      reg_fence(st.p_frag);
      mbar_arrive(empty_v(s_prev));
      AC_TRACE(AC_TRACE_TILE(tile), kTracePv, threadIdx.x == 128);
    } else {
      if constexpr (!kQPrefetch) mbar_arrive(barQfree);
      if constexpr (kQPrefetch) v3_row_finish<Cfg>(st, p, buf, row0, b, h, bh, inv);
      // A warpgroup whose rows meet none of the CTA's n blocks took n turns; the others take n + 1 (S_0 alone
      // and the last P V are one turn each), so it takes the last one empty.
      if (kWgWalk && skipped) {
        turn_wait();
        turn_grant();
      }
    }
    if constexpr (kWgWalk) {  // blocks after this warpgroup's run
      while (walk.valid(j)) {
        skip_block();
        j = walk.next(j, b, h, q0, q_hi, p, buf);
      }
    }

    // Epilogue: O / l, LSE = (m + log2 l) * ln 2; rows with no visible key get O = 0 and LSE = -inf;
    // rows >= Nq are not written.
#ifdef AC_V3_NO_EPILOGUE  // timing only (no output): what the epilogue costs the persistent grid's boundary
    if (p.Nq < 0)
#endif
    {
      if constexpr (kQPrefetch) {
        v3_epilogue_handoff<Cfg>(st, inv, sQt, qbufs.staged(it), wg, AC_TRACE_TILE(tile));
      } else if constexpr (Cfg::TMA_STORE_O) {
        v3_epilogue_tma<Cfg>(st, p, buf, sOt, &maps.o, wg, row0, wq_lo, b, h, bh, AC_TRACE_TILE(tile));
      } else {
        v3_epilogue<Cfg>(st, p, buf, sQ, wg, row0, wq_lo, b, h, bh, AC_TRACE_TILE(tile));
      }
    }
    AC_TRACE(AC_TRACE_TILE(tile), kTraceEpi0, threadIdx.x == 128);
    AC_TRACE(AC_TRACE_TILE(tile), kTraceEpi1, threadIdx.x == 256);
  }
  if (kPingPong && wg == 0) named_bar_sync(kTurnBar + 0, 256);  // the extra grant (see above)
  // TMA_STORE_O: the last tile's stores read the O tile, which must outlive them
  if constexpr (Cfg::TMA_STORE_O && !kQPrefetch) {
    if ((threadIdx.x & 127) == 0) bulk_wait_all();
  }
#undef AC_TRACE_TILE
}

}  // namespace ac
