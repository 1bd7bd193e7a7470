"""The attention backward in plain torch, chunked over query rows (no O(N^2) tensor kept).

Used where no CUDA kernel applies: the custom op's CPU implementation (so autograd and
``torch.compile`` integration are testable without a GPU) and the gradients of learnable captured
buffers (``dL/dbuf``, from the symbolic derivatives of :mod:`attncompiler.ir.grad`).

Per query chunk, in ``dtype`` (float32 by default):

    s   = scale * q k^T                 x = score_expr(s)  (masked -> P = 0)
    P   = exp(x - lse)                  (the forward's lse; a row with lse = -inf has P = 0)
    z   = keep / (1 - p)                (Philox keep bits, attncompiler.philox)
    dP  = dO v^T                        D = rowsum(dO * (z P) v) - dlse   (O recomputed in dtype)
    dx  = P * (z dP - D)                (dL/dx)
    dS  = dx * dx/ds                    dq = scale dS k,  dk += scale dS^T q,  dv += (z P)^T dO
    dbuf[idx] += dx * dx/dbuf[idx]      for each read of a learnable float buffer
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import torch

from .ir.grad import buffer_grad_terms, score_grad_expr
from .ir.types import AttentionIR
from .philox import dropout_keep_mask
from .reference import evaluate
from .spec.symbols import B as SYM_B
from .spec.symbols import H as SYM_H
from .spec.symbols import KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE

__all__ = ["torch_backward"]

_CHUNK_ELEMS = 1 << 24


def _bcast(v, shape, dtype, dev) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return torch.broadcast_to(v.to(dtype), shape)
    return torch.full(shape, v, dtype=dtype, device=dev)


def torch_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   dout: torch.Tensor, ir: AttentionIR, *, buffers: Mapping[str, torch.Tensor], scale: float,
                   dropout_p: float, seed: int, offset: int, dlse: Optional[torch.Tensor] = None,
                   buffer_grads: tuple[str, ...] = (), dtype: torch.dtype = torch.float32,
                   q_chunk: Optional[int] = None, b_start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                           dict[str, torch.Tensor]]:
    """(dq, dk, dv, {buffer: grad}) in ``dtype`` for the attention ``ir`` at (q, k, v) -> (out, lse).

    ``buffers`` maps every buffer of ``ir`` to its tensor; ``buffer_grads`` names the float buffers
    whose gradient is wanted (GradError, naming the buffer, if it has none).  ``b_start``: batch entry
    ``b`` is batch ``b_start + b`` for the mods' ``b`` and the dropout bits (one sequence of a packed
    batch at a time)."""
    B, H, Nq, D = q.shape
    Hkv, Nk, DV = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hkv
    dev = q.device
    terms = {n: buffer_grad_terms(ir, n) for n in buffer_grads}
    grad_expr = score_grad_expr(ir.score_expr)
    bufs = {}
    for info in ir.buffers:
        t = buffers[info.name]
        bufs[info.name] = t.detach().to(device=dev, dtype=dtype if info.kind == "float" else torch.int64)
    qf, kf, vf = q.detach().to(dtype), k.detach().to(dtype), v.detach().to(dtype)
    dof = dout.detach().to(dtype)
    kt = kf.transpose(-1, -2).unsqueeze(2)  # (B, Hkv, 1, D, Nk)
    vt = vf.transpose(-1, -2).unsqueeze(2)
    dq = torch.zeros(B, H, Nq, D, dtype=dtype, device=dev)
    dk = torch.zeros(B, Hkv, Nk, D, dtype=dtype, device=dev)
    dv = torch.zeros(B, Hkv, Nk, DV, dtype=dtype, device=dev)
    # Buffer gradients sum B*H*Nq*Nk terms of both signs into a few entries (an ALiBi slope per
    # head): they accumulate in float64 so the reduction adds no error of its own.
    gbuf = {n: torch.zeros_like(bufs[n], dtype=torch.float64) for n in buffer_grads}
    if Nq == 0 or Nk == 0 or B * H == 0:
        return dq, dk, dv, {n: g.to(dtype) for n, g in gbuf.items()}
    if q_chunk is None:
        q_chunk = max(16, _CHUNK_ELEMS // max(1, B * H * Nk) // 16 * 16)
    b_idx = torch.arange(b_start, b_start + B, device=dev).view(B, 1, 1, 1)
    h_idx = torch.arange(H, device=dev).view(1, H, 1, 1)
    kv_idx = torch.arange(Nk, device=dev).view(1, 1, 1, Nk)
    dlse_f = dlse.to(dtype) if dlse is not None else None
    for r0 in range(0, Nq, q_chunk):
        r1 = min(Nq, r0 + q_chunk)
        n = r1 - r0
        shape = (B, H, n, Nk)
        qc = qf[:, :, r0:r1].reshape(B, Hkv, G, n, D)
        s = torch.matmul(qc, kt).reshape(shape) * scale
        env = {SCORE.name: s, SYM_B.name: b_idx, SYM_H.name: h_idx, KV_IDX.name: kv_idx,
               Q_IDX.name: torch.arange(r0, r1, device=dev).view(1, 1, n, 1), Q_LEN.name: Nq, KV_LEN.name: Nk}
        x = _bcast(evaluate(ir.score_expr, env, bufs, float_dtype=dtype), shape, dtype, dev) \
            if ir.score_expr is not None else s
        visible = torch.ones(shape, dtype=torch.bool, device=dev)
        if ir.mask_expr is not None:
            m = evaluate(ir.mask_expr, env, bufs, float_dtype=dtype)
            if isinstance(m, torch.Tensor) and m.dtype != torch.bool:
                m = m != 0
            visible = _bcast(m, shape, torch.bool, dev).clone()
        row_lse = lse[:, :, r0:r1].to(dtype).unsqueeze(-1)
        visible &= torch.isfinite(row_lse)
        p = torch.exp(torch.where(visible, x - torch.where(torch.isfinite(row_lse), row_lse, 0.0), -math.inf))
        z = torch.ones((), dtype=dtype, device=dev)
        if dropout_p > 0.0:
            keep = dropout_keep_mask(B, H, Nq, Nk, seed=seed, offset=offset, p=dropout_p, device=dev,
                                     q_start=r0, q_end=r1, b_start=b_start)
            z = keep.to(dtype) / (1.0 - dropout_p)
        doc = dof[:, :, r0:r1]
        dp = torch.matmul(doc.reshape(B, Hkv, G, n, DV), vt).reshape(shape)
        pz = (p * z).reshape(B, Hkv, G, n, Nk)
        # D = rowsum(dO * O) with O recomputed from P in `dtype` (= rowsum(P z dP)): the stored O is
        # rounded to the element type, and that rounding, summed coherently over rows, dominates the
        # error of reductions such as a learnable slope's gradient.
        o_rec = torch.matmul(pz, vf.unsqueeze(2)).reshape(B, H, n, DV)
        dsum = (doc * o_rec).sum(-1)
        if dlse_f is not None:
            dsum = dsum - dlse_f[:, :, r0:r1]
        dx = p * (z * dp - dsum.unsqueeze(-1))
        dx = torch.where(visible, dx, 0.0)
        if grad_expr != 1:
            g = _bcast(evaluate(grad_expr, env, bufs, float_dtype=dtype), shape, dtype, dev)
            ds = torch.where(visible, dx * g, 0.0)
        else:
            ds = dx
        ds5 = (ds * scale).reshape(B, Hkv, G, n, Nk)
        dq[:, :, r0:r1] = torch.matmul(ds5, kf.unsqueeze(2)).reshape(B, H, n, D)
        dk += torch.matmul(ds5.transpose(-1, -2), qc).sum(2)
        dv += torch.matmul(pz.transpose(-1, -2), doc.reshape(B, Hkv, G, n, DV)).sum(2)
        for name, ts in terms.items():
            flat = gbuf[name].view(-1)
            dims = bufs[name].shape
            for term in ts:
                val = torch.where(visible, dx.double() * _bcast(evaluate(term.expr, env, bufs, float_dtype=dtype),
                                                                   shape, torch.float64, dev), 0.0)
                lin = torch.zeros(shape, dtype=torch.int64, device=dev)
                for d_i, idx_e in enumerate(term.indices):
                    iv = evaluate(idx_e, env, bufs, float_dtype=dtype)
                    it = _bcast(iv, shape, torch.int64, dev).clamp(0, dims[d_i] - 1)
                    lin = lin * dims[d_i] + it
                flat.index_add_(0, lin.reshape(-1), val.reshape(-1))
    return dq, dk, dv, {n: g.to(dtype) for n, g in gbuf.items()}
