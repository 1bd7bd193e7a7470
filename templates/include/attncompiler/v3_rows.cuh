// attncompiler/v3_rows.cuh -- the TMA row coordinates of the v3 kernels (forward and backward), padded or packed,
// and the forward's work tiles (v3_tile).
//
// Requires (from the prelude): struct AttnParams (cu_seqlens_q / cu_seqlens_k, total_q / total_k, B, H), and
// Cfg::VARLEN; attncompiler/common.cuh (varlen_start).
#pragma once

namespace ac {

// TMA coordinates (row, batch) of a tile's rows: the padded layout addresses row r of batch b as (r, b); packed
// sequences (Cfg::VARLEN: the maps span (D, total rows, heads, 1), and p is the sequence's view, varlen.cuh) as
// (first row of sequence b + r, 0). Rows past the sequence's end are the next sequence's: the kernels mask keys
// kv >= Nk and queries q >= Nq of the ragged last blocks (P = 0, and dS = 0 in the backward) and never store
// rows past them.
template <class Cfg>
struct V3Rows {
  int q_start = 0, k_start = 0, batch = 0;
  __device__ __forceinline__ V3Rows(const AttnParams& p, int b) {
    if constexpr (Cfg::VARLEN) {
      q_start = varlen_start(p.cu_seqlens_q[b], p.total_q);  // (common.cuh: the clamp varlen_view applies)
      k_start = varlen_start(p.cu_seqlens_k[b], p.total_k);
    } else {
      batch = b;
    }
  }
};

// Work tile -> (query block, batch*head). Non-persistent: one tile per CTA from blockIdx (heaviest,
// for causal the last, query blocks first; blockIdx.x runs over the query blocks of one batch*head, so the
// CTAs resident together share their K/V in L2). Persistent: CTA c takes tiles c, c + gridDim.x, ...
// (a static round robin), in one of two orders:
//   kByHead (Cfg::TILES_BY_HEAD, balanced tiles: no mask, or a band such as a sliding window; plan/v3_grid.py):
//     the query blocks of one batch*head consecutive, as the non-persistent grid. Measured on an H100 (2026-11-27, v3_sweep.py, TFLOP/s,
//     d = 128 unless noted, query-major -> head-major, non-persistent beside): N = 512 280 -> 462 (430),
//     N = 1024 324 -> 527 (540), N = 16k 601 -> 667 (670), d = 64 N = 1024 335 -> 371 (355). Query-major
//     runs one query block of ~132 different batch*heads at a time, so with many short sequences each
//     K/V is streamed from HBM once per query block.
//   otherwise (masks whose tiles differ in length: causal): all heads' heaviest query blocks first, the static
//     round robin's balance (causal N = 16k: 502 query-major, 418 head-major).
// kList (Cfg::TILE_LIST, persistent only): the CTA's loop runs over slots of the host's tile list instead (v3_fwd.cuh;
// runtime/tile_list.py deals the tiles, longest first, to the least-loaded CTA), and slot s holds tile list[s] of the
// order above; a null list is the round robin (slot s is tile s).
template <bool kPersistent, bool kByHead, bool kList = false>
__device__ __forceinline__ void v3_tile(int slot, int num_qb, const AttnParams& p, int& q_block, int& bh,
                                        const int* list = nullptr) {
  static_assert(!kList || kPersistent, "a tile list is the persistent grid's");
  const int tile = (kList && list != nullptr) ? list[slot] : slot;
  if constexpr (kPersistent && kByHead) {
    q_block = num_qb - 1 - tile % num_qb;
    bh = tile / num_qb;
  } else if constexpr (kPersistent) {
    const int nbh = p.B * p.H;
    q_block = num_qb - 1 - tile / nbh;
    bh = tile % nbh;
  } else {
    q_block = gridDim.x - 1 - blockIdx.x;
    bh = ac_grid_bh();
  }
}

}  // namespace ac
