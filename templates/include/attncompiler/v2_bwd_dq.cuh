// attncompiler/v2_bwd_dq.cuh -- the deterministic dQ kernel of the v2 backward (sm_80+, mma.sync).
//
// v2_bwd_dq: grid (ceil(Nq / DQ_BLOCK_M), H, B), forward-like: each warp owns 16 * MT query rows
// and keeps their dQ (MT * D/8 * 4 fp32) in registers while the CTA walks the key tiles that the
// mask's classifier does not prove EMPTY (K/V double-buffered with cp.async). Per tile:
//   S = Q K^T, dP = dO V^T      (rows = queries: the forward's layout, so one Philox call serves
//                                the thread's four accumulator values, exactly as the forward)
//   dS = P o (z dP - dsum) o score_mod' * scale      (bwd_element, v2_bwd.cuh)
//   dQ += dS K                   (A = the dS accumulators, B = K rows via ldmatrix.trans)
// dQ is written once in the element type: no atomics, bit-identical run to run.
//
// Requires v2_bwd.cuh (bwd_element, mma_rows_rows) and the prelude; Cfg supplies D, DV,
// DQ_BLOCK_M, DQ_BLOCK_N, DQ_NUM_WARPS.
#pragma once

#include "attncompiler/ranges.cuh"

namespace ac {

template <class Cfg>
struct V2BwdDqLayout {
  static constexpr int D = Cfg::D;
  static constexpr int DV = Cfg::DV;
  static constexpr int BM = Cfg::DQ_BLOCK_M;
  static constexpr int BN = Cfg::DQ_BLOCK_N;
  static constexpr int W = Cfg::DQ_NUM_WARPS;
  static constexpr int NTHREADS = 32 * W;
  static constexpr int MT = BM / (16 * W);
  static constexpr int KS = D + 8;
  static constexpr int VS = DV + 8;
  static constexpr int NT_S = BN / 8;
  static constexpr int kQBytes = BM * KS * 2;
  static constexpr int kDOBytes = BM * VS * 2;
  static constexpr int kKBytes = BN * KS * 2;
  static constexpr int kStageBytes = BN * (KS + VS) * 2;
  static constexpr int kSmemBytes = kQBytes + kDOBytes + 2 * kStageBytes;
  static_assert(BM % (16 * W) == 0 && (MT == 1 || MT == 2), "each warp owns 16 or 32 query rows");
  static_assert(BN % 16 == 0, "DQ_BLOCK_N must be a multiple of 16");
};

template <class Cfg>
__device__ __forceinline__ void v2_bwd_dq(const AttnParams& p, const AttnBwdParams& bp, const AttnBuffers& buf) {
  using L = V2BwdDqLayout<Cfg>;
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  constexpr int BM = L::BM, BN = L::BN, MT = L::MT, D = L::D, DV = L::DV, NT_S = L::NT_S;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned int smem0 = smem_u32(smem_raw);
  const unsigned int sQ = smem0;
  const unsigned int sdO = sQ + L::kQBytes;
  const unsigned int sK0 = sdO + L::kDOBytes;  // stage s: K at sK0 + s*kStageBytes, V after it
  const unsigned int sV0 = sK0 + L::kKBytes;

  const int q_block = gridDim.x - 1 - blockIdx.x;
  const int b = ac_grid_b();
  const int h = ac_grid_h();
  const int bh = ac_grid_bh();  // b * H + h
  const int h_kv = h / (p.H / p.H_kv);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int q0 = q_block * BM;
  const int q_rows = min(BM, p.Nq - q0);
  const int q_hi = q0 + q_rows - 1;
  const T* gK = reinterpret_cast<const T*>(p.k) + b * p.k_sb + h_kv * p.k_sh;
  const T* gV = reinterpret_cast<const T*>(p.v) + b * p.v_sb + h_kv * p.v_sh;
  const int nblocks = (p.Nk + BN - 1) / BN;
  auto load_kv = [&](int j, unsigned int stage_off) {
    const int rows = p.Nk - j * BN;
    load_tile_rows_async<BN, D, L::KS, L::NTHREADS>(sK0 + stage_off, gK + (long long)j * BN * p.k_sn, p.k_sn, rows, tid);
    load_tile_rows_async<BN, DV, L::VS, L::NTHREADS>(sV0 + stage_off, gV + (long long)j * BN * p.v_sn, p.v_sn, rows, tid);
  };

  load_tile_rows_async<BM, D, L::KS, L::NTHREADS>(
      sQ, reinterpret_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (long long)q0 * p.q_sn, p.q_sn, q_rows, tid);
  load_tile_rows_async<BM, DV, L::VS, L::NTHREADS>(
      sdO, reinterpret_cast<const T*>(bp.dout) + b * bp.do_sb + h * bp.do_sh + (long long)q0 * bp.do_sn, bp.do_sn,
      q_rows, tid);
  int j = kv_next_block<BN>(0, nblocks, b, h, q0, q_hi, p, buf);  // the first block not proven EMPTY
  if (j < nblocks) load_kv(j, 0);
  cp_async_commit();

  const int warp_row0 = warp * 16 * MT;
  const int q_row0 = q0 + warp_row0;
  float lse2[MT][2], dsum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const long long r = (long long)bh * bp.Nq_pad + q_row0 + mt * 16 + g + 8 * hf;  // padded: always in range
      lse2[mt][hf] = bp.lse2[r];
      dsum[mt][hf] = bp.dsum[r];
    }
  float acc_q[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_q[mt][nt][e] = 0.f;

  const unsigned int q_a = sQ + ((warp_row0 + (lane & 15)) * L::KS + (lane >> 4) * 8) * 2;
  const unsigned int do_a = sdO + ((warp_row0 + (lane & 15)) * L::VS + (lane >> 4) * 8) * 2;
  const unsigned int bnk = ((lane & 7) + (lane >> 4) * 8);
  const unsigned int bnk_col = ((lane >> 3) & 1) * 8;
  const unsigned int k_b = sK0 + (bnk * L::KS + bnk_col) * 2;
  const unsigned int v_b = sV0 + (bnk * L::VS + bnk_col) * 2;
  const unsigned int k_btr = sK0 + ((((lane & 7) + ((lane >> 3) & 1) * 8)) * L::KS + (lane >> 4) * 8) * 2;
  const float scale_log2 = p.scale * AC_LOG2E;

  unsigned int stage_off = 0;
  while (j < nblocks) {
    const int j_next = kv_next_block<BN>(j + 1, nblocks, b, h, q0, q_hi, p, buf);
    cp_async_wait<0>();
    __syncthreads();
    if (j_next < nblocks) load_kv(j_next, stage_off ^ L::kStageBytes);
    cp_async_commit();
    const int kv0 = j * BN;
    const int kv_rows = min(BN, p.Nk - kv0);
    int tile = AC_TILE_FULL;
    if constexpr (Variant::kHasMask) tile = Variant::tile_class(b, h, q0, q_hi, kv0, kv0 + kv_rows - 1, p, buf);
    const bool need_mask = (tile != AC_TILE_FULL) || (kv_rows < BN) || (q_rows < BM);

    float acc_s[MT][NT_S][4], acc_dp[MT][NT_S][4];
    mma_rows_rows<MT, NT_S, D / 16, L::KS, L::KS>(acc_s, q_a, k_b + stage_off);
    mma_rows_rows<MT, NT_S, DV / 16, L::VS, L::VS>(acc_dp, do_a, v_b + stage_off);
    // dS (C layout: rows = queries, columns = keys), as the forward's grouping of Philox words.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt) {
        const int qa = q_row0 + mt * 16 + g;
        const int ka = kv0 + nt * 8 + 2 * t;
        ac_u32x4 w;
        if constexpr (Variant::kHasDropout) w = ac_dropout_words(p, b, h, qa, ka);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hf = e >> 1;
          bool keep = true;
          if constexpr (Variant::kHasDropout) {
            const unsigned int word = e == 0 ? w.x : (e == 1 ? w.y : (e == 2 ? w.z : w.w));
            keep = word < p.dropout_threshold;
          }
          if (need_mask) {
            bwd_element<true, true>(acc_s[mt][nt][e], acc_dp[mt][nt][e], b, h, qa + 8 * hf, ka + (e & 1),
                                    lse2[mt][hf], dsum[mt][hf], keep, scale_log2, p, buf);
          } else {
            bwd_element<false, true>(acc_s[mt][nt][e], acc_dp[mt][nt][e], b, h, qa + 8 * hf, ka + (e & 1),
                                     lse2[mt][hf], dsum[mt][hf], keep, scale_log2, p, buf);
          }
        }
      }
    }
    // dQ += dS K: A = the dS accumulators, B = K rows via ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned int a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = Tr::pack2(acc_dp[mt][2 * kk][0], acc_dp[mt][2 * kk][1]);
        a[mt][1] = Tr::pack2(acc_dp[mt][2 * kk][2], acc_dp[mt][2 * kk][3]);
        a[mt][2] = Tr::pack2(acc_dp[mt][2 * kk + 1][0], acc_dp[mt][2 * kk + 1][1]);
        a[mt][3] = Tr::pack2(acc_dp[mt][2 * kk + 1][2], acc_dp[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        unsigned int bk[4];
        ldmatrix_x4_trans(bk, k_btr + stage_off + (kk * 16 * L::KS + np * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Tr::kIsBf16>(acc_q[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_16816<Tr::kIsBf16>(acc_q[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
    stage_off ^= L::kStageBytes;
    j = j_next;
  }
  // Epilogue: dQ rows in the element type.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = q_row0 + mt * 16 + g + 8 * hf;
      if (r < p.Nq) {
        T* dst = reinterpret_cast<T*>(bp.dq) + b * bp.dq_sb + h * bp.dq_sh + (long long)r * bp.dq_sn + 2 * t;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
          *reinterpret_cast<unsigned int*>(dst + nt * 8) = Tr::pack2(acc_q[mt][nt][2 * hf], acc_q[mt][nt][2 * hf + 1]);
        }
      }
    }
  }
}


}  // namespace ac
