// attncompiler/ranges.cuh -- which K/V blocks a query tile visits (v2 and v3 forward, the v2 dQ
// kernel, split-KV decode).
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

// The first block j' >= j below j_end that Tiles::tile_class does not prove EMPTY (j_end: none).
// Runs of EMPTY blocks (other documents of a document mask, the gaps of a chunked one) are crossed
// by galloping: the range [j, j + s) is classified as one tile, s doubles after each EMPTY range
// and halves, without advancing, at a range that is not; the walk stops at a single block that is
// not EMPTY. The classifier is sound on any range (an EMPTY range has no visible key, so neither
// has any block in it), so nothing visible is skipped, and a run of r EMPTY blocks costs O(log r)
// calls instead of r; a block right after a visited one costs one call, as before. Tiles: a class
// with a static tile_class of Variant's signature, given (b, h, q_lo, q_hi) as they are -- Variant
// itself, or decode's union over a CTA's heads (DecodeTiles, whose three ints are first head, row,
// rows).
template <int BN, class Tiles = Variant>
__device__ __forceinline__ int kv_next_block(int j, int j_end, int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                             const AttnBuffers& buf) {
  if constexpr (Variant::kHasMask) {
    int s = 1;
    while (j < j_end) {
      const int j_hi = min(j + s, j_end);
      const int kv_lo = j * BN;
      const int kv_hi = min(j_hi * BN, p.Nk) - 1;
      if (Tiles::tile_class(b, h, q_lo, q_hi, kv_lo, kv_hi, p, buf) == AC_TILE_EMPTY) {
        j = j_hi;
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

// The mirror of kv_next_block for a walk from the last block down: the largest block j' <= j and
// >= j_begin that Tiles::tile_class does not prove EMPTY (j_begin - 1: none), galloping the same way.
template <int BN, class Tiles = Variant>
__device__ __forceinline__ int kv_prev_block(int j, int j_begin, int b, int h, int q_lo, int q_hi, const AttnParams& p,
                                             const AttnBuffers& buf) {
  if constexpr (Variant::kHasMask) {
    int s = 1;
    while (j >= j_begin) {
      const int j_lo = max(j - s + 1, j_begin);
      const int kv_lo = j_lo * BN;
      const int kv_hi = min((j + 1) * BN, p.Nk) - 1;
      if (Tiles::tile_class(b, h, q_lo, q_hi, kv_lo, kv_hi, p, buf) == AC_TILE_EMPTY) {
        j = j_lo - 1;
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

}  // namespace ac
