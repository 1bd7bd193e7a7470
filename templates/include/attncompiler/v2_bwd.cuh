// attncompiler/v2_bwd.cuh -- FlashAttention-2 style backward (sm_80+, mma.sync m16n8k16).
//
// Three kernels (docs/architecture.md, "Backward"):
//
// v2_bwd_pre   DV / 8 lanes (rounded up to a power of two) per query row: lse2 = lse * log2(e) (+inf for
//              an empty row, so that every recomputed P of it is 0) and dsum = rowsum(dO * O) - dlse,
//              into row-padded fp32 arrays (padded rows: lse2 = +inf, dsum = 0, so the main loop never
//              bounds-checks).
//
// v2_bwd_kv    grid (ceil(Nk / BLOCK_N), H_kv, B). A CTA owns BLOCK_N keys of one (b, kv head)
//              and keeps their dK and dV in registers while it walks the query blocks (BLOCK_M
//              rows) of every query head of the group. Per query block, with the keys as the mma's
//              M dimension ("transposed" products):
//                S^T  = K Q^T                     (A = K rows, B = Q rows)
//                P^T  = exp2(score_mod(scale S^T) log2 e - lse2)      masked -> 0
//                dP^T = V dO^T
//                dS^T = P^T o (z dP^T - dsum) o score_mod'(scale S^T) * scale   (z: dropout keep / (1-p))
//                dV  += (z P^T) dO                (B = dO via ldmatrix.trans)
//                dK  += dS^T Q                    (B = Q via ldmatrix.trans)
//                atomic mode: dQ_blk = dS K over a WQM x WQN warp grid (dS^T from shared memory),
//                added into the fp32 accumulator with reds.
//              Two warp layouts (the planner's choice):
//                v2_bwd_kv     1-D: each warp owns 16 * MTK keys for every product; P^T and dS^T
//                              are register A operands (no round trip through shared memory for
//                              dK / dV); every warp reads all of Q and dO twice per step. kDoDV /
//                              kDoDK split the work in two launches for head dims whose dK + dV do
//                              not fit in registers together.
//                v2_bwd_kv_2d  2-D (FlashAttention-2's; v2_bwd_2d.cuh): S^T / dP^T on a WKS x WQS
//                              grid (both mma operands reused across the warp's tile), z P^T and dS^T through
//                              shared memory, dK / dV on a WKV x WCV grid (keys x columns); about
//                              15 % fewer shared-memory bytes per mma at D = 128.
//              Q / dO / lse2 / dsum tiles are double-buffered (cp.async of block i+1 during block i).
//              Query blocks the mask's tile classifier proves EMPTY are skipped; FULL tiles inside
//              both sequences run without mask code.
//
// v2_bwd_dq    (deterministic dQ, v2_bwd_dq.cuh) grid (ceil(Nq / BLOCK_M), H, B): forward-like, each warp owns
//              16 * MT query rows; per key tile S = Q K^T, dP = dO V^T, dS, dQ += dS K with dQ in
//              registers; written once in the element type. No atomics: bit-identical run to run.
//
// Dropout replays the forward's Philox stream (philox.cuh): in v2_bwd_dq the thread's four
// accumulator values are exactly one Philox call, as in the forward; in the transposed v2_bwd_kv a
// call at (q, k) serves (q, k) and (q + 8, k) of the same thread (two n8 tiles of queries).
//
// Requires (from the prelude): ac_elem_t, AttnParams, AttnBwdParams, AttnBuffers, Variant (with
// score_mod_grad and kScoreModGradIsOne). The preprocess kernel and the elementwise code it shares with the v3
// backward are in v2_bwd_common.cuh.
#pragma once

#include "attncompiler/ranges.cuh"
#include "attncompiler/v2_bwd_common.cuh"

namespace ac {

// ------------------------------------------------------------------------------------ dK / dV
template <class Cfg>
struct V2BwdLayout {
  static constexpr int D = Cfg::D;
  static constexpr int DV = Cfg::DV;
  static constexpr int BM = Cfg::BLOCK_M;   // query rows per step
  static constexpr int BN = Cfg::BLOCK_N;   // keys per CTA
  static constexpr int W = Cfg::NUM_WARPS;
  static constexpr int MTK = Cfg::MTK;      // m16 key tiles per warp
  static constexpr int STAGES = Cfg::STAGES;
  static constexpr int WQM = Cfg::DQ_WARPS_M;
  static constexpr int WQN = Cfg::DQ_WARPS_N;
  static constexpr int NTHREADS = 32 * W;
  static constexpr int KS = D + 8;          // padded row strides (elements)
  static constexpr int VS = DV + 8;
  static constexpr int SS = BM + 8;         // dS^T rows (one per key)
  static constexpr int NT_Q = BM / 8;       // n8 tiles of queries in S^T
  static constexpr int RQ = BM / WQM;       // dQ rows per warp
  static constexpr int CQ = D / WQN;        // dQ columns per warp
  static constexpr int MTQ = RQ / 16;
  static constexpr int NTQ = CQ / 8;
  static constexpr int kKBytes = BN * KS * 2;
  static constexpr int kVBytes = BN * VS * 2;
  static constexpr int kQBytes = BM * KS * 2;
  static constexpr int kDOBytes = BM * VS * 2;
  static constexpr int kRowBytes = BM * 4;
  static constexpr int kStageBytes = kQBytes + kDOBytes + 2 * kRowBytes;
  static constexpr int kSBytes = BN * SS * 2;
  // DS_TILES BN x BM tiles after the stages. 2: 2-D layout, z P^T and dS^T; 1-D layout, dS^T
  // double-buffered (kDqDefer: the dQ product of step i runs in step i + 1, one barrier per step;
  // otherwise the second is unused). 1: the split (dV, dK) launches.
  // DQ_STAGE (2-D layout): each warp stages its RQ x CQ fp32 dQ tile (row stride CQ + 4) and adds
  // it with 16-byte reds that cover whole CQ*4-byte row segments (fewer, fuller L2 requests).
  static constexpr bool kDqStage = Cfg::DQ_STAGE != 0;
  static constexpr bool kDqBulk = Cfg::DQ_STAGE == 2;  // sm_90: cp.reduce.async.bulk per staged row
  static constexpr int kStageRowF = Cfg::D / Cfg::DQ_WARPS_N + 4;
  // reserved by the planner's formula in non-split plans with D % 128 == 0: BM * (D + D/8) fp32
  static constexpr int kDqStageBytes = (Cfg::DS_TILES == 2 && D % 128 == 0) ? BM * (D + D / 8) * 4 : 0;
  static constexpr int kSmemBytes = kKBytes + kVBytes + STAGES * kStageBytes + Cfg::DS_TILES * kSBytes + kDqStageBytes;

  // 2-D layout (kLayout2d): S^T / dP^T on a WKS x WQS warp grid (MTS m16 key tiles x NTS n8 query
  // tiles per warp), dK / dV on a WKV x WCV grid (MTV m16 key tiles x NTK / NTV n8 column tiles).
  static constexpr bool kLayout2d = Cfg::LAYOUT_2D;
  static constexpr int WKS = kLayout2d ? Cfg::S_WARPS_K : 1;
  static constexpr int WQS = W / WKS;
  static constexpr int MTS = BN / (16 * WKS);
  static constexpr int NTS = BM / (8 * WQS);
  static constexpr int WKV = kLayout2d ? Cfg::KV_WARPS_K : 1;
  static constexpr int WCV = W / WKV;
  static constexpr int MTV = BN / (16 * WKV);
  static constexpr int NTK = D / (8 * WCV);
  static constexpr int NTV = DV / (8 * WCV);
  static constexpr int RED_VEC = Cfg::DQ_RED_VEC;
  static constexpr bool kDqDefer = Cfg::DQ_DEFER;
  // 2-D layout with the same key split in both grids: each warp's own S^T tile is the slice
  // q_s.. of its dK/dV reduction, which it takes from registers before the barrier.
  static constexpr bool kRegHalf = kLayout2d && Cfg::REG_HALF;

  static_assert(BN == 16 * MTK * W, "BLOCK_N = 16 * MTK * NUM_WARPS (each warp owns 16*MTK keys)");
  static_assert(MTK == 1 || MTK == 2, "MTK is 1 or 2");
  static_assert(!kLayout2d || (WKS * WQS == W && MTS * 16 * WKS == BN && NTS * 8 * WQS == BM && NTS % 2 == 0),
                "2-D layout: the S^T warp grid must tile BLOCK_N x BLOCK_M in 16 x 16");
  static_assert(!kLayout2d || (WKV * WCV == W && MTV * 16 * WKV == BN && NTK * 8 * WCV == D && NTK % 2 == 0 &&
                               NTV * 8 * WCV == DV && NTV % 2 == 0),
                "2-D layout: the dK/dV warp grid must tile BLOCK_N x D and BLOCK_N x DV in 16 x 16");
  static_assert(RED_VEC == 2 || RED_VEC == 4, "dQ reds are 8 or 16 bytes");
  static_assert(!kRegHalf || WKS == WKV, "reg_half needs the same key split for S^T and dK/dV");
  static_assert(!kDqStage || (kLayout2d && CQ >= 32 && 32 % (CQ / 4) == 0 && (RQ * CQ / 4) % 32 == 0 &&
                              W * RQ * kStageRowF * 4 <= kDqStageBytes),
                "staged dQ: 2-D layout, CQ >= 32 columns per warp, CQ/4 lanes per row dividing 32");
  static_assert(Cfg::DS_TILES == 2 || (Cfg::DS_TILES == 1 && !kLayout2d && !kDqDefer), "2-D / deferred dQ need 2 tiles");
  static_assert(BM % 16 == 0, "BLOCK_M must be a multiple of 16");
  static_assert(D % 16 == 0 && DV % 16 == 0 && D <= 256 && DV <= 256, "head dims: multiples of 16, <= 256");
  static_assert(STAGES == 2, "Q/dO tiles are double-buffered");
  static_assert(WQM * WQN == W && RQ % 16 == 0 && CQ % 16 == 0, "dQ warp grid must tile BLOCK_M x D in 16x16");
};

template <class Cfg, bool kDoDV, bool kDoDK, bool kDQAtomic>
struct V2BwdKvCta {
  using L = V2BwdLayout<Cfg>;
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  static constexpr int MTK = L::MTK, NT_Q = L::NT_Q;

  float acc_dk[kDoDK ? MTK : 1][kDoDK ? L::D / 8 : 1][4];
  float acc_dv[kDoDV ? MTK : 1][kDoDV ? L::DV / 8 : 1][4];

  // out[MTK][NT][4] += X^T-accumulators (keys x queries, C layout) x rows of B (queries x NT*8 cols)
  // at b_addr (ldmatrix.trans). kStore: also stores X (element type) to the transposed dS buffer at
  // the shared byte address s_addr (the warp's first key row).
  template <int NT, int BS, bool kStore>
  __device__ __forceinline__ void acc_product(float (&out)[MTK][NT][4], const float (&x)[MTK][NT_Q][4],
                                              unsigned int b_addr, unsigned int s_addr) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int kq = 0; kq < NT_Q / 2; ++kq) {
      unsigned int a[MTK][4];
#pragma unroll
      for (int mt = 0; mt < MTK; ++mt) {
        a[mt][0] = Tr::pack2(x[mt][2 * kq][0], x[mt][2 * kq][1]);
        a[mt][1] = Tr::pack2(x[mt][2 * kq][2], x[mt][2 * kq][3]);
        a[mt][2] = Tr::pack2(x[mt][2 * kq + 1][0], x[mt][2 * kq + 1][1]);
        a[mt][3] = Tr::pack2(x[mt][2 * kq + 1][2], x[mt][2 * kq + 1][3]);
        if constexpr (kStore) {
          const unsigned int r0 = s_addr + ((mt * 16 + g) * L::SS + kq * 16 + 2 * t) * 2;
          st_shared_u32(r0, a[mt][0]);
          st_shared_u32(r0 + 8 * L::SS * 2, a[mt][1]);
          st_shared_u32(r0 + 16, a[mt][2]);
          st_shared_u32(r0 + 8 * L::SS * 2 + 16, a[mt][3]);
        }
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned int bv[4];
        ldmatrix_x4_trans(bv, b_addr + (kq * 16 * BS + np * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < MTK; ++mt) {
          mma_16816<Tr::kIsBf16>(out[mt][2 * np], a[mt], bv[0], bv[1]);
          mma_16816<Tr::kIsBf16>(out[mt][2 * np + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }

  // P^T and dS^T of one step, in place (acc_s -> z P^T, acc_dp -> dS^T * scale).
  template <bool kMasked>
  __device__ __forceinline__ void elementwise(float (&acc_s)[MTK][NT_Q][4], float (&acc_dp)[MTK][NT_Q][4],
                                              const float* s_lse2, const float* s_dsum, int key0, int q0, int b,
                                              int h, float scale_log2, const AttnParams& p, const AttnBuffers& buf) {
    bwd_tile_elementwise<MTK, NT_Q, kMasked, kDoDK>(acc_s, acc_dp, s_lse2, s_dsum, key0, q0, b, h, scale_log2, p, buf);
  }
};

// dQ_blk (BM x D) = dS (BM x BN) K (BN x D) from the transposed dS tile at s_ds (keys x queries,
// row stride SS) and the K tile, added into the fp32 accumulator rows q0.. of gdq (row stride D).
// Warp (wm, wn) of the WQM x WQN grid owns rows wm*RQ.., columns wn*CQ...
template <class L>
__device__ __forceinline__ void dq_product_red(unsigned int s_ds, unsigned int s_k, float* gdq, int q0, int nq,
                                               int warp, unsigned int s_stage = 0) {
  constexpr int VEC = L::RED_VEC;
  const int wm = warp / L::WQN;
  const int wn = warp % L::WQN;
  float acc_q[L::MTQ][L::NTQ][4];
  mma_ab<L::MTQ, L::NTQ, L::BN / 16, L::SS, L::KS, true, true, true>(
      acc_q, s_ds + wm * L::RQ * 2 + ldsm_a_lane_off<true, L::SS>(), s_k + wn * L::CQ * 2 + ldsm_b_lane_off<true, L::KS>());
  if constexpr (L::kDqStage) {
    constexpr int RS = L::kStageRowF;        // staged row stride (floats)
    constexpr int LPR = L::CQ / 4;           // lanes per row (16 bytes each)
    constexpr int RPI = 32 / LPR;            // rows per red instruction
    const int lane = threadIdx.x & 31;
    const unsigned int wbase = s_stage + warp * L::RQ * RS * 4;
    const unsigned int wr = wbase + ((lane >> 2) * RS + 2 * (lane & 3)) * 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (L::kDqBulk) bulk_wait_read_all();  // this lane's bulk reduce of the previous step has read its row
#endif
    __syncwarp();  // the previous step's reads of this buffer are done
#pragma unroll
    for (int mq = 0; mq < L::MTQ; ++mq)
#pragma unroll
      for (int nt = 0; nt < L::NTQ; ++nt) {
        st_shared_f32x2(wr + (mq * 16 * RS + nt * 8) * 4, acc_q[mq][nt][0], acc_q[mq][nt][1]);
        st_shared_f32x2(wr + ((mq * 16 + 8) * RS + nt * 8) * 4, acc_q[mq][nt][2], acc_q[mq][nt][3]);
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (L::kDqBulk) {
      // The staged tile's rows are contiguous CQ*4-byte segments of dQ: one bulk reduce (TMA) per
      // row, issued by lane r for row r, with no register operands and no LSU queue entries.
      bulk_fence_proxy_async_smem();
      __syncwarp();
#pragma unroll
      for (int r0 = 0; r0 < L::RQ; r0 += 32) {
        const int r = r0 + lane;
        const int row = q0 + wm * L::RQ + r;
        if (r < L::RQ && row < nq) {
          bulk_reduce_add_f32(gdq + (long long)row * L::D + wn * L::CQ, wbase + r * RS * 4, L::CQ * 4);
        }
      }
      bulk_commit();
      return;
    }
#endif
    __syncwarp();
    const int rr = lane / LPR;
    const int ch = lane % LPR;
    const unsigned int rd = wbase + (rr * RS + ch * 4) * 4;
    const int row0 = q0 + wm * L::RQ + rr;
    float* lp = gdq + (long long)row0 * L::D + wn * L::CQ + ch * 4;
#pragma unroll
    for (int i = 0; i < L::RQ / RPI; ++i) {
      float v[4];
      ld_shared_f32x4(rd + i * RPI * RS * 4, v);
      if (q0 + L::BM <= nq || row0 + i * RPI < nq) red_add_f32x4(lp + i * RPI * L::D, v[0], v[1], v[2], v[3]);
    }
    return;
  }
  const int lrow = q0 + wm * L::RQ + atomic_add_lane_row<VEC>();
  float* lp = gdq + (long long)lrow * L::D + wn * L::CQ + atomic_add_lane_col<VEC>();
  if (q0 + L::BM <= nq) {
#pragma unroll
    for (int mq = 0; mq < L::MTQ; ++mq)
#pragma unroll
      for (int nt = 0; nt < L::NTQ; ++nt)
        atomic_add_c_tile<VEC, false>(lp + mq * 16 * L::D + nt * 8, L::D, 0, 0, acc_q[mq][nt]);
  } else {
#pragma unroll
    for (int mq = 0; mq < L::MTQ; ++mq)
#pragma unroll
      for (int nt = 0; nt < L::NTQ; ++nt)
        atomic_add_c_tile<VEC, true>(lp + mq * 16 * L::D + nt * 8, L::D, lrow + mq * 16, nq, acc_q[mq][nt]);
  }
}

// Where a dK/dV CTA (v2_bwd_kv, v2_bwd_kv_2d) and its thread stand: K/V block kv_block = blockIdx.x
// of batch b and K/V head h_kv (ac_grid_bh() = b * H_kv + h_kv), reduced over the group's G = H / H_kv
// query heads; its keys [kv0, kv_hi] (kv_rows of them: BN, fewer in the ragged last block) and their
// K and V rows gK, gV in global memory; the thread's warp, lane and mma fragment row g / column t.
struct V2BwdKvPos {
  int kv_block, b, h_kv, G, kv0, kv_rows, kv_hi, tid, warp, lane, g, t;
  const ac_elem_t* gK;
  const ac_elem_t* gV;
};

template <int BN>
__device__ __forceinline__ V2BwdKvPos v2_bwd_kv_pos(const AttnParams& p) {
  using T = ac_elem_t;
  V2BwdKvPos c;
  c.kv_block = blockIdx.x;
  c.b = ac_grid_b();  // (grid (key blocks, H_kv, B))
  c.h_kv = ac_grid_h();
  c.G = p.H / p.H_kv;
  c.tid = threadIdx.x;
  c.warp = c.tid >> 5;
  c.lane = c.tid & 31;
  c.g = c.lane >> 2;
  c.t = c.lane & 3;
  c.kv0 = c.kv_block * BN;
  c.kv_rows = min(BN, p.Nk - c.kv0);
  c.kv_hi = c.kv0 + c.kv_rows - 1;
  c.gK = reinterpret_cast<const T*>(p.k) + c.b * p.k_sb + c.h_kv * p.k_sh + (long long)c.kv0 * p.k_sn;
  c.gV = reinterpret_cast<const T*>(p.v) + c.b * p.v_sb + c.h_kv * p.v_sh + (long long)c.kv0 * p.v_sn;
  return c;
}

template <class Cfg, bool kDoDV, bool kDoDK, bool kDQAtomic>
__device__ __forceinline__ void v2_bwd_kv(const AttnParams& p, const AttnBwdParams& bp, const AttnBuffers& buf) {
  using L = V2BwdLayout<Cfg>;
  using T = ac_elem_t;
  using Tr = ac_type_traits<T>;
  using Cta = V2BwdKvCta<Cfg, kDoDV, kDoDK, kDQAtomic>;
  constexpr int BM = L::BM, BN = L::BN, MTK = L::MTK, D = L::D, DV = L::DV, NT_Q = L::NT_Q;
  static_assert(kDoDV || kDoDK, "nothing to compute");
  static_assert(!kDQAtomic || kDoDK, "dQ needs dS (the dK pass)");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const unsigned int smem0 = smem_u32(smem_raw);
  const unsigned int sK = smem0;
  const unsigned int sV = sK + L::kKBytes;
  const unsigned int sStage0 = sV + L::kVBytes;        // stage s at sStage0 + s * kStageBytes: Q, dO, lse2, dsum
  const unsigned int sS = sStage0 + L::STAGES * L::kStageBytes;

  const V2BwdKvPos pos = v2_bwd_kv_pos<BN>(p);
  const int kv_block = pos.kv_block, b = pos.b, h_kv = pos.h_kv, G = pos.G, kv0 = pos.kv0, kv_rows = pos.kv_rows;
  const int kv_hi = pos.kv_hi, tid = pos.tid, warp = pos.warp, lane = pos.lane, g = pos.g, t = pos.t;

  const int nqb = (p.Nq + BM - 1) / BM;
  const int total = G * nqb;
  // Atomic dQ: CTAs of one head start at different query blocks so that they do not all add into
  // the same dQ rows at once (the order does not matter for atomics).
  const int rot = kDQAtomic ? kv_block % nqb : 0;
  auto coords = [&](int it, int& h, int& q0) {
    const int hg = it / nqb;
    int qb = it - hg * nqb + rot;
    if (qb >= nqb) qb -= nqb;
    h = h_kv * G + hg;
    q0 = qb * BM;
  };
  auto next_it = [&](int it) { return q_walk_next<BM>(it, G, nqb, rot, b, h_kv * G, kv0, kv_hi, p, buf); };
  auto load_stage = [&](int it, unsigned int stage_off) {
    int h, q0;
    coords(it, h, q0);
    const int rows = p.Nq - q0;
    const unsigned int base = sStage0 + stage_off;
    load_tile_rows_async<BM, D, L::KS, L::NTHREADS>(
        base, reinterpret_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (long long)q0 * p.q_sn, p.q_sn, rows, tid);
    load_tile_rows_async<BM, DV, L::VS, L::NTHREADS>(
        base + L::kQBytes, reinterpret_cast<const T*>(bp.dout) + b * bp.do_sb + h * bp.do_sh + (long long)q0 * bp.do_sn,
        bp.do_sn, rows, tid);
    const long long row = (long long)(b * p.H + h) * bp.Nq_pad + q0;
    for (int c = tid; c < BM / 2; c += L::NTHREADS) {  // BM/4 chunks of lse2, then BM/4 of dsum
      const int arr = c / (BM / 4);
      const int cc = c % (BM / 4);
      const float* src = (arr ? bp.dsum : bp.lse2) + row + cc * 4;
      cp_async_16(smem_raw + (base - smem0) + L::kQBytes + L::kDOBytes + arr * L::kRowBytes + cc * 16, src, true);
    }
  };

  // Prologue: K, V and the first query block.
  load_tile_rows_async<BN, D, L::KS, L::NTHREADS>(sK, pos.gK, p.k_sn, kv_rows, tid);
  load_tile_rows_async<BN, DV, L::VS, L::NTHREADS>(sV, pos.gV, p.v_sn, kv_rows, tid);
  int it = next_it(0);
  if (it < total) load_stage(it, 0);
  cp_async_commit();

  Cta st;
  if constexpr (kDoDK) {
#pragma unroll
    for (int mt = 0; mt < MTK; ++mt)
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.acc_dk[mt][nt][e] = 0.f;
  }
  if constexpr (kDoDV) {
#pragma unroll
    for (int mt = 0; mt < MTK; ++mt)
#pragma unroll
      for (int nt = 0; nt < DV / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.acc_dv[mt][nt][e] = 0.f;
  }

  const int kr0 = warp * 16 * MTK;  // this warp's first key (CTA-local)
  // Per-lane ldmatrix bases (bytes, shared state space).
  const unsigned int k_arow = sK + ((kr0 + (lane & 15)) * L::KS + (lane >> 4) * 8) * 2;
  const unsigned int v_arow = sV + ((kr0 + (lane & 15)) * L::VS + (lane >> 4) * 8) * 2;
  const unsigned int bnk_off = ((lane & 7) + (lane >> 4) * 8);       // rows of a non-trans B load
  const unsigned int bnk_col = ((lane >> 3) & 1) * 8;
  const unsigned int btr_row = ((lane & 7) + ((lane >> 3) & 1) * 8); // rows of a trans B load
  const unsigned int btr_col = (lane >> 4) * 8;
  const unsigned int q_brow = sStage0 + (bnk_off * L::KS + bnk_col) * 2;
  const unsigned int do_brow = sStage0 + L::kQBytes + (bnk_off * L::VS + bnk_col) * 2;
  const unsigned int q_btr = sStage0 + (btr_row * L::KS + btr_col) * 2;
  const unsigned int do_btr = sStage0 + L::kQBytes + (btr_row * L::VS + btr_col) * 2;
  const float scale_log2 = p.scale * AC_LOG2E;

  unsigned int stage_off = 0;
  unsigned int ds_buf = 0;       // kDqDefer: byte offset of this step's dS^T buffer
  int prev_h = 0, prev_q0 = -1;  // kDqDefer: the step whose dQ is pending
  while (it < total) {
    const int it_next = next_it(it + 1);
    cp_async_wait<0>();
    __syncthreads();  // this stage landed; every read of the other stage and of dS^T is done
    if (it_next < total) load_stage(it_next, stage_off ^ L::kStageBytes);
    cp_async_commit();

    int h, q0;
    coords(it, h, q0);
    int tile = AC_TILE_FULL;
    if constexpr (Variant::kHasMask) tile = Variant::tile_class(b, h, q0, min(q0 + BM, p.Nq) - 1, kv0, kv_hi, p, buf);
    const bool need_mask = (tile != AC_TILE_FULL) || (q0 + BM > p.Nq) || (kv_rows < BN);
    const float* s_lse2 = reinterpret_cast<const float*>(smem_raw + (sStage0 - smem0) + stage_off + L::kQBytes +
                                                         L::kDOBytes);
    const float* s_dsum = s_lse2 + BM;

    float acc_s[MTK][NT_Q][4];
    float acc_dp[MTK][NT_Q][4];  // dP^T, then dS^T (dead code without kDoDK)
    mma_rows_rows<MTK, NT_Q, D / 16, L::KS, L::KS>(acc_s, k_arow, q_brow + stage_off);
    if constexpr (kDoDK) mma_rows_rows<MTK, NT_Q, DV / 16, L::VS, L::VS>(acc_dp, v_arow, do_brow + stage_off);
    if (need_mask) {
      st.template elementwise<true>(acc_s, acc_dp, s_lse2, s_dsum, kv0 + kr0, q0, b, h, scale_log2, p, buf);
    } else {
      st.template elementwise<false>(acc_s, acc_dp, s_lse2, s_dsum, kv0 + kr0, q0, b, h, scale_log2, p, buf);
    }
    if constexpr (kDoDV) st.template acc_product<DV / 8, L::VS, false>(st.acc_dv, acc_s, do_btr + stage_off, 0u);
    if constexpr (kDoDK) {
      st.template acc_product<D / 8, L::KS, kDQAtomic>(st.acc_dk, acc_dp, q_btr + stage_off,
                                                        sS + ds_buf + kr0 * L::SS * 2);
    }
    if constexpr (kDQAtomic) {
      if constexpr (L::kDqDefer) {
        // dQ of the previous step (its dS^T is in the other buffer, complete since this step's
        // first barrier); this step's dS^T is read in the next step, or after the loop.
        if (prev_q0 >= 0) {
          dq_product_red<L>(sS + (ds_buf ^ L::kSBytes), sK, bp.dq_accum + (long long)(b * p.H + prev_h) * p.Nq * D,
                            prev_q0, p.Nq, warp);
        }
        prev_h = h;
        prev_q0 = q0;
      } else {
        __syncthreads();  // dS^T complete
        dq_product_red<L>(sS, sK, bp.dq_accum + (long long)(b * p.H + h) * p.Nq * D, q0, p.Nq, warp);
      }
    }
    if constexpr (L::kDqDefer) ds_buf ^= L::kSBytes;
    stage_off ^= L::kStageBytes;
    it = it_next;
  }
  if constexpr (kDQAtomic && L::kDqDefer) {
    if (prev_q0 >= 0) {
      __syncthreads();
      dq_product_red<L>(sS + (ds_buf ^ L::kSBytes), sK, bp.dq_accum + (long long)(b * p.H + prev_h) * p.Nq * D,
                        prev_q0, p.Nq, warp);
    }
  }

  // Epilogue: dK and dV rows of this CTA (every row is written, zeros where no query saw the key).
#pragma unroll
  for (int mt = 0; mt < MTK; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = kv0 + kr0 + mt * 16 + g + 8 * hf;
      if (key < p.Nk) {
        if constexpr (kDoDK) {
          T* dst = reinterpret_cast<T*>(bp.dk) + b * bp.dk_sb + h_kv * bp.dk_sh + (long long)key * bp.dk_sn + 2 * t;
#pragma unroll
          for (int nt = 0; nt < D / 8; ++nt) {
            *reinterpret_cast<unsigned int*>(dst + nt * 8) = Tr::pack2(st.acc_dk[mt][nt][2 * hf], st.acc_dk[mt][nt][2 * hf + 1]);
          }
        }
        if constexpr (kDoDV) {
          T* dst = reinterpret_cast<T*>(bp.dv) + b * bp.dv_sb + h_kv * bp.dv_sh + (long long)key * bp.dv_sn + 2 * t;
#pragma unroll
          for (int nt = 0; nt < DV / 8; ++nt) {
            *reinterpret_cast<unsigned int*>(dst + nt * 8) = Tr::pack2(st.acc_dv[mt][nt][2 * hf], st.acc_dv[mt][nt][2 * hf + 1]);
          }
        }
      }
    }
  }
}

}  // namespace ac
