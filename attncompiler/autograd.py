"""Autograd and ``torch.compile`` integration: attention as ``torch.library`` custom ops.

Three ops, registered when this module is imported (nothing runs on a GPU at import):

``attncompiler::attention_fwd(q, k, v, buffers, kernel_id, scale, dropout_p, rng, deterministic)
-> (out, lse)``
    The compiled forward (any schedule).  ``kernel_id`` names a :class:`CompiledAttention` in this
    module's registry (:func:`register_kernel`), so the op takes only tensors and simple scalars;
    ``rng`` is None without dropout, else an int64 tensor [seed, offset] (two's complement for seeds >= 2^63):
    on the CPU, read on the host, or on q's device, read by the kernels (below).  With a CPU pair the same
    implementation runs as ``attncompiler::attention_fwd_dropout``, which carries torch's ``cudagraph_unsafe`` tag
    (below), and so does the backward (``attention_bwd_dropout``).
``attncompiler::attention_bwd(dout, q, k, v, out, lse, dlse, buffers, kernel_id, scale, dropout_p, rng,
deterministic) -> (dq, dk, dv)``
    The v2 backward kernels (:mod:`attncompiler.runtime.backward`) -- also for a v1 forward, whose
    lse is the same.  ``deterministic`` selects the separate dQ pass (no atomics).
``attncompiler::attention_bwd_buffers(...) -> buffer grads``
    Gradients of learnable captured float buffers (``torch_backward``: chunked torch with the
    symbolic derivatives of :mod:`attncompiler.ir.grad`).

Each op has a fake (meta) implementation for ``torch.compile``, and the forward is registered with
``torch.library.register_autograd``; dropout's seed and offset are saved so the backward replays
the same Philox stream (no mask is stored).

CUDA graphs (``torch.compile(mode="reduce-overhead")``): a graph output must live in the graph's memory pool, and
an rng tensor [seed, offset] made from a fixed seed is a CPU constant that the forward saves for the backward, so
inductor refused the whole step ("storage data ptrs are not allocated in pool").  Without dropout there is no rng
tensor.  With dropout, on a CUDA device under ``torch.compile`` (or a ``torch.cuda.graph`` capture), the pair is
made on the device by ops and the kernels read it there (:mod:`attncompiler.runtime.rng`): a graph replays the
random draw with it, so each replay drops a fresh mask, and inductor captures the dropout forward and backward too.
A CPU pair (eager calls; learnable buffers, whose gradients torch computes from the seed on the host) runs as
``attention_fwd_dropout`` / ``attention_bwd_dropout``, tagged ``cudagraph_unsafe``: inductor keeps those out of its
CUDA graphs.  The runtime's own long-lived device tensors are made outside the graph's pool
(:mod:`attncompiler.runtime.persistent`).  On CPU tensors the ops run the float32 torch
reference (``reference_attention`` / ``torch_backward``) so that the integration is testable
without a GPU.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import Tensor

from .runtime.rng import device_rng, host_values, rng_parts, signed64, wants_device_rng

__all__ = ["register_kernel", "get_kernel", "attention_op", "make_rng", "POISON_GRADS", "CUDAGRAPH_UNSAFE"]

#: Tests set this to True: backward outputs are filled with NaN before the kernels run.
POISON_GRADS = False

_lock = threading.Lock()
_registry: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)


def register_kernel(kernel: Any) -> int:
    """The registry id of ``kernel`` (a CompiledAttention), registering it on first use."""
    kid = getattr(kernel, "_op_id", 0)
    if kid:
        return kid
    with _lock:
        kid = getattr(kernel, "_op_id", 0)
        if not kid:
            kid = next(_ids)
            _registry[kid] = kernel
            kernel._op_id = kid
    return kid


def get_kernel(kernel_id: int) -> Any:
    try:
        return _registry[kernel_id]
    except KeyError:
        raise KeyError(f"attncompiler kernel id {kernel_id} is not registered in this process") from None


def make_rng(seed: int | None, offset: int, device: Optional[torch.device] = None) -> Tensor:
    """The op's rng tensor for a dropout call: int64 [seed, offset] (a fresh random seed when None).  On the CPU, and
    read on the host at launch, except for a CUDA ``device`` under ``torch.compile`` or CUDA graph capture: there
    the pair is made on the device by ops and the kernels read it in place, so that a graph's replays drop fresh
    masks (:mod:`attncompiler.runtime.rng`)."""
    if wants_device_rng(device):
        return device_rng(seed, offset, device)
    if seed is None or torch.compiler.is_compiling():  # made by ops: a traced torch.tensor([...]) is a constant, and
        # a constant saved for the backward is a graph output outside the CUDA graph pool (inductor refuses the graph)
        return device_rng(seed, offset, torch.device("cpu"))
    return torch.tensor([signed64(seed), signed64(offset)], dtype=torch.int64)


def uses_graph_safe_rng(rng: Optional[Tensor]) -> bool:
    """No dropout, or dropout whose pair the kernels read on the device: the op may be captured in a CUDA graph."""
    return rng is None or rng.device.type == "cuda"


def _buffer_map(kern: Any, buffers: Sequence[Tensor]) -> dict[str, Tensor]:
    names = [b.name for b in kern.ir.buffers]
    if len(names) != len(buffers):
        raise ValueError(f"buffers: expected {len(names)} tensors ({names}), got {len(buffers)}")
    return dict(zip(names, buffers))


def _own_buffers(kern: Any, bufs: Mapping[str, Tensor]) -> bool:
    """Whether ``bufs`` are the kernel's own captured tensors (recorded launches hold only those)."""
    return len(bufs) == len(kern._buffers) and all(bufs.get(n) is t for n, t in kern._buffers.items())


def _out_like(q: Tensor, dv: int) -> Tensor:
    """An empty (B, H, N, dv) tensor in q's layout: (B, N, H, d) storage when q's heads are inner
    (q.stride(1) < q.stride(2)), else contiguous (B, H, N, d).  The kernels' outputs and gradients
    follow this rule, and the fake implementations use it too."""
    B, H, N, _ = q.shape
    if q.stride(1) < q.stride(2):
        return q.new_empty(B, N, H, dv).transpose(1, 2)
    return q.new_empty(B, H, N, dv)


# ----------------------------------------------------------------------------------------- forward
def _attention_fwd_impl(q: Tensor, k: Tensor, v: Tensor, buffers: list[Tensor], kernel_id: int, scale: float,
                        dropout_p: float, rng: Optional[Tensor], deterministic: bool) -> tuple[Tensor, Tensor]:
    kern = get_kernel(kernel_id)
    seed, offset, rng_state = rng_parts(rng)
    bufs = _buffer_map(kern, buffers)
    if q.device.type == "cpu":
        from .reference import reference_attention

        o, lse = reference_attention(q, k, v, kern.ir, buffers=bufs, scale=scale, dropout_p=dropout_p, seed=seed,
                                     offset=offset, return_lse=True, dtype=torch.float32)
        out = _out_like(q, v.shape[-1])
        out.copy_(o)
        return out, lse.contiguous()
    own = _own_buffers(kern, bufs)
    with torch.no_grad():
        return kern._launch_forward(q, k, v, return_lse=True, scale=scale, dropout_p=dropout_p, seed=seed,
                                    offset=offset, buffers=bufs, out=None, record=own, rng_state=rng_state)


#: torch's tag for ops a CUDA graph must not capture (inductor then runs the graph without one)
CUDAGRAPH_UNSAFE: tuple = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

_attention_fwd = torch.library.custom_op("attncompiler::attention_fwd", mutates_args=())(_attention_fwd_impl)
_attention_fwd_dropout = torch.library.custom_op("attncompiler::attention_fwd_dropout", mutates_args=(),
                                                 tags=CUDAGRAPH_UNSAFE)(_attention_fwd_impl)


def _fwd_fake(q, k, v, buffers, kernel_id, scale, dropout_p, rng, deterministic):
    B, H, N, _ = q.shape
    return _out_like(q, v.shape[-1]), q.new_empty(B, H, N, dtype=torch.float32)


_attention_fwd.register_fake(_fwd_fake)
_attention_fwd_dropout.register_fake(_fwd_fake)


# ----------------------------------------------------------------------------------------- backward
def _attention_bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        dlse: Optional[Tensor], buffers: list[Tensor], kernel_id: int, scale: float, dropout_p: float,
                        rng: Optional[Tensor], deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    kern = get_kernel(kernel_id)
    seed, offset, rng_state = rng_parts(rng)
    bufs = _buffer_map(kern, buffers)
    if q.device.type == "cpu":
        from .backward_torch import torch_backward

        grads = torch_backward(q, k, v, out, lse, dout, kern.ir, buffers=bufs, scale=scale, dropout_p=dropout_p,
                               seed=seed, offset=offset, dlse=dlse)[:3]
        res = []
        for g, t in zip(grads, (q, k, v)):
            res.append(_out_like(t, t.shape[-1]).copy_(g))
        return tuple(res)
    from .runtime.backward import run_backward

    own = _own_buffers(kern, bufs)
    return run_backward(kern.ir, kern.target, dout, q, k, v, out, lse, dlse, bufs, scale=scale, dropout_p=dropout_p,
                        seed=seed, offset=offset, rng_state=rng_state, deterministic=deterministic,
                        options=getattr(kern, "backward_options", None), poison=POISON_GRADS,
                        recipes=kern._bwd_recipes if own else None)


_attention_bwd = torch.library.custom_op("attncompiler::attention_bwd", mutates_args=())(_attention_bwd_impl)
_attention_bwd_dropout = torch.library.custom_op("attncompiler::attention_bwd_dropout", mutates_args=(),
                                                 tags=CUDAGRAPH_UNSAFE)(_attention_bwd_impl)


def _bwd_fake(dout, q, k, v, out, lse, dlse, buffers, kernel_id, scale, dropout_p, rng, deterministic):
    return _out_like(q, q.shape[-1]), _out_like(k, k.shape[-1]), _out_like(v, v.shape[-1])


_attention_bwd.register_fake(_bwd_fake)
_attention_bwd_dropout.register_fake(_bwd_fake)


@torch.library.custom_op("attncompiler::attention_bwd_buffers", mutates_args=())
def _attention_bwd_buffers(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                           dlse: Optional[Tensor], buffers: list[Tensor], need: list[bool], kernel_id: int,
                           scale: float, dropout_p: float, rng: Optional[Tensor]) -> list[Tensor]:
    from .backward_torch import torch_backward

    kern = get_kernel(kernel_id)
    seed, offset = host_values(rng)  # (torch computes these gradients: the pair is read on the host)
    bufs = _buffer_map(kern, buffers)
    names = tuple(n for n, want in zip(bufs, need) if want)
    *_, grads = torch_backward(q, k, v, out, lse, dout, kern.ir, buffers=bufs, scale=scale, dropout_p=dropout_p,
                               seed=seed, offset=offset, dlse=dlse, buffer_grads=names)
    return [grads[n].to(device=t.device, dtype=t.dtype) if n in grads else torch.zeros_like(t)
            for n, t in bufs.items()]


@_attention_bwd_buffers.register_fake
def _(dout, q, k, v, out, lse, dlse, buffers, need, kernel_id, scale, dropout_p, rng):
    return [torch.empty_like(b) for b in buffers]


# ----------------------------------------------------------------------------------------- autograd
def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, buffers, kernel_id, scale, dropout_p, rng, deterministic = inputs
    out, lse = output
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse, rng, *buffers)
    ctx.kernel_id, ctx.scale, ctx.dropout_p, ctx.deterministic = kernel_id, scale, dropout_p, deterministic
    ctx.kernel = get_kernel(kernel_id)  # keeps the (weakly registered) kernel alive for the backward
    ctx.buffers_need_grad = [bool(b.requires_grad and b.is_floating_point()) for b in buffers]


def _backward(ctx: Any, dout: Optional[Tensor], dlse: Optional[Tensor]):
    q, k, v, out, lse, rng, *buffers = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    if getattr(ctx, "eager", False):
        bwd = _attention_bwd_impl
    else:  # (the dropout op is tagged cudagraph_unsafe: its seed is read on the host)
        ops = torch.ops.attncompiler
        bwd = ops.attention_bwd if uses_graph_safe_rng(rng) else ops.attention_bwd_dropout
    dq, dk, dv = bwd(dout, q, k, v, out, lse, dlse, buffers, ctx.kernel_id, ctx.scale, ctx.dropout_p, rng,
                     ctx.deterministic)
    gb: list = [None] * len(buffers)
    if any(ctx.buffers_need_grad):
        gb = list(torch.ops.attncompiler.attention_bwd_buffers(dout, q, k, v, out, lse, dlse, buffers,
                                                               ctx.buffers_need_grad, ctx.kernel_id, ctx.scale,
                                                               ctx.dropout_p, rng))
        gb = [g if need else None for g, need in zip(gb, ctx.buffers_need_grad)]
    return dq, dk, dv, gb, None, None, None, None, None


torch.library.register_autograd("attncompiler::attention_fwd", _backward, setup_context=_setup_context)
torch.library.register_autograd("attncompiler::attention_fwd_dropout", _backward, setup_context=_setup_context)


def eager_forward(ctx: Any, impl: Any, setup_context: Any, args: tuple) -> Any:
    """The forward of an eager Function over a custom op's pieces: the op's implementation, then its autograd
    context (marked eager, so that the backward calls the implementations directly)."""
    output = impl(*args)
    setup_context(ctx, args, output)
    ctx.eager = True
    return output


class _EagerAttention(torch.autograd.Function):
    """The eager path of ``attncompiler::attention_fwd``: the same implementations, context and backward as the
    custom op, without ``torch.library``'s dispatch, schema checks and pytree work around every call (measured on
    an H100 with torch 2.11: a no-op custom op with registered autograd costs 430 us per forward+backward, a
    no-op autograd.Function 114 us).  Buffers come last, one input each, so that each gets its own gradient.
    ``forward`` takes ``ctx`` itself: a separate ``setup_context`` makes ``apply`` bind the arguments through
    ``inspect.signature`` on every call."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, kernel_id: int, scale: float, dropout_p: float,
                rng: Optional[Tensor], deterministic: bool, *buffers: Tensor) -> tuple[Tensor, Tensor]:
        args = (q, k, v, list(buffers), kernel_id, scale, dropout_p, rng, deterministic)
        return eager_forward(ctx, _attention_fwd_impl, _setup_context, args)

    @staticmethod
    def backward(ctx: Any, dout: Optional[Tensor], dlse: Optional[Tensor]):
        dq, dk, dv, gb, *_ = _backward(ctx, dout, dlse)
        return (dq, dk, dv, None, None, None, None, None, *gb)


def plain_tensor(t: Any) -> bool:
    """A tensor that is no subclass (fake, functional, DTensor...) but a Parameter: the eager path takes it."""
    return type(t) is Tensor or type(t) is torch.nn.Parameter


def attention_op(kernel: Any, q: Tensor, k: Tensor, v: Tensor, *, scale: float, dropout_p: float,
                 rng: Optional[Tensor], buffers: Mapping[str, Tensor],
                 deterministic: bool = False) -> tuple[Tensor, Tensor]:
    """(out, lse), differentiable: through the custom op when ``torch.compile`` traces (or a tensor subclass, such
    as a fake tensor, is passed), else through :class:`_EagerAttention` (the same kernels, less host time)."""
    kid = kernel._op_id or register_kernel(kernel)
    bufs = [buffers[b.name] for b in kernel.ir.buffers]
    if not torch.compiler.is_compiling() and all(plain_tensor(t) for t in (q, k, v, *bufs)):
        return _EagerAttention.apply(q, k, v, kid, float(scale), float(dropout_p), rng, bool(deterministic), *bufs)
    ops = torch.ops.attncompiler
    op = ops.attention_fwd if uses_graph_safe_rng(rng) else ops.attention_fwd_dropout
    return op(q, k, v, bufs, kid, float(scale), float(dropout_p), rng, bool(deterministic))
