"""The per-call bound behind the v3 score skip (plan option ``score_skip``).

A separable score_mod with a column term linear in the key position (ALiBi) feeds the softmax
``x = coef * (q . k) + slope * kv + R(q)`` (log2 units).  Keys far enough below a key the row sees
have ``exp2(x - m) = 0`` exactly, whatever the dot product, once ``|q . k|`` is bounded; the kernel
(``v3_skip_begin`` in ``templates/include/attncompiler/v3_fwd.cuh``) then starts each tile's walk
above their blocks.  This module computes that bound per (batch, head) on the GPU, on torch's
current stream:

    bound[b, h] = max_i |q[b, h, i]| * max_j |k[b, h_kv, j]| * (1 + 2^-10)

(Cauchy-Schwarz; the factor covers the fp32 rounding of the norms and of the kernel's dot products
for head dims up to 2^13).  A non-finite value anywhere in q, k or v of the head makes its bound NaN
or inf, and the kernel then skips nothing, so NaN and inf reach the output exactly as without the skip.
Cost: one read of q, k and v (for N = 8k, d = 64, 32 heads: ~32 MB each), a few percent of the
attention itself; :data:`attncompiler.plan.v3.SCORE_SKIP_MIN_BLOCKS` keeps it off short sequences.
"""
from __future__ import annotations

import torch

__all__ = ["score_bound", "BOUND_MARGIN"]

#: relative margin on the product of the largest norms (fp32 rounding of the norms and the dot products)
BOUND_MARGIN = 1.0 + 2.0**-10


def score_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, H) float32, contiguous: a bound on ``|q[b, h, i] . k[b, h // (H / H_kv), j]|`` over every i, j, or
    NaN / inf where q, k or v of that head hold a non-finite value.  q: (B, H, Nq, D), k: (B, H_kv, Nk, D),
    v: (B, H_kv, Nk, DV), any strides."""
    qn = torch.linalg.vector_norm(q, dim=-1, dtype=torch.float32).amax(dim=-1)  # (B, H)
    kn = torch.linalg.vector_norm(k, dim=-1, dtype=torch.float32).amax(dim=-1)  # (B, H_kv)
    # 0 * max|v| is 0 for finite v and NaN otherwise: a non-finite v disables the skip for its heads
    vmax = torch.linalg.vector_norm(v, ord=float("inf"), dim=(-2, -1), dtype=torch.float32)  # (B, H_kv)
    kb = kn * BOUND_MARGIN + vmax * 0.0
    group = q.shape[1] // k.shape[1]
    if group > 1:
        kb = kb.repeat_interleave(group, dim=1)
    return (qn * kb).contiguous()
