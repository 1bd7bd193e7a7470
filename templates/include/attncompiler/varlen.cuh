// attncompiler/varlen.cuh -- packed sequences (cu_seqlens): a per-sequence view of the parameters.
//
// Included only by translation units rendered with varlen=True (attncompiler/runtime/varlen.py);
// the padded kernels never see it, so they pay nothing for it.
//
// Layout (FlashAttention's varlen API): q (total_q, H, D), k (total_k, H_kv, D), v (total_k, H_kv,
// DV), out (total_q, H, DV); sequence b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key
// rows [cu_seqlens_k[b], cu_seqlens_k[b+1]). The launcher passes p.B = number of sequences,
// p.Nq / p.Nk = the longest sequence (grid size) and p.total_q / p.total_k = the packed rows. At
// entry each CTA rewrites its copy of the params
// into the view of one sequence -- base pointers moved to the sequence's first row, batch strides 0,
// Nq / Nk its own lengths -- and the schedule's body runs unchanged on it: the Variant hooks see
// the sequence index as b, sequence-local q_idx / kv_idx, and Q_LEN / KV_LEN (p.Nq / p.Nk) of this
// sequence (so causal's bottom-right alignment is per sequence).
//
// Row-indexed arrays that the kernels address as ptr[(b*H + h) * p.Nq + row] get a moved base so
// that the same expression lands in their packed layout:
//   lse, dlse   (H, total_q) float32        element (h, q_start + row)
//   dq_accum    one (H, Nq_b, D) block per sequence at q_start * H * D (fp32, atomic dQ); or, tiled (v3,
//               kTiledRow > 0: [rows / 16][H][...] with b * Nq_pad + row as the row), the sequence's rows from
//               row 64 (q_start / 64 + b): 64-aligned, and past the previous sequence's last 64-row block
// lse2 / dsum keep the padded (B, H, Nq_pad) layout (Nq_pad from the longest sequence): no change.
#pragma once

namespace ac {

// base + off elements, through integer arithmetic: the moved base may lie outside the array (only
// the addresses the kernel forms from it are inside).
template <class P>
__device__ __forceinline__ P* varlen_shift(P* base, long long off) {
  return reinterpret_cast<P*>(reinterpret_cast<unsigned long long>(base) +
                              static_cast<unsigned long long>(off * static_cast<long long>(sizeof(P))));
}

struct VarlenSeq {
  int q_start;  // first packed query row of the sequence
  int k_start;  // first packed key row
  int total_q;  // packed query rows of the whole batch
};

// Error bits a view ORs into *p.varlen_errors when cu_seqlens disagree with the launch (runtime/varlen.py reads
// them): offsets out of [0, total rows], decreasing, not starting at 0 or ending at the packed rows, or a
// sequence longer than the launch's max_seqlen.
#define AC_VARLEN_BAD_OFFSETS 1

// Rows [start, end) of one sequence, clamped so that every row the kernels address lies in [0, total) and no
// sequence exceeds the grid's max_len; ok is false when clamping changed anything.
__device__ __forceinline__ int varlen_len(int start, int end, int total, int max_len, bool& ok) {
  const int s = varlen_start(start, total);
  const long long len = (long long)end - s;
  const int cap = min(max_len, total - s);
  ok = ok && s == start && len >= 0 && len <= cap;
  return len < 0 ? 0 : (len > cap ? cap : (int)len);
}

// Rewrite p into the view of sequence b (q, k, v, o, Nq, Nk, batch strides). On entry p.Nq / p.Nk are the
// launch's longest sequence (the grid's extent). The host checks cu_seqlens before an eager launch; a launch a
// CUDA graph replays had its cu_seqlens rewritten since, so the view clamps them (no address leaves the packed
// tensors) and reports what it clamped in p.varlen_errors (null: the host checked).
__device__ __forceinline__ VarlenSeq varlen_view(AttnParams& p, int b) {
  using T = ac_elem_t;
  VarlenSeq s;
  const int q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
  const int k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
  bool ok = (b > 0 || (q0 == 0 && k0 == 0)) && (b < p.B - 1 || (q1 == p.total_q && k1 == p.total_k));
  p.Nq = varlen_len(q0, q1, p.total_q, p.Nq, ok);
  p.Nk = varlen_len(k0, k1, p.total_k, p.Nk, ok);
  if (!ok && p.varlen_errors != nullptr) atomicOr(p.varlen_errors, AC_VARLEN_BAD_OFFSETS);  // (uniform: no
  // threadIdx test, whose divergent path made ptxas serialize the wgmma of the v3 forward: C7520)
  s.q_start = varlen_start(q0, p.total_q);
  s.k_start = varlen_start(k0, p.total_k);
  s.total_q = p.total_q;
  p.q = reinterpret_cast<const T*>(p.q) + (long long)s.q_start * p.q_sn;
  p.o = reinterpret_cast<T*>(p.o) + (long long)s.q_start * p.o_sn;
  p.k = reinterpret_cast<const T*>(p.k) + (long long)s.k_start * p.k_sn;
  p.v = reinterpret_cast<const T*>(p.v) + (long long)s.k_start * p.v_sn;
  p.q_sb = p.k_sb = p.v_sb = p.o_sb = 0;
  return s;
}

// An (H, total_q) row array addressed as ptr[(b*H + h) * Nq + row] by the CTA of (b, h).
template <class P>
__device__ __forceinline__ P* varlen_rows(P* base, const AttnParams& p, const VarlenSeq& s, int b, int h) {
  if (base == nullptr) return base;
  return varlen_shift(base, (long long)h * s.total_q + s.q_start - (long long)(b * p.H + h) * p.Nq);
}

// Forward CTA (q_block, b, h): false when the block lies past the end of its sequence.
__device__ __forceinline__ bool varlen_fwd_enter(AttnParams& p, int q0) {
  const int b = ac_grid_b();  // (grid (blocks, H, B))
  const int h = ac_grid_h();
  const VarlenSeq s = varlen_view(p, b);
  if (q0 >= p.Nq) return false;
  p.lse = varlen_rows(p.lse, p, s, b, h);
  return true;
}

// Backward: the view of sequence b in both parameter blocks (BP = AttnBwdParams, a template so
// that the forward translation unit, which has no AttnBwdParams, can include this header; D is the
// head dim, the row length of dq_accum; kTiledRow > 0: dq_accum is tiled, kTiledRow fp32 per row and head).
template <int D, class BP, int kTiledRow = 0>
__device__ __forceinline__ VarlenSeq varlen_bwd_view(AttnParams& p, BP& bp, int b) {
  using T = ac_elem_t;
  const VarlenSeq s = varlen_view(p, b);
  bp.dout = reinterpret_cast<const T*>(bp.dout) + (long long)s.q_start * bp.do_sn;
  if (bp.dq != nullptr) bp.dq = reinterpret_cast<T*>(bp.dq) + (long long)s.q_start * bp.dq_sn;
  bp.dk = reinterpret_cast<T*>(bp.dk) + (long long)s.k_start * bp.dk_sn;
  bp.dv = reinterpret_cast<T*>(bp.dv) + (long long)s.k_start * bp.dv_sn;
  bp.do_sb = bp.dq_sb = bp.dk_sb = bp.dv_sb = 0;
  if (bp.dq_accum != nullptr) {
    if constexpr (kTiledRow > 0) {
      // accumulator row b * Nq_pad + row  ->  64 (q_start / 64 + b) + row (runtime/varlen.py: varlen_dq_rows)
      const long long first = 64LL * (s.q_start / 64 + b);
      bp.dq_accum = varlen_shift(bp.dq_accum, (first - (long long)b * bp.Nq_pad) * p.H * kTiledRow);
    } else {
      // (b*H + h) * Nq * D + row * D  ->  (q_start * H + h * Nq + row) * D
      bp.dq_accum = varlen_shift(bp.dq_accum, ((long long)s.q_start * p.H - (long long)b * p.H * p.Nq) * D);
    }
  }
  return s;
}

// Preprocess CTA (row block, b, h): lse and dlse rows move to the packed layout; lse2 / dsum keep
// their padded layout, and every padded row is written (the dK/dV and dQ kernels read them).
template <int D, class BP>
__device__ __forceinline__ void varlen_bwd_pre_enter(AttnParams& p, BP& bp) {
  const int b = ac_grid_b();  // (grid (blocks, H, B))
  const int h = ac_grid_h();
  const VarlenSeq s = varlen_bwd_view<D>(p, bp, b);
  p.lse = varlen_rows(p.lse, p, s, b, h);
  bp.dlse = varlen_rows(bp.dlse, p, s, b, h);
}

// dK/dV CTA (key block, b, h_kv): false when the block lies past the end of its sequence or the
// sequence has no queries (the launcher zeroes dK, dV of such sequences).
template <int D, int kTiledRow = 0, class BP>
__device__ __forceinline__ bool varlen_bwd_kv_enter(AttnParams& p, BP& bp, int kv0) {
  varlen_bwd_view<D, BP, kTiledRow>(p, bp, ac_grid_b());
  return kv0 < p.Nk && p.Nq > 0;
}

// dQ CTA (q_block, b, h): false when the block lies past the end of its sequence.
template <int D, class BP>
__device__ __forceinline__ bool varlen_bwd_dq_enter(AttnParams& p, BP& bp, int q0) {
  varlen_bwd_view<D>(p, bp, ac_grid_b());
  return q0 < p.Nq;
}

}  // namespace ac
