// attncompiler/v3_rows.cuh -- the TMA row coordinates of the v3 kernels (forward and backward), padded or packed.
//
// Requires (from the prelude): struct AttnParams (cu_seqlens_q / cu_seqlens_k), and Cfg::VARLEN.
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
      q_start = p.cu_seqlens_q[b];
      k_start = p.cu_seqlens_k[b];
    } else {
      batch = b;
    }
  }
};

}  // namespace ac
