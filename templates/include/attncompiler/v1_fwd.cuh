// attncompiler/v1_fwd.cuh -- schedule v1: attention forward in FlashAttention-1's loop order.
//
// This is Algorithm 1 of Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention
// with IO-Awareness" (2022), with the scale / mask / dropout of its Algorithm 2, written for
// clarity rather than speed.  It is the correctness baseline every other schedule is compared with.
// Comments "[A1 line n]" name the line of Algorithm 1 that a step implements:
//
//    2: O = 0, l = 0, m = -inf                               (in HBM: the workspace)
//    5: for each K/V block j:
//    6:   load K_j, V_j into SRAM
//    7:   for each Q block i:
//    8:     load Q_i, O_i, l_i, m_i
//    9:     S_ij = Q_i K_j^T
//   10:     m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)
//   11:     m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
//   12:     O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j) -> HBM
//   13:     l_i = l_new, m_i = m_new -> HBM
//
// O, l and m live in HBM between iterations (that is what makes this FA1's order and slow).
// A final pass (after line 15) converts O to the output element type and writes the LSE.
//
// ---------------------------------------------------------------------------------------------
// Launch geometry (the launcher's side of the contract)
//   grid   : B * H CTAs, blockIdx.x = b * H + h        (one CTA owns one (batch, head) pair)
//   block  : Cfg::BLOCK_R threads                       (thread r owns row r of every Q block)
//   smem   : Cfg::kSmemBytes dynamic bytes
//              = BLOCK_R*D*2 + BLOCK_C*D*2 + BLOCK_C*DV*2 + BLOCK_R*BLOCK_C*4
//              (Q_i, K_j, V_j as ac_elem_t, then the fp32 S/P tile); the launcher sets
//              cudaFuncAttributeMaxDynamicSharedMemorySize when this exceeds 48 KiB.
//   workspace: p.workspace, float32, B*H*Nq*(DV+2) floats = B*H*Nq*Cfg::kWorkspaceFloatsPerRow,
//              16-byte aligned, no initial value required (the kernel initializes it):
//                O_acc[((b*H + h)*Nq + q)*DV + d]                     B*H*Nq*DV floats
//                l    [B*H*Nq*DV + (b*H + h)*Nq + q]                   B*H*Nq floats
//                m    [B*H*Nq*DV + B*H*Nq + (b*H + h)*Nq + q]          B*H*Nq floats
//   inputs : q/k/v/o rows 16-byte aligned (strides multiples of 8 elements, bases 16B aligned),
//            head dimension contiguous; k, v use head h / (H / H_kv) (GQA / MQA).
//
// Shared memory layout (byte offsets, every region 16-byte aligned because D % 8 == DV % 8 == 0):
//   sQ [BLOCK_R][D]   ac_elem_t, row-major
//   sK [BLOCK_C][D]   ac_elem_t, row-major   (rows >= Nk zero-filled)
//   sV [BLOCK_C][DV]  ac_elem_t, row-major   (rows >= Nk zero-filled)
//   sS [BLOCK_C][BLOCK_R] float, COLUMN-major: element (r, c) at sS[c*BLOCK_R + r], so that the
//      32 threads of a warp, each touching its own row r, hit 32 consecutive words (no bank
//      conflicts).  Holds S_ij, then P~_ij (dropout applied) in place.
//
// Ownership (what makes the kernel race-free): inside the (i, j) loop, thread r reads and writes
// only row r of sS and only workspace row i*BLOCK_R + r (O, l, m); shared K/V/Q tiles are written
// cooperatively and read by everyone, with __syncthreads() between every write and read (RAW) and
// before every overwrite (WAR).  The cooperative initialization and the final pass touch other
// threads' workspace rows, and are fenced by __syncthreads() (which also orders global memory
// among the threads of a block).
//
// Requires (defined before this header): ac_elem_t, AttnParams, AttnBuffers, Variant
// (the generated prelude), attncompiler/common.cuh and attncompiler/philox.cuh (ac_dropout_keep).
#pragma once

namespace ac {
namespace v1detail {

// The 16-bit pattern of one ac_elem_t -> float (exact for both bf16 and fp16).
__device__ __forceinline__ float elem_bits_to_float(unsigned int bits16) {
  if (ac_type_traits<ac_elem_t>::kIsBf16) {
    return __uint_as_float(bits16 << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
  }
}

// Eight packed ac_elem_t (one 16-byte vector) -> eight floats.
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  f[0] = elem_bits_to_float(u.x & 0xffffu);
  f[1] = elem_bits_to_float(u.x >> 16);
  f[2] = elem_bits_to_float(u.y & 0xffffu);
  f[3] = elem_bits_to_float(u.y >> 16);
  f[4] = elem_bits_to_float(u.z & 0xffffu);
  f[5] = elem_bits_to_float(u.z >> 16);
  f[6] = elem_bits_to_float(u.w & 0xffffu);
  f[7] = elem_bits_to_float(u.w >> 16);
}

// Eight floats -> eight packed ac_elem_t (round to nearest even).
__device__ __forceinline__ uint4 pack8(const float4& a, const float4& b) {
  uint4 u;
  u.x = ac_type_traits<ac_elem_t>::pack2(a.x, a.y);
  u.y = ac_type_traits<ac_elem_t>::pack2(a.z, a.w);
  u.z = ac_type_traits<ac_elem_t>::pack2(b.x, b.y);
  u.w = ac_type_traits<ac_elem_t>::pack2(b.z, b.w);
  return u;
}

// Cooperative, coalesced copy of rows [row0, row0 + ROWS) of a (rows, COLS) global matrix into a
// row-major shared tile, 16 bytes per thread per step; rows >= n_rows are zero-filled.
// `base` points at row 0 of this (b, head); `row_stride` is in elements.
template <int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void load_tile(ac_elem_t* __restrict__ s_tile,
                                          const ac_elem_t* __restrict__ base, long long row_stride,
                                          int row0, int n_rows, int tid) {
  constexpr int kVecPerRow = COLS / 8;
  for (int idx = tid; idx < ROWS * kVecPerRow; idx += NTHREADS) {
    const int r = idx / kVecPerRow;
    const int c = idx - r * kVecPerRow;
    const int g = row0 + r;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (g < n_rows) {
      val = *reinterpret_cast<const uint4*>(base + static_cast<long long>(g) * row_stride + c * 8);
    }
    *reinterpret_cast<uint4*>(s_tile + r * COLS + c * 8) = val;
  }
}

// Largest of {32, 16, 8} dividing n (n % 8 == 0): the width of the register chunks below.
__host__ __device__ constexpr int chunk_width(int n) { return n % 32 == 0 ? 32 : (n % 16 == 0 ? 16 : 8); }

}  // namespace v1detail

template <class Cfg>
__device__ void v1_fwd(const AttnParams& p, const AttnBuffers& buf) {
  constexpr int D = Cfg::D;              // q/k head dimension
  constexpr int DV = Cfg::DV;            // v/o head dimension
  constexpr int BLOCK_R = Cfg::BLOCK_R;  // query rows per Q block == threads per CTA
  constexpr int BLOCK_C = Cfg::BLOCK_C;  // keys per K/V block
  constexpr int QC = v1detail::chunk_width(D);   // q values held in registers at a time
  constexpr int OC = v1detail::chunk_width(DV);  // output columns accumulated in registers at a time

  static_assert(sizeof(ac_elem_t) == 2, "ac_elem_t must be a 16-bit type (bf16 / fp16)");
  static_assert(BLOCK_R % 32 == 0, "BLOCK_R must be a multiple of the warp size");
  static_assert(BLOCK_R >= 32 && BLOCK_R <= 1024, "BLOCK_R threads per CTA: 32..1024");
  static_assert(BLOCK_C >= 1, "BLOCK_C must be positive");
  static_assert(D % 8 == 0 && D > 0, "D must be a positive multiple of 8 (16-byte rows)");
  static_assert(DV % 8 == 0 && DV > 0, "DV must be a positive multiple of 8 (16-byte rows)");
  static_assert(Cfg::kSmemBytes ==
                    BLOCK_R * D * 2 + BLOCK_C * D * 2 + BLOCK_C * DV * 2 + BLOCK_R * BLOCK_C * 4,
                "kSmemBytes must match the planner's v1 formula");
  static_assert(Cfg::kWorkspaceFloatsPerRow == DV + 2, "workspace row = O (DV) + l + m");

  // ---- shared memory carve-up (see the layout above) ------------------------------------------
  extern __shared__ __align__(16) unsigned char smem[];
  ac_elem_t* sQ = reinterpret_cast<ac_elem_t*>(smem);
  ac_elem_t* sK = sQ + BLOCK_R * D;
  ac_elem_t* sV = sK + BLOCK_C * D;
  float* sS = reinterpret_cast<float*>(sV + BLOCK_C * DV);  // column-major [BLOCK_C][BLOCK_R]

  // ---- who am I ------------------------------------------------------------------------------
  const int tid = threadIdx.x;
  const int bh = blockIdx.x;  // b * H + h
  const int b = bh / p.H;
  const int h = bh - b * p.H;
  const int h_kv = h / (p.H / p.H_kv);
  const int Nq = p.Nq;
  const int Nk = p.Nk;

  const ac_elem_t* gQ = static_cast<const ac_elem_t*>(p.q) + b * p.q_sb + h * p.q_sh;
  const ac_elem_t* gK = static_cast<const ac_elem_t*>(p.k) + b * p.k_sb + h_kv * p.k_sh;
  const ac_elem_t* gV = static_cast<const ac_elem_t*>(p.v) + b * p.v_sb + h_kv * p.v_sh;
  ac_elem_t* gO = static_cast<ac_elem_t*>(p.o) + b * p.o_sb + h * p.o_sh;

  // Workspace views for this (b, h): O_acc [Nq][DV], l [Nq], m [Nq] (fp32, not const: read+write).
  const long long rows_total = static_cast<long long>(p.B) * p.H * Nq;
  float* wO = p.workspace + static_cast<long long>(bh) * Nq * DV;
  float* wL = p.workspace + rows_total * DV + static_cast<long long>(bh) * Nq;
  float* wM = wL + rows_total;

  // [A1 line 2] O = 0, l = 0, m = -inf in HBM (cooperative, coalesced).
  for (long long idx = tid; idx < static_cast<long long>(Nq) * (DV / 4); idx += BLOCK_R) {
    reinterpret_cast<float4*>(wO)[idx] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int q = tid; q < Nq; q += BLOCK_R) {
    wL[q] = 0.f;
    wM[q] = AC_NEG_INF;
  }
  // (Ordered before any use by the __syncthreads() at the top of the j loop, or before the
  //  final pass when there is no K/V block at all.)

  // [A1 lines 3-4] T_c K/V blocks of BLOCK_C keys, T_r Q blocks of BLOCK_R queries.
  const int Tc = (Nk + BLOCK_C - 1) / BLOCK_C;
  const int Tr = (Nq + BLOCK_R - 1) / BLOCK_R;

  // [A1 line 5] outer loop over K/V blocks.
  for (int j = 0; j < Tc; ++j) {
    const int kv_lo = j * BLOCK_C;
    const int kv_n = min(BLOCK_C, Nk - kv_lo);  // valid keys in this block (last one may be short)
    const int kv_hi = kv_lo + kv_n - 1;         // inclusive, clipped to Nk - 1

    // WAR: every thread has finished reading sK/sV/sQ of the previous (i, j); also orders the
    // workspace initialization (j == 0) before the first read of l/m/O.
    __syncthreads();

    // [A1 line 6] load K_j, V_j into shared memory (rows >= Nk zero-filled).
    v1detail::load_tile<BLOCK_C, D, BLOCK_R>(sK, gK, p.k_sn, kv_lo, Nk, tid);
    v1detail::load_tile<BLOCK_C, DV, BLOCK_R>(sV, gV, p.v_sn, kv_lo, Nk, tid);

    // [A1 line 7] inner loop over Q blocks.
    for (int i = 0; i < Tr; ++i) {
      const int q_lo = i * BLOCK_R;
      const int q_hi = min(q_lo + BLOCK_R, Nq) - 1;  // inclusive, clipped to Nq - 1

      // Tile classification against the mask (uniform across the CTA, so the branches below
      // never split a __syncthreads()).  EMPTY tiles change nothing: skip them entirely.
      int cls = AC_TILE_FULL;
      if constexpr (Variant::kHasMask) {
        cls = Variant::tile_class(b, h, q_lo, q_hi, kv_lo, kv_hi, p, buf);
      }
      if (cls == AC_TILE_EMPTY) continue;

      // WAR: every thread has finished reading sQ of the previous Q block.
      __syncthreads();

      // [A1 line 8, part 1] load Q_i into shared memory (rows >= Nq zero-filled).
      v1detail::load_tile<BLOCK_R, D, BLOCK_R>(sQ, gQ, p.q_sn, q_lo, Nq, tid);

      // RAW: K_j, V_j and Q_i are visible to every thread.
      __syncthreads();

      // From here to the end of the i iteration each thread works on its own row only.
      const int r = tid;
      const int q = q_lo + r;
      if (q < Nq) {
        float* sRow = sS + r;  // element c of this row is sRow[c * BLOCK_R]

        // [A1 line 8, part 2] load l_i, m_i (O_i is streamed in chunks at line 12).
        const float m_old = wM[q];
        const float l_old = wL[q];

        // [A1 line 9] S_ij = Q_i K_j^T for this row: fp32 FMA over D, QC q values in registers
        // at a time, partial dot products accumulated in this thread's column of sS.
        const ac_elem_t* qRow = sQ + r * D;
#pragma unroll 1
        for (int d0 = 0; d0 < D; d0 += QC) {
          float qv[QC];
#pragma unroll
          for (int t = 0; t < QC / 8; ++t) {
            float f[8];
            v1detail::unpack8(*reinterpret_cast<const uint4*>(qRow + d0 + t * 8), f);
#pragma unroll
            for (int e = 0; e < 8; ++e) qv[t * 8 + e] = f[e];
          }
          // (unroll 4: four independent dot products in flight; measured spill-free at <= 96
          //  registers for the planner's configurations on sm_80 and sm_90a)
#pragma unroll 4
          for (int c = 0; c < kv_n; ++c) {
            const ac_elem_t* kRow = sK + c * D + d0;  // same address for all threads: broadcast
            float acc = 0.f;
#pragma unroll
            for (int t = 0; t < QC / 8; ++t) {
              float f[8];
              v1detail::unpack8(*reinterpret_cast<const uint4*>(kRow + t * 8), f);
#pragma unroll
              for (int e = 0; e < 8; ++e) acc = fmaf(qv[t * 8 + e], f[e], acc);
            }
            sRow[c * BLOCK_R] = (d0 == 0) ? acc : sRow[c * BLOCK_R] + acc;
          }
        }

        // Scale, score_mod, mask (Algorithm 2's S -> scale, mask); m~_ij = rowmax  [A1 line 10].
        // Keys c >= kv_n (beyond Nk) are never touched: every loop stops at kv_n.
        float m_tile = AC_NEG_INF;
        for (int c = 0; c < kv_n; ++c) {
          const int kv = kv_lo + c;
          float s = p.scale * sRow[c * BLOCK_R];
          if constexpr (Variant::kHasScoreMod) {
            s = Variant::score_mod(s, b, h, q, kv, p, buf);
          }
          if constexpr (Variant::kHasMask) {
            // FULL tiles skip the per-element mask; the kv < Nk bound is the loop bound.
            if (cls != AC_TILE_FULL && !Variant::mask(b, h, q, kv, p, buf)) s = AC_NEG_INF;
          }
          sRow[c * BLOCK_R] = s;
          m_tile = fmaxf(m_tile, s);
        }

        // A row with no visible key in this tile (m~ = -inf): P~ = 0, l~ = 0, and lines 11-13
        // leave O_i, l_i, m_i unchanged -- skip them (this also avoids (-inf) - (-inf)).
        if (m_tile != AC_NEG_INF) {
          // [A1 line 10] P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij) (of the undropped P~);
          // then dropout scales P~ in place: P~ * (keep ? 1/(1-p) : 0).
          float l_tile = 0.f;
          for (int c = 0; c < kv_n; ++c) {
            float pr = expf(sRow[c * BLOCK_R] - m_tile);  // exp(-inf) = 0 for masked keys
            l_tile += pr;
            if constexpr (Variant::kHasDropout) {
              pr *= ac_dropout_keep(p, b, h, q, kv_lo + c) ? p.dropout_rescale : 0.f;
            }
            sRow[c * BLOCK_R] = pr;
          }

          // [A1 line 11] m_new = max(m_i, m~), l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~.
          // m_new is finite here; an empty-so-far row (m_i = -inf, l_i = 0, O_i = 0) gets
          // alpha = 0 without evaluating exp((-inf) - m_new).
          const float m_new = fmaxf(m_old, m_tile);
          const float alpha = (m_old == AC_NEG_INF) ? 0.f : expf(m_old - m_new);
          const float beta = expf(m_tile - m_new);
          const float l_new = alpha * l_old + beta * l_tile;  // > 0 (l~ >= 1 or l_i >= 1)
          const float inv_l_new = 1.f / l_new;
          const float c_old = l_old * alpha * inv_l_new;  // weight of the stored (normalized) O_i
          const float c_new = beta * inv_l_new;           // weight of P~_ij V_j

          // [A1 line 12] O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j),
          // OC output columns at a time: accumulate (P~ V_j)[:, chunk] in registers, then read
          // the old O_i chunk from HBM, combine, and write it back.
          float* oRow = wO + static_cast<long long>(q) * DV;
#pragma unroll 1
          for (int d0 = 0; d0 < DV; d0 += OC) {
            float acc[OC];
#pragma unroll
            for (int e = 0; e < OC; ++e) acc[e] = 0.f;
#pragma unroll 4
            for (int c = 0; c < kv_n; ++c) {
              const float pr = sRow[c * BLOCK_R];
              const ac_elem_t* vRow = sV + c * DV + d0;  // broadcast
#pragma unroll
              for (int t = 0; t < OC / 8; ++t) {
                float f[8];
                v1detail::unpack8(*reinterpret_cast<const uint4*>(vRow + t * 8), f);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[t * 8 + e] = fmaf(pr, f[e], acc[t * 8 + e]);
              }
            }
#pragma unroll
            for (int t = 0; t < OC / 4; ++t) {
              float4* o4 = reinterpret_cast<float4*>(oRow + d0 + t * 4);
              float4 o = *o4;
              o.x = c_old * o.x + c_new * acc[t * 4 + 0];
              o.y = c_old * o.y + c_new * acc[t * 4 + 1];
              o.z = c_old * o.z + c_new * acc[t * 4 + 2];
              o.w = c_old * o.w + c_new * acc[t * 4 + 3];
              *o4 = o;
            }
          }

          // [A1 line 13] l_i <- l_new, m_i <- m_new in HBM.
          wL[q] = l_new;
          wM[q] = m_new;
        }
      }
      // [A1 line 14] end of the Q-block loop; the next iteration's (or the next j's) leading
      // __syncthreads() protects sQ/sK/sV before they are overwritten.
    }
  }  // [A1 line 15]

  // RAW on global memory: the final pass reads workspace rows written by other threads.
  __syncthreads();

  // [A1 line 16] return O: convert the (already normalized) fp32 O to ac_elem_t, 8 columns per
  // thread per step, coalesced on both sides.  Rows that never saw a visible key hold O = 0.
  constexpr int kOutVecPerRow = DV / 8;
  for (long long idx = tid; idx < static_cast<long long>(Nq) * kOutVecPerRow; idx += BLOCK_R) {
    const int q = static_cast<int>(idx / kOutVecPerRow);
    const int c = static_cast<int>(idx - static_cast<long long>(q) * kOutVecPerRow);
    const float4* src = reinterpret_cast<const float4*>(wO + static_cast<long long>(q) * DV + c * 8);
    *reinterpret_cast<uint4*>(gO + static_cast<long long>(q) * p.o_sn + c * 8) =
        v1detail::pack8(src[0], src[1]);
  }

  // LSE = m + log(l) (natural log); -inf for rows without a visible key (m = -inf, l = 0).
  if (p.lse != nullptr) {
    float* lse = p.lse + static_cast<long long>(bh) * Nq;
    for (int q = tid; q < Nq; q += BLOCK_R) {
      const float m = wM[q];
      lse[q] = (m == AC_NEG_INF) ? AC_NEG_INF : m + logf(wL[q]);
    }
  }
}

}  // namespace ac
