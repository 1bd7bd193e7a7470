// attncompiler/v3_bwd_roles.cuh -- the Hopper backward's consumers split by role (DKV_ROLES, head dims above 128).
//
// With DKV_SPLIT (v3_bwd.cuh) both consumer warpgroups own the CTA's 64 keys and each computes S^T, dP^T, P^T and
// dS^T whole: at D = 192, DV = 128 that is 19 GEMM units of 64 x 64 x 64 a step where 13 are needed. Here the two
// warpgroups own the same 64 keys by role, and every product runs once:
//   warpgroup 0 (v3_bwd_role_s):  S^T = K Q^T; waits for dP^T; the elementwise step (bwd_tile_elementwise, as in
//                                 v3_bwd.cuh); P^T and dS^T into tiles; dK += dS^T Q (A: registers, all D columns)
//   warpgroup 1 (v3_bwd_role_dp): dP^T = V dO^T into shared memory (fp32, fragment order: thread t of either
//                                 warpgroup holds the same elements); one step behind, dV += (z P^T) dO (A: the P^T
//                                 tile) and dQ = dS K over all D columns, issued behind the next block's dP^T; dQ
//                                 staged per warp and added chunk by chunk (64 columns), each chunk by one bulk
//                                 reduction into the tiled accumulator (v3_bwd_dq.cuh)
// So warpgroup 0's elementwise step of block i runs under warpgroup 1's dV / dQ products of block i - 1.
// Deterministic dQ (Cfg::DETERMINISTIC): warpgroup 1 alone adds dQ, so it alone takes each block's turn.
//
// Two named barriers per parity (256 threads: one warpgroup arrives, the other syncs), step i using parity i & 1:
//   dp_full(pb): warpgroup 1 has stored dP^T of step i in the dP buffer;
//   ps_full(pb): warpgroup 0 has stored P^T and dS^T of step i in tiles pb.
// Every arrival has its sync (each step one of each), and the buffers need no "free" barriers: warpgroup 1 stores
// dP^T of step i + 1 only after its ps_full(i) sync, which warpgroup 0 arrives after loading dP^T of step i;
// warpgroup 0 overwrites tiles pb at step i + 2 only after its dp_full(i + 2) sync, which warpgroup 1 arrives after
// its step i + 1 turn, whose dV / dQ products of step i have retired (wgmma_wait) by then.
// dQ's staging: each warp of warpgroup 1 stages its chunks in a ring of DQ_STAGES buffers, and waits before staging
// only for the reduction that used the buffer last (DQ_STAGES - 1 others may still be reading theirs).
// Stage release: each thread of both warpgroups arrives once per step on empty[s] (count 256): warpgroup 0 when the
// next step's S^T wait has retired its dK product (Q read), warpgroup 1 when the wait that retires its dV / dQ group
// has passed (dO read).
//
// Requires: v3_bwd_dq.cuh (and what it requires), v2_bwd.cuh's bwd_tile_elementwise, the wgmma wrappers of
// v3_bwd.cu.j2 with DKV_ROLES: ac::wgmma_bwd_s, ac::wgmma_bwd_dk (A registers, N = D), ac::wgmma_bwd_dv (A and B in
// shared memory, A K-major, B MN-major, N = DV), ac::wgmma_bwd_dq (N = 64, and with DQ_WIDE N = D).
#pragma once

#include "attncompiler/v3_bwd_dq.cuh"

namespace ac {

// The backward kernel's shared-memory addresses (V3BwdLayout offsets from the 1024-byte aligned base).
template <class L>
struct V3BwdSmem {
  const unsigned char* gen;  // the generic address of the dynamic shared memory (for the lse2 / dsum rows)
  unsigned int raw;          // its shared-window address
  unsigned int base;         // 1024-byte aligned
  __device__ __forceinline__ unsigned int k() const { return base; }
  __device__ __forceinline__ unsigned int v() const { return base + L::kKBytes; }
  __device__ __forceinline__ unsigned int full(int s) const { return base + L::kBarOffset + 8u * (1 + s); }
  __device__ __forceinline__ unsigned int empty(int s) const {
    return base + L::kBarOffset + 8u * (1 + L::STAGES + s);
  }
  __device__ __forceinline__ unsigned int q(int s) const { return base + L::kStageOffset + s * L::kStageBytes; }
  __device__ __forceinline__ unsigned int dout(int s) const { return q(s) + L::kQBytes; }
  __device__ __forceinline__ const float* lse2(int s) const {
    return reinterpret_cast<const float*>(gen + (base + L::kRowsOffset + s * 2 * L::kRowBytes - raw));
  }
  __device__ __forceinline__ unsigned int ds(int pb) const { return base + L::kDSOffset + pb * L::kDSBytes; }
  __device__ __forceinline__ unsigned int pt(int pb) const { return base + L::kPOffset + pb * L::kDSBytes; }
  __device__ __forceinline__ unsigned int dp() const { return base + L::kDPOffset; }
  // warp w (0..3) of warpgroup 1: its staging buffer n (0 .. DQ_STAGES - 1)
  __device__ __forceinline__ unsigned int dq_stage(int n, int w) const {
    return base + L::kDqStageOffset + (n * 4 + w) * L::kDqWarpStageBytes;
  }
};

constexpr int kRoleBarDpFull = 1;  // + parity
constexpr int kRoleBarPsFull = 3;  // + parity
constexpr int kRoleBarTurn = 5;    // (deterministic dQ: warpgroup 1 alone, 128 threads)

// Timing-only builds (wrong results; `v3_bwd_sweep.py ...:define=NAME`): AC_ROLES_NO_ELEM skips the elementwise step,
// AC_ROLES_NO_DQ_RED dQ's staging and reductions (fifty-first session: what bounds the kernel, docs/perf-notes.md).
#ifdef AC_ROLES_NO_ELEM
constexpr bool kTimingNoElementwise = true;
#else
constexpr bool kTimingNoElementwise = false;
#endif
#ifdef AC_ROLES_NO_DQ_RED
constexpr bool kTimingNoDqRed = true;
#else
constexpr bool kTimingNoDqRed = false;
#endif

// Whether step (h, q0) of the walk takes the masked elementwise code (a partial block, or a tile that is not FULL).
template <int BM, int BN>
__device__ __forceinline__ bool v3_bwd_step_masked(const V3BwdWalk& walk, int h, int q0, const AttnParams& p,
                                                   const AttnBuffers& buf) {
  bool m = (q0 + BM > p.Nq) || (walk.kv0 + BN > p.Nk);
  if constexpr (Variant::kHasMask) {
    m = m || Variant::tile_class(walk.b, h, q0, min(q0 + BM, p.Nq) - 1, walk.kv0, walk.kv_hi, p, buf) != AC_TILE_FULL;
  }
  return m;
}

// This warp's 16 key rows (key0 + g, + 8) of dK or dV (N columns, the wgmma C layout) into the element type at rows
// (row stride sn) of one (batch, kv head); rows past nk are not written.
template <int N>
__device__ __forceinline__ void v3_bwd_store_keys(const float (&acc)[N / 2], ac_elem_t* rows, long long sn, int key0,
                                                  int nk) {
  using Tr = ac_type_traits<ac_elem_t>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = key0 + g + 8 * hf;
    if (key < nk) {
      ac_elem_t* row = rows + (long long)key * sn + 2 * t;
#pragma unroll
      for (int nt = 0; nt < N / 8; ++nt) {
        *reinterpret_cast<unsigned int*>(row + nt * 8) = Tr::pack2(acc[4 * nt + 2 * hf], acc[4 * nt + 2 * hf + 1]);
      }
    }
  }
}

// S^T or dP^T (m64 n64 over the K dimension KD) of one step: A = the 64 rows at a_rows, B = the 64 rows at b_rows
// (both boxes of 64 rows x 128 bytes, K-major), issued as one commit group; v3_bwd_roles_st also waits for it (and
// for every older group of the warpgroup).
template <int KD>
__device__ __forceinline__ void v3_bwd_roles_st_issue(float (&acc)[32], unsigned int a_rows, unsigned int b_rows) {
  const unsigned long long da = opaque_u64(wgmma_desc_sw128(a_rows, 16, 1024));
  const unsigned long long db = opaque_u64(wgmma_desc_sw128(b_rows, 16, 1024));
  reg_fence(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk) {
    const unsigned int off = (kk / 4) * 64 * 128 + (kk % 4) * 32;
    wgmma_bwd_s(acc, da + (off >> 4), db + (off >> 4), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}
template <int KD>
__device__ __forceinline__ void v3_bwd_roles_st(float (&acc)[32], unsigned int a_rows, unsigned int b_rows) {
  v3_bwd_roles_st_issue<KD>(acc, a_rows, b_rows);
  wgmma_wait<0>();
  reg_fence(acc);
}

// Warpgroup 0: S^T, the elementwise step, P^T / dS^T into their tiles, dK.
template <class Cfg>
__device__ __forceinline__ void v3_bwd_role_s(const AttnParams& p, const AttnBwdParams& bp, const AttnBuffers& buf,
                                              const V3BwdWalk& walk, const V3BwdSmem<V3BwdLayout<Cfg>>& sm) {
  using L = V3BwdLayout<Cfg>;
  using Tr = ac_type_traits<ac_elem_t>;
  constexpr int BM = L::BM, BN = L::BN, D = L::D, STAGES = L::STAGES;
  constexpr int NTQ = BM / 8, KQ = BM / 16;
  const int tid = threadIdx.x & 127, warp_wg = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int key0 = walk.kv0 + 16 * warp_wg;  // this warp's first key
  const float scale_log2 = p.scale * AC_LOG2E;
  // dK: the first step's product overwrites it (scale_d 0; zeros after a walk without steps), so no instruction but
  // a wgmma defines it while the previous step's product is in flight across the loop (ptxas C7515 otherwise)
  float acc_dk[D / 2];
  unsigned int ds_frag[KQ][4];  // dS^T as the A operand of the step's dK product (read until it retires)

  int i = 0, prev_s = 0;
  for (int it = walk.next<true>(0, p, buf); it < walk.total; ++i) {
    const int it_next = walk.next<true>(it + 1, p, buf);
    int h, q0;
    walk.coords(it, h, q0);
    const bool masked = v3_bwd_step_masked<BM, BN>(walk, h, q0, p, buf);
    const int s = i % STAGES;
    mbar_wait(sm.full(s), (i / STAGES) & 1);

    float acc_s[1][NTQ][4];
    float acc_dp[1][NTQ][4];
    float(&s_flat)[BM / 2] = reinterpret_cast<float(&)[BM / 2]>(acc_s);
    float(&dp_flat)[BM / 2] = reinterpret_cast<float(&)[BM / 2]>(acc_dp);
    v3_bwd_roles_st<D>(s_flat, sm.k(), sm.q(s));  // (its wait retires the previous step's dK product too)
    reg_fence(acc_dk);
    reg_fence(ds_frag);
    if (i > 0) mbar_arrive(sm.empty(prev_s));  // the previous step's Q is no longer read

    named_bar_sync(kRoleBarDpFull + (i & 1), 256);
    {
      const unsigned int a = sm.dp() + tid * 16;
#pragma unroll
      for (int r = 0; r < BM / 8; ++r) {
        float v[4];
        ld_shared_f32x4(a + r * 128 * 16, v);
#pragma unroll
        for (int j = 0; j < 4; ++j) dp_flat[4 * r + j] = v[j];
      }
    }
    const float* s_lse2 = sm.lse2(s);
    const float* s_dsum = s_lse2 + BM;
    if (!kTimingNoElementwise && masked) {
      bwd_tile_elementwise<1, NTQ, true, true>(acc_s, acc_dp, s_lse2, s_dsum, key0, q0, walk.b, h, scale_log2, p, buf);
    } else if (!kTimingNoElementwise) {
      bwd_tile_elementwise<1, NTQ, false, true>(acc_s, acc_dp, s_lse2, s_dsum, key0, q0, walk.b, h, scale_log2, p,
                                                buf);
    }

    // z P^T and dS^T into tiles pb: row = key (CTA-local), 16-byte chunk = n8 query tile, swizzled by the row's low 3
    // bits (the 128-byte swizzle: dV's A operand K-major, dQ's A operand MN-major)
    const unsigned int sP = sm.pt(i & 1), sDS = sm.ds(i & 1);
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int nt = 2 * kk + (j >> 1), hf = j & 1;
        const int row = 16 * warp_wg + g + 8 * hf;
        const unsigned int off = row * 128 + ((nt ^ (row & 7)) << 4) + 4 * t;
        ds_frag[kk][j] = Tr::pack2(acc_dp[0][nt][2 * hf], acc_dp[0][nt][2 * hf + 1]);
        st_shared_u32(sP + off, Tr::pack2(acc_s[0][nt][2 * hf], acc_s[0][nt][2 * hf + 1]));
        st_shared_u32(sDS + off, ds_frag[kk][j]);
      }
    }
    bulk_fence_proxy_async_smem();  // the generic stores become visible to warpgroup 1's wgmma (async proxy)
    named_bar_arrive(kRoleBarPsFull + (i & 1), 256);

    // dK += dS^T Q: B = Q MN-major (the query rows are wgmma's K), all D columns
    {
      const unsigned long long dq_t = opaque_u64(wgmma_desc_sw128(sm.q(s), BM * 128, 1024));
      reg_fence(acc_dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk) {
        wgmma_bwd_dk(acc_dk, ds_frag[kk], dq_t + ((kk * 16 * 128) >> 4), (i > 0 || kk > 0) ? 1 : 0);
      }
      wgmma_commit();
    }
    prev_s = s;
    it = it_next;
  }
  wgmma_wait<0>();
  reg_fence(acc_dk);
  if (i == 0) {
#pragma unroll
    for (int j = 0; j < D / 2; ++j) acc_dk[j] = 0.f;
  }

  // dK rows of this warp (every row is written: zeros where no query saw the key)
  v3_bwd_store_keys<D>(acc_dk, reinterpret_cast<ac_elem_t*>(bp.dk) + walk.b * bp.dk_sb + walk.h_kv * bp.dk_sh,
                       bp.dk_sn, key0, p.Nk);
}

// Warpgroup 1: dP^T into shared memory; one step behind, dV and dQ. Step i issues dP^T of block i, then block
// i - 1's dV and first dQ product (DQ_WIDE: all D columns in one product, where dP^T, dV and dQ fit its registers;
// otherwise the first 64-column chunk) behind it, waits for dP^T only and hands it over -- so warpgroup 0 gets it
// without waiting for block i - 1's products -- then stages and adds dQ chunk by chunk (the chunks past the first
// product each one product, waited).
template <class Cfg>
__device__ __forceinline__ void v3_bwd_role_dp(const AttnParams& p, const AttnBwdParams& bp, const AttnBuffers& buf,
                                               const V3BwdWalk& walk, const V3BwdSmem<V3BwdLayout<Cfg>>& sm) {
  using L = V3BwdLayout<Cfg>;
  constexpr int BM = L::BM, BN = L::BN, D = L::D, DV = L::DV, STAGES = L::STAGES, CH = L::DQ_CHUNK;
  constexpr int KQ = BM / 16;
  constexpr int NQ = Cfg::DQ_WIDE ? D : CH;  // dQ columns of the product issued with dV
  const int tid = threadIdx.x & 127, warp_wg = tid >> 5, lane = tid & 31;
  const int key0 = walk.kv0 + 16 * warp_wg;
  float acc_dv[DV / 2];
#pragma unroll
  for (int i = 0; i < DV / 2; ++i) acc_dv[i] = 0.f;
  float acc_q[NQ / 2];
  int stage_slot = 0;  // this warp's next staging buffer (a ring of DQ_STAGES)

  // dV += (z P^T) dO of block j (A: its P^T tile, K-major; B: dO of stage sj, MN-major) and dQ = dS K over columns
  // 0 .. NQ (A: its dS^T tile, MN-major; B: K, MN-major): one commit group
  auto issue_behind = [&](int j, int sj) {
    named_bar_sync(kRoleBarPsFull + (j & 1), 256);
    const unsigned long long pa = opaque_u64(wgmma_desc_sw128(sm.pt(j & 1), 16, 1024));
    const unsigned long long ddo_t = opaque_u64(wgmma_desc_sw128(sm.dout(sj), BM * 128, 1024));
    const unsigned long long dds = opaque_u64(wgmma_desc_sw128(sm.ds(j & 1), BN * 128, 1024));
    const unsigned long long dkt = opaque_u64(wgmma_desc_sw128(sm.k(), BN * 128, 1024));
    reg_fence(acc_dv);
    reg_fence(acc_q);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) wgmma_bwd_dv(acc_dv, pa + ((kk * 32) >> 4), ddo_t + ((kk * 16 * 128) >> 4), 1);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      wgmma_bwd_dq(acc_q, dds + ((kk * 16 * 128) >> 4), dkt + ((kk * 16 * 128) >> 4), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // Deterministic dQ (Cfg::DETERMINISTIC): warpgroup 1 alone adds dQ, so a block's turn (v3_bwd_dq.cuh
  // v3_bwd_turn: the CTAs adding into one query block go in key-block order) is taken before its first reduction and
  // passed on once its reductions have completed (each warp waits for and fences its own, then one thread releases).
  bool turn_last = false;
  auto wait_turn = [&](unsigned int* sem, int h, int q0) {
    if (warp_wg == 0) {
      const V3BwdTurn tn = v3_bwd_turn<BN>(sem, walk.b, h, q0, blockIdx.x, p, buf);
      turn_last = tn.place == tn.total - 1;
    }
    named_bar_sync(kRoleBarTurn, 128);  // the warpgroup's reductions wait for warp 0's acquire
  };
  auto pass_turn = [&](unsigned int* sem) {
    if (lane == 0) {
      bulk_wait_all();  // the reductions have completed, ordered before the release (async proxy -> generic proxy)
      asm volatile("fence.proxy.async.global;\n" ::: "memory");
    }
    __threadfence();
    named_bar_sync(kRoleBarTurn, 128);
    if (tid == 0) {
      if (turn_last) {
        *reinterpret_cast<volatile unsigned int*>(sem) = 0u;
      } else {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sem) : "memory");
      }
    }
  };

  // the rest of block j once its group has retired: dQ staged and added chunk by chunk
  auto finish_behind = [&](int j, int h, int q0, int sj) {
    reg_fence(acc_dv);
    reg_fence(acc_q);
    mbar_arrive(sm.empty(sj));  // the step's dO is no longer read
    unsigned int* sem = nullptr;
    if constexpr (Cfg::DETERMINISTIC) {
      sem = reinterpret_cast<unsigned int*>(bp.dq_sem) + (long long)(walk.b * p.H + h) * (bp.Nq_pad / 64) + q0 / 64;
      wait_turn(sem, h, q0);
    }
    const long long trow = (long long)walk.b * bp.Nq_pad + q0 + 16 * warp_wg;
    const unsigned long long dds = opaque_u64(wgmma_desc_sw128(sm.ds(j & 1), BN * 128, 1024));
#pragma unroll
    for (int c = 0; c < D / CH; ++c) {
      constexpr int kIssued = NQ / CH;  // chunks of the product issued with dV
      float acc_own[CH / 2];
      float(&acc_dq)[CH / 2] =
          c < kIssued ? reinterpret_cast<float(&)[CH / 2]>(acc_q[c < kIssued ? c * (CH / 2) : 0]) : acc_own;
      if (c >= kIssued) v3_bwd_dq_product<L::DQ_K, BN>(acc_dq, dds, sm.k(), c * CH);
      if (!kTimingNoDqRed || acc_dq[0] == 12345.f) {  // (the timing build keeps the products alive)
        v3_bwd_dq_staged<L, L::DQ_STAGES - 1>(acc_dq, sm.dq_stage(stage_slot, warp_wg),
                                              bp.dq_accum + L::dq_tiled_offset(trow, h, p.H, c * CH),
                                              q0 + 16 * warp_wg, p.Nq);
      }
      stage_slot = stage_slot + 1 == L::DQ_STAGES ? 0 : stage_slot + 1;
    }
    if constexpr (Cfg::DETERMINISTIC) pass_turn(sem);
  };
  // dP^T of a step into dP buffer pb, for warpgroup 0 (thread tid's fragment, 16 bytes at a time)
  auto hand_over = [&](const float(&dp_flat)[BM / 2], int pb) {
    const unsigned int a = sm.dp() + tid * 16;
#pragma unroll
    for (int r = 0; r < BM / 8; ++r) {
      st_shared_f32x4(a + r * 128 * 16, dp_flat[4 * r], dp_flat[4 * r + 1], dp_flat[4 * r + 2], dp_flat[4 * r + 3]);
    }
    named_bar_arrive(kRoleBarDpFull + pb, 256);
  };

  int i = 0, prev_h = 0, prev_q0 = 0, prev_s = 0;
  int it = walk.next<true>(0, p, buf);
  // the first step has no block behind it (peeled: every path into the loop's wgmmas is the same)
  if (it < walk.total) {
    walk.coords(it, prev_h, prev_q0);
    mbar_wait(sm.full(0), 0);
    float dp_flat[BM / 2];
    v3_bwd_roles_st<DV>(dp_flat, sm.v(), sm.dout(0));
    hand_over(dp_flat, 0);
    it = walk.next<true>(it + 1, p, buf);
    i = 1;
  }
  for (; it < walk.total; ++i) {
    const int it_next = walk.next<true>(it + 1, p, buf);
    int h, q0;
    walk.coords(it, h, q0);
    const int s = i % STAGES;
    mbar_wait(sm.full(s), (i / STAGES) & 1);
    float dp_flat[BM / 2];
    v3_bwd_roles_st_issue<DV>(dp_flat, sm.v(), sm.dout(s));
    issue_behind(i - 1, prev_s);
    wgmma_wait<1>();  // dP^T (the older group)
    reg_fence(dp_flat);
    hand_over(dp_flat, i & 1);
    wgmma_wait<0>();
    finish_behind(i - 1, prev_h, prev_q0, prev_s);
    prev_h = h;
    prev_q0 = q0;
    prev_s = s;
    it = it_next;
  }
  if (i > 0) {
    issue_behind(i - 1, prev_s);
    wgmma_wait<0>();
    finish_behind(i - 1, prev_h, prev_q0, prev_s);
  }
  if (lane == 0) bulk_wait_read_all();  // the last reduction reads shared memory: it must outlive it
  v3_bwd_store_keys<DV>(acc_dv, reinterpret_cast<ac_elem_t*>(bp.dv) + walk.b * bp.dv_sb + walk.h_kv * bp.dv_sh,
                        bp.dv_sn, key0, p.Nk);
}

}  // namespace ac
