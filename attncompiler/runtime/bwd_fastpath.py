"""Repeated backward calls: the launches recorded for a call signature (the forward's :mod:`.fastpath`, for
:func:`attncompiler.runtime.backward.run_backward`).

A backward call checks q, k, v, dO, out and lse, picks and loads its kernels (v3 or v2; v2 where TMA cannot describe
a tensor), packs two parameter structs, builds the TMA maps and launches two or three kernels. On an H200's host that
was 116-130 µs a call (thirty-eighth session, ``benchmarks/host_backward.py``), about a fifth of a small training
step's host time. Everything but the pointers, dropout's seed and offset and the deterministic mode's turn counters
is a function of the call's *signature*: the shapes, strides, dtypes and devices of dO, q, k, v, out, lse (and dL/dlse
when given), the scale, the dropout probability, the deterministic mode and the backward options. The first call of
a signature runs the full path and records a :class:`BackwardRecipe`; a later call re-checks only what the signature
does not fix (16-byte aligned base pointers, the captured buffers' versions), allocates the gradients and the
workspaces, patches the pointers into copies of the two structs and launches.

Recorded only where the full path ran on the inputs as given: lse and dL/dlse float32 and contiguous, dO and out
aligned for the kernels (else that path makes copies), the kernel's own captured buffers (autograd passes the
recipe table only then), no NaN poisoning (tests), no CUDA graph capture (the graph must hold the full path's
per-call GPU work, e.g. the tile classifier's buffer tables), and a non-empty problem.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .fastpath import buffer_versions, remembered
from .launch import launch_structs

__all__ = ["BackwardRecipe", "signature", "run", "record", "like_layout", "stats"]

_SEED_MASK = 2**64 - 1
#: backward calls launched from a recipe in this process (tests check that a repeated call took it)
stats = {"hits": 0}
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def like_layout(ref: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty (B, H, N, d) tensor in ref's memory layout (heads inner if ref is (B, N, H, d) storage); a packed
    (total rows, H, d) shape is contiguous."""
    if len(shape) == 3:  # packed rows (total, H, d): always contiguous
        return torch.empty(shape, device=ref.device, dtype=dtype)
    B, H, N, d = shape
    if ref.stride(1) < ref.stride(2):
        return torch.empty(B, N, H, d, device=ref.device, dtype=dtype).transpose(1, 2)
    return torch.empty(B, H, N, d, device=ref.device, dtype=dtype)


@dataclass
class BackwardRecipe:
    """A validated backward signature's launches (see the module's docstring)."""

    #: (function pointer, grid, threads, dynamic shared memory, by-value arguments: 2 = (P, bp), 3 = with the
    #: buffers struct, 4 = with the TMA maps too), in launch order
    launches: tuple[tuple[int, tuple[int, int, int], int, int, int], ...]
    device_index: int
    p_template: bytes
    ptype: type[ctypes.Structure]
    bp_template: bytes
    bptype: type[ctypes.Structure]
    bufs: Any  # the buffers struct of the recording call (its device copies and tables kept alive in it)
    dq_shape: tuple[int, ...]  # (B, H, N, d), or (total rows, H, d) for packed sequences
    dk_shape: tuple[int, ...]
    dv_shape: tuple[int, ...]
    dtype: torch.dtype
    ws_shape: tuple[int, int]
    dq_accum_shape: tuple[int, ...] | None  # the fp32 accumulator of atomic dQ modes
    rows_accum: bool  # dQ left in a row-major fp32 accumulator and converted here
    turn_counters: Callable[[torch.device], tuple[int, Any]] | None  # deterministic v3: (address, owner)
    maps: Callable[[ctypes.Structure, ctypes.Structure], Any] | None
    buffer_versions: tuple[int, ...] | None = ()
    keep: tuple[Any, ...] = field(default=(), repr=False)


def signature(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, dlse: Any, scale: Any, dropout_p: Any,
              deterministic: bool, options: Mapping[str, Any] | None) -> tuple | None:
    """The key a backward recipe is stored under, or None where none applies (a tensor subclass, options that do
    not hash)."""
    ts = (dout, q, k, v, out, lse) if dlse is None else (dout, q, k, v, out, lse, dlse)
    if not all(type(t) in _PLAIN for t in ts):
        return None
    try:
        okey = tuple(sorted(options.items())) if options else ()
        hash(okey)
    except TypeError:
        return None
    return (tuple((t.shape, t.stride(), t.dtype, t.device) for t in ts), dlse is None, scale, dropout_p,
            bool(deterministic), okey)


def _maps_by_pointers(build: Callable[[ctypes.Structure, ctypes.Structure], Any]
                      ) -> Callable[[ctypes.Structure, ctypes.Structure], Any]:
    """``build(P, bp)`` remembered by the pointers the v3 backward's maps describe (q, k, v, dO)."""
    return remembered(build, lambda P, bp: (P.q, P.k, P.v, bp.dout))


def record(*, src: Any, fns: Mapping[str, Any], grids: Mapping[str, tuple[int, int, int]],
           P: ctypes.Structure, bp: ctypes.Structure, Bf: ctypes.Structure, has_maps: bool,
           build_maps: Callable[[ctypes.Structure, ctypes.Structure], Any], turn_counters: Callable | None,
           q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dq: torch.Tensor | None, dk: torch.Tensor,
           dv: torch.Tensor, ws: torch.Tensor, dq_accum: torch.Tensor | None, device_index: int,
           buffers: Mapping[str, Any], keep: tuple[Any, ...]) -> BackwardRecipe:
    """The recipe of a backward the full path just launched with ``P`` and ``bp`` (``grids``: per entry, as
    launched; an empty grid is left out); the caller stores it (:func:`.fastpath.remember`)."""
    launches = []
    for e in src.entries:
        if grids[e][0] == 0:
            continue
        nargs = 2 if not src.takes_buffers(e) else (4 if has_maps else 3)
        launches.append((fns[e].ptr, tuple(grids[e]), src.threads(e), src.smem(e), nargs))
    rows_accum = dq is None
    return BackwardRecipe(
        tuple(launches), device_index, bytes(P), type(P), bytes(bp), type(bp), Bf,
        tuple(q.shape), tuple(dk.shape), tuple(dv.shape), dk.dtype, tuple(ws.shape),
        tuple(dq_accum.shape) if dq_accum is not None else None, rows_accum, turn_counters,
        _maps_by_pointers(build_maps) if has_maps else None, buffer_versions(buffers), keep)


def run(r: BackwardRecipe, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None, seed: int, offset: int,
        buffers: Mapping[str, Any], finish: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
        *, capture_checked: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Launch ``r`` for these tensors: (dq, dk, dv), or None when the full path must run: a base pointer not 16-byte
    aligned (that path copies or refuses), a captured buffer changed in place since the recording, or CUDA graph
    capture. ``finish(dq, dk, dv, dq_accum)``, when given, does the work after the launches and returns the
    gradients (packed sequences: :mod:`.varlen_fastpath`); else a row-major accumulator is copied into dq.
    ``capture_checked``: the caller has already found that no capture runs."""
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr())
    versions = buffer_versions(buffers)
    if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15 or versions is None or versions != r.buffer_versions:
        return None
    if not capture_checked and torch.cuda.is_current_stream_capturing():
        return None
    dev = q.device
    dk = like_layout(k, r.dk_shape, r.dtype)
    dv = like_layout(v, r.dv_shape, r.dtype)
    dq = None if r.rows_accum else like_layout(q, r.dq_shape, r.dtype)
    ws = torch.empty(r.ws_shape, device=dev, dtype=torch.float32)
    # (zeroed by the preprocess kernel: the template's dq_accum_floats)
    dq_accum = torch.empty(r.dq_accum_shape, device=dev, dtype=torch.float32) if r.dq_accum_shape else None
    P = r.ptype.from_buffer_copy(r.p_template)
    P.q, P.k, P.v, P.o = ptrs[0], ptrs[1], ptrs[2], ptrs[3]
    P.lse = lse.data_ptr()
    P.seed = seed & _SEED_MASK
    P.offset = offset & _SEED_MASK
    bp = r.bptype.from_buffer_copy(r.bp_template)
    bp.dout = ptrs[4]
    bp.dq = dq.data_ptr() if dq is not None else None
    bp.dk, bp.dv = dk.data_ptr(), dv.data_ptr()
    bp.dq_accum = dq_accum.data_ptr() if dq_accum is not None else None
    bp.dlse = dlse.data_ptr() if dlse is not None else None
    bp.lse2 = ws.data_ptr()
    bp.dsum = bp.lse2 + ws.stride(0) * ws.element_size()
    owner = None
    if r.turn_counters is not None:
        sem, owner = r.turn_counters(dev)
        bp.dq_sem = sem or None
    maps = r.maps(P, bp) if r.maps is not None else None
    idx = r.device_index
    stats["hits"] += 1
    if torch.cuda.current_device() == idx:
        _launch_all(r, P, bp, maps, idx)
    else:
        with torch.cuda.device(idx):
            _launch_all(r, P, bp, maps, idx)
    del owner  # (the caching allocator reuses it only after the launches queued on this stream)
    if finish is not None:
        return finish(dq, dk, dv, dq_accum)
    if r.rows_accum:
        dq = like_layout(q, r.dq_shape, r.dtype).copy_(dq_accum)
    return dq, dk, dv  # type: ignore[return-value]


def _launch_all(r: BackwardRecipe, P: ctypes.Structure, bp: ctypes.Structure, maps: Any, idx: int) -> None:
    for fn, grid, threads, smem, nargs in r.launches:
        args = (P, bp) if nargs == 2 else ((P, bp, r.bufs) if nargs == 3 else (P, bp, r.bufs, maps))
        launch_structs(fn, grid, threads, smem, args, idx)

