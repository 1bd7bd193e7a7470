"""Launching the backward kernels on torch tensors: the v2 backward (attncompiler/codegen/v2_bwd.py,
mma.sync, every target) or on sm_90 the v3 backward (attncompiler/codegen/v3_bwd.py: TMA + wgmma).

:func:`run_backward` takes what the forward saved (q, k, v, out, lse) and dO (and optionally
dL/dlse) and returns (dq, dk, dv) in the inputs' dtype, whatever schedule ran the forward (every
forward stores the same lse).  The backward options' ``schedule`` picks the kernels: "auto" (default:
v3 where :func:`~attncompiler.plan.v3_bwd.v3_bwd_auto_refusal` allows it, else v2), "v2" or "v3" (an error
naming the reason where v3 cannot run).  Rendered sources are cached per (IR structure, target, dQ mode,
plan options); compiled modules by the NVRTC caches.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Mapping

import torch

from ..codegen.v2_bwd import BwdKernelSource, make_bwd_plan, render_bwd
from ..codegen.v3_bwd import V3BwdKernelSource, render_v3_bwd
from ..ir.types import AttentionIR
from ..plan.model import PlanError
from ..plan.targets import Target
from ..plan.v3_bwd import V3_BWD_OPTIONS, plan_v3_bwd, v3_bwd_auto_refusal, v3_bwd_refusal
from .compiler import LoadedKernel, allow_dynamic_smem, compile_functions
from . import bwd_fastpath
from .bwd_fastpath import like_layout as _like_layout
from .fastpath import recordable, remember
from .launch import AttnInputs, InputError, check_inputs, device_index, launch_structs, pack_params, prepare_buffers
from .params import BWD_PARAM_FIELDS, ctypes_struct, set_strides
from .rng import device_rng_variant
from .tma import tma_layout_error

__all__ = ["bwd_source", "load_bwd", "bwd_params", "launch_bwd", "run_backward", "tma_checked_source",
           "turn_counters", "BWD_SCHEDULES"]

BWD_SCHEDULES = ("auto", "v2", "v3")

_lock = threading.Lock()
_sources: dict[tuple, BwdKernelSource | V3BwdKernelSource] = {}
_loaded: dict[tuple, dict[str, LoadedKernel]] = {}


def bwd_source(ir: AttentionIR, target: Target, *, deterministic: bool = False,
               options: Mapping[str, Any] | None = None,
               varlen: bool = False) -> BwdKernelSource | V3BwdKernelSource:
    """The rendered backward translation unit (cached); ``varlen``: the packed-sequence kernels.  ``options``
    are the plan options of the chosen backward plus ``schedule`` ("auto", "v2", "v3")."""
    opts = dict(options or {})
    key = (ir.key(), target.name, deterministic, tuple(sorted(opts.items())), bool(varlen))
    with _lock:
        hit = _sources.get(key)
    if hit is None:
        schedule = opts.pop("schedule", "auto")
        if schedule not in BWD_SCHEDULES:
            raise PlanError(f"backward schedule: expected one of {BWD_SCHEDULES}, got {schedule!r}")
        hard = v3_bwd_refusal(ir, target, deterministic=deterministic, varlen=varlen)
        if schedule == "v3" and hard is not None:
            raise PlanError(hard)
        refusal = v3_bwd_auto_refusal(ir, target, deterministic=deterministic, varlen=varlen)
        if schedule == "v3" and not set(opts) <= set(V3_BWD_OPTIONS):
            raise PlanError(f"v3 backward: expected plan options among {V3_BWD_OPTIONS}, got "
                            f"{sorted(set(opts) - set(V3_BWD_OPTIONS))}")
        if schedule == "auto" and refusal is None and not set(opts) <= set(V3_BWD_OPTIONS):
            refusal = f"plan options {sorted(set(opts) - set(V3_BWD_OPTIONS))} are the v2 backward's"
        if schedule == "v3" or (schedule == "auto" and refusal is None):
            hit = render_v3_bwd(ir, plan_v3_bwd(ir, target, deterministic=deterministic, varlen=varlen, **opts), target,
                                varlen=varlen)
        else:
            hit = render_bwd(ir, make_bwd_plan(ir, target, deterministic=deterministic, **opts), target, varlen=varlen)
        with _lock:
            hit = _sources.setdefault(key, hit)
    return hit


def load_bwd(src: BwdKernelSource | V3BwdKernelSource, device: int) -> dict[str, LoadedKernel]:
    """Compile (or fetch) and load every kernel of ``src`` on ``device``."""
    # keyed by the source text, not id(src): a source dropped from _sources (tests clear it) may leave its id to a
    # new object, which must not find the old kernels
    key = (src.arch, src.source, device)
    with _lock:
        hit = _loaded.get(key)
    if hit is not None:
        return hit
    fns = compile_functions(src.source, src.arch, device, src.entries)
    for e, k in fns.items():
        allow_dynamic_smem(k.ptr, src.smem(e), device)
    with _lock:
        _loaded[key] = fns
    return fns


def tma_checked_source(src: BwdKernelSource | V3BwdKernelSource, ir: AttentionIR, target: Target,
                       tensors: tuple[tuple[str, torch.Tensor], ...], *, deterministic: bool,
                       options: Mapping[str, Any] | None, varlen: bool = False) -> BwdKernelSource | V3BwdKernelSource:
    """``src``, or where it is the v3 backward and TMA cannot describe one of ``tensors`` ((B, H, N, d) views, e.g.
    heads broadcast by .expand()) the v2 backward; an explicit ``schedule="v3"`` gets an InputError saying why."""
    if not isinstance(src, V3BwdKernelSource):
        return src
    bad = next((e for e in (tma_layout_error(n, t) for n, t in tensors) if e is not None), None)
    if bad is None:
        return src
    if (options or {}).get("schedule") == "v3":
        raise InputError(f"backward schedule v3: {bad}")
    return bwd_source(ir, target, deterministic=deterministic, options={**(options or {}), "schedule": "v2"},
                      varlen=varlen)


@functools.lru_cache(maxsize=None)
def _bwd_params_type() -> type:
    return ctypes_struct("AttnBwdParams", BWD_PARAM_FIELDS)


def _aligned(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 and all(s % 8 == 0 for s in t.stride()[:3]) and t.data_ptr() % 16 == 0


def turn_counters(src: BwdKernelSource | V3BwdKernelSource, dims: AttnInputs, device: torch.device) -> tuple[int, Any]:
    """(address, owner) of the zeroed int32 turn counters ``src`` needs (deterministic v3 dQ), or (0, None).  The
    kernel leaves them zero, so they come from the per-stream arena of :mod:`.counters`; where it has no room (or
    inside a capture without an arena) the call zeroes counters of its own (``owner`` keeps them alive)."""
    n = src.turn_counters(dims)
    if n == 0:
        return 0, None
    from .counters import ARENA_INTS, counters

    addr = counters(device, n) if n <= ARENA_INTS else None
    if addr is not None:
        return addr, None
    own = torch.zeros(n, dtype=torch.int32, device=device)
    return own.data_ptr(), own


def dq_accumulator(src: BwdKernelSource | V3BwdKernelSource, dims: AttnInputs, device: torch.device) -> torch.Tensor:
    """The fp32 dQ accumulator of a padded-batch launch (uninitialized: the preprocess kernel zeroes it,
    ``AttnBwdParams::dq_accum_floats``): (B, H, Nq, D) rows, or with ``src.dq_tiles`` the tiles (B, Nq_pad / rows, H,
    D / chunk, rows, row_floats)."""
    t = src.dq_tiles
    if t is None:
        return torch.empty(dims.B, dims.H, dims.Nq, dims.D, device=device, dtype=torch.float32)
    return torch.empty(dims.B, src.nq_padded(dims.Nq) // t.rows, dims.H, dims.D // t.chunk, t.rows, t.row_floats,
                       device=device, dtype=torch.float32)


def bwd_params(dout: torch.Tensor, dq: torch.Tensor | None, dk: torch.Tensor, dv: torch.Tensor,
               dq_accum: torch.Tensor | None, dlse: torch.Tensor | None, ws: torch.Tensor, nq_pad: int,
               dq_sem: int = 0) -> Any:
    """The AttnBwdParams of one backward launch (padded and varlen).  dout, dq, dk, dv are (B, H, N, d)
    views, whose strides the kernels index with (a packed varlen tensor: its (1, H, rows, d) view); dq is
    None in atomic mode, which accumulates into dq_accum (zeroed by the preprocess kernel); ws holds the lse2 and dsum
    rows (Nq_pad each)."""
    bp = _bwd_params_type()()
    bp.dout = dout.data_ptr()
    bp.dq = dq.data_ptr() if dq is not None else None
    bp.dk, bp.dv = dk.data_ptr(), dv.data_ptr()
    bp.dq_accum = dq_accum.data_ptr() if dq_accum is not None else None
    bp.dq_accum_floats = dq_accum.numel() if dq_accum is not None else 0  # the preprocess zeroes them
    bp.dlse = dlse.data_ptr() if dlse is not None else None
    bp.lse2 = ws.data_ptr()  # rows 0 and 1 of ws (no views made: this runs on every backward)
    bp.dsum = bp.lse2 + ws.stride(0) * ws.element_size()
    set_strides(bp, "do", dout.stride())
    if dq is not None:
        set_strides(bp, "dq", dq.stride())
    set_strides(bp, "dk", dk.stride())
    set_strides(bp, "dv", dv.stride())
    bp.Nq_pad = nq_pad
    bp.dq_sem = dq_sem or None
    return bp


def launch_bwd(src: BwdKernelSource | V3BwdKernelSource, fns: Mapping[str, LoadedKernel], dims: AttnInputs,
               P: Any, bp: Any, Bf: Any, maps: Any, device: torch.device) -> None:
    """Queue the kernels of ``src`` in launch order on torch's current stream (padded and packed batches alike);
    an entry with an empty grid is skipped."""
    grids = src.grids(dims)
    with torch.cuda.device(device):
        for e in src.entries:
            if grids[e][0] == 0:
                continue
            if not src.takes_buffers(e):
                args: tuple = (P, bp)
            else:
                args = (P, bp, Bf) if maps is None else (P, bp, Bf, maps)
            launch_structs(fns[e].ptr, grids[e], src.threads(e), src.smem(e), args, device)


def run_backward(ir: AttentionIR, target: Target, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None,
                 buffers: Mapping[str, torch.Tensor], *, scale: float, dropout_p: float, seed: int, offset: int,
                 rng_state: torch.Tensor | None = None, deterministic: bool = False,
                 options: Mapping[str, Any] | None = None,
                 poison: bool = False, recipes: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of the attention ``ir`` (the backward :func:`bwd_source` picks) on torch's current stream.

    ``poison`` fills every output with NaN before the kernels run (tests: nothing may be left
    unwritten).  ``recipes``: a table of recorded launches (:mod:`.bwd_fastpath`) for calls whose ``buffers`` are
    the kernel's own; a repeated signature takes its recording.  ``rng_state``: dropout's [seed, offset] on the
    device, which the kernels read in place of ``seed`` and ``offset`` (:mod:`.rng`)."""
    key = None
    if recipes is not None and not poison and rng_state is None:  # (recordings hold the by-value seed's kernels)
        key = bwd_fastpath.signature(dout, q, k, v, out, lse, dlse, scale, dropout_p, deterministic, options)
        hit = recipes.get(key) if key is not None else None
        done = bwd_fastpath.run(hit, dout, q, k, v, out, lse, dlse, seed, offset, buffers) if hit else None
        if done is not None:
            return done
    as_given = (dout, out, lse, dlse)  # recorded only if the full path uses these as they are (no copies)
    dims: AttnInputs = check_inputs(q, k, v, ir)
    want = (dims.B, dims.H, dims.Nq, dims.DV)
    for name, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != want or t.dtype != q.dtype or t.device != q.device:
            raise InputError(f"{name}: expected {want} {q.dtype} on {q.device}, got {tuple(t.shape)} {t.dtype} "
                             f"on {t.device}")
    if not _aligned(dout):
        dout = dout.contiguous()
    if not _aligned(out):
        out = out.contiguous()
    lse = lse.to(torch.float32).contiguous()
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    dk = _like_layout(k, (dims.B, dims.H_kv, dims.Nk, dims.D), q.dtype)
    dv = _like_layout(v, (dims.B, dims.H_kv, dims.Nk, dims.DV), q.dtype)
    fill = float("nan") if poison else 0.0
    if dims.Nq == 0 or dims.Nk == 0 or dims.B * dims.H == 0:
        return _like_layout(q, (dims.B, dims.H, dims.Nq, dims.D), q.dtype).zero_(), dk.zero_(), dv.zero_()
    src = bwd_source(ir, target, deterministic=deterministic, options=options)
    src = tma_checked_source(src, ir, target, (("q", q), ("k", k), ("v", v), ("dout", dout)),
                             deterministic=deterministic, options=options)
    if rng_state is not None:
        src = device_rng_variant(src)
    plan = src.plan
    dev_idx = device_index(q.device)
    fns = load_bwd(src, dev_idx)
    if poison:
        dk.fill_(fill)
        dv.fill_(fill)
    atomic = plan.dq_mode == "atomic"
    dq_accum = dq_accumulator(src, dims, q.device) if atomic else None
    if dq_accum is not None and poison:
        dq_accum.fill_(fill)  # (the preprocess must zero every float of it)
    # the kernels write dq unless it is left in a row-major fp32 accumulator (the v2 backward, dq_red < 2)
    rows_accum = atomic and src.dq_tiles is None
    dq = None if rows_accum else _like_layout(q, (dims.B, dims.H, dims.Nq, dims.D), q.dtype)
    if dq is not None and poison:
        dq.fill_(fill)
    nq_pad = src.nq_padded(dims.Nq)
    ws = torch.empty(2, dims.B * dims.H * nq_pad, device=q.device, dtype=torch.float32)
    if poison:
        ws.fill_(fill)
    bufs = prepare_buffers(ir, buffers, q.device)
    P, Bf = pack_params(q, k, v, out, lse, None, dims, scale=scale, dropout_p=dropout_p, seed=seed, offset=offset,
                        ir=ir, buffers=bufs, rng_state=rng_state)
    sem, sem_owner = turn_counters(src, dims, q.device)
    bp = bwd_params(dout, dq, dk, dv, dq_accum, dlse, ws, nq_pad, sem)
    maps = src.maps(P, bp, dims)
    launch_bwd(src, fns, dims, P, bp, Bf, maps, q.device)
    del sem_owner  # (the caching allocator reuses it only after the launches queued on this stream)
    if key is not None and all(a is b for a, b in zip((dout, out, lse, dlse), as_given)) and recordable(buffers):
        counters = functools.partial(turn_counters, src, dims) if src.turn_counters(dims) else None
        remember(recipes, key, bwd_fastpath.record(
            src=src, fns=fns, grids=src.grids(dims), P=P, bp=bp, Bf=Bf, has_maps=maps is not None,
            build_maps=lambda P_, bp_: src.maps(P_, bp_, dims), turn_counters=counters, q=q, k=k, v=v,
            dq=None if rows_accum else dq, dk=dk, dv=dv, ws=ws, dq_accum=dq_accum, device_index=dev_idx,
            buffers=buffers, keep=(bufs, fns)))
    if rows_accum:
        dq = _like_layout(q, (dims.B, dims.H, dims.Nq, dims.D), q.dtype).copy_(dq_accum)
    return dq, dk, dv  # type: ignore[return-value]
