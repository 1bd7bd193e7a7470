"""Repeated packed-sequence calls: the recorded launches of :mod:`.fastpath` and :mod:`.bwd_fastpath`, for
:mod:`.varlen`.

A packed call's launch is a function of what a padded call's is (the shapes, strides, dtypes and devices of the
tensors, the scale, dropout, the backward's options) and of the *values* of cu_seqlens_q / cu_seqlens_k: they give
the number of sequences, max_seqlen, the grid and the rows of sequences that have keys but no queries. The full path
reads those values on the host once per tensor and in-place version (``varlen._host_values``); a recording is keyed
the same way, by the cu_seqlens tensors themselves. Its key holds their ``id`` and the max_seqlen arguments, and the
recording holds :class:`CuSeqlens`: weak references to the two tensors with their versions and data pointers. A
later call launches from the recording only if it passes those very tensors, unchanged. So the layers of a step
that share one cu_seqlens pair record on the first layer and launch from the recording on the others, forward and
backward; the next batch's tensors record again (a table holds at most ``fastpath.MAX_RECIPES`` recordings and is
emptied when full).

What is not recorded: cu_seqlens made under ``torch.inference_mode()`` (no version counter, so the full path reads
their values on every call); and, as for padded calls, buffers passed per call or made under inference mode,
dropout kernels that read their seed on the device, calls under CUDA graph capture (which take the full path, whose
checks a graph must not skip), NaN-poisoned backwards (tests), and inputs the full path copies or refuses (a
non-contiguous cu_seqlens, misaligned rows).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from . import bwd_fastpath, fastpath

__all__ = ["CuSeqlens", "PackedForward", "PackedBackward", "forward_key", "backward_key", "run_forward",
           "run_backward"]


@dataclass(frozen=True)
class CuSeqlens:
    """The cu_seqlens pair a recording was made from: weak references (a recording never keeps a batch's tensors
    alive), torch's in-place version counters and the data pointers at the time."""

    refs: tuple[Any, Any]
    versions: tuple[int, int]
    pointers: tuple[int, int]

    @staticmethod
    def of(cu_q: torch.Tensor, cu_k: torch.Tensor) -> "CuSeqlens":
        return CuSeqlens((weakref.ref(cu_q), weakref.ref(cu_k)), (cu_q._version, cu_k._version),
                         (cu_q.data_ptr(), cu_k.data_ptr()))

    def matches(self, cu_q: torch.Tensor, cu_k: torch.Tensor) -> bool:
        """Whether ``cu_q`` / ``cu_k`` are the recorded tensors, not changed in place since (a tensor that died and
        another that took its ``id`` and address fail the identity test)."""
        return (self.refs[0]() is cu_q and self.refs[1]() is cu_k
                and (cu_q._version, cu_k._version) == self.versions
                and (cu_q.data_ptr(), cu_k.data_ptr()) == self.pointers)


@dataclass(frozen=True)
class PackedForward:
    """A packed forward's recording: the padded forward's recipe (its struct holds the cu_seqlens pointers and
    sizes) and the cu_seqlens pair it is valid for."""

    recipe: fastpath.ForwardRecipe
    cu: CuSeqlens


@dataclass(frozen=True)
class PackedBackward:
    """A packed backward's recording: the padded backward's recipe, the cu_seqlens pair, the validated sizes
    (``vi``, a :class:`~attncompiler.runtime.varlen.VarlenInputs` with the host offsets) and whether dQ is
    gathered from a row-major accumulator."""

    recipe: bwd_fastpath.BackwardRecipe
    cu: CuSeqlens
    vi: Any
    rows_accum: bool


def _cu_part(cu_q: Any, cu_k: Any, max_q: Any, max_k: Any) -> tuple | None:
    if type(cu_q) is not torch.Tensor or type(cu_k) is not torch.Tensor:
        return None
    if cu_q.is_inference() or cu_k.is_inference():
        return None  # (no version counter: a change in place could not be seen, so the full path reads them)
    if not (max_q is None or type(max_q) is int) or not (max_k is None or type(max_k) is int):
        return None  # (a SymInt under tracing: the full path)
    return (id(cu_q), id(cu_k), max_q, max_k)


def forward_key(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: Any, max_k: Any, scale: Any, dropout_p: Any,
                out: Any) -> tuple | None:
    """The key of a packed forward's recording, or None where none applies."""
    part = _cu_part(cu_q, cu_k, max_q, max_k)
    base = fastpath.signature(q, k, v, True, scale, dropout_p, out) if part is not None else None
    return None if base is None else ("packed", base, part)


def backward_key(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, dlse: Any, cu_q: Any, cu_k: Any, max_q: Any,
                 max_k: Any, scale: Any, dropout_p: Any, deterministic: bool,
                 options: Mapping[str, Any] | None) -> tuple | None:
    """The key of a packed backward's recording, or None where none applies."""
    part = _cu_part(cu_q, cu_k, max_q, max_k)
    base = (bwd_fastpath.signature(dout, q, k, v, out, lse, dlse, scale, dropout_p, deterministic, options)
            if part is not None else None)
    return None if base is None else ("packed", base, part)


def run_forward(r: PackedForward, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                cu_k: torch.Tensor, seed: int, offset: int, buffers: Mapping[str, Any],
                out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(out, lse) launched from ``r``, or None when the full path must run (other or changed cu_seqlens, and what
    :func:`.fastpath.run` hands back). The caller has found that no CUDA graph capture runs."""
    if not r.cu.matches(cu_q, cu_k):
        return None
    done = fastpath.run(r.recipe, q, k, v, seed, offset, buffers, out, capture_checked=True)
    return None if done is None else (done[0], done[1])  # type: ignore[return-value]


def run_backward(r: PackedBackward, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None, cu_q: torch.Tensor,
                 cu_k: torch.Tensor, seed: int, offset: int, buffers: Mapping[str, Any],
                 finish: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(dq, dk, dv) launched from ``r``, or None when the full path must run. ``finish(dq, dk, dv, dq_accum, vi,
    rows_accum)``: the packed work after the kernels (dK, dV of sequences without queries; dQ gathered from a
    row-major accumulator). The caller has found that no CUDA graph capture runs."""
    if not r.cu.matches(cu_q, cu_k):
        return None
    return bwd_fastpath.run(r.recipe, dout, q, k, v, out, lse, dlse, seed, offset, buffers,
                            finish=lambda dq, dk, dv, acc: finish(dq, dk, dv, acc, r.vi, r.rows_accum),
                            capture_checked=True)
