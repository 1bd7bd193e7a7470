"""Packed sequences (varlen): the call path, the autograd custom ops and the float64 reference.

``kernel(q, k, v, cu_seqlens_q=..., cu_seqlens_k=..., max_seqlen_q=..., max_seqlen_k=...)`` with
q (total_q, H, D), k (total_k, H_kv, D), v (total_k, H_kv, DV) returns out (total_q, H, DV) and,
with ``return_lse``, lse (H, total_q) float32 (layout and checks: :mod:`attncompiler.runtime.varlen`).
The mods see b = the sequence index and sequence-local q_idx / kv_idx; Q_LEN / KV_LEN are the
sequence's lengths (so ``causal=True`` is bottom-right aligned per sequence).

Three ``torch.library`` ops, registered when this module is imported (nothing runs at import):

``attncompiler::attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, buffers, kernel_id,
max_seqlen_q, max_seqlen_k, scale, dropout_p, rng, deterministic) -> (out, lse)``
``attncompiler::attention_varlen_bwd(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k,
buffers, kernel_id, max_seqlen_q, max_seqlen_k, scale, dropout_p, rng, deterministic) -> (dq, dk, dv)``
``attncompiler::attention_varlen_bwd_buffers(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k,
buffers, need, kernel_id, scale, dropout_p, rng) -> [grad per buffer]`` (learnable captured buffers)

``max_seqlen_*`` = -1 means "the longest sequence" (read from cu_seqlens).  ``rng`` is None without dropout, else
the int64 [seed, offset] pair (on the GPU under torch.compile or capture: :mod:`attncompiler.runtime.rng`).

The first two carry torch's ``cudagraph_unsafe`` tag: ``torch.compile(mode="reduce-overhead")`` keeps them out of its
CUDA graphs.  Calls that give both max_seqlen and whose dropout pair (if any) lies on the GPU read nothing on the host
once captured (:mod:`attncompiler.runtime.varlen`: the kernels clamp and report inconsistent cu_seqlens), so they run
as ``attention_varlen_fwd_graph_safe`` / ``attention_varlen_bwd_graph_safe``, the same implementations untagged,
and a training step on packed sequences is graphed whole.  On CPU tensors the ops
run :func:`reference_varlen` in float32 (and its autograd), so the integration is testable without
a GPU.  Learnable captured buffers (``requires_grad`` float tensors, e.g. a relative-bias table) get
their gradients from the chunked torch backward (:func:`attncompiler.backward_torch.torch_backward`)
run sequence by sequence, as the padded path computes them.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from .autograd import CUDAGRAPH_UNSAFE
from .ir.types import AttentionIR
from .reference import eager_attention, reference_attention
from .runtime.launch import InputError
from .runtime.rng import host_values, rng_parts
from .spec.symbols import B as SYM_B

__all__ = ["call_varlen", "reference_varlen", "eager_varlen", "pack", "unpack", "check_replays"]


# ------------------------------------------------------------------------------------ reference
def _uses_batch(ir: AttentionIR, dropout_p: float) -> bool:
    exprs = [e for e in (ir.score_expr, ir.mask_expr) if e is not None]
    return dropout_p > 0 or any(SYM_B in e.free_symbols for e in exprs)


def _sequences(cu_q: Tensor, cu_k: Tensor) -> list[tuple[int, slice, slice]]:
    """(b, query rows, key rows) of each sequence of a packed batch (cu_seqlens copied to the host)."""
    cq = [int(x) for x in cu_q.tolist()]
    ck = [int(x) for x in cu_k.tolist()]
    return [(b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)]


def _per_sequence(fn: Any, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, ir: AttentionIR,
                  dropout_p: Optional[float], out_dtype: torch.dtype, **kw: Any) -> tuple[Tensor, Tensor]:
    H, DV = q.shape[1], v.shape[-1]
    p_drop = float(ir.dropout_p if dropout_p is None else dropout_p)
    batch = _uses_batch(ir, p_drop)
    outs, lses = [], []
    for b, rq, rk in _sequences(cu_q, cu_k):
        qb, kb, vb = (t[r].transpose(0, 1).unsqueeze(0) for t, r in ((q, rq), (k, rk), (v, rk)))
        if batch and b > 0:  # the mods (or dropout's counter) read b: sequence b is batch entry b
            qb, kb, vb = (t.expand(b + 1, *t.shape[1:]) for t in (qb, kb, vb))
        o, lse = fn(qb, kb, vb, ir, dropout_p=dropout_p, return_lse=True, **kw)
        outs.append(o[-1].transpose(0, 1))
        lses.append(lse[-1])
    out = torch.cat(outs, 0) if outs else q.new_zeros(0, H, DV, dtype=out_dtype)
    lse = torch.cat(lses, 1) if lses else q.new_zeros(H, 0, dtype=out_dtype)
    return out, lse


def reference_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, ir: AttentionIR,
                     *, buffers: Optional[Mapping[str, Tensor]] = None, scale: Optional[float] = None,
                     dropout_p: Optional[float] = None, seed: int = 0, offset: int = 0,
                     dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """(out (total_q, H, DV), lse (H, total_q)) of a packed batch in ``dtype``: the reference of each
    sequence (:func:`attncompiler.reference.reference_attention`) with b = its index.  Differentiable."""
    return _per_sequence(reference_attention, q, k, v, cu_seqlens_q, cu_seqlens_k, ir, dropout_p, dtype,
                         buffers=buffers, scale=scale, seed=seed, offset=offset, dtype=dtype)


def eager_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, ir: AttentionIR, *,
                 buffers: Optional[Mapping[str, Tensor]] = None, scale: Optional[float] = None,
                 dropout_p: Optional[float] = None, seed: int = 0, offset: int = 0) -> tuple[Tensor, Tensor]:
    """As :func:`reference_varlen`, computed the way eager PyTorch does in q's dtype (the error-ratio bound)."""
    return _per_sequence(eager_attention, q, k, v, cu_seqlens_q, cu_seqlens_k, ir, dropout_p, q.dtype,
                         buffers=buffers, scale=scale, seed=seed, offset=offset)


def pack(seqs: list[Tensor]) -> tuple[Tensor, Tensor]:
    """(total, H, d) packed rows and int32 cu_seqlens (on the tensors' device) from (N_b, H, d) tensors."""
    if not seqs:
        raise ValueError("pack: expected at least one (N, H, d) tensor, got none")
    lens = [int(t.shape[0]) for t in seqs]
    cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return torch.cat(seqs, 0), cu.to(seqs[0].device)


def unpack(packed: Tensor, cu_seqlens: Tensor) -> list[Tensor]:
    """The per-sequence slices of a packed (total, ...) tensor."""
    cu = [int(x) for x in cu_seqlens.tolist()]
    return [packed[cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]


def check_replays(device: Any = None) -> None:
    """Raise :class:`~attncompiler.runtime.launch.InputError` if a packed call replayed from a CUDA graph on
    ``device`` (default: the current CUDA device) saw cu_seqlens inconsistent with its captured launch since the last
    check; one device sync (:func:`attncompiler.runtime.varlen.check_replays`)."""
    from .runtime.varlen import check_replays as check

    check(device)


# ------------------------------------------------------------------------------------ custom ops
def _kernel(kernel_id: int) -> Any:
    from .autograd import get_kernel

    return get_kernel(kernel_id)


def _bufs(kern: Any, buffers: list[Tensor]) -> dict[str, Tensor]:
    names = [b.name for b in kern.ir.buffers]
    if len(names) != len(buffers):
        raise ValueError(f"buffers: expected {len(names)} tensors ({names}), got {len(buffers)}")
    return dict(zip(names, buffers))


def _max(n: int) -> Optional[int]:
    return None if n < 0 else n


def _varlen_fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     buffers: list[Tensor], kernel_id: int, max_seqlen_q: int, max_seqlen_k: int, scale: float,
                     dropout_p: float, rng: Optional[Tensor], deterministic: bool) -> tuple[Tensor, Tensor]:
    kern = _kernel(kernel_id)
    seed, offset, rng_state = rng_parts(rng)
    bufs = _bufs(kern, buffers)
    if q.device.type == "cpu":
        o, lse = reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, kern.ir, buffers=bufs, scale=scale,
                                  dropout_p=dropout_p, seed=seed, offset=offset, dtype=torch.float32)
        return o.to(q.dtype).contiguous(), lse.contiguous()
    from .runtime.varlen import run_varlen_forward

    from .autograd import _own_buffers

    with torch.no_grad():
        return run_varlen_forward(kern.ir, kern.target, kern.kernel_source, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                  _max(max_seqlen_q), _max(max_seqlen_k), bufs, scale=scale, dropout_p=dropout_p,
                                  seed=seed, offset=offset, rng_state=rng_state,
                                  recipes=kern._recipes if _own_buffers(kern, bufs) else None)


# Tagged cudagraph_unsafe: a call without max_seqlen reads cu_seqlens on the host for its grid, and a CPU dropout
# pair is read there too, which a CUDA graph cannot replay, so torch.compile(mode="reduce-overhead") runs a graph
# holding these ops without one.  The graph-safe twins (the module's docstring) carry no tag.
_varlen_fwd = torch.library.custom_op("attncompiler::attention_varlen_fwd", mutates_args=(),
                                      tags=CUDAGRAPH_UNSAFE)(_varlen_fwd_impl)
_varlen_fwd_graph_safe = torch.library.custom_op("attncompiler::attention_varlen_fwd_graph_safe",
                                                 mutates_args=())(_varlen_fwd_impl)


def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, buffers, kernel_id, max_seqlen_q, max_seqlen_k, scale, dropout_p,
              rng, deterministic):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1]), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)


_varlen_fwd.register_fake(_fwd_fake)
_varlen_fwd_graph_safe.register_fake(_fwd_fake)


def graph_safe(max_seqlen_q: int, max_seqlen_k: int, rng: Optional[Tensor]) -> bool:
    """Whether a packed call may run inside a CUDA graph: both max_seqlen given, and no dropout pair on the host."""
    return max_seqlen_q >= 0 and max_seqlen_k >= 0 and (rng is None or rng.device.type == "cuda")


def _seq_view(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, rq: slice,
              rk: slice) -> tuple[Tensor, ...]:
    """Sequence (rq, rk) of a packed batch as a batch of one, in torch_backward's argument order:
    q, k, v, out, dout as (1, H, N, d) views, lse as (1, H, N)."""
    def seq(t: Tensor, r: slice) -> Tensor:
        return t[r].transpose(0, 1).unsqueeze(0)
    return seq(q, rq), seq(k, rk), seq(v, rk), seq(out, rq), lse[:, rq].unsqueeze(0), seq(dout, rq)


def _cpu_backward(ir: AttentionIR, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  dlse: Optional[Tensor], cu_q: Tensor, cu_k: Tensor, bufs: Mapping[str, Tensor], *, scale: float,
                  dropout_p: float, seed: int, offset: int) -> tuple[Tensor, Tensor, Tensor]:
    """The CPU op path: chunked torch backward (backward_torch.py) per sequence, float32."""
    from .backward_torch import torch_backward

    dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype) for t in (q, k, v))
    for b, rq, rk in _sequences(cu_q, cu_k):
        g = torch_backward(*_seq_view(q, k, v, out, lse, dout, rq, rk), ir, buffers=bufs, scale=scale,
                           dropout_p=dropout_p, seed=seed, offset=offset, b_start=b,
                           dlse=None if dlse is None else dlse[:, rq].unsqueeze(0))
        dq[rq], dk[rk], dv[rk] = (x[0].transpose(0, 1).to(q.dtype) for x in g[:3])
    return dq, dk, dv


def _varlen_bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                     dlse: Optional[Tensor], cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, buffers: list[Tensor],
                     kernel_id: int, max_seqlen_q: int, max_seqlen_k: int, scale: float, dropout_p: float,
                     rng: Optional[Tensor], deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    kern = _kernel(kernel_id)
    seed, offset, rng_state = rng_parts(rng)
    bufs = _bufs(kern, buffers)
    if q.device.type == "cpu":
        return _cpu_backward(kern.ir, dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, bufs, scale=scale,
                             dropout_p=dropout_p, seed=seed, offset=offset)
    from . import autograd
    from .runtime.varlen import run_varlen_backward

    return run_varlen_backward(kern.ir, kern.target, dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k,
                               _max(max_seqlen_q), _max(max_seqlen_k), bufs, scale=scale, dropout_p=dropout_p,
                               seed=seed, offset=offset, deterministic=deterministic,
                               options=getattr(kern, "backward_options", None), poison=autograd.POISON_GRADS,
                               rng_state=rng_state,
                               recipes=kern._bwd_recipes if autograd._own_buffers(kern, bufs) else None)


_varlen_bwd = torch.library.custom_op("attncompiler::attention_varlen_bwd", mutates_args=(),
                                      tags=CUDAGRAPH_UNSAFE)(_varlen_bwd_impl)
_varlen_bwd_graph_safe = torch.library.custom_op("attncompiler::attention_varlen_bwd_graph_safe",
                                                 mutates_args=())(_varlen_bwd_impl)


def _bwd_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, buffers, kernel_id, max_seqlen_q,
              max_seqlen_k, scale, dropout_p, rng, deterministic):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape))


_varlen_bwd.register_fake(_bwd_fake)
_varlen_bwd_graph_safe.register_fake(_bwd_fake)


def _varlen_bwd_buffers_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             dlse: Optional[Tensor], cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, buffers: list[Tensor],
                             need: list[bool], kernel_id: int, scale: float, dropout_p: float,
                             rng: Optional[Tensor]) -> list[Tensor]:
    """Gradients of the learnable buffers (``need``; zeros for the others): the chunked torch backward of
    each sequence with b = its index, summed over the sequences (float64 accumulation).  It reads cu_seqlens on the
    host, so its op is tagged cudagraph_unsafe."""
    from .backward_torch import torch_backward

    kern = _kernel(kernel_id)
    seed, offset = host_values(rng)
    bufs = _bufs(kern, buffers)
    names = tuple(n for n, want in zip(bufs, need) if want)
    total = {n: torch.zeros(bufs[n].shape, dtype=torch.float64, device=bufs[n].device) for n in names}
    for b, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        if rq.stop == rq.start or rk.stop == rk.start:
            continue  # no score of this sequence: nothing to add
        *_, grads = torch_backward(*_seq_view(q, k, v, out, lse, dout, rq, rk), kern.ir, buffers=bufs, scale=scale,
                                   dropout_p=dropout_p, seed=seed, offset=offset, b_start=b, buffer_grads=names,
                                   dlse=None if dlse is None else dlse[:, rq].unsqueeze(0))
        for n in names:
            total[n] += grads[n].to(device=total[n].device, dtype=torch.float64)
    return [total[n].to(t.dtype) if n in total else torch.zeros_like(t) for n, t in bufs.items()]


_varlen_bwd_buffers = torch.library.custom_op("attncompiler::attention_varlen_bwd_buffers", mutates_args=(),
                                              tags=CUDAGRAPH_UNSAFE)(_varlen_bwd_buffers_impl)


@_varlen_bwd_buffers.register_fake
def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, buffers, need, kernel_id, scale, dropout_p, rng):
    return [torch.empty_like(b) for b in buffers]


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    (q, k, v, cu_q, cu_k, buffers, kernel_id, max_q, max_k, scale, dropout_p, rng, deterministic) = inputs
    out, lse = output
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, rng, *buffers)
    ctx.args = (kernel_id, max_q, max_k, scale, dropout_p, deterministic)
    ctx.kernel = _kernel(kernel_id)  # keeps the (weakly registered) kernel alive for the backward
    ctx.buffers_need_grad = [bool(b.requires_grad and b.is_floating_point()) for b in buffers]


def _backward(ctx: Any, dout: Optional[Tensor], dlse: Optional[Tensor]):
    q, k, v, out, lse, cu_q, cu_k, rng, *buffers = ctx.saved_tensors
    kernel_id, max_q, max_k, scale, dropout_p, deterministic = ctx.args
    if dout is None:
        dout = torch.zeros_like(out)
    if getattr(ctx, "eager", False):
        bwd = _varlen_bwd_impl
    elif graph_safe(max_q, max_k, rng):
        bwd = torch.ops.attncompiler.attention_varlen_bwd_graph_safe
    else:
        bwd = torch.ops.attncompiler.attention_varlen_bwd
    dq, dk, dv = bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, buffers, kernel_id, max_q, max_k, scale, dropout_p,
                     rng, deterministic)
    gb: list = [None] * len(buffers)
    if any(ctx.buffers_need_grad):
        gb = list(torch.ops.attncompiler.attention_varlen_bwd_buffers(
            dout, q, k, v, out, lse, dlse, cu_q, cu_k, buffers, ctx.buffers_need_grad, kernel_id, scale, dropout_p,
            rng))
        gb = [g if want else None for g, want in zip(gb, ctx.buffers_need_grad)]
    return dq, dk, dv, None, None, gb, None, None, None, None, None, None, None


torch.library.register_autograd("attncompiler::attention_varlen_fwd", _backward, setup_context=_setup_context)
torch.library.register_autograd("attncompiler::attention_varlen_fwd_graph_safe", _backward,
                                setup_context=_setup_context)


class _EagerVarlen(torch.autograd.Function):
    """The eager path of ``attncompiler::attention_varlen_fwd`` (see ``autograd._EagerAttention``): the same
    implementations, context and backward, without the custom op's dispatch.  Buffers come last, one input each."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, kernel_id: int, max_q: int,
                max_k: int, scale: float, dropout_p: float, rng: Optional[Tensor], deterministic: bool,
                *buffers: Tensor) -> tuple[Tensor, Tensor]:
        from .autograd import eager_forward

        args = (q, k, v, cu_q, cu_k, list(buffers), kernel_id, max_q, max_k, scale, dropout_p, rng, deterministic)
        return eager_forward(ctx, _varlen_fwd_impl, _setup_context, args)

    @staticmethod
    def backward(ctx: Any, dout: Optional[Tensor], dlse: Optional[Tensor]):
        dq, dk, dv, _, _, gb, *_ = _backward(ctx, dout, dlse)
        return (dq, dk, dv) + (None,) * 9 + tuple(gb)


# ------------------------------------------------------------------------------------ call path
def call_varlen(kern: Any, q: Tensor, k: Tensor, v: Tensor, *, cu_seqlens_q: Any, cu_seqlens_k: Any,
                max_seqlen_q: Any, max_seqlen_k: Any, return_lse: bool, scale: Optional[float],
                dropout_p: Optional[float], seed: Optional[int], offset: int, buffers: Mapping[str, Tensor],
                out: Optional[Tensor], deterministic: Optional[bool]) -> Any:
    """``CompiledAttention.__call__`` with cu_seqlens (arguments already checked there, buffers merged)."""
    from . import autograd

    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise InputError(f"cu_seqlens_q, cu_seqlens_k: expected both for packed sequences, got "
                         f"{'a tensor' if cu_seqlens_q is not None else 'None'} and "
                         f"{'a tensor' if cu_seqlens_k is not None else 'None'}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, torch.SymInt)) or m < 0):
            raise InputError(f"{name}: expected a non-negative int or None, got {m!r}")
    # every sequence fits one 64-row tile (max_seqlen_q given as an int: no host read): the 64-row sibling (plan/short.py)
    short = kern._short_kernel(max_seqlen_q) if type(max_seqlen_q) is int else None
    if short is not None:
        res = call_varlen(short, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, return_lse=return_lse, scale=scale,
                          dropout_p=dropout_p, seed=seed, offset=offset, buffers=buffers, out=out,
                          deterministic=deterministic)
        if hasattr(short, "last_seed"):
            kern.last_seed, kern.last_offset, kern.last_rng_state = short.last_seed, short.last_offset, \
                short.last_rng_state
        return res
    p_drop = kern.ir.dropout_p if dropout_p is None else float(dropout_p)
    kern._check_dropout(p_drop)
    sc = kern.ir.scale if scale is None else float(scale)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                                 for t in (q, k, v, *buffers.values()))
    if not (needs_grad or torch.compiler.is_compiling()):
        from .runtime.rng import captured_rng
        from .runtime.varlen import run_varlen_forward

        rng_state = captured_rng(p_drop, seed, offset, q.device) if isinstance(q, Tensor) else None
        if rng_state is None and seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item()) if p_drop > 0 else 0
        own = autograd._own_buffers(kern, buffers)
        o, lse = run_varlen_forward(kern.ir, kern.target, kern.kernel_source, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                    max_seqlen_q, max_seqlen_k, buffers, scale=sc, dropout_p=p_drop,
                                    seed=seed or 0, offset=offset, out=out, rng_state=rng_state,
                                    recipes=kern._recipes if own else None)
        kern.last_seed, kern.last_offset, kern.last_rng_state = seed, offset, rng_state
        return (o, lse) if return_lse else o
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.device.type != "cuda":
            raise InputError(f"{name}: expected a CUDA tensor, got {getattr(t, 'device', type(t).__name__)}")
    if out is not None:
        raise InputError("out: expected None when inputs require grad or under torch.compile, got a tensor")
    det = torch.are_deterministic_algorithms_enabled() if deterministic is None else bool(deterministic)
    rng = autograd.make_rng(seed, offset, q.device) if p_drop > 0 else None
    if rng is not None:
        if rng.device.type == "cuda":
            kern.last_seed, kern.last_rng_state = None, rng
        else:
            kern.last_seed, kern.last_rng_state = host_values(rng)[0], None
        kern.last_offset = offset
    kid = kern._op_id or autograd.register_kernel(kern)
    bufs = [buffers[b.name] for b in kern.ir.buffers]
    mq, mk = (-1 if m is None else int(m) for m in (max_seqlen_q, max_seqlen_k))
    if not torch.compiler.is_compiling() and all(autograd.plain_tensor(t) for t in (q, k, v, *bufs)):
        o, lse = _EagerVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, kid, mq, mk, float(sc), float(p_drop), rng,
                                    det, *bufs)
    else:
        ops = torch.ops.attncompiler
        op = ops.attention_varlen_fwd_graph_safe if graph_safe(mq, mk, rng) else ops.attention_varlen_fwd
        o, lse = op(q, k, v, cu_seqlens_q, cu_seqlens_k, bufs, kid, mq, mk, float(sc), float(p_drop), rng, det)
    return (o, lse) if return_lse else o
