"""The v2 backward: plan + render of ``templates/v2_bwd.cu.j2`` and the launch geometry.

One translation unit holds every backward kernel of a variant (they share the prelude, so one
NVRTC compile serves them all):

* ``attn_bwd_pre``  -- lse2 and dsum = rowsum(dO * O) - dlse, per query row (grid over rows)
* ``attn_bwd_kv``   -- dK, dV (and dQ by fp32 reds in "atomic" mode), grid over key blocks; or
  ``attn_bwd_dv`` + ``attn_bwd_dk`` when the plan splits dK and dV (large head dims)
* ``attn_bwd_dq``   -- "separate" (deterministic) mode only: dQ per query block, no atomics
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.types import AttentionIR
from ..plan.targets import Target
from ..plan.v2_bwd import V2BwdPlan, plan_v2_bwd
from ..runtime.launch import AttnInputs
from ..runtime.params import BWD_PARAM_FIELDS, c_struct
from .hooks import render_prelude
from .render import render_source

__all__ = ["BwdKernelSource", "make_bwd_plan", "render_bwd", "bwd_grids", "nq_padded", "kv_entries", "TEMPLATE"]

TEMPLATE = "v2_bwd.cu.j2"


@dataclass(frozen=True)
class BwdKernelSource:
    """A rendered backward translation unit and what is needed to launch its kernels."""

    arch: str
    source: str
    plan: V2BwdPlan

    @property
    def entries(self) -> tuple[str, ...]:
        """Kernel names in launch order."""
        out = ["attn_bwd_pre", *kv_entries(self.plan)]
        if self.plan.dq_mode == "separate":
            out.append("attn_bwd_dq")
        return tuple(out)

    def threads(self, entry: str) -> int:
        if entry == "attn_bwd_pre":
            return self.plan.pre_warps * 32
        if entry == "attn_bwd_dq":
            return self.plan.dq_num_warps * 32
        return self.plan.num_threads

    def smem(self, entry: str) -> int:
        if entry == "attn_bwd_pre":
            return 0
        if entry == "attn_bwd_dq":
            return self.plan.dq_smem_bytes
        return self.plan.smem_bytes

    def takes_buffers(self, entry: str) -> bool:
        """Whether ``entry`` takes (params, bwd params, buffers) rather than (params, bwd params)."""
        return entry != "attn_bwd_pre"

    def nq_padded(self, nq: int) -> int:
        """Rows of the lse2 / dsum workspace per (b, h) (:func:`nq_padded`)."""
        return nq_padded(self.plan, nq)

    def grids(self, dims: AttnInputs) -> dict[str, tuple[int, int, int]]:
        """Launch grid of each kernel (:func:`bwd_grids`)."""
        return bwd_grids(self.plan, dims)

    @property
    def dq_tiles(self) -> None:
        """The v2 kernels add dQ into a (B, H, Nq, D) row-major accumulator (the v3 backward may tile it)."""
        return None

    def turn_counters(self, dims: AttnInputs) -> int:
        """The v2 kernels need no turn counters (its deterministic mode is a separate dQ pass)."""
        return 0

    def maps(self, params: Any, bwd_params: Any, dims: AttnInputs, packed_rows: tuple[int, int] | None = None) -> None:
        """The v2 kernels take no TMA maps (the v3 backward's :meth:`V3BwdKernelSource.maps`)."""
        return None


def kv_entries(plan: V2BwdPlan) -> tuple[str, ...]:
    return ("attn_bwd_dv", "attn_bwd_dk") if plan.split_dkv else ("attn_bwd_kv",)


def make_bwd_plan(ir: AttentionIR, target: Target, *, deterministic: bool = False, **options: Any) -> V2BwdPlan:
    """The backward plan (``options``: block_m, num_warps, mtk, split_dkv, layout, s_warps_k, kv_warps_k,
    dq_red_vec, dq_defer, reg_half, dq_stage)."""
    return plan_v2_bwd(ir, target, dq_mode="separate" if deterministic else "atomic", **options)


def render_bwd(ir: AttentionIR, plan: V2BwdPlan, target: Target, *, varlen: bool = False) -> BwdKernelSource:
    """CUDA source of every backward kernel of ``ir`` under ``plan`` (``varlen``: the packed-sequence
    kernels, runtime/varlen.py)."""
    src = render_source(
        TEMPLATE,
        name=ir.name,
        prelude=render_prelude(ir, backward=True),
        bwd_params=c_struct("AttnBwdParams", BWD_PARAM_FIELDS),
        plan_text=plan.describe(),
        head_dim=ir.head_dim,
        head_dim_v=ir.head_dim_v,
        block_m=plan.block_m,
        block_n=plan.block_n,
        num_warps=plan.num_warps,
        mtk=plan.mtk,
        dq_warps_m=plan.dq_warps_m,
        dq_warps_n=plan.dq_warps_n,
        layout=plan.layout,
        s_warps_k=plan.s_warps_k,
        kv_warps_k=plan.kv_warps_k,
        dq_red_vec=plan.dq_red_vec,
        dq_defer=plan.dq_defer,
        reg_half=plan.reg_half,
        dq_stage=plan.dq_stage,
        split_dkv=plan.split_dkv,
        dq_mode=plan.dq_mode,
        dq_block_m=plan.dq_block_m,
        dq_block_n=plan.dq_block_n,
        dq_num_warps=plan.dq_num_warps,
        pre_warps=plan.pre_warps,
        pre_rows=plan.pre_rows,
        smem_bytes=plan.smem_bytes,
        dq_smem_bytes=plan.dq_smem_bytes,
        varlen=bool(varlen),
    )
    return BwdKernelSource(target.nvrtc_arch, src, plan)


def nq_padded(plan: V2BwdPlan, nq: int) -> int:
    """Rows of the lse2 / dsum workspace per (b, h): Nq rounded up to every query tile used."""
    m = max(plan.block_m, plan.dq_block_m)
    return -(-nq // m) * m


def bwd_grids(plan: V2BwdPlan, dims: AttnInputs) -> dict[str, tuple[int, int, int]]:
    """Launch grid of each backward kernel."""
    rows = plan.pre_warps * plan.pre_rows
    kv = (-(-dims.Nk // plan.block_n), dims.H_kv, dims.B)  # (heads on y, the batch on z: common.cuh's ac_grid_bh)
    out = {"attn_bwd_pre": (-(-nq_padded(plan, dims.Nq) // rows), dims.H, dims.B)}
    for e in kv_entries(plan):
        out[e] = kv
    out["attn_bwd_dq"] = (-(-dims.Nq // plan.dq_block_m), dims.H, dims.B)
    return out
