// attncompiler/decode_tiles.cuh -- the split-KV decode kernel's pieces (decode.cuh has the kernels):
// its shared-memory layout (DecodeLayout, with the static_asserts on it), the tensor maps of the "tma"
// loader, the tile class over a CTA's (query head, query) rows, and the "bulk" and "tma" K/V tile loaders.
//
// Requires (from the prelude): ac_elem_t, AttnParams, AttnBuffers, Variant; Cfg supplies D, DV, BLOCK_N,
// NUM_WARPS, STAGES, BULK_LOADER, TMA_LOADER.
#pragma once

#include "attncompiler/ranges.cuh"
#include "attncompiler/bulk_copy.cuh"

namespace ac {

// The tensor maps of the "tma" loader (128-byte CUtensorMaps, 4-d: head dim, seqlen, heads, batch),
// passed by value as a __grid_constant__ kernel parameter.
struct __align__(64) DecodeTmaDesc {
  unsigned long long opaque[16];
};
struct DecodeMaps {
  DecodeTmaDesc k, v;
};

template <class Cfg>
struct DecodeLayout {
  static constexpr int D = Cfg::D;
  static constexpr int DV = Cfg::DV;
  static constexpr int BM = 16;                // rows per CTA: one m16 tile
  static constexpr int BN = Cfg::BLOCK_N;
  static constexpr int W = Cfg::NUM_WARPS;
  static constexpr int STAGES = Cfg::STAGES;
  static constexpr int NTHREADS = 32 * W;
  static constexpr int KW = BN / W;            // keys per warp per tile
  static constexpr int QS = D + 8;             // padded smem row strides (elements)
  static constexpr int KS = D + 8;
  static constexpr int VS = DV + 8;
  static constexpr int NT_S = KW / 8;          // n8 tiles of a warp's S
  static constexpr int NT_O = DV / 8;
  static constexpr int KT_QK = D / 16;
  static constexpr int KT_PV = KW / 16;
  static constexpr bool BULK = Cfg::BULK_LOADER;
  static constexpr bool TMA = Cfg::TMA_LOADER;
  static constexpr bool MBAR = BULK || TMA;   // the ring completes on one mbarrier per stage
  // TMA: 64-column boxes of BN rows x 128 bytes, 128-byte swizzle (1024-byte atoms): unpadded stages at a
  // 1024-byte aligned base (dynamic smem is only 16-byte aligned: kAlignSlack bytes of slack).
  static constexpr int kAlignSlack = TMA ? 1024 : 0;
  static constexpr int kQBytes = BM * QS * 2;
  static constexpr int kQRegion = TMA ? (kQBytes + 1023) / 1024 * 1024 : kQBytes;
  static constexpr int kKBytes = TMA ? BN * D * 2 : BN * KS * 2;
  static constexpr int kStageBytes = TMA ? BN * (D + DV) * 2 : BN * (KS + VS) * 2;
  // Bulk / TMA loader: one 8-byte mbarrier per stage after the stages (16-byte multiple; none for cp.async).
  static constexpr int kBarOffset = kQRegion + STAGES * kStageBytes;
  static constexpr int kBarBytes = MBAR ? (8 * STAGES + 15) / 16 * 16 : 0;
  static constexpr int kSmemBytes = kAlignSlack + kBarOffset + kBarBytes;
  static constexpr int kKRowBytes = D * 2;     // one bulk copy per K row / V row
  static constexpr int kVRowBytes = DV * 2;
  static constexpr int kTileTxBytes = BN * (kKRowBytes + kVRowBytes);  // bytes a stage's phase waits for
  // End-of-loop merge of the warps' (m, l, O), aliasing the K/V stages.
  static constexpr int OS = DV + 4;            // fp32 row stride of a warp's O
  static constexpr int kMergeBytes = W * BM * OS * 4 + 2 * W * BM * 4;

  static_assert(D % 16 == 0 && DV % 16 == 0, "head dims must be multiples of 16");
  static_assert(D <= 256 && DV <= 256, "head dims above 256 are not planned");
  static_assert(BN % (16 * W) == 0, "each warp takes a multiple of 16 keys of a tile");
  static_assert(STAGES >= 2 && STAGES <= 6, "STAGES is 2..6");
  static_assert(kMergeBytes <= STAGES * kStageBytes, "the warp merge must fit in the K/V stages");
  // Bulk copies: 16-byte aligned shared destinations (every row, K and V, of every stage) and sizes.
  static_assert(kQBytes % 16 == 0 && kKBytes % 16 == 0 && kStageBytes % 16 == 0, "stage bases 16-byte aligned");
  static_assert((KS * 2) % 16 == 0 && (VS * 2) % 16 == 0, "padded smem rows 16-byte aligned");
  static_assert(kKRowBytes % 16 == 0 && kVRowBytes % 16 == 0, "a K / V row is a multiple of 16 bytes");
  static_assert(kBarOffset % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(!MBAR || kTileTxBytes < (1 << 20), "a stage's transaction count fits the mbarrier's tx-count");
  static_assert(!(BULK && TMA), "one K/V loader");
  static_assert(!TMA || (D % 64 == 0 && DV % 64 == 0 && BN <= 256), "TMA boxes: 64-column head-dim boxes, <= 256 rows");
  static_assert(!TMA || (kQRegion % 1024 == 0 && kKBytes % 1024 == 0 && kStageBytes % 1024 == 0),
                "TMA: every box starts on a 1024-byte swizzle atom");
};

// Rows [R0, R0 + nrows) of the group cover query heads hg in [R0 / Nq, (R0 + nrows - 1) / Nq]; for head
// hg, the queries [q_lo, q_hi] below.
__device__ __forceinline__ void decode_head_rows(int hg, int R0, int nrows, int Nq, int& q_lo, int& q_hi) {
  q_lo = max(0, R0 - hg * Nq);
  q_hi = min(Nq - 1, R0 + nrows - 1 - hg * Nq);
}

// Tile class of [kv_lo, kv_hi] for all the CTA's rows: EMPTY only if EMPTY for every head, FULL only
// if FULL for every head. A Tiles class for kv_next_block (ranges.cuh): the first block not proven
// EMPTY for the CTA's rows is kv_next_block<BN, DecodeTiles>(j, j_end, b, h0, R0, nrows, p, buf).
struct DecodeTiles {
  // the union over heads of (b, h)-dependent ranges can have gaps: always search for EMPTY blocks
  static constexpr bool kKvDense = false;
  static __device__ __forceinline__ int tile_class(int b, int h0, int R0, int nrows, int kv_lo, int kv_hi,
                                                   const AttnParams& p, const AttnBuffers& buf) {
    bool any_visible = false, all_full = true;
    const int hg_end = (R0 + nrows - 1) / p.Nq;
    for (int hg = R0 / p.Nq; hg <= hg_end; ++hg) {
      int q_lo, q_hi;
      decode_head_rows(hg, R0, nrows, p.Nq, q_lo, q_hi);
      const int c = Variant::tile_class(b, h0 + hg, q_lo, q_hi, kv_lo, kv_hi, p, buf);
      any_visible = any_visible || (c != AC_TILE_EMPTY);
      all_full = all_full && (c == AC_TILE_FULL);
    }
    return !any_visible ? AC_TILE_EMPTY : (all_full ? AC_TILE_FULL : AC_TILE_PARTIAL);
  }
};

// Bulk loader: issue tile rows [row0, row0 + BN) of one K/V head into the stage at sK / sV, completing
// on the stage's mbarrier `bar`. Called by all 32 lanes of one warp (the issuing warp). Lane 0 arrives
// with the tile's byte count first (the phase cannot complete before its one arrival), then every lane
// copies rows lane, lane + 32, ...: one bulk copy per K row and one per V row, into the padded smem rows
// (row stride KS / VS elements, so ldmatrix stays conflict-free). Rows >= Nk copy row Nk - 1: the bytes
// are always BN * (D + DV) * 2 and the data is finite; the split kernel masks those keys (kv_idx >= Nk)
// to -inf, so their P is 0 and P * V adds 0.
template <class L, typename T>
__device__ __forceinline__ void decode_bulk_tile(unsigned int sK, unsigned int sV, unsigned int bar, const T* gK,
                                                 const T* gV, long long k_sn, long long v_sn, int row0, int Nk,
                                                 int lane) {
  static_assert(L::BULK, "decode_bulk_tile is the bulk loader's");
  if (lane == 0) bulk_mbar_arrive_expect_tx<>(bar, L::kTileTxBytes);
  __syncwarp();
  const int last = Nk - 1;
#pragma unroll
  for (int i = 0; i < (L::BN + 31) / 32; ++i) {
    const int r = i * 32 + lane;
    if (L::BN % 32 == 0 || r < L::BN) {
      const long long src = min(row0 + r, last);
      bulk_copy_g2s<>(sK + r * L::KS * 2, gK + src * k_sn, L::kKRowBytes, bar);
      bulk_copy_g2s<>(sV + r * L::VS * 2, gV + src * v_sn, L::kVRowBytes, bar);
    }
  }
}

// TMA loader: tile rows [row0, row0 + BN) of K/V head hk of batch b into the stage at sK / sV (D/64, DV/64
// swizzled boxes of BN rows x 128 bytes each), completing on the stage's mbarrier `bar`. One thread
// issues: the expect_tx arrival (the whole boxes' bytes, zero-filled rows past Nk included) before the
// copies, so the phase cannot complete early.
template <class L>
__device__ __forceinline__ void decode_tma_tile(unsigned int sK, unsigned int sV, unsigned int bar,
                                                const DecodeMaps* maps, int row0, int hk, int b) {
  static_assert(L::TMA, "decode_tma_tile is the tma loader's");
  bulk_mbar_arrive_expect_tx<>(bar, L::kTileTxBytes);
#pragma unroll
  for (int c = 0; c < L::D / 64; ++c) bulk_tensor_g2s_4d(sK + c * L::BN * 128, &maps->k, c * 64, row0, hk, b, bar);
#pragma unroll
  for (int c = 0; c < L::DV / 64; ++c) bulk_tensor_g2s_4d(sV + c * L::BN * 128, &maps->v, c * 64, row0, hk, b, bar);
}


}  // namespace ac
