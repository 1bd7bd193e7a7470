// attncompiler/decode.cuh -- split-KV decode (flash-decoding) forward: a split kernel and a combine kernel.
//
// For few query rows (Nq <= 16) against a long K/V, one CTA per (query block, head) -- the v2 grid -- has
// B*H CTAs, each streaming all of K/V: the GPU is mostly idle and each K/V head is read H/H_kv times.
//
// attn_fwd (the split kernel), grid (num_splits * row_blocks, H_kv, B), NUM_WARPS warps (blockIdx.x = split +
// num_splits * row block):
//   * the M rows of one tensor-core tile are the (query head, query) pairs of one K/V head's group,
//     row R = hg * Nq + qi for hg < H/H_kv, qi < Nq (dp.rows = H/H_kv * Nq rows, 16 per row block):
//     with GQA, 1 query x 8 grouped heads fills 8 rows and K/V is read once for the whole group;
//   * the K/V blocks that the mask's kv_range allows (union over the CTA's heads) are cut into
//     num_splits contiguous chunks of whole BLOCK_N tiles; the CTA of split s streams its chunk through a
//     STAGES-deep ring (STAGES-1 tiles in flight while one is computed), and skips tiles the tile
//     classifier proves EMPTY for every head of the CTA. The ring is filled by one of two loaders:
//       - BULK_LOADER = false (loader "cp_async"): every thread issues 16-byte cp.async copies (rows
//         past Nk zero-filled), one commit group per tile, cp.async.wait_group before a tile is used;
//       - BULK_LOADER = true (loader "bulk", sm_90+, bulk_copy.cuh): warp 0 issues one cp.async.bulk
//         copy per K row and per V row of a tile (D*2 / DV*2 bytes into the padded smem rows), all
//         completing on the stage's mbarrier (one expect_tx arrival + the tile's bytes per phase);
//         every thread waits on that barrier with the stage's phase parity. Rows at or past Nk copy
//         row Nk-1 instead (finite data; the mask below sets those scores to -inf, so P = 0 there);
//       - TMA_LOADER = true (loader "tma", sm_90+): thread 0 issues D/64 + DV/64 tensor copies per tile
//         (cp.async.bulk.tensor, boxes of 64 columns x BLOCK_N rows from the tensor maps in DecodeMaps,
//         128-byte swizzle, rows past Nk zero-filled) on the same per-stage mbarriers; the stages are
//         unpadded, 1024-byte aligned, and ldmatrix undoes the swizzle in its row addresses;
//   * each warp takes its own KW = BLOCK_N / NUM_WARPS keys of every tile (S = Q K^T, score_mod, mask,
//     online softmax in the log2 domain, dropout, O += P V, all with mma.sync m16n8k16); the warps'
//     (m, l, O) are merged through shared memory at the end;
//   * with num_splits == 1 the CTA writes O (element type) and LSE directly; otherwise it writes the
//     normalized partial O (fp32) and its LSE to the workspace:
//       ws[0 : S*R*DV]           partial O,   [split][row][DV], row = (b*H + h)*Nq + qi  (R = B*H*Nq)
//       ws[S*R*DV : S*R*(DV+1)]  partial LSE, [split][row], natural log, -inf for a split with no visible key
//   * FOLD_COMBINE (num_splits > 1 only): after its partial write each CTA fences and increments the
//     int counter of its (b, h_kv, row block), dp.counters[(b*H_kv + h_kv)*row_blocks + row block]
//     (B*H_kv*row_blocks ints, zero when the kernel starts: runtime/counters.py); the CTA that sees
//     S-1 (the last split to finish) reads every split's partials of its rows from L2 (ld.global.cg),
//     writes O and LSE exactly as attn_decode_combine does, and resets the counter to 0 for the next
//     launch (CUDA-graph replays included). No combine launch follows.
// attn_decode_combine, grid ceil(R / COMBINE_WARPS), one warp per row: LSE = log sum_s exp(lse_s),
//   O = sum_s exp(lse_s - LSE) O_s; a row with no visible key in any split gets O = 0, LSE = -inf.
//
// The shared-memory layout, the tensor maps, the tile class and the K/V tile loaders: decode_tiles.cuh; the
// merge of the splits (the folded tail and the combine kernel): decode_combine.cuh.
//
// Requires (from the prelude): ac_elem_t, AttnParams, AttnBuffers, Variant, DecodeParams; Cfg supplies
// D, DV, BLOCK_N, NUM_WARPS, STAGES, Q_IN_REGS, L2_HINT, BULK_LOADER, TMA_LOADER, FOLD_COMBINE.
#pragma once

#include "attncompiler/ranges.cuh"
#include "attncompiler/bulk_copy.cuh"
#include "attncompiler/decode_tiles.cuh"
#include "attncompiler/decode_combine.cuh"

namespace ac {

template <class Cfg>
__device__ __forceinline__ void decode_split(const AttnParams& p, const AttnBuffers& buf, const DecodeParams& dp,
                                             const DecodeMaps* maps) {
  using L = DecodeLayout<Cfg>;
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  constexpr int BN = L::BN, KW = L::KW, D = L::D, DV = L::DV;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  // (TMA: rounded up to the 1024-byte swizzle atom, inside the layout's slack)
  const unsigned int smem0 = L::TMA ? (smem_u32(smem_raw) + 1023u) & ~1023u : smem_u32(smem_raw);
  const unsigned int sK0 = smem0 + L::kQRegion;  // K of stage s: sK0 + s * kStageBytes
  const unsigned int sV0 = sK0 + L::kKBytes;     // V of stage s: sV0 + s * kStageBytes
  const unsigned int bar0 = smem0 + L::kBarOffset;  // bulk loader: the mbarrier of stage s at bar0 + 8 * s
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
  static_assert(!L::MBAR, "loaders 'bulk' and 'tma' need sm_90+ (cp.async.bulk, mbarrier expect_tx / try_wait)");
#endif

  const int split = blockIdx.x % dp.num_splits;
  const int b = ac_grid_b();
  const int hk = ac_grid_h();
  const int R0 = blockIdx.x / dp.num_splits * L::BM;
  const int nrows = min(L::BM, dp.rows - R0);
  const int h0 = hk * dp.group;                  // first query head of the group
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  // Q rows: R -> (head h0 + R / Nq, query R % Nq); rows past the group are zero-filled.
  {
    constexpr int kChunks = L::BM * (D / 8);
    const T* gQ = reinterpret_cast<const T*>(p.q);
    for (int c = tid; c < kChunks; c += L::NTHREADS) {
      const int r = c / (D / 8);
      const int cc = c % (D / 8);
      const bool valid = r < nrows;
      const int R = R0 + (valid ? r : 0);
      const T* src = gQ + b * p.q_sb + (long long)(h0 + R / p.Nq) * p.q_sh + (long long)(R % p.Nq) * p.q_sn + cc * 8;
      cp_async_16_zfill(smem0 + (r * L::QS + cc * 8) * 2, src, valid ? 16 : 0);
    }
    cp_async_commit();
  }
  if constexpr (L::MBAR) {
    // One arrival (the issuing lane's expect_tx) per phase; visible to the bulk-copy unit before any
    // copy completes on it, and to the other warps through the barrier before the K/V loop.
    if (tid == 0) {
      if constexpr (L::TMA) {
        bulk_prefetch_tensormap(&maps->k);
        bulk_prefetch_tensormap(&maps->v);
      }
#pragma unroll
      for (int s = 0; s < L::STAGES; ++s) bulk_mbar_init<>(bar0 + 8 * s, 1);
      bulk_mbar_init_fence<>();
    }
  }

  // This split's K/V blocks: the blocks meeting kv_range (union over the CTA's heads) cut into
  // num_splits chunks of whole tiles.
  int j_begin = 0, j_end = (p.Nk + BN - 1) / BN;
  if constexpr (Variant::kHasMask) {
    int lo = 0x7fffffff, hi = -1;
    const int hg_end = (R0 + nrows - 1) / p.Nq;
    for (int hg = R0 / p.Nq; hg <= hg_end; ++hg) {
      int q_lo, q_hi, l, r;
      decode_head_rows(hg, R0, nrows, p.Nq, q_lo, q_hi);
      Variant::kv_range(b, h0 + hg, q_lo, q_hi, p, buf, l, r);
      l = max(l, 0);
      r = min(r, p.Nk - 1);
      if (l <= r) {
        lo = min(lo, l);
        hi = max(hi, r);
      }
    }
    j_begin = (lo > hi) ? 0 : lo / BN;
    j_end = (lo > hi) ? 0 : hi / BN + 1;
  }
  const int per = (j_end - j_begin + dp.num_splits - 1) / dp.num_splits;
  const int my_begin = min(j_end, j_begin + split * per);
  const int my_end = min(j_end, my_begin + per);

  const T* gK = reinterpret_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T* gV = reinterpret_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh;

  // Prologue: STAGES - 1 tiles in flight (one commit group each, empty groups keep the count).
  // K/V tiles (rows past Nk zero-filled) with the plan's L2 prefetch-size hint (Cfg::L2_HINT; 256 =
  // `.L2::256B`: each warp's 32 copies cover 512 contiguous bytes of a (B, H, N, d) K/V row run) and
  // FULL_BRANCH = false: one predicated copy loop, half the copy code inside the ring's loop.
  // Bulk loader: warp 0 alone issues (and tracks j_load); the other warps only consume.
  int j_load = kv_next_block<BN, DecodeTiles>(my_begin, my_end, b, h0, R0, nrows, p, buf);
  // cp.async loader: K/V of block j_load into stage st (if any is left), the next visited block, one
  // commit group (empty past the end, which keeps the group count)
  auto load_next_cp_async = [&](int st) {
    if (j_load < my_end) {
      const int rows = p.Nk - j_load * BN;
      load_tile_rows_async<BN, D, L::KS, L::NTHREADS, Cfg::L2_HINT, false>(
          sK0 + st * L::kStageBytes, gK + (long long)j_load * BN * p.k_sn, p.k_sn, rows, tid);
      load_tile_rows_async<BN, DV, L::VS, L::NTHREADS, Cfg::L2_HINT, false>(
          sV0 + st * L::kStageBytes, gV + (long long)j_load * BN * p.v_sn, p.v_sn, rows, tid);
      j_load = kv_next_block<BN, DecodeTiles>(j_load + 1, my_end, b, h0, R0, nrows, p, buf);
    }
    cp_async_commit();
  };
  // Bulk / TMA loaders: the issuing threads (TMA: thread 0, which initialized the barriers; bulk: warp 0)
  // fill stage st with block j_load on its mbarrier and track j_load; the other threads only consume.
  const bool mbar_issuer = L::TMA ? tid == 0 : warp == 0;
  auto load_next_mbar = [&](int st) {
    if (j_load < my_end) {
      if constexpr (L::TMA) {
        decode_tma_tile<L>(sK0 + st * L::kStageBytes, sV0 + st * L::kStageBytes, bar0 + 8 * st, maps, j_load * BN,
                           hk, b);
      } else if constexpr (L::BULK) {
        decode_bulk_tile<L>(sK0 + st * L::kStageBytes, sV0 + st * L::kStageBytes, bar0 + 8 * st, gK, gV, p.k_sn,
                            p.v_sn, j_load * BN, p.Nk, lane);
      }
      j_load = kv_next_block<BN, DecodeTiles>(j_load + 1, my_end, b, h0, R0, nrows, p, buf);
    }
  };
  if constexpr (L::MBAR) {
    if (mbar_issuer) {
      if constexpr (L::BULK) __syncwarp();  // lane 0's mbarrier.init and fence come before any lane's copy
#pragma unroll
      for (int s = 0; s < L::STAGES - 1; ++s) load_next_mbar(s);
    }
  } else {
#pragma unroll
    for (int s = 0; s < L::STAGES - 1; ++s) {
      load_next_cp_async(s);
    }
  }

  // Per-thread rows g and g + 8: their query head and query index (rows past the group reuse the
  // last row's, so the hooks see valid indices; they are never written).
  int row_h[2], row_q[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int R = R0 + min(g + 8 * hf, nrows - 1);
    row_h[hf] = h0 + R / p.Nq;
    row_q[hf] = R % p.Nq;
  }

  float acc_o[L::NT_O][4];
#pragma unroll
  for (int nt = 0; nt < L::NT_O; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[nt][e] = 0.f;
  }
  float row_max[2] = {AC_NEG_INF, AC_NEG_INF};  // log2 domain
  float row_sum[2] = {0.f, 0.f};                // per-thread partial
  const float exp_scale = Variant::kHasScoreMod ? 1.f : p.scale * AC_LOG2E;

  // ldmatrix bases (bytes, shared state space): Q rows; this warp's keys of a K / V stage.
  // Padded rows (cp_async, bulk): a lane's 16-byte chunk c of row r at r * KS * 2 + c * 16.
  // TMA (128-byte swizzle): chunk c of row r at (c / 8) * BN * 128 + r * 128 + ((c % 8) ^ (r % 8)) * 16,
  // and r % 8 == lane % 8 for every row a lane addresses (the other row terms are multiples of 8), so a
  // lane XORs its even chunk offsets with a fixed k_x / v_x.
  const unsigned int q_base = smem0 + ((lane & 15) * L::QS + (lane >> 4) * 8) * 2;
  const unsigned int k_base =
      L::TMA ? sK0 + (warp * KW + (lane & 7) + (lane >> 4) * 8) * 128
             : sK0 + ((warp * KW + (lane & 7) + (lane >> 4) * 8) * L::KS + ((lane >> 3) & 1) * 8) * 2;
  const unsigned int v_base =
      L::TMA ? sV0 + (warp * KW + (lane & 7) + ((lane >> 3) & 1) * 8) * 128
             : sV0 + ((warp * KW + (lane & 7) + ((lane >> 3) & 1) * 8) * L::VS + (lane >> 4) * 8) * 2;
  const unsigned int k_x = ((lane >> 3) & 1) ^ (lane & 7);
  const unsigned int v_x = (lane >> 4) ^ (lane & 7);
  // K rows np*16.. of k16 step kk (x4: keys x head-dim chunks); V rows kk*16.. of columns np*16.. (x4.trans)
  auto k_addr = [&](unsigned int soff, int np, int kk) -> unsigned int {
    if constexpr (L::TMA) {
      return k_base + soff + np * 16 * 128 + (kk >> 2) * BN * 128 + ((((2 * kk) & 7) ^ k_x) << 4);
    } else {
      return k_base + soff + (np * 16 * L::KS + kk * 16) * 2;
    }
  };
  auto v_addr = [&](unsigned int soff, int kk, int np) -> unsigned int {
    if constexpr (L::TMA) {
      return v_base + soff + kk * 16 * 128 + (np >> 2) * BN * 128 + ((((2 * np) & 7) ^ v_x) << 4);
    } else {
      return v_base + soff + (kk * 16 * L::VS + np * 16) * 2;
    }
  };

  unsigned int q_frag[Cfg::Q_IN_REGS ? L::KT_QK : 1][4];
  if constexpr (L::MBAR) {
    cp_async_wait<0>();  // Q's group (the only cp.async group) has landed
  } else {
    cp_async_wait<L::STAGES - 1>();  // Q's group has landed
  }
  __syncthreads();  // (bulk: also publishes the mbarriers' initialization to every warp)
  if constexpr (Cfg::Q_IN_REGS) {
#pragma unroll
    for (int kk = 0; kk < L::KT_QK; ++kk) ldmatrix_x4(q_frag[kk], q_base + kk * 16 * 2);
  }

  int j = kv_next_block<BN, DecodeTiles>(my_begin, my_end, b, h0, R0, nrows, p, buf);
  int stage = 0;                   // stage of tile j
  int load_stage = L::STAGES - 1;  // stage the next load goes to
  unsigned int phases = 0;         // bulk: bit s = parity of the next phase of stage s's mbarrier
  while (j < my_end) {
    // Tile j has landed; every warp is done with the previous tile's stage, which the load below refills.
    if constexpr (L::MBAR) {
      bulk_mbar_wait<>(bar0 + 8 * stage, (phases >> stage) & 1u);
      phases ^= 1u << stage;
      __syncthreads();
      if (mbar_issuer && j_load < my_end) {  // (bulk: warp-uniform)
        // The stage's last readers (ldmatrix, generic proxy) are ordered before the refill (async
        // proxy) by the barrier above and this fence.
        bulk_fence_proxy_async_smem<>();
        load_next_mbar(load_stage);
      }
    } else {
      cp_async_wait<L::STAGES - 2>();
      __syncthreads();
      load_next_cp_async(load_stage);
    }
    load_stage = (load_stage + 1 == L::STAGES) ? 0 : load_stage + 1;

    const int kv0 = j * BN + warp * KW;  // this warp's first key
    const unsigned int soff = stage * L::kStageBytes;
    int tile = AC_TILE_FULL;
    if constexpr (Variant::kHasMask) tile = DecodeTiles::tile_class(b, h0, R0, nrows, j * BN, min(j * BN + BN, p.Nk) - 1, p, buf);
    // Every variant masks keys >= Nk of the last tile (zero-filled rows with cp_async, copies of row
    // Nk - 1 with bulk): the Nk test below does not depend on the variant's mask.
    const bool need_mask = (tile != AC_TILE_FULL) || (j * BN + BN > p.Nk);

    // S = Q K^T for this warp's KW keys.
    float acc_s[L::NT_S][4];
#pragma unroll
    for (int kk = 0; kk < L::KT_QK; ++kk) {
      unsigned int a[4];
      if constexpr (Cfg::Q_IN_REGS) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = q_frag[kk][e];
      } else {
        ldmatrix_x4(a, q_base + kk * 16 * 2);
      }
#pragma unroll
      for (int np = 0; np < L::NT_S / 2; ++np) {
        unsigned int bk[4];
        ldmatrix_x4(bk, k_addr(soff, np, kk));
        if (kk == 0) {
          mma_16816_zc<Tr::kIsBf16>(acc_s[2 * np], a, bk[0], bk[1]);
          mma_16816_zc<Tr::kIsBf16>(acc_s[2 * np + 1], a, bk[2], bk[3]);
        } else {
          mma_16816<Tr::kIsBf16>(acc_s[2 * np], a, bk[0], bk[1]);
          mma_16816<Tr::kIsBf16>(acc_s[2 * np + 1], a, bk[2], bk[3]);
        }
      }
    }

    // score_mod, mask, online-softmax statistics (log2 domain).
    float m_ref[2], alpha[2];
    bool changed = false;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int nt = 0; nt < L::NT_S; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kv_idx = kv0 + nt * 8 + 2 * t + e;
          float x = acc_s[nt][2 * hf + e];
          if constexpr (Variant::kHasScoreMod) {
            x = Variant::score_mod_log2(x, b, row_h[hf], row_q[hf], kv_idx, p, buf);
          }
          if (need_mask) {
            bool visible = kv_idx < p.Nk;
            if constexpr (Variant::kHasMask) visible = visible && Variant::mask(b, row_h[hf], row_q[hf], kv_idx, p, buf);
            if (!visible) x = AC_NEG_INF;
          }
          acc_s[nt][2 * hf + e] = x;
        }
      }
      float m = AC_NEG_INF;
#pragma unroll
      for (int nt = 0; nt < L::NT_S; ++nt) m = fmaxf(m, fmaxf(acc_s[nt][2 * hf], acc_s[nt][2 * hf + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float m_old = row_max[hf];
      const float m_new = fmaxf(m_old, m * exp_scale);
      m_ref[hf] = (m_new == AC_NEG_INF) ? 0.f : m_new;  // exp2(-inf - 0) = 0, never NaN
      alpha[hf] = fast_exp2(m_old - m_ref[hf]);
      changed = changed || (m_new != m_old);
      row_max[hf] = m_new;
      row_sum[hf] *= alpha[hf];
    }
    if (__any_sync(0xffffffffu, changed)) {
#pragma unroll
      for (int nt = 0; nt < L::NT_O; ++nt) {
        acc_o[nt][0] *= alpha[0];
        acc_o[nt][1] *= alpha[0];
        acc_o[nt][2] *= alpha[1];
        acc_o[nt][3] *= alpha[1];
      }
    }

    // P = exp2(S - m) (summed into l before dropout), dropout, O += P V.
#pragma unroll
    for (int kk = 0; kk < L::KT_PV; ++kk) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float* c = acc_s[2 * kk + n];
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = fast_exp2(fmaf(c[e], exp_scale, -m_ref[e >> 1]));
        row_sum[0] += c[0] + c[1];
        row_sum[1] += c[2] + c[3];
        if constexpr (Variant::kHasDropout) {
          // Rows are (head, query) pairs, so the four elements of a thread need not share a Philox
          // counter: one call per element (docs/architecture.md's stream, element by element).
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kv_idx = kv0 + (2 * kk + n) * 8 + 2 * t + (e & 1);
            const bool keep = ac_dropout_keep(p, b, row_h[e >> 1], row_q[e >> 1], kv_idx);
            c[e] *= keep ? p.dropout_rescale : 0.f;
          }
        }
      }
      unsigned int a[4];
      a[0] = Tr::pack2(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      a[1] = Tr::pack2(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      a[2] = Tr::pack2(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      a[3] = Tr::pack2(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
#pragma unroll
      for (int np = 0; np < L::NT_O / 2; ++np) {
        unsigned int bv[4];
        ldmatrix_x4_trans(bv, v_addr(soff, kk, np));
        mma_16816<Tr::kIsBf16>(acc_o[2 * np], a, bv[0], bv[1]);
        mma_16816<Tr::kIsBf16>(acc_o[2 * np + 1], a, bv[2], bv[3]);
      }
    }

    stage = (stage + 1 == L::STAGES) ? 0 : stage + 1;
    j = kv_next_block<BN, DecodeTiles>(j + 1, my_end, b, h0, R0, nrows, p, buf);
  }

  // Merge the warps' (m, l, O) through shared memory (aliasing the K/V stages: drain every copy first).
  // Bulk / TMA: every issued tile was consumed (and its mbarrier waited on) by the loop, so no copy is
  // in flight; the mbarriers lie past the stages and are not overwritten.
  if constexpr (!L::MBAR) cp_async_wait<0>();
  __syncthreads();
  float* sO = reinterpret_cast<float*>(smem_raw + (sK0 - smem_u32(smem_raw)));  // [W][BM][OS], over the stages
  float* sM = sO + L::W * L::BM * L::OS;                         // [W][BM]
  float* sL = sM + L::W * L::BM;                                 // [W][BM]
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = row_sum[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = g + 8 * hf;
#pragma unroll
    for (int nt = 0; nt < L::NT_O; ++nt) {
      *reinterpret_cast<float2*>(sO + (warp * L::BM + r) * L::OS + nt * 8 + 2 * t) =
          make_float2(acc_o[nt][2 * hf], acc_o[nt][2 * hf + 1]);
    }
    if (t == 0) {
      sM[warp * L::BM + r] = row_max[hf];
      sL[warp * L::BM + r] = l;
    }
  }
  __syncthreads();

  // Each thread: one row and 8 consecutive columns at a time.
  constexpr int kColChunks = DV / 8;
  const bool direct = dp.num_splits == 1;
  const long long part_rows = (long long)dp.total_rows;
  for (int c = tid; c < L::BM * kColChunks; c += L::NTHREADS) {
    const int r = c / kColChunks;
    const int c0 = (c % kColChunks) * 8;
    if (r >= nrows) continue;
    float m = AC_NEG_INF;
#pragma unroll
    for (int w = 0; w < L::W; ++w) m = fmaxf(m, sM[w * L::BM + r]);
    float o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float l = 0.f;
    if (m != AC_NEG_INF) {
#pragma unroll
      for (int w = 0; w < L::W; ++w) {
        const float sc = fast_exp2(sM[w * L::BM + r] - m);  // a warp still at -inf: 0
        l += sc * sL[w * L::BM + r];
        const float4 x0 = *reinterpret_cast<const float4*>(sO + (w * L::BM + r) * L::OS + c0);
        const float4 x1 = *reinterpret_cast<const float4*>(sO + (w * L::BM + r) * L::OS + c0 + 4);
        o[0] += sc * x0.x; o[1] += sc * x0.y; o[2] += sc * x0.z; o[3] += sc * x0.w;
        o[4] += sc * x1.x; o[5] += sc * x1.y; o[6] += sc * x1.z; o[7] += sc * x1.w;
      }
    }
    const float inv = (l > 0.f) ? 1.f / l : 0.f;
    const float lse = (l > 0.f && m != AC_NEG_INF) ? (m + __log2f(l)) * AC_LN2 : AC_NEG_INF;
    const int R = R0 + r;
    const int h = h0 + R / p.Nq;
    const int qi = R % p.Nq;
    const long long row = ((long long)b * p.H + h) * p.Nq + qi;
    if (direct) {
      T* gO = reinterpret_cast<T*>(p.o) + b * p.o_sb + (long long)h * p.o_sh + (long long)qi * p.o_sn + c0;
      uint4 v;
      v.x = Tr::pack2(o[0] * inv, o[1] * inv);
      v.y = Tr::pack2(o[2] * inv, o[3] * inv);
      v.z = Tr::pack2(o[4] * inv, o[5] * inv);
      v.w = Tr::pack2(o[6] * inv, o[7] * inv);
      *reinterpret_cast<uint4*>(gO) = v;
      if (c0 == 0 && p.lse != nullptr) p.lse[row] = lse;
    } else {
      float* wO = p.workspace + ((long long)split * part_rows + row) * DV + c0;
      *reinterpret_cast<float4*>(wO) = make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
      *reinterpret_cast<float4*>(wO + 4) = make_float4(o[4] * inv, o[5] * inv, o[6] * inv, o[7] * inv);
      if (c0 == 0) p.workspace[(long long)dp.num_splits * part_rows * DV + (long long)split * part_rows + row] = lse;
    }
  }
  if constexpr (Cfg::FOLD_COMBINE) {
    if (!direct) decode_fold_tail<Cfg>(p, dp, b, h0, R0, nrows);
  }
}
}  // namespace ac
