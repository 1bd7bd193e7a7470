"""The per-call input of the score skip (v2 and v3 forward, plan option ``score_skip``).

A separable score_mod with a column term linear in the key position (ALiBi) feeds the softmax
``x = coef * (q . k) + slope * kv + R(q)`` (log2 units).  Keys far enough below a key the row sees
have ``exp2(x - m) = 0`` exactly, whatever the dot product, once ``|q . k|`` is bounded; the kernel
(``score_skip_begin`` in ``templates/include/attncompiler/score_skip.cuh``) then starts each tile's walk
above their blocks.  The bound is Cauchy-Schwarz's,

    |q[b, h, i] . k[b, h_kv, j]| <= max_i |q[b, h, i]| * max_j |k[b, h_kv, j]| * (1 + 2^-10)

(the factor covers the fp32 rounding of the norms and of the kernel's dot products for head dims up to
2^13).  Per call, :func:`launch_row_norms` runs the translation unit's second kernel, ``attn_row_norms``
(``templates/include/attncompiler/row_norms.cuh``), on torch's current stream: one read of q and k at
full bandwidth, leaving the largest squared row norms per (b, h) of q and per (b, h_kv) of k in a float32
table that ``AttnParams.row_norms_sq`` points to.  A NaN or inf in a head's q or k rows makes its entry
non-finite, and the kernel then skips nothing for that head.  :func:`score_bound_reference` is the
same bound in torch (tests, documentation).
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

__all__ = ["BOUND_MARGIN", "NORMS_ENTRY", "launch_row_norms", "prepare_score_skip", "row_norms_grid",
           "score_bound_reference"]

#: relative margin on the product of the largest norms (ScoreSkip::kBoundMargin in score_skip.cuh)
BOUND_MARGIN = 1.0 + 2.0**-10
#: the row-norm kernel's entry in a v2 or v3 translation unit rendered with score_skip
NORMS_ENTRY = "attn_row_norms"
_THREADS = 256   # RowNorms<D>::kThreads
_PASSES = 8      # RowNorms<D>::kPasses
_MAX_GRID_Y = 65535
_loaded: dict[tuple[Any, int], Any] = {}  # attn_row_norms by (kernel source, device)


def row_norms_grid(head_dim: int, B: int, H: int, H_kv: int, Nq: int, Nk: int) -> tuple[int, int, int]:
    """(B*H + B*H_kv, row chunks, 1): RowNorms<D>::kRowsPerCta rows of one (tensor, b, h) per chunk, at most
    65535 chunks (the grid's y limit; a CTA then loops over every gridDim.y-th chunk)."""
    chunks = head_dim // 8
    group = 1 << max(0, (chunks - 1).bit_length())  # RowNorms<D>::kGroup: lanes per row, a power of two
    rows_per_cta = _THREADS // min(group, 32) * _PASSES
    return (B * H + B * H_kv, max(1, min(-(-max(Nq, Nk) // rows_per_cta), _MAX_GRID_Y)), 1)


def launch_row_norms(ks: Any, dims: Any, params: ctypes.Structure, device: torch.device) -> torch.Tensor:
    """Run ``attn_row_norms`` of the forward kernel source ``ks`` on q and k (``params`` holds their pointers and
    strides) and point ``params.row_norms_sq`` at the result: float32 (B*H + B*H_kv,), the largest squared row
    norms of q per (b, h), then of k per (b, h_kv).  Returns the table (keep it until the launch is queued)."""
    from .compiler import compile_functions
    from .launch import device_index, launch_structs

    idx = device_index(device)
    fn = _loaded.get((ks, idx))  # (the source string caches its hash: no sha256 per call)
    if fn is None:
        loaded = compile_functions(ks.source, ks.arch, idx, (ks.entry, NORMS_ENTRY))[NORMS_ENTRY]
        fn = _loaded.setdefault((ks, idx), loaded)
    table = torch.zeros(dims.B * dims.H + dims.B * dims.H_kv, device=device, dtype=torch.float32)
    out = ctypes.c_void_p(table.data_ptr())
    grid = row_norms_grid(dims.D, dims.B, dims.H, dims.H_kv, dims.Nq, dims.Nk)
    with torch.cuda.device(device):
        launch_structs(fn.ptr, grid, _THREADS, 0, (params, out), device)
    params.row_norms_sq = table.data_ptr()
    return table


def prepare_score_skip(ks: Any, dims: Any, params: ctypes.Structure, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor) -> torch.Tensor | None:
    """The v2 and v3 schedules' ``prepare_forward``: for a plan with the score skip and at least
    :data:`attncompiler.plan.scoreskip.SCORE_SKIP_MIN_KEYS` keys, :func:`launch_row_norms` (params holds q's
    and k's pointers); else None (null ``row_norms_sq``: the kernel skips nothing)."""
    from ..plan.scoreskip import SCORE_SKIP_MIN_KEYS

    if not getattr(ks.plan, "score_skip", False) or dims.Nk < SCORE_SKIP_MIN_KEYS:
        return None
    return launch_row_norms(ks, dims, params, q.device)


def score_bound_reference(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, H) float32: the bound on ``|q[b, h, i] . k[b, h // (H / H_kv), j]|`` over every i, j that the kernel
    derives from the row-norm table (non-finite where q or k of that head holds a non-finite value)."""
    qn = torch.linalg.vector_norm(q, dim=-1, dtype=torch.float32).amax(dim=-1)  # (B, H)
    kn = torch.linalg.vector_norm(k, dim=-1, dtype=torch.float32).amax(dim=-1)  # (B, H_kv)
    kn = kn.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return qn * kn * BOUND_MARGIN
