// attncompiler/v3_bwd_layout.cuh -- the Hopper backward's shared-memory layout, tensor maps and walk
// (v3_bwd.cuh has the kernel, v3_bwd_dq.cuh its dQ side).
//
// Shared memory (from a 1024-byte aligned base; every tile is made of 64-column boxes of rows x 128 bytes):
//   K (DB boxes of BLOCK_N rows) | V (DVB boxes) | STAGES x [Q (DB boxes of 64 rows) | dO (DVB boxes)] |
//   dS^T x 2 (BLOCK_N rows x 128 bytes, double-buffered: the dQ GEMM of step i reads one while step i + 1
//   writes the other; DKV_SPLIT: one per warpgroup) | DKV_ROLES: P^T x 2 (the same layout), dP^T (64 x 64 fp32
//   in fragment order) | STAGES x [lse2 (64 fp32) | dsum (64 fp32)] |
//   DQ_RED > 0: 16 x (DQ_CHUNK + DQ_PAD) fp32 per consumer warp (its staged dQ rows; DKV_ROLES: DQ_STAGES of them
//   per warp of warpgroup 1) |
//   mbarriers: KV, full[STAGES], empty[STAGES]
//
// Requires: v3_sm90.cuh (TmaDesc), v3_rows.cuh; the walk also Variant, AttnParams, AttnBuffers.
#pragma once

#include "attncompiler/ranges.cuh"
#include "attncompiler/v3_rows.cuh"

namespace ac {

struct V3BwdMaps {
  TmaDesc q, k, v, dout;  // 4-d tensor maps (head dim, seqlen, heads, batch); q, dout: 64-row boxes
};

template <class Cfg>
struct V3BwdLayout {
  static constexpr int D = Cfg::D;
  static constexpr int DV = Cfg::DV;
  static constexpr int BM = Cfg::BLOCK_M;
  static constexpr int BN = Cfg::BLOCK_N;
  static constexpr int NC = Cfg::NC;
  static constexpr int STAGES = Cfg::STAGES;
  static constexpr int NTHREADS = 128 * (NC + 1);
  // DKV_SPLIT (D or DV above 128): every consumer warpgroup owns the CTA's same 64 keys and keeps dK / dV columns
  // [w D / NC, (w + 1) D / NC) only (S^T and dP^T are then computed by each warpgroup: 7 GEMM units a step for 5)
  static constexpr bool kKvSplit = Cfg::DKV_SPLIT;
  // DKV_ROLES (head dims above 128, v3_bwd_roles.cuh): the two consumers own the CTA's same 64 keys by role instead --
  // warpgroup 0 S^T, the elementwise step and dK (all D columns), warpgroup 1 dP^T, dV (all DV columns) and dQ --
  // exchanging dP^T (fp32) and P^T / dS^T (tiles) through shared memory: 5 GEMM units a step for 5
  static constexpr bool kRoles = Cfg::DKV_ROLES;
  // the kernel's widths: with DKV_SPLIT D and DV rounded up to 128, so each warpgroup's half is whole boxes (D = 192:
  // warpgroup 1 owns columns 128..255; the box past D is TMA's zero fill, and its dK / dQ columns are never stored)
  static constexpr int DKP = kKvSplit ? (D + 127) / 128 * 128 : D;
  static constexpr int DVP = kKvSplit ? (DV + 127) / 128 * 128 : DV;
  static constexpr int DK_N = DKP / (kKvSplit ? NC : 1);  // dK columns per warpgroup
  static constexpr int DV_N = DVP / (kKvSplit ? NC : 1);  // dV columns per warpgroup
  static constexpr int DB = (DKP + 63) / 64;  // 64-column boxes per row (TMA zero-fills the columns past D)
  static constexpr int DVB = (DVP + 63) / 64;
  static constexpr int kKBytes = BN * DB * 128;
  static constexpr int kVBytes = BN * DVB * 128;
  static constexpr int kQBytes = BM * DB * 128;
  static constexpr int kDOBytes = BM * DVB * 128;
  static constexpr int kStageBytes = kQBytes + kDOBytes;
  static constexpr int kDSBytes = BN * 128;  // one dS^T buffer: BLOCK_N key rows of 64 queries
  static constexpr int kRowBytes = BM * 4;   // lse2 or dsum of one query block
  static constexpr int kStageOffset = kKBytes + kVBytes;
  static constexpr int kDSOffset = kStageOffset + STAGES * kStageBytes;
  static constexpr int kPOffset = kDSOffset + 2 * kDSBytes;    // DKV_ROLES: P^T x 2 (dS^T's layout), for dV's A
  static constexpr int kDPBytes = kRoles ? BN * BM * 4 : 0;     // DKV_ROLES: one dP^T in fragment order (fp32)
  static constexpr int kDPOffset = kPOffset + (kRoles ? 2 * kDSBytes : 0);
  static constexpr int kRowsOffset = kDPOffset + kDPBytes;
  static constexpr int kDqStageOffset = kRowsOffset + STAGES * 2 * kRowBytes;
  static constexpr bool kSplitN = Cfg::DQ_SPLIT_N;
  static constexpr int DQ_N = kSplitN ? DKP / NC : D;  // dQ columns per warpgroup (chunks past D are skipped)
  static constexpr int DQ_K = kSplitN ? BN : 64;     // keys per warpgroup's dQ product
  // dQ columns per wgmma (the planner's: at most the largest of 64 / 32 / 16 dividing DQ_N, so no chunk straddles a
  // 64-column box of K; smaller where the staging would not fit shared memory)
  static constexpr int DQ_CHUNK = Cfg::DQ_CHUNK;
  // 0: 8-byte reds from registers; 1: staged, 16-byte reds; 2: staged, one bulk reduction per warp into the tiled
  // accumulator
  static constexpr int DQ_RED = Cfg::DQ_RED;
  // staged row stride: DQ_PAD = 4 pads each row by 16 bytes (fewer bank conflicts); DQ_PAD = 0 (DQ_RED 2 only, where
  // shared memory is short) swizzles instead: a row's 16-byte column groups XOR the row's low bits (kDqSwizzle)
  static constexpr int kDqRowFloats = DQ_CHUNK + Cfg::DQ_PAD;
  static constexpr int kDqSwizzle = Cfg::DQ_PAD == 0 ? (DQ_CHUNK / 4 < 8 ? DQ_CHUNK / 4 : 8) - 1 : 0;
  // the float offset of (row, column) inside one staged 16 x DQ_CHUNK tile (its image in the tiled accumulator too)
  static __device__ __forceinline__ int dq_tile_offset(int row, int col) {
    return row * kDqRowFloats + ((((col >> 2) ^ (row & kDqSwizzle)) << 2) | (col & 3));
  }
  // DQ_RED 2: the fp32 accumulator is tiled as [rows / 16][H][D / DQ_CHUNK][16][kDqRowFloats], rows = B x Nq_pad
  // (packed sequences: varlen.cuh moves each sequence's rows), so one warp's staged 16 x DQ_CHUNK tile (padding
  // included) is one contiguous bulk reduction (attn_bwd_dq_out reads the DQ_CHUNK columns of each row)
  static constexpr int kDqTileFloats = 16 * kDqRowFloats;
  static constexpr int kDqTiledRowFloats = DQ_RED == 2 ? (D / DQ_CHUNK) * kDqRowFloats : 0;  // per row and head
  // DQ_RED 2: the float offset of accumulator row trow (b x Nq_pad + row), head h (of H), column col
  static __device__ __forceinline__ long long dq_tiled_offset(long long trow, int h, int H, int col) {
    const long long tile = ((trow / 16) * H + h) * (D / DQ_CHUNK) + col / DQ_CHUNK;
    return tile * kDqTileFloats + dq_tile_offset(static_cast<int>(trow % 16), col % DQ_CHUNK);
  }
  // DKV_ROLES: staging buffers per warp (a ring: a chunk waits only for the reduction DQ_STAGES chunks back)
  static constexpr int DQ_STAGES = Cfg::DQ_STAGES;
  static constexpr int kDqWarpStageBytes = 16 * kDqRowFloats * 4;  // one warp's 16 staged rows
  // per consumer warp that adds dQ (DKV_ROLES: warpgroup 1's four, DQ_STAGES buffers each)
  static constexpr int kDqStageBytes = DQ_RED ? (kRoles ? DQ_STAGES : NC) * 4 * kDqWarpStageBytes : 0;
  static constexpr int kBarOffset = kDqStageOffset + kDqStageBytes;
  static constexpr int kNumBars = 1 + 2 * STAGES;
  static constexpr int kAlignSlack = 1024;  // dynamic shared memory is only 16-byte aligned
  static constexpr int kSmemBytes = kAlignSlack + kBarOffset + 8 * kNumBars;

  static_assert(BM == 64, "BLOCK_M = 64: the N of S^T / dP^T, the K of dV / dK, the M of dQ (one 128-byte row of dS^T)");
  static_assert((kKvSplit || kRoles) ? (BN == 64 && NC == 2) : (BN == 64 * NC && (NC == 1 || NC == 2)),
                "each consumer warpgroup owns 64 keys (1 or 2 of them), or with DKV_SPLIT / DKV_ROLES both own the "
                "same 64");
  static_assert(!(kKvSplit && kRoles), "DKV_SPLIT or DKV_ROLES");
  static_assert(DQ_STAGES >= 1 && (kRoles || DQ_STAGES == 1) && DQ_STAGES <= D / Cfg::DQ_CHUNK,
                "dQ staging buffers per warp: 1, or with DKV_ROLES up to one per chunk of a step");
  static_assert(!kRoles || (!kSplitN && !Cfg::DQ_DEFER && DQ_RED == 2 && Cfg::DQ_CHUNK == 64 && D % 64 == 0 && DV % 64 == 0 && D <= 256 && DV <= 256),
                "DKV_ROLES: warpgroup 1 adds all D columns of dQ (64-column chunks, bulk reductions; DQ_WIDE: one "
                "product) one step behind warpgroup 0; head dims of whole boxes, at most 256");
  static_assert(D % 16 == 0 && DV % 16 == 0 && (kKvSplit ? (D % 64 == 0 && DV % 64 == 0 && D >= 128 && DV >= 128 &&
                                                             D <= 256 && DV <= 256)
                                                         : (kRoles || (D <= 128 && DV <= 128))),
                "head dims: multiples of 16 (wgmma k16 steps / n), at most 128 (dK and dV stay in registers), or with "
                "DKV_SPLIT multiples of 64 in [128, 256] (whole boxes; each warpgroup's half of DKP / DVP is whole "
                "boxes and starts inside D / DV)");
  static_assert(!kKvSplit || (kSplitN && !Cfg::DQ_DEFER),
                "DKV_SPLIT: dQ split by columns, each warpgroup from its own dS^T copy, in the step (registers)");
  static_assert(STAGES >= 2 && STAGES <= 4, "Q / dO stages");
  static_assert(!Cfg::DETERMINISTIC || kSplitN || NC == 1 || kRoles,
                "deterministic dQ: the warpgroups add disjoint columns (DKV_ROLES: warpgroup 1 adds them all)");
  static constexpr bool kDeterministic = Cfg::DETERMINISTIC;
  static_assert(Cfg::DET_PASS >= 0 && Cfg::DET_PASS <= 2, "DET_PASS: 0 after the reds, 1 mid next step, 2 next dQ step");
  static_assert(D % DQ_CHUNK == 0 && (kDqTileFloats * 4) % 16 == 0, "DQ_RED 2: whole tiles, 16-byte bulk sizes");
  static_assert(!kSplitN || (DQ_N % 64 == 0 || 64 % DQ_N == 0), "DQ_SPLIT_N: every warpgroup's dQ columns are whole "
                "boxes of K or a part of one box (an MN-major B operand may start 16-byte aligned inside the row)");
  static_assert(DQ_N % DQ_CHUNK == 0 && DQ_CHUNK % 16 == 0 && DQ_CHUNK <= 64 && 64 % DQ_CHUNK == 0,
                "dQ in whole chunks of at most one box");
  static_assert(Cfg::DQ_PAD == 4 || (Cfg::DQ_PAD == 0 && DQ_RED == 2), "staged rows padded by 4 fp32, or swizzled (DQ_RED 2)");
  static_assert(DQ_RED >= 0 && DQ_RED <= 2 && (DQ_RED != 1 || 32 % (DQ_CHUNK / 4) == 0),
                "DQ_RED 0..2; 16-byte reds: whole rows per warp instruction");
  static_assert(kKBytes % 1024 == 0 && kVBytes % 1024 == 0 && kStageBytes % 1024 == 0 && kDSBytes % 1024 == 0 &&
                    kDPBytes % 1024 == 0,
                "1024-byte aligned tiles (the 128-byte swizzle's atom)");
  static_assert(kSmemBytes <= 232448, "227 KB per block on sm_90");
};

// The CTA's walk over (query head of the group, query block) pairs, as v2_bwd_kv's: start block rotated by
// the key block (atomic dQ adds of one head's CTAs spread over rows), EMPTY tiles skipped.
// Deterministic (rot < 0): no rotation, query blocks descending, so that the CTAs of one head reach each
// query block in the order of their key blocks without waiting long (the dQ adds' turn order, v3_bwd_turn).
struct V3BwdWalk {
  int b, h_kv, G, nqb, total, rot, kv0, kv_hi;
  __device__ __forceinline__ void coords(int it, int& h, int& q0) const {
    const int hg = it / nqb;
    int qb = it - hg * nqb;
    if (rot < 0) {
      qb = nqb - 1 - qb;
    } else {
      qb += rot;
      if (qb >= nqb) qb -= nqb;
    }
    h = h_kv * G + hg;
    q0 = qb * 64;
  }
  // kJump: q_walk_skip's jumps over the positions outside q_range (the same positions as without them)
  template <bool kJump = true>
  __device__ __forceinline__ int next(int it, const AttnParams& p, const AttnBuffers& buf) const {
    return q_walk_next<64, kJump>(it, G, nqb, rot, b, h_kv * G, kv0, kv_hi, p, buf);
  }
};

}  // namespace ac
