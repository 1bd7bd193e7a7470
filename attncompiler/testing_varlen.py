"""Checking a kernel on packed sequences (varlen) against the float64 reference (error-ratio rule).

As :mod:`attncompiler.testing`: random inputs, outputs poisoned with NaN before the run, and the
kernel's error compared with eager PyTorch's error in the same dtype -- here per packed batch, with
the reference computed sequence by sequence (:func:`attncompiler.varlen.reference_varlen`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch

from .reference import error_ratio_check
from .testing import _inputs_generator
from .varlen import eager_varlen, reference_varlen

__all__ = ["VarlenCheck", "make_varlen_inputs", "check_varlen_kernel", "check_varlen_grads"]


@dataclass(frozen=True)
class VarlenCheck:
    ok: bool
    messages: tuple[tuple[str, str], ...]
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]

    def __str__(self) -> str:
        return (f"seqlens_q={list(self.seqlens_q)} seqlens_k={list(self.seqlens_k)}: "
                + "; ".join(f"{n}: {m}" for n, m in self.messages))


def _cu(lens: Sequence[int], device: str) -> torch.Tensor:
    return torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(device=device, dtype=torch.int32)


def make_varlen_inputs(kernel, seqlens_q: Sequence[int], seqlens_k: Sequence[int], H: int, H_kv: Optional[int] = None,
                       *, device: str = "cuda", generator: Optional[torch.Generator] = None):
    """Random q (total_q, H, D), k, v (total_k, H_kv, d) in the kernel's dtype and int32 cu_seqlens."""
    ir = kernel.ir
    dt = torch.bfloat16 if ir.dtype == "bf16" else torch.float16
    hk = H if H_kv is None else H_kv
    tq, tk = sum(seqlens_q), sum(seqlens_k)

    def mk(*s: int) -> torch.Tensor:
        return torch.randn(*s, device=device, dtype=torch.float32, generator=generator).to(dt)

    return (mk(tq, H, ir.head_dim), mk(tk, hk, ir.head_dim), mk(tk, hk, ir.head_dim_v),
            _cu(seqlens_q, device), _cu(seqlens_k, device))


def _lse_err(lse: torch.Tensor, ref: torch.Tensor) -> float:
    both_inf = torch.isinf(ref) & (lse.double() == ref)
    err = (lse.double() - ref).abs().masked_fill(both_inf, 0.0)
    err = err.masked_fill(torch.isnan(err), float("inf"))
    return float(err.max()) if err.numel() else 0.0


def check_varlen_kernel(kernel, seqlens_q: Sequence[int], seqlens_k: Optional[Sequence[int]] = None, H: int = 2, *,
                        H_kv: Optional[int] = None, seed: int = 1234, factor: float = 2.0, lse_tol: float = 2e-3,
                        buffers: Optional[Mapping[str, torch.Tensor]] = None,
                        max_seqlen: Optional[tuple[int, int]] = None) -> VarlenCheck:
    """Forward (out and lse) of ``kernel`` on a packed batch against the float64 reference. ``seed`` seeds the inputs
    (their own generator: the same call draws the same inputs whatever ran before it) and is the dropout seed."""
    sk = list(seqlens_q if seqlens_k is None else seqlens_k)
    q, k, v, cu_q, cu_k = make_varlen_inputs(kernel, seqlens_q, sk, H, H_kv, generator=_inputs_generator(seed))
    bufs = dict(kernel._buffers)
    if buffers:
        bufs.update(buffers)
    out = torch.full((q.shape[0], H, kernel.ir.head_dim_v), float("nan"), device=q.device, dtype=q.dtype)
    mq, mk = max_seqlen if max_seqlen is not None else (None, None)
    _, lse = kernel(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk, out=out,
                    return_lse=True, seed=seed, buffers=buffers)
    ref, ref_lse = reference_varlen(q, k, v, cu_q, cu_k, kernel.ir, buffers=bufs, seed=seed)
    eag, _ = eager_varlen(q, k, v, cu_q, cu_k, kernel.ir, buffers=bufs, seed=seed)
    ok, msg = error_ratio_check(out, ref, eag, factor=factor)
    lerr = _lse_err(lse, ref_lse)
    ok = ok and lerr <= lse_tol and tuple(lse.shape) == (H, q.shape[0])
    return VarlenCheck(ok, (("out", msg), ("lse", f"max err {lerr:.2e} (tol {lse_tol})")), tuple(seqlens_q),
                       tuple(sk))


def check_varlen_grads(kernel, seqlens_q: Sequence[int], seqlens_k: Optional[Sequence[int]] = None, H: int = 2, *,
                       H_kv: Optional[int] = None, seed: int = 1234, factor: float = 2.0,
                       deterministic: bool = False, use_lse: bool = False,
                       buffers: Optional[Mapping[str, torch.Tensor]] = None,
                       buffer_grads: tuple[str, ...] = (),
                       max_seqlen: Optional[tuple[int, int]] = None) -> VarlenCheck:
    """dq, dk, dv of ``kernel`` on a packed batch (poisoned before the kernels run) against float64
    autograd of the reference, by the error-ratio rule; ``use_lse`` adds lse to the loss;
    ``buffer_grads`` names float buffers made learnable (``requires_grad``) whose gradients are checked
    too. ``seed`` seeds the inputs and output gradients (their own generator) and is the dropout seed;
    ``max_seqlen`` = (max_seqlen_q, max_seqlen_k) passed to the kernel (default: None, None)."""
    from . import autograd

    sk = list(seqlens_q if seqlens_k is None else seqlens_k)
    gen = _inputs_generator(seed)
    q, k, v, cu_q, cu_k = make_varlen_inputs(kernel, seqlens_q, sk, H, H_kv, generator=gen)
    bufs = dict(kernel._buffers)
    if buffers:
        bufs.update(buffers)
    dout = torch.randn(q.shape[0], H, kernel.ir.head_dim_v, device=q.device, generator=gen).to(q.dtype)
    dlse = torch.randn(H, q.shape[0], device=q.device, generator=gen) if use_lse else None

    def run(fn, tensors, bufs_in):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        learn = {n: bufs_in[n].detach().clone().requires_grad_() for n in buffer_grads}
        o, lse = fn(*leaves, {**bufs_in, **learn})
        loss = (o.double() * dout.double()).sum()
        if dlse is not None:
            loss = loss + (torch.where(torch.isfinite(lse), lse.double(), 0.0) * dlse.double()).sum()
        return torch.autograd.grad(loss, leaves + [learn[n] for n in buffer_grads], allow_unused=True)

    old = autograd.POISON_GRADS
    autograd.POISON_GRADS = True
    try:
        mq, mk = max_seqlen if max_seqlen is not None else (None, None)
        got = run(lambda a, b, c, bf: kernel(a, b, c, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq,
                                             max_seqlen_k=mk, seed=seed, buffers=bf, return_lse=True,
                                             deterministic=deterministic), (q, k, v), bufs)
    finally:
        autograd.POISON_GRADS = old
    bufs64 = {n: t.double() if t.is_floating_point() else t for n, t in bufs.items()}
    ref = run(lambda a, b, c, bf: reference_varlen(a, b, c, cu_q, cu_k, kernel.ir, buffers=bf, seed=seed),
              [t.double() for t in (q, k, v)], bufs64)
    eag = run(lambda a, b, c, bf: eager_varlen(a, b, c, cu_q, cu_k, kernel.ir, buffers=bf, seed=seed), (q, k, v),
              bufs)
    msgs, ok = [], True
    names = ("dq", "dk", "dv", *(f"d{n}" for n in buffer_grads))
    for name, g, r, e, t in zip(names, got, ref, eag, (q, k, v, *(bufs[n] for n in buffer_grads))):
        r = torch.zeros_like(t, dtype=torch.float64) if r is None else r
        e = torch.zeros_like(t) if e is None else e
        if g is None:
            ok, msg = False, "no gradient"
        else:
            good, msg = error_ratio_check(g, r, e, factor=factor)
            ok = ok and good
        msgs.append((name, msg))
    return VarlenCheck(ok, tuple(msgs), tuple(seqlens_q), tuple(sk))
