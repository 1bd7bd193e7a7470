"""Packed sequences (varlen): input checks and the launches of the forward and backward kernels.

Layout (FlashAttention's varlen API): q (total_q, H, D), k (total_k, H_kv, D), v (total_k, H_kv,
DV), out (total_q, H, DV), lse (H, total_q) float32; ``cu_seqlens_q`` / ``cu_seqlens_k`` are int32
tensors of length B+1 on q's device, starting at 0, non-decreasing, ending at total_q / total_k:
sequence b owns query rows [cu_q[b], cu_q[b+1]) and key rows [cu_k[b], cu_k[b+1]).  Empty
sequences are allowed (no rows: nothing is computed; queries with no keys get out = 0, lse = -inf).

The kernels are the v2 ones rendered with ``varlen=True`` (templates/include/attncompiler/varlen.cuh:
each CTA takes the view of its sequence at entry), so the Variant hooks see b = the sequence index,
sequence-local q_idx / kv_idx and Q_LEN / KV_LEN of the sequence.  The forward runs the v3 schedule
when the kernel was compiled with v3 (Hopper) and the copy engine can describe q, k and v (TMA maps over
(D, total rows, heads): the kernel's plan, one tile per CTA, no score skip), else v2 (the kernel's own
plan when it was compiled with v2, else the v2 planner's choice).  The backward is the one
:func:`~attncompiler.runtime.backward.bwd_source` picks for ``varlen=True``: on sm_90 at head dims 64 / 128 the
v3 backward (TMA maps over the packed rows, each CTA in its sequence's view), where TMA can describe q, k, v
and dO; else v2's.

:func:`check_varlen` copies the two cu_seqlens to the host (one device sync each) to check that they
are monotone and consistent with the tensors.  The copy is cached per tensor (keyed by torch's version
counter, so an in-place change is seen): the layers of one step that share a cu_seqlens, and their
backward, sync once.

CUDA graphs: a call captured by ``torch.cuda.graph`` or ``torch.compile(mode="reduce-overhead")`` cannot read
cu_seqlens on the host -- its replays see whatever the graph's input buffer holds then.  It needs max_seqlen_q and
max_seqlen_k (they size the grid), checks only what the shapes say, and leaves the values to the kernels: each
sequence's view is clamped into the packed rows and max_seqlen (varlen.cuh, so no address leaves the tensors), and
a view that had to be clamped ORs a bit into a per-device error word.  The next eager packed call on the device, or
:func:`check_replays`, raises the error a replay recorded.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import torch

from ..codegen.schedule import KernelSource, get_schedule
from ..ir.types import AttentionIR
from ..plan.targets import Target
from ..plan.v3_grid import without_persistent_grid
from .compiler import LoadedKernel, allow_dynamic_smem, compile_kernel
from . import fastpath
from . import varlen_fastpath as vfast
from .launch import (AttnInputs, InputError, check_index_limit, check_out, device_index, pack_params,
                     prepare_buffers)

if TYPE_CHECKING:
    from ..codegen.v3_bwd import DqTiles

__all__ = ["VarlenInputs", "check_varlen", "check_replays", "varlen_fwd_source", "run_varlen_forward",
           "run_varlen_backward"]

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_MAX_GRID_YZ = 65535  # the launch grid's y and z limits: the heads go on y, the batch on z (common.cuh: ac_grid_bh)
_lock = threading.Lock()


@dataclass(frozen=True)
class VarlenInputs:
    """Validated sizes of a packed batch; ``cu_q`` / ``cu_k`` are the host copies of cu_seqlens, None for a call
    captured in a CUDA graph (``errors``: the address of the device's error word the kernels report to; 0 when the
    host checked cu_seqlens)."""

    B: int
    H: int
    H_kv: int
    total_q: int
    total_k: int
    max_q: int
    max_k: int
    D: int
    DV: int
    cu_q: tuple[int, ...] | None
    cu_k: tuple[int, ...] | None
    errors: int = 0

    def launch_dims(self) -> AttnInputs:
        """What the launch geometry sees: B sequences of at most max_q queries and max_k keys."""
        return AttnInputs(self.B, self.H, self.H_kv, self.max_q, self.max_k, self.D, self.DV)


def _desc(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__


# Host copies of cu_seqlens tensors already read: id(tensor) -> (weak ref, version, data_ptr, values).
# A training step passes one cu_seqlens to every layer's forward and backward; only the first call
# syncs.  (Tensors compare elementwise, so a WeakKeyDictionary cannot hold them.)
_host_cache: dict[int, tuple[Any, int, int, list[int]]] = {}


def _forget(key: int) -> Any:
    def drop(_ref: Any) -> None:
        with _lock:
            _host_cache.pop(key, None)
    return drop


def _host_values(cu: torch.Tensor) -> list[int]:
    """cu's values on the host: a device sync the first time a (GPU) tensor is seen or after it
    was modified in place (torch's version counter).  An inference-mode tensor has no version counter, so its
    values are read on every call."""
    if cu.is_inference():
        return [int(x) for x in cu.tolist()]
    ver, ptr = cu._version, cu.data_ptr()
    with _lock:
        hit = _host_cache.get(id(cu))
    if hit is not None and hit[0]() is cu and hit[1:3] == (ver, ptr):
        return hit[3]
    vals = [int(x) for x in cu.tolist()]
    if not torch.compiler.is_compiling():
        with _lock:
            _host_cache[id(cu)] = (weakref.ref(cu, _forget(id(cu))), ver, ptr, vals)
    return vals


def _check_cu_tensor(name: str, cu: Any) -> None:
    if not isinstance(cu, torch.Tensor):
        raise InputError(f"{name}: expected an int32 tensor of length B+1, got {_desc(cu)}")
    if cu.dtype != torch.int32:
        raise InputError(f"{name}: expected dtype torch.int32, got {cu.dtype}; use .to(torch.int32)")
    if cu.dim() != 1 or cu.numel() < 1:
        raise InputError(f"{name}: expected a 1-d tensor of length B+1 >= 1, got shape {tuple(cu.shape)}")


def _check_cu(name: str, cu: Any, total: int, rows: str) -> list[int]:
    _check_cu_tensor(name, cu)
    vals = _host_values(cu)
    if vals[0] != 0:
        raise InputError(f"{name}: expected cu_seqlens[0] == 0, got {vals[0]}")
    for i in range(len(vals) - 1):
        if vals[i + 1] < vals[i]:
            raise InputError(f"{name}: expected non-decreasing offsets, got {name}[{i}] = {vals[i]} > "
                             f"{name}[{i + 1}] = {vals[i + 1]}")
    if vals[-1] != total:
        raise InputError(f"{name}: expected the last offset to equal the packed {rows} rows ({total}), "
                         f"got {vals[-1]}")
    return vals


def _check_max(name: str, given: Any, actual: int) -> int:
    if given is None:
        return actual
    if isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise InputError(f"{name}: expected a non-negative int or None, got {given!r}")
    if given < actual:
        raise InputError(f"{name}: expected at least the longest sequence ({actual}), got {given}")
    return given


# The error word of each device (int32, outside torch's allocator): varlen.cuh ORs AC_VARLEN_BAD_OFFSETS into it.
# _replayed: the devices whose captured launches carry its address (only those can have set it).
_error_words: dict[int, torch.Tensor] = {}
_replayed: set[int] = set()


def _error_word(index: int) -> torch.Tensor:
    """The device's error word, made by its first packed call, eager or captured (``settled_zeros``: allocated and
    zeroed outside any graph, ready before a launch on any stream reads it)."""
    with _lock:
        word = _error_words.get(index)
    if word is None:
        from .persistent import settled_zeros

        word = settled_zeros(1, torch.int32, torch.device("cuda", index))
        with _lock:
            word = _error_words.setdefault(index, word)
    return word


def check_replays(device: Any = None) -> None:
    """Raise :class:`InputError` if a packed-sequence call replayed from a CUDA graph on ``device`` (default: the
    current one) found cu_seqlens inconsistent with its launch since the last check (one device sync; nothing to do
    when no packed call was captured there).  The error is cleared once raised."""
    index = device_index(torch.device("cuda") if device is None else torch.device(device))
    if index not in _replayed:
        return
    word = _error_word(index)
    bits = int(word.item())
    if bits:
        word.zero_()
        raise InputError("cu_seqlens_q, cu_seqlens_k (a call replayed from a CUDA graph): expected offsets from 0 to "
                         "the packed rows, non-decreasing, no sequence longer than the captured max_seqlen_q / "
                         f"max_seqlen_k; got offsets that are not (error bits {bits:#x}), so the outputs of that "
                         "replay are wrong for the sequences they name")


def _check_captured(cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any, max_seqlen_k: Any, total_q: int,
                    total_k: int) -> tuple[int, int, int]:
    """(B, max_q, max_k) of a call captured in a CUDA graph, from the shapes alone (see the module)."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_cu_tensor(name, cu)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise InputError(f"cu_seqlens_q, cu_seqlens_k: expected the same length B+1, got {cu_seqlens_q.numel()} and "
                         f"{cu_seqlens_k.numel()}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if m is None:
            raise InputError(f"{name}: expected an int under CUDA graph capture (it sizes the grid, and cu_seqlens "
                             "cannot be read on the host while capturing), got None")
    B = cu_seqlens_q.numel() - 1
    if B == 0 and (total_q or total_k):
        raise InputError(f"cu_seqlens_q, cu_seqlens_k: expected B+1 >= 2 offsets for {total_q} query and {total_k} "
                         "key rows, got one (no sequence)")
    return B, _check_max("max_seqlen_q", max_seqlen_q, 0), _check_max("max_seqlen_k", max_seqlen_k, 0)


def check_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
                 max_seqlen_k: Any, ir: AttentionIR) -> VarlenInputs:
    """Validate a packed batch for ``ir``.  Order: the tensors' types, ranks, dtypes and shapes; the
    cu_seqlens (dtype, rank, length, values); max_seqlen; then devices, limits and memory layout --
    so that everything but the device is reported for CPU tensors too.  Under CUDA graph capture the values of
    cu_seqlens are left to the kernels (see the module)."""
    want = _TORCH_DTYPES[ir.dtype]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise InputError(f"{name}: expected 3 dims (total_rows, heads, head_dim) for packed sequences, "
                             f"got shape {tuple(t.shape)}")
        if t.dtype != want:
            raise InputError(f"{name}: expected dtype {want} (the spec's dtype {ir.dtype!r}), got {t.dtype}")
    total_q, H, D = q.shape
    total_k, H_kv, Dk = k.shape
    total_v, H_v, DV = v.shape
    if D != ir.head_dim or Dk != ir.head_dim:
        raise InputError(f"q, k: expected head_dim {ir.head_dim} (compiled), got {D} and {Dk}")
    if DV != ir.head_dim_v:
        raise InputError(f"v: expected head_dim_v {ir.head_dim_v} (compiled), got {DV} in shape {tuple(v.shape)}")
    if total_v != total_k or H_v != H_kv:
        raise InputError(f"k and v: expected the same rows and heads, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if H_kv == 0 or H % H_kv != 0:
        raise InputError(f"heads: expected q heads ({H}) to be a multiple of k/v heads ({H_kv})")
    captured = q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    cq: list[int] | None = None
    ck: list[int] | None = None
    if captured:
        B, max_q, max_k = _check_captured(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k)
    else:
        if q.device.type == "cuda":
            check_replays(q.device)
        cq = _check_cu("cu_seqlens_q", cu_seqlens_q, total_q, "query")
        ck = _check_cu("cu_seqlens_k", cu_seqlens_k, total_k, "key")
        if len(cq) != len(ck):
            raise InputError(f"cu_seqlens_q, cu_seqlens_k: expected the same length B+1, got {len(cq)} and {len(ck)}")
        B = len(cq) - 1
        max_q = _check_max("max_seqlen_q", max_seqlen_q, max((cq[i + 1] - cq[i] for i in range(B)), default=0))
        max_k = _check_max("max_seqlen_k", max_seqlen_k, max((ck[i + 1] - ck[i] for i in range(B)), default=0))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise InputError(f"{name}: expected a CUDA tensor, got a tensor on {t.device}; move it with .cuda()")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.device != q.device:
            raise InputError(f"{name}: expected an int32 tensor on {q.device} (q's device), got one on {t.device}")
    if B > _MAX_GRID_YZ or H > _MAX_GRID_YZ:
        raise InputError(f"sequences and heads: expected each at most {_MAX_GRID_YZ} (the launch grid's z and y "
                         f"limits), got {B} sequences, H={H}")
    if B * H >= 2**31:
        raise InputError(f"sequences*heads: expected < 2^31 (the kernels' int (sequence, head) index), got {B * H}")
    if max(total_q, total_k) >= 2**31 - 1024 or max(max_q, max_k) >= 2**31 - 1024:
        raise InputError(f"rows: expected < 2^31, got total_q={total_q}, total_k={total_k}")
    check_index_limit(ir, sequences=B, heads=H, max_seqlen_q=max_q, max_seqlen_k=max_k)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() == 0:
            continue
        if t.stride(-1) != 1:
            raise InputError(f"{name}: expected a contiguous head dimension (stride 1), got strides {t.stride()}; "
                             f"call .contiguous() first")
        if any(s % 8 for s in t.stride()[:2]) or t.data_ptr() % 16:
            raise InputError(f"{name}: expected 16-byte aligned rows (strides multiples of 8 elements, 16-byte "
                             f"aligned base), got strides {t.stride()} and address {t.data_ptr():#x}")
    errors = 0
    if captured:
        index = device_index(q.device)
        errors = _error_word(index).data_ptr()
        with _lock:
            _replayed.add(index)
    return VarlenInputs(B, H, H_kv, total_q, total_k, max_q, max_k, D, DV, None if cq is None else tuple(cq),
                        None if ck is None else tuple(ck), errors)


def _as4(t: torch.Tensor) -> torch.Tensor:
    """(rows, H, d) viewed as (1, H, rows, d): the kernels' (b, h, n) strides of a packed tensor."""
    return t.unsqueeze(0).transpose(1, 2)


# ------------------------------------------------------------------------------------ forward
_sources: dict[tuple, KernelSource] = {}
_loaded: dict[tuple, LoadedKernel] = {}


def varlen_fwd_source(ir: AttentionIR, target: Target, kernel_source: KernelSource | None = None,
                      schedule: str = "v2") -> KernelSource:
    """The varlen forward translation unit (cached).  ``schedule`` "v2": ``kernel_source``'s v2 plan, else the
    v2 planner's; "v3": ``kernel_source``'s v3 plan (which must be given) without the persistent grid and the
    score skip."""
    # the kernel's source names its plan and IR (a cheap, cached hash): the per-call lookup builds nothing
    key = (schedule, target.name, ir.key(), kernel_source)
    with _lock:
        hit = _sources.get(key)
    if hit is None:
        sched = get_schedule(schedule)
        if schedule == "v3":
            if kernel_source is None or kernel_source.schedule != "v3":
                raise ValueError("varlen_fwd_source: the v3 varlen kernel takes a v3 kernel's plan")
            plan = without_persistent_grid(kernel_source.plan)
        else:
            plan = kernel_source.plan if kernel_source is not None and kernel_source.schedule == "v2" else None
        hit = sched.render(ir, plan if plan is not None else sched.make_plan(ir, target), target, varlen=True)
        with _lock:
            hit = _sources.setdefault(key, hit)
    return hit


def _v3_applies(kernel_source: KernelSource | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the packed batch runs the v3 varlen kernel: a v3 kernel, and q, k, v the copy engine can address."""
    if kernel_source is None or kernel_source.schedule != "v3":
        return False
    from .tma import tma_layout_error

    return all(tma_layout_error(n, _as4(t)) is None for n, t in (("q", q), ("k", k), ("v", v)))


def _v3_maps(P: Any, vi: VarlenInputs, ks: KernelSource) -> Any:
    """``struct V3Maps`` of the packed tensors: (D, total rows, heads, 1), boxes of BLOCK_M / BLOCK_N rows."""
    from .tma import maps_struct

    dt, bm, bn = ks.plan.dtype, ks.plan.block_m, ks.plan.block_n
    return maps_struct((
        ("q", P.q, (1, vi.H, vi.total_q, vi.D), (0, P.q_sh, P.q_sn), dt, bm),
        ("k", P.k, (1, vi.H_kv, vi.total_k, vi.D), (0, P.k_sh, P.k_sn), dt, bn),
        ("v", P.v, (1, vi.H_kv, vi.total_k, vi.DV), (0, P.v_sh, P.v_sn), dt, bn),
    ))


def _load(ks: KernelSource, device: int) -> LoadedKernel:
    key = (ks.arch, ks.source, ks.entry, device)  # by value: a dropped source's id may be reused
    with _lock:
        hit = _loaded.get(key)
    if hit is None:
        hit = compile_kernel(ks.source, ks.arch, device, ks.entry)
        allow_dynamic_smem(hit.ptr, ks.smem_bytes, device)
        with _lock:
            hit = _loaded.setdefault(key, hit)
    return hit


def _dev_index(t: torch.Tensor) -> int:
    return device_index(t.device)


def _set_cu(P: Any, cu_q: torch.Tensor, cu_k: torch.Tensor, vi: VarlenInputs) -> None:
    P.cu_seqlens_q, P.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    P.total_q, P.total_k = vi.total_q, vi.total_k
    P.varlen_errors = vi.errors or None
    for name in ("q", "k", "v", "o"):
        setattr(P, f"{name}_sb", 0)


def run_varlen_forward(ir: AttentionIR, target: Target, kernel_source: KernelSource | None, q: torch.Tensor,
                       k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                       max_seqlen_q: int | None, max_seqlen_k: int | None, buffers: Mapping[str, torch.Tensor], *,
                       scale: float, dropout_p: float, seed: int, offset: int,
                       out: torch.Tensor | None = None, rng_state: torch.Tensor | None = None,
                       recipes: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (total_q, H, DV), lse (H, total_q) float32) of a packed batch.  ``rng_state``: dropout's [seed, offset]
    on the device, read by the kernels in place of ``seed`` and ``offset`` (runtime/rng.py).  ``recipes``: a table
    of recorded launches (:mod:`.varlen_fastpath`) for calls whose ``buffers`` are the kernel's own."""
    key = None
    if recipes is not None and rng_state is None:  # (recordings hold the by-value seed's kernels)
        key = vfast.forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, dropout_p, out)
        hit = recipes.get(key) if key is not None else None
        if hit is not None and not torch.cuda.is_current_stream_capturing():  # (a capture takes the full path)
            check_replays(q.device)  # (as the full path: a replay's recorded error is raised by the next eager call)
            done = vfast.run_forward(hit, q, k, v, cu_seqlens_q, cu_seqlens_k, seed, offset, buffers, out)
            if done is not None:
                return done
    vi = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ir)
    if out is not None:
        o = check_out(out, (vi.total_q, vi.H, vi.DV), q)
    else:
        o = torch.empty(vi.total_q, vi.H, vi.DV, device=q.device, dtype=q.dtype)
    lse = torch.empty(vi.H, vi.total_q, device=q.device, dtype=torch.float32)
    if vi.total_q == 0 or vi.H == 0:
        return o, lse
    if vi.total_k == 0:  # no keys anywhere: every row is empty
        o.zero_()
        lse.fill_(float("-inf"))
        return o, lse
    v3 = _v3_applies(kernel_source, q, k, v)
    ks = varlen_fwd_source(ir, target, kernel_source, "v3" if v3 else "v2")
    if rng_state is not None:
        from .rng import device_rng_variant

        ks = device_rng_variant(ks)
    loaded = _load(ks, _dev_index(q))
    bufs = prepare_buffers(ir, buffers, q.device)
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    dims = vi.launch_dims()
    P, Bf = pack_params(_as4(q), _as4(k), _as4(v), _as4(o), lse, None, dims, scale=scale, dropout_p=dropout_p,
                        seed=seed, offset=offset, ir=ir, buffers=bufs, rng_state=rng_state)
    _set_cu(P, cu_q, cu_k, vi)
    grid = (-(-vi.max_q // ks.plan.block_m), vi.H, vi.B)  # (varlen.cuh: b = blockIdx.z, h = blockIdx.y)
    if v3:
        maps = fastpath.maps_by_pointers(lambda P_: _v3_maps(P_, vi, ks), ("q", "k", "v"))
        args: Any = lambda P_, Bf=Bf: (P_, Bf, maps(P_))
    else:
        args = lambda P_, Bf=Bf: (P_, Bf)
    fl = fastpath.FastLaunch(loaded.ptr, grid, ks.threads, ks.smem_bytes, args, keep=(loaded, Bf))
    with torch.cuda.device(q.device):
        fl.launch(P, _dev_index(q))
    if (key is not None and not vi.errors and cu_q is cu_seqlens_q and cu_k is cu_seqlens_k
            and fastpath.recordable(buffers)):
        fastpath.remember(recipes, key, vfast.PackedForward(  # type: ignore[arg-type]
            fastpath.ForwardRecipe(fl, _dev_index(q), bytes(P), type(P), tuple(o.shape), False, tuple(lse.shape),
                                   dropout_p, o.dtype, o.device, 0, fastpath.buffer_versions(buffers),
                                   keep=(bufs,)),
            vfast.CuSeqlens.of(cu_q, cu_k)))
    return o, lse


# ------------------------------------------------------------------------------------ backward
def _rows_of(cu: tuple[int, ...], pick: list[int], device: torch.device) -> torch.Tensor:
    """Row indices of the sequences ``pick``."""
    idx = [r for b in pick for r in range(cu[b], cu[b + 1])]
    return torch.tensor(idx, dtype=torch.long, device=device)


def _sequence_of_rows(cu: torch.Tensor, total: int) -> torch.Tensor:
    """The sequence index (int64) of each of ``total`` packed rows, by kernels on the device (no host read: a CUDA
    graph may capture it).  An inconsistent ``cu`` still gives indices in [0, B)."""
    rows = torch.arange(total, device=cu.device, dtype=cu.dtype)
    return torch.searchsorted(cu[1:].contiguous(), rows, right=True).clamp_(max=max(cu.numel() - 2, 0))


def _zero_keys_without_queries(dk: torch.Tensor, dv: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                               vi: VarlenInputs) -> None:
    """dK, dV <- 0 on the key rows of sequences that have keys but no queries (the dK/dV kernels skip those)."""
    if vi.cu_q is not None and vi.cu_k is not None:  # host offsets: index the few rows there are, if any
        idle = [b for b in range(vi.B) if vi.cu_q[b + 1] == vi.cu_q[b] and vi.cu_k[b + 1] > vi.cu_k[b]]
        if idle:
            rows = _rows_of(vi.cu_k, idle, dk.device)
            dk[rows] = 0
            dv[rows] = 0
        return
    no_queries = (cu_q[1:] <= cu_q[:-1])[_sequence_of_rows(cu_k, vi.total_k)].view(-1, 1, 1)
    dk.masked_fill_(no_queries, 0)
    dv.masked_fill_(no_queries, 0)


def varlen_dq_rows(vi: VarlenInputs) -> int:
    """Rows of a tiled dQ accumulator over packed sequences: sequence b's rows start at 64 (q_start / 64 + b)
    (``varlen.cuh``), 64-aligned and past the previous sequence's last 64-row query block."""
    return 64 * (-(-vi.total_q // 64) + vi.B)


def varlen_dq_accumulator(tiles: DqTiles | None, vi: VarlenInputs, device: torch.device) -> torch.Tensor:
    """The fp32 dQ accumulator of a packed batch (uninitialized: the preprocess kernel zeroes it): one (H, Nq_b, D)
    block per sequence, or ``tiles`` (accumulator rows / rows, H, D / chunk, rows, row_floats) over
    :func:`varlen_dq_rows` rows."""
    if tiles is None:
        return torch.empty(vi.total_q * vi.H * vi.D, device=device, dtype=torch.float32)
    return torch.empty(varlen_dq_rows(vi) // tiles.rows, vi.H, vi.D // tiles.chunk, tiles.rows, tiles.row_floats,
                       device=device, dtype=torch.float32)


def _gather_dq(acc: torch.Tensor, cu_q: torch.Tensor, vi: VarlenInputs, dtype: torch.dtype) -> torch.Tensor:
    """dq (total_q, H, D) from the row-major atomic accumulator (one (H, Nq_b, D) block per sequence; the tiled one
    is converted by the v3 backward's own kernel, attn_bwd_dq_out)."""
    dev = acc.device
    cu = cu_q.to(torch.long)
    lens = cu[1:] - cu[:-1]
    seq = _sequence_of_rows(cu_q, vi.total_q)  # (on the device: a CUDA graph may capture it)
    start, ln = cu[:-1][seq], lens[seq]
    rows = torch.arange(vi.total_q, device=dev) - start
    heads = torch.arange(vi.H, device=dev)
    idx = (start * vi.H + rows).unsqueeze(1) + heads.unsqueeze(0) * ln.unsqueeze(1)  # (total_q, H)
    if vi.cu_q is None:  # captured: cu_seqlens unchecked, so no index may leave the accumulator
        idx.clamp_(0, vi.total_q * vi.H - 1)
    return acc.view(-1, vi.D).to(dtype)[idx]  # round first: the gather then moves half the bytes


def run_varlen_backward(ir: AttentionIR, target: Target, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None,
                        cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int | None,
                        max_seqlen_k: int | None, buffers: Mapping[str, torch.Tensor], *, scale: float,
                        dropout_p: float, seed: int, offset: int, deterministic: bool = False,
                        options: Mapping[str, Any] | None = None, poison: bool = False,
                        rng_state: torch.Tensor | None = None,
                        recipes: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq (total_q, H, D), dk (total_k, H_kv, D), dv (total_k, H_kv, DV) of a packed batch (the backward
    kernels :func:`bwd_source` picks, rendered with ``varlen=True``).  ``poison`` NaN-fills the outputs first;
    ``rng_state`` and ``recipes`` as in :func:`run_varlen_forward`."""
    from .backward import bwd_params, bwd_source, launch_bwd, load_bwd, tma_checked_source, turn_counters
    from .bwd_fastpath import record
    from .rng import device_rng_variant

    key = None
    if recipes is not None and not poison and rng_state is None:
        key = vfast.backward_key(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, scale, dropout_p, deterministic, options)
        hit = recipes.get(key) if key is not None else None
        if hit is not None and not torch.cuda.is_current_stream_capturing():
            check_replays(q.device)
            done = vfast.run_backward(hit, dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seed, offset,
                                      buffers, lambda dq, dk, dv, acc, vi, ra: _finish_backward(
                                          dq, dk, dv, acc, cu_seqlens_q, cu_seqlens_k, vi, ra, q.dtype))
            if done is not None:
                return done
    as_given = (dout, out, lse, dlse, cu_seqlens_q, cu_seqlens_k)  # recorded only if used as given (no copies)
    vi = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ir)
    want = (vi.total_q, vi.H, vi.DV)
    for name, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != want or t.dtype != q.dtype or t.device != q.device:
            raise InputError(f"{name}: expected {want} {q.dtype} on {q.device}, got {tuple(t.shape)} {t.dtype} "
                             f"on {t.device}")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is not None and tuple(t.shape) != (vi.H, vi.total_q):
            raise InputError(f"{name}: expected shape {(vi.H, vi.total_q)} (heads, total_q), got {tuple(t.shape)}")
    dout = dout.contiguous()
    out = out.contiguous()
    lse = lse.to(torch.float32).contiguous()
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    def alloc(*shape: int, dtype: torch.dtype = q.dtype) -> torch.Tensor:
        t = torch.empty(shape, device=q.device, dtype=dtype)
        return t.fill_(float("nan")) if poison else t

    dk = alloc(vi.total_k, vi.H_kv, vi.D)
    dv = alloc(vi.total_k, vi.H_kv, vi.DV)
    if vi.total_q == 0 or vi.total_k == 0 or vi.H == 0:
        return torch.zeros(vi.total_q, vi.H, vi.D, device=q.device, dtype=q.dtype), dk.zero_(), dv.zero_()
    src = bwd_source(ir, target, deterministic=deterministic, options=options, varlen=True)
    src = tma_checked_source(src, ir, target, tuple((n, _as4(t)) for n, t in (("q", q), ("k", k), ("v", v),
                                                                            ("dout", dout))),
                             deterministic=deterministic, options=options, varlen=True)
    if rng_state is not None:
        src = device_rng_variant(src)
    plan = src.plan
    fns = load_bwd(src, _dev_index(q))
    atomic = plan.dq_mode == "atomic"
    dq_accum = varlen_dq_accumulator(src.dq_tiles, vi, q.device) if atomic else None
    if dq_accum is not None and poison:
        dq_accum.fill_(float("nan"))  # (the preprocess must zero every float of it)
    # the kernels write dq unless it is left in a row-major fp32 accumulator (the v2 backward, dq_red < 2)
    rows_accum = atomic and src.dq_tiles is None
    dq = None if rows_accum else alloc(vi.total_q, vi.H, vi.D)
    dims = vi.launch_dims()
    nq_pad = src.nq_padded(vi.max_q)
    ws = alloc(2, vi.B * vi.H * nq_pad, dtype=torch.float32)
    bufs = prepare_buffers(ir, buffers, q.device)
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    P, Bf = pack_params(_as4(q), _as4(k), _as4(v), _as4(out), lse, None, dims, scale=scale, dropout_p=dropout_p,
                        seed=seed, offset=offset, ir=ir, buffers=bufs, rng_state=rng_state)
    _set_cu(P, cu_q, cu_k, vi)
    sem, sem_owner = turn_counters(src, dims, q.device)
    bp = bwd_params(_as4(dout), None if dq is None else _as4(dq), _as4(dk), _as4(dv), dq_accum, dlse, ws, nq_pad, sem)
    rows = (vi.total_q, vi.total_k)
    maps = src.maps(P, bp, dims, packed_rows=rows)
    launch_bwd(src, fns, dims, P, bp, Bf, maps, q.device)
    del sem_owner
    if (key is not None and not vi.errors and fastpath.recordable(buffers)
            and all(a is b for a, b in zip((dout, out, lse, dlse, cu_q, cu_k), as_given))):
        counters = functools.partial(turn_counters, src, dims) if src.turn_counters(dims) else None
        fastpath.remember(recipes, key, vfast.PackedBackward(record(  # type: ignore[arg-type]
            src=src, fns=fns, grids=src.grids(dims), P=P, bp=bp, Bf=Bf, has_maps=maps is not None,
            build_maps=lambda P_, bp_: src.maps(P_, bp_, dims, packed_rows=rows), turn_counters=counters, q=q, k=k,
            v=v, dq=dq, dk=dk, dv=dv, ws=ws, dq_accum=dq_accum, device_index=_dev_index(q), buffers=buffers,
            keep=(bufs, fns)), vfast.CuSeqlens.of(cu_q, cu_k), vi, rows_accum))
    return _finish_backward(dq, dk, dv, dq_accum, cu_q, cu_k, vi, rows_accum, q.dtype)


def _finish_backward(dq: torch.Tensor | None, dk: torch.Tensor, dv: torch.Tensor, dq_accum: torch.Tensor | None,
                     cu_q: torch.Tensor, cu_k: torch.Tensor, vi: VarlenInputs, rows_accum: bool,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed backward's work after its kernels, on the full path and from a recording alike: dK, dV <- 0 on
    the key rows of sequences without queries; dQ gathered from a row-major accumulator (``rows_accum``)."""
    _zero_keys_without_queries(dk, dv, cu_q, cu_k, vi)
    if rows_accum:
        dq = _gather_dq(dq_accum, cu_q, vi, dtype)  # type: ignore[arg-type]
    return dq, dk, dv  # type: ignore[return-value]
