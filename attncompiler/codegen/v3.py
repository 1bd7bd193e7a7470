"""The v3 schedule: FlashAttention-3 style Hopper forward (templates/v3_fwd.cu.j2,
include/attncompiler/v3_fwd.cuh, v3_consumer.cuh, v3_producer.cuh, v3_epilogue.cuh, v3_sm90.cuh; v3_trace.cuh: the
phase marks).

Besides ``(AttnParams, AttnBuffers)`` the kernel takes a third by-value argument, ``struct V3Maps``:
the TMA tensor maps of q, k and v (``struct V3MapsO`` with the plan option ``tma_store_o``: and o), built per
call by :meth:`V3Schedule.launch_forward` (:mod:`attncompiler.runtime.tma`); with ``tile_list`` a fourth, the
device pointer of the persistent grid's tile list (:mod:`attncompiler.runtime.tile_list`; null: the round robin).
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..ir.types import AttentionIR
from ..plan.targets import Target
from ..plan.v3 import V3Plan, plan_v3
from ..runtime.launch import AttnInputs, device_index
from ..runtime.scoreskip import prepare_score_skip
from ..runtime.spills import narrower_by_16
from .hooks import render_prelude
from .render import render_source
from .schedule import KernelSource, ScheduleError

__all__ = ["SCHEDULE", "V3Schedule", "PTX_TYPES"]

PTX_TYPES = {"bf16": "bf16", "fp16": "f16"}
_loaded: dict[tuple[KernelSource, int], Any] = {}  # loaded functions by (kernel source, device)


@dataclass(frozen=True)
class V3Schedule:
    name: str = "v3"
    template: str = "v3_fwd.cu.j2"

    def make_plan(self, ir: AttentionIR, target: Target, **options: Any) -> V3Plan:
        if (target.major, target.minor) != (9, 0):
            raise ScheduleError(f"v3 needs sm_90a, got {target.name} (TMA, wgmma and setmaxnreg are Hopper-only); "
                                f"use schedule='v2' there")
        return plan_v3(ir, target, **options)

    def replan_widths(self, plan: V3Plan) -> tuple[int, ...]:
        """The key-tile widths a plan whose machine code spills is tried at (runtime/spills.py), widest first."""
        return narrower_by_16(plan.block_n)

    def render(self, ir: AttentionIR, plan: V3Plan, target: Target, *, varlen: bool = False) -> KernelSource:
        """The translation unit of ``plan``; ``varlen``: the packed-sequence kernel (runtime/varlen.py), one tile
        per CTA without the score skip."""
        if varlen and (plan.persistent or plan.score_skip):
            raise ScheduleError(f"v3 varlen: expected a plan without persistent / score_skip, got persistent="
                                f"{plan.persistent}, score_skip={plan.score_skip}")
        src = render_source(
            self.template,
            name=ir.name,
            prelude=render_prelude(ir),
            plan_text=plan.describe(),
            ptx_type=PTX_TYPES[ir.dtype],
            head_dim=ir.head_dim,
            head_dim_v=ir.head_dim_v,
            block_m=plan.block_m,
            block_n=plan.block_n,
            stages=plan.stages,
            consumers=plan.consumers,
            producer_regs=plan.producer_regs,
            consumer_regs=plan.consumer_regs,
            ctas_per_sm=plan.ctas_per_sm,
            persistent=plan.persistent,
            tiles_by_head=plan.tiles_by_head,
            exp2_poly=plan.exp2_poly,
            kv_descending=plan.kv_descending,
            score_skip=plan.score_skip,
            q_prescale=plan.q_prescale,
            late_pv_wait=plan.late_pv_wait,
            tma_store_o=plan.tma_store_o,
            softmax_copies=plan.softmax_copies,
            half_blocks=plan.half_blocks,
            q_prefetch=plan.q_prefetch,
            tile_list=plan.tile_list,
            smem_bytes=plan.smem_bytes,
            varlen=varlen,
        )
        # the tile list's costs come from the mask's K/V range (None: every tile visits every block)
        kv = None
        if plan.tile_list and ir.mask_expr is not None:
            from ..ir.ranges import kv_range

            kv = kv_range(ir.mask_expr)
        # wgmma and setmaxnreg exist only on the arch-specific target
        return KernelSource(self.name, "attn_fwd", "sm_90a", src, plan, plan.num_threads, plan.smem_bytes,
                            launch_info=kv)

    def grid(self, ks: KernelSource, dims: AttnInputs, sm_count: int | None = None) -> tuple[int, int, int]:
        """(query blocks, H, B); persistent: min(tiles, CTAs per SM x SMs) CTAs (``sm_count``: the device's, else
        the target's)."""
        q_blocks = -(-dims.Nq // ks.plan.block_m)
        if ks.plan.persistent:
            slots = (sm_count or ks.plan.sm_count) * ks.plan.ctas_per_sm
            return (max(1, min(q_blocks * dims.B * dims.H, slots)), 1, 1)
        return (q_blocks, dims.H, dims.B)  # (common.cuh: ac_grid_bh)

    def workspace_floats(self, ks: KernelSource, dims: AttnInputs) -> int:
        return 0

    prepare_forward = staticmethod(prepare_score_skip)  # the score skip's per-call row norms

    def forward_launch(self, ks: KernelSource, dims: AttnInputs, buffers: Any, device: torch.device) -> Any:
        """The launch of ``ks`` for ``dims`` (:class:`attncompiler.runtime.fastpath.FastLaunch`): its arguments
        after ``(AttnParams, AttnBuffers)`` are ``struct V3Maps``, the TMA maps of q (boxes of BLOCK_M rows), k and
        v (BLOCK_N rows) built from the packed pointers and strides (with ``tma_store_o``: ``struct V3MapsO``, o's
        map too, in boxes of 64 rows: one consumer warpgroup's), then with ``tile_list`` the list's pointer."""
        from ..runtime.compiler import allow_dynamic_smem, compile_kernel
        from ..runtime.fastpath import FastLaunch, maps_by_pointers
        from ..runtime.tma import attn_maps

        idx = device_index(device)
        fn = _loaded.get((ks, idx))  # (the source string caches its hash: no sha256 per call)
        if fn is None:
            fn = compile_kernel(ks.source, ks.arch, idx, ks.entry)
            allow_dynamic_smem(fn.ptr, ks.smem_bytes, idx)  # (set here too, not only by the caller's build)
            fn = _loaded.setdefault((ks, idx), fn)
        plan = ks.plan
        maps = maps_by_pointers(lambda P: attn_maps(P, dims, plan.dtype, plan.block_m, plan.block_n,
                                                    with_o=plan.tma_store_o))
        grid = self.grid(ks, dims, _sm_count(idx) if plan.persistent else None)
        tail: tuple[Any, ...] = ()
        keep: tuple[Any, ...] = ()
        if plan.tile_list:
            from ..runtime.tile_list import tile_list

            lst = tile_list(ks.launch_info, dims.Nq, dims.Nk, dims.B, dims.H, plan.block_m, plan.block_n,
                            plan.tiles_by_head, grid[0], device)
            tail, keep = (ctypes.c_void_p(lst.data_ptr() if lst is not None else 0),), (lst,)
        return FastLaunch(fn.ptr, grid, ks.threads, ks.smem_bytes, lambda P: (P, buffers, maps(P), *tail),
                          keep=(fn, buffers, *keep))

    def launch_forward(self, ks: KernelSource, dims: AttnInputs, params: Any, buffers: Any,
                       device: torch.device) -> None:
        """Launch :meth:`forward_launch`'s kernel with ``params``."""
        fl = self.forward_launch(ks, dims, buffers, device)
        fl.launch(params, device_index(device))


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


SCHEDULE = V3Schedule()
