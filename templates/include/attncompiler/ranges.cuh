// attncompiler/ranges.cuh -- which K/V blocks a query tile visits (v2 and v3 forward, the v2 dQ
// kernel, split-KV decode), and which query blocks a K/V tile visits (the v2 and v3 dK/dV kernels).
//
// A CTA walks the BN-key blocks [j_begin, j_end) that meet Variant::kv_range of its query rows (the
// K/V range derived from the mask, attncompiler/ir/ranges.py; sound, so every block outside it is
// EMPTY), and inside that range skips the blocks the tile classifier proves EMPTY; block j holds
// keys [j*BN, min(j*BN + BN, Nk) - 1]. Without a mask: every block, none skipped, and no hook is
// called (compile-time branches). tests/test_ranges.py (kernel_blocks) replays this walk in Python.
//
// Requires (from the prelude): AttnParams, AttnBuffers, Variant; AC_TILE_EMPTY (common.cuh).
#pragma once

namespace ac {

// The K/V blocks [j_begin, j_end) that can hold a key visible from query rows [q_lo, q_hi] of
// (b, h). No visible key (kv_range empty within [0, Nk)): j_end = 0, the rows get O = 0, LSE = -inf.
template <int BN>
__device__ __forceinline__ void kv_block_range(int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                               const AttnBuffers& buf, int& j_begin, int& j_end) {
  j_begin = 0;
  j_end = (p.Nk + BN - 1) / BN;
  if constexpr (Variant::kHasMask) {
    int lo, hi;
    Variant::kv_range(b, h, q_lo, q_hi, p, buf, lo, hi);
    lo = max(lo, 0);
    hi = min(hi, p.Nk - 1);
    j_begin = lo / BN;
    j_end = (lo > hi) ? 0 : hi / BN + 1;
  }
}

// The next block the walk visits: from j towards j_stop (ascending: the first j' in [j, j_stop); kDesc:
// the last j' in [j_stop, j]) that Tiles::tile_class does not prove EMPTY; j_stop (ascending) or
// j_stop - 1 (kDesc) when there is none. Runs of EMPTY blocks (other documents of a document mask, the
// gaps of a chunked one) are crossed by galloping: s blocks next to j are classified as one range, s
// doubles after each EMPTY range and halves, without moving, at a range that is not; the walk stops at
// a single block that is not EMPTY. The classifier is sound on any range (an EMPTY range has no visible
// key, so neither has any block in it), so nothing visible is skipped, and a run of r EMPTY blocks
// costs O(log r) calls instead of r; a block right next to a visited one costs one call. Tiles: a class
// with a static tile_class of Variant's signature, given (b, h, q_lo, q_hi) as they are -- Variant
// itself, or decode's union over a CTA's heads (DecodeTiles, whose three ints are first head, row,
// rows).
template <int BN, bool kDesc, class Tiles = Variant>
__device__ __forceinline__ int kv_walk_block(int j, int j_stop, int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                             const AttnBuffers& buf) {
  // Tiles::kKvDense (ir/ranges.py kv_dense): no block of the range is EMPTY, so there is nothing to search for.
  // (AC_KV_ALWAYS_SEARCH searches anyway: same-process A/B runs, benchmarks/v3_sweep.py define=.)
#ifdef AC_KV_ALWAYS_SEARCH
  constexpr bool kDense = false;
#else
  constexpr bool kDense = Tiles::kKvDense;
#endif
  if constexpr (Variant::kHasMask && !kDense) {
    int s = 1;
    while (kDesc ? j >= j_stop : j < j_stop) {
      const int first = kDesc ? max(j - s + 1, j_stop) : j;  // the range [first, past)
      const int past = kDesc ? j + 1 : min(j + s, j_stop);
      if (Tiles::tile_class(b, h, q_lo, q_hi, first * BN, min(past * BN, p.Nk) - 1, p, buf) == AC_TILE_EMPTY) {
        j = kDesc ? first - 1 : past;
        s *= 2;
      } else if (s == 1) {
        break;
      } else {
        s >>= 1;
      }
    }
  }
  return j;
}

// The first block j' >= j below j_end that Tiles::tile_class does not prove EMPTY (j_end: none).
template <int BN, class Tiles = Variant>
__device__ __forceinline__ int kv_next_block(int j, int j_end, int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                             const AttnBuffers& buf) {
  return kv_walk_block<BN, false, Tiles>(j, j_end, b, h, q_lo, q_hi, p, buf);
}

// The last block j' <= j, >= j_begin, that Tiles::tile_class does not prove EMPTY (j_begin - 1: none).
template <int BN, class Tiles = Variant>
__device__ __forceinline__ int kv_prev_block(int j, int j_begin, int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                             const AttnBuffers& buf) {
  return kv_walk_block<BN, true, Tiles>(j, j_begin, b, h, q_lo, q_hi, p, buf);
}

// The visited blocks of [j_begin, j_end) in ascending order (kDesc false) or from the last down (true).
template <int BN, bool kDesc>
struct KvWalk {
  int j_begin, j_end;
  __device__ __forceinline__ int first(int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                       const AttnBuffers& buf) const {
    return kDesc ? kv_prev_block<BN>(j_end - 1, j_begin, b, h, q_lo, q_hi, p, buf)
                 : kv_next_block<BN>(j_begin, j_end, b, h, q_lo, q_hi, p, buf);
  }
  __device__ __forceinline__ int next(int j, int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                      const AttnBuffers& buf) const {
    return kDesc ? kv_prev_block<BN>(j - 1, j_begin, b, h, q_lo, q_hi, p, buf)
                 : kv_next_block<BN>(j + 1, j_end, b, h, q_lo, q_hi, p, buf);
  }
  __device__ __forceinline__ bool valid(int j) const { return kDesc ? j >= j_begin : j < j_end; }
};

// The backward's walk over the (query head of the group, query block) pairs of one K/V block [kv0, kv_hi]:
// position (hg, i) is query block (i + rot) mod nqb of head h_first + hg (rot >= 0), or block nqb - 1 - i
// (rot < 0: descending). q_walk_skip moves (hg, i) to the first position at or after it whose tile tile_class
// does not prove EMPTY (hg = G: none); q_walk_next does the same for the flat position it = hg * nqb + i
// (G * nqb: none). Positions whose query block lies outside Variant::q_range of the K/V rows
// (sound: no row outside it sees any of the keys, so every such tile is EMPTY) are jumped over without
// classifying them -- a causal K/V block's walk otherwise classifies each of the ~2 kv0 / BM query blocks above
// the diagonal in turn. The positions visited, and their order, are the same as a scan's.
// kJump false, or AC_Q_WALK_SCAN: every position classified (a walk run where registers are short; same-process A/B
// runs).
template <int BM, bool kJump = true>
__device__ __forceinline__ void q_walk_skip(int& hg, int& i, int G, int nqb, int rot, int b, int h_first, int kv0,
                                            int kv_hi, const AttnParams& p, const AttnBuffers& buf) {
#ifdef AC_Q_WALK_SCAN
  constexpr bool kJumps = false;
#else
  constexpr bool kJumps = kJump;
#endif
  if constexpr (Variant::kHasMask) {
    auto block_of = [&](int pos) {
      int qb = rot < 0 ? nqb - 1 - pos : pos + rot;
      return qb >= nqb ? qb - nqb : qb;
    };
    while (hg < G) {
      const int q0 = block_of(i) * BM;
      if (Variant::tile_class(b, h_first + hg, q0, min(q0 + BM, p.Nq) - 1, kv0, kv_hi, p, buf) != AC_TILE_EMPTY)
        return;
      if (++i == nqb) {
        ++hg;
        i = 0;
        continue;
      }
      if constexpr (kJumps) {
        // An EMPTY tile: the head's query-block range says where the next candidate is. (Derived again at each
        // EMPTY tile rather than kept per head: the v3 consumer runs this walk with its accumulators live, and
        // loop-carried registers cost more there than the few instructions of q_range.)
        int lo, hi;
        Variant::q_range(b, h_first + hg, kv0, kv_hi, p, buf, lo, hi);
        lo = max(lo, 0);
        hi = min(hi, p.Nq - 1);
        const int qb = block_of(i);
        if (lo > hi) {  // no row sees these keys
          ++hg;
          i = 0;
        } else if (qb * BM > hi || qb * BM + BM <= lo) {
          // The in-range positions form one run taken mod nqb, from that of the first in-range block on; i lies
          // outside it, so the next one is that start when i lies before it, and none of this head's otherwise.
          int i_t = rot < 0 ? nqb - 1 - hi / BM : lo / BM - rot;
          if (i_t < 0) i_t += nqb;
          if (i < i_t) {
            i = i_t;
          } else {
            ++hg;
            i = 0;
          }
        }
      }
    }
  }
}

template <int BM, bool kJump = true>
__device__ __forceinline__ int q_walk_next(int it, int G, int nqb, int rot, int b, int h_first, int kv0, int kv_hi,
                                           const AttnParams& p, const AttnBuffers& buf) {
  if constexpr (Variant::kHasMask) {
    const int total = G * nqb;
    if (it >= total) return it;
    int hg = it / nqb;
    int i = it - hg * nqb;
    q_walk_skip<BM, kJump>(hg, i, G, nqb, rot, b, h_first, kv0, kv_hi, p, buf);
    return hg < G ? hg * nqb + i : total;
  } else {
    return it;
  }
}

}  // namespace ac
