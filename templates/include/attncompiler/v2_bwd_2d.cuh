// attncompiler/v2_bwd_2d.cuh -- the 2-D warp layout of the v2 backward's dK / dV kernel (sm_80+, mma.sync).
//
// v2_bwd_kv_2d: FlashAttention-2's layout (v2_bwd.cuh describes the three backward kernels and when the
// planner picks this one). Per query step, S^T / dP^T on a WKS x WQS warp grid (both mma operands
// reused across the warp's tile), z P^T and dS^T through shared memory, then dK / dV on a WKV x WCV grid
// (keys x columns).
//
// Requires v2_bwd.cuh (V2BwdLayout, V2BwdKvPos / v2_bwd_kv_pos, mma_rows_rows, bwd_tile_elementwise,
// dq_product_red) and the prelude.
#pragma once

namespace ac {

// Phase A of one query step of the 2-D layout for this warp: S^T = K Q^T and dP^T = V dO^T on its
// MTS x NTS tile, the elementwise step, z P^T and dS^T to shared memory (p_st / s_st: this lane's
// first element), and (kRegHalf) the warp's own slice of dV += (zP)^T dO, dK += dS^T Q.
// issue_loads() (the next query block's cp.async) runs between the two products.
template <class L, bool kMasked, class F>
__device__ __forceinline__ void v2_bwd_2d_phase_a(float (&acc_dk)[L::MTV][L::NTK][4], float (&acc_dv)[L::MTV][L::NTV][4],
                                                  unsigned int k_a, unsigned int v_a, unsigned int q_b,
                                                  unsigned int do_b, unsigned int q_bt, unsigned int do_bt,
                                                  unsigned int p_st, unsigned int s_st, const float* s_lse2,
                                                  const float* s_dsum, int key0, int q0w, int q_s, int b, int h,
                                                  float scale_log2, const AttnParams& p, const AttnBuffers& buf,
                                                  const F& issue_loads) {
  using Tr = ac_type_traits<ac_elem_t>;
  constexpr int MTS = L::MTS, NTS = L::NTS, KS = L::KS, VS = L::VS, SS = L::SS;
  float acc_s[MTS][NTS][4];
  float acc_dp[MTS][NTS][4];
  mma_ab<MTS, NTS, L::D / 16, KS, KS, false, false, true>(acc_s, k_a, q_b);
  issue_loads();
  mma_ab<MTS, NTS, L::DV / 16, VS, VS, false, false, true>(acc_dp, v_a, do_b);
  bwd_tile_elementwise<MTS, NTS, kMasked, true>(acc_s, acc_dp, s_lse2, s_dsum, key0, q0w, b, h, scale_log2, p, buf);
  unsigned int xp[MTS][NTS][2], xs[MTS][NTS][2];  // element-type pairs: rows g and g + 8 of each n8 tile
#pragma unroll
  for (int mt = 0; mt < MTS; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NTS; ++nt) {
      xp[mt][nt][0] = Tr::pack2(acc_s[mt][nt][0], acc_s[mt][nt][1]);
      xp[mt][nt][1] = Tr::pack2(acc_s[mt][nt][2], acc_s[mt][nt][3]);
      xs[mt][nt][0] = Tr::pack2(acc_dp[mt][nt][0], acc_dp[mt][nt][1]);
      xs[mt][nt][1] = Tr::pack2(acc_dp[mt][nt][2], acc_dp[mt][nt][3]);
      const unsigned int o = (mt * 16 * SS + nt * 8) * 2;
      st_shared_u32(p_st + o, xp[mt][nt][0]);
      st_shared_u32(p_st + o + 8 * SS * 2, xp[mt][nt][1]);
      st_shared_u32(s_st + o, xs[mt][nt][0]);
      st_shared_u32(s_st + o + 8 * SS * 2, xs[mt][nt][1]);
    }
  }
  if constexpr (L::kRegHalf) {
    // This warp's own queries of the dK/dV reduction, from registers, before the barrier.
    mma_regs_a<MTS, L::NTV, NTS / 2, VS>(acc_dv, xp, do_bt + q_s * VS * 2);
    mma_regs_a<MTS, L::NTK, NTS / 2, KS>(acc_dk, xs, q_bt + q_s * KS * 2);
  }
}

// The FlashAttention-2 warp layout: per query block, warp (ws, qs) of a WKS x WQS grid computes
// S^T / dP^T for MTS*16 keys x NTS*8 queries (both operands reused across the warp's tile), the
// elementwise step, and stores z P^T and dS^T (element type) to shared memory; after one barrier,
// warp (wk, wc) of a WKV x WCV grid accumulates dV += (zP)^T dO and dK += dS^T Q for MTV*16 keys x
// D/WCV (DV/WCV) columns, and (atomic mode) the warps compute dQ_blk = dS K as in the 1-D layout.
// Shared-memory bytes per mma are ~15 % lower than the 1-D layout at D = 128 (docs/backward.md).
template <class Cfg, bool kDQAtomic>
__device__ __forceinline__ void v2_bwd_kv_2d(const AttnParams& p, const AttnBwdParams& bp, const AttnBuffers& buf) {
  using L = V2BwdLayout<Cfg>;
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  constexpr int BM = L::BM, BN = L::BN, D = L::D, DV = L::DV;
  constexpr int MTS = L::MTS, NTS = L::NTS, MTV = L::MTV, NTK = L::NTK, NTV = L::NTV;
  constexpr int KS = L::KS, VS = L::VS, SS = L::SS;
  static_assert(L::kLayout2d, "2-D layout config expected");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned int smem0 = smem_u32(smem_raw);
  const unsigned int sK = smem0;
  const unsigned int sV = sK + L::kKBytes;
  const unsigned int sStage0 = sV + L::kVBytes;  // stage s at sStage0 + s * kStageBytes: Q, dO, lse2, dsum
  const unsigned int sP = sStage0 + L::STAGES * L::kStageBytes;
  const unsigned int sS = sP + L::kSBytes;

  const V2BwdKvPos pos = v2_bwd_kv_pos<BN>(p);
  const int kv_block = pos.kv_block, b = pos.b, h_kv = pos.h_kv, G = pos.G, kv0 = pos.kv0, kv_rows = pos.kv_rows;
  const int kv_hi = pos.kv_hi, tid = pos.tid, warp = pos.warp, lane = pos.lane, g = pos.g, t = pos.t;

  const int nqb = (p.Nq + BM - 1) / BM;
  const int rot = kDQAtomic ? kv_block % nqb : 0;  // see v2_bwd_kv
  // The walk over (query head of the group, query block) without divisions: position j of head
  // hg is query block j + rot (mod nqb); hg == G is the end.
  struct Walk {
    int hg, j;
  };
  auto q0_of = [&](const Walk& w) {
    int qb = w.j + rot;
    if (qb >= nqb) qb -= nqb;
    return qb * BM;
  };
  auto advance = [&](Walk w) {
    if (++w.j == nqb) {
      w.j = 0;
      ++w.hg;
    }
    return w;
  };
  auto skip_empty = [&](Walk w) {
    q_walk_skip<BM>(w.hg, w.j, G, nqb, rot, b, h_kv * G, kv0, kv_hi, p, buf);
    return w;
  };
  const T* gQh = reinterpret_cast<const T*>(p.q) + b * p.q_sb + (long long)h_kv * G * p.q_sh;
  const T* gDOh = reinterpret_cast<const T*>(bp.dout) + b * bp.do_sb + (long long)h_kv * G * bp.do_sh;
  const long long row_h = (long long)(b * p.H + h_kv * G) * bp.Nq_pad;
  auto load_stage = [&](const Walk& w, unsigned int stage_off) {
    const int q0 = q0_of(w);
    const unsigned int base = sStage0 + stage_off;
    if (tid < BM / 2) {  // BM/4 16-byte chunks of lse2, then BM/4 of dsum
      const int arr = tid / (BM / 4);
      const int cc = tid % (BM / 4);
      const float* src = (arr ? bp.dsum : bp.lse2) + row_h + (long long)w.hg * bp.Nq_pad + q0 + cc * 4;
      cp_async_16(smem_raw + (base - smem0) + L::kQBytes + L::kDOBytes + arr * L::kRowBytes + cc * 16, src, true);
    }
    const int rows = p.Nq - q0;
    load_tile_rows_async<BM, D, KS, L::NTHREADS>(base, gQh + w.hg * p.q_sh + (long long)q0 * p.q_sn, p.q_sn, rows, tid);
    load_tile_rows_async<BM, DV, VS, L::NTHREADS>(base + L::kQBytes, gDOh + w.hg * bp.do_sh + (long long)q0 * bp.do_sn,
                                                  bp.do_sn, rows, tid);
  };
  static_assert(BM / 2 <= L::NTHREADS, "one thread per lse2 / dsum chunk");

  load_tile_rows_async<BN, D, KS, L::NTHREADS>(sK, pos.gK, p.k_sn, kv_rows, tid);
  load_tile_rows_async<BN, DV, VS, L::NTHREADS>(sV, pos.gV, p.v_sn, kv_rows, tid);
  Walk cur = skip_empty(Walk{0, 0});
  if (cur.hg < G) load_stage(cur, 0);
  cp_async_commit();

  float acc_dk[MTV][NTK][4];
  float acc_dv[MTV][NTV][4];
#pragma unroll
  for (int mt = 0; mt < MTV; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NTK; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][nt][e] = 0.f;
#pragma unroll
    for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[mt][nt][e] = 0.f;
  }

  // Phase A tile of this warp (CTA-local first key / query) and phase B tile (first key / column).
  const int key_s = (warp % L::WKS) * 16 * MTS;
  const int q_s = (warp / L::WKS) * 8 * NTS;
  const int key_v = (warp % L::WKV) * 16 * MTV;
  const int col_v = warp / L::WKV;  // column block: NTK*8 columns of dK, NTV*8 of dV
  // Per-lane ldmatrix bases (bytes, shared state space); stage-relative ones get + stage_off.
  const unsigned int k_a = sK + key_s * KS * 2 + ldsm_a_lane_off<false, KS>();
  const unsigned int v_a = sV + key_s * VS * 2 + ldsm_a_lane_off<false, VS>();
  const unsigned int q_b = sStage0 + q_s * KS * 2 + ldsm_b_lane_off<false, KS>();
  const unsigned int do_b = sStage0 + L::kQBytes + q_s * VS * 2 + ldsm_b_lane_off<false, VS>();
  const unsigned int p_a = sP + key_v * SS * 2 + ldsm_a_lane_off<false, SS>();
  const unsigned int ds_a = sS + key_v * SS * 2 + ldsm_a_lane_off<false, SS>();
  const unsigned int do_bt = sStage0 + L::kQBytes + col_v * NTV * 8 * 2 + ldsm_b_lane_off<true, VS>();
  const unsigned int q_bt = sStage0 + col_v * NTK * 8 * 2 + ldsm_b_lane_off<true, KS>();
  const unsigned int st_off = ((key_s + g) * SS + q_s + 2 * t) * 2;  // this lane's (key g, query 2t) in sP / sS
  const float scale_log2 = p.scale * AC_LOG2E;

  unsigned int stage_off = 0;
  while (cur.hg < G) {
    const Walk nxt = skip_empty(advance(cur));
    cp_async_wait<0>();
    __syncthreads();  // this stage landed; every read of the other stage, of P^T and of dS^T is done
    const int h = h_kv * G + cur.hg;
    const int q0 = q0_of(cur);
    // Loads of the next query block (into the other stage), issued inside phase A after the S^T
    // product so that their address arithmetic overlaps the mma chains.
    auto issue_next = [&]() {
      if (nxt.hg < G) load_stage(nxt, stage_off ^ L::kStageBytes);
      cp_async_commit();
    };
    int tile = AC_TILE_FULL;
    if constexpr (Variant::kHasMask) tile = Variant::tile_class(b, h, q0, min(q0 + BM, p.Nq) - 1, kv0, kv_hi, p, buf);
    const bool need_mask = (tile != AC_TILE_FULL) || (q0 + BM > p.Nq) || (kv_rows < BN);
    const float* s_lse2 = reinterpret_cast<const float*>(smem_raw + (sStage0 - smem0) + stage_off + L::kQBytes +
                                                         L::kDOBytes) + q_s;
    const float* s_dsum = s_lse2 + BM;

    // Phase A in one basic block per mask mode (products, elementwise, stores, own-slice dK/dV).
    if (need_mask) {
      v2_bwd_2d_phase_a<L, true>(acc_dk, acc_dv, k_a, v_a, q_b + stage_off, do_b + stage_off, q_bt + stage_off,
                                 do_bt + stage_off, sP + st_off, sS + st_off, s_lse2, s_dsum, kv0 + key_s, q0 + q_s,
                                 q_s, b, h, scale_log2, p, buf, issue_next);
    } else {
      v2_bwd_2d_phase_a<L, false>(acc_dk, acc_dv, k_a, v_a, q_b + stage_off, do_b + stage_off, q_bt + stage_off,
                                  do_bt + stage_off, sP + st_off, sS + st_off, s_lse2, s_dsum, kv0 + key_s, q0 + q_s,
                                  q_s, b, h, scale_log2, p, buf, issue_next);
    }
    __syncthreads();  // z P^T and dS^T complete
    // dQ first: its reds drain while the dK / dV mma chains run.
    if constexpr (kDQAtomic) {
      dq_product_red<L>(sS, sK, bp.dq_accum + (long long)(b * p.H + h) * p.Nq * D, q0, p.Nq, warp,
                        sS + L::kSBytes);
    }
    if constexpr (L::kRegHalf) {
      // The other warps' queries (same keys) from shared memory.
#pragma unroll
      for (int j = 1; j < L::WQS; ++j) {
        int qj = (warp / L::WKS) + j;
        if (qj >= L::WQS) qj -= L::WQS;
        const int qo = qj * NTS * 8;
        mma_ab<MTV, NTV, NTS / 2, SS, VS, false, true, false>(acc_dv, p_a + qo * 2, do_bt + stage_off + qo * VS * 2);
        mma_ab<MTV, NTK, NTS / 2, SS, KS, false, true, false>(acc_dk, ds_a + qo * 2, q_bt + stage_off + qo * KS * 2);
      }
    } else {
      mma_ab<MTV, NTV, BM / 16, SS, VS, false, true, false>(acc_dv, p_a, do_bt + stage_off);
      mma_ab<MTV, NTK, BM / 16, SS, KS, false, true, false>(acc_dk, ds_a, q_bt + stage_off);
    }
    stage_off ^= L::kStageBytes;
    cur = nxt;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (L::kDqBulk) bulk_wait_all();  // the staged rows must be read before the CTA exits
#endif

  // Epilogue: dK and dV rows of this CTA (every row is written, zeros where no query saw the key).
#pragma unroll
  for (int mt = 0; mt < MTV; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = kv0 + key_v + mt * 16 + g + 8 * hf;
      if (key < p.Nk) {
        T* dk = reinterpret_cast<T*>(bp.dk) + b * bp.dk_sb + h_kv * bp.dk_sh + (long long)key * bp.dk_sn +
                col_v * NTK * 8 + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NTK; ++nt) {
          *reinterpret_cast<unsigned int*>(dk + nt * 8) = Tr::pack2(acc_dk[mt][nt][2 * hf], acc_dk[mt][nt][2 * hf + 1]);
        }
        T* dv = reinterpret_cast<T*>(bp.dv) + b * bp.dv_sb + h_kv * bp.dv_sh + (long long)key * bp.dv_sn +
                col_v * NTV * 8 + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NTV; ++nt) {
          *reinterpret_cast<unsigned int*>(dv + nt * 8) = Tr::pack2(acc_dv[mt][nt][2 * hf], acc_dv[mt][nt][2 * hf + 1]);
        }
      }
    }
  }
}

}  // namespace ac
