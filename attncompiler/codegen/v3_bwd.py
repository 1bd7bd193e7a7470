"""The v3 backward: render of ``templates/v3_bwd.cu.j2`` (Hopper: TMA + wgmma) and its launch geometry.

One translation unit, two or three kernels:

* ``attn_bwd_pre``    -- lse2 and dsum = rowsum(dO * O) - dlse per query row (the v2 backward's kernel)
* ``attn_bwd_kv``     -- dK, dV and dQ (fp32 reds into the accumulator), grid over key blocks; its fourth
  by-value argument is ``struct V3BwdMaps`` (TMA maps of q, k, v and dO: :func:`bwd_maps`)
* ``attn_bwd_dq_out`` -- (``dq_red`` 2 only) dQ in the element type from the tiled accumulator, grid over 64-row
  query blocks: one pass, fp32 read once, packed sequences written straight into their packed rows

Both kernel sources (this one and the v2 backward's ``BwdKernelSource``) answer the same launch questions:
``entries``, ``threads``, ``smem``, ``takes_buffers``, ``nq_padded``, ``grids``, ``turn_counters`` (0 for v2),
``maps`` (None for v2) and ``dq_tiles`` (the dQ accumulator's tiles; None for v2: rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.types import AttentionIR
from ..plan.targets import Target
from ..plan.v3_bwd import DQ_TILE_ROWS, V3BwdPlan, split_width
from ..runtime.launch import AttnInputs
from ..runtime.params import BWD_PARAM_FIELDS, c_struct
from .hooks import render_prelude
from .render import render_source
from .v3 import PTX_TYPES

__all__ = ["V3BwdKernelSource", "DqTiles", "render_v3_bwd", "bwd_maps", "TEMPLATE"]

TEMPLATE = "v3_bwd.cu.j2"
DQ_OUT_THREADS = 256  # threads per CTA of attn_bwd_dq_out (ac::kDqOutThreads in v3_bwd_dq.cuh)
DQ_OUT_ROWS = 64      # query rows per CTA of attn_bwd_dq_out (v3_bwd_dq_out)


@dataclass(frozen=True)
class DqTiles:
    """The layout of a tiled fp32 dQ accumulator (``dq_red`` 2): (accumulator rows / rows, H, D / chunk, rows,
    row_floats), one warp's staged rows x chunk columns per tile, of which chunk floats of each row hold dQ (the
    rest is the staging buffer's padding, never read; with ``swizzled`` rows, no padding, each row's 16-byte
    groups XOR the row's low bits: V3BwdLayout::dq_tile_offset).  Accumulator rows: b * Nq_pad + row in a padded
    batch; packed sequences start at row 64 (q_start / 64 + b) (``varlen.cuh``)."""

    rows: int
    chunk: int
    row_floats: int
    swizzled: bool = False


@dataclass(frozen=True)
class V3BwdKernelSource:
    """A rendered v3 backward translation unit and what is needed to launch its kernels."""

    arch: str
    source: str
    plan: V3BwdPlan
    varlen: bool = False

    @property
    def entries(self) -> tuple[str, ...]:
        """Kernel names in launch order."""
        return ("attn_bwd_pre", "attn_bwd_kv", "attn_bwd_dq_out") if self.plan.dq_red == 2 else \
            ("attn_bwd_pre", "attn_bwd_kv")

    def threads(self, entry: str) -> int:
        return {"attn_bwd_pre": self.plan.pre_warps * 32, "attn_bwd_dq_out": DQ_OUT_THREADS}.get(
            entry, self.plan.num_threads)

    def smem(self, entry: str) -> int:
        return self.plan.smem_bytes if entry == "attn_bwd_kv" else 0

    def takes_buffers(self, entry: str) -> bool:
        """Whether ``entry`` takes (params, bwd params, buffers[, maps]) rather than (params, bwd params)."""
        return entry == "attn_bwd_kv"

    def nq_padded(self, nq: int) -> int:
        """Rows of the lse2 / dsum workspace per (b, h): whole 64-row query blocks (the bulk row copies)."""
        return -(-nq // self.plan.block_m) * self.plan.block_m

    def grids(self, dims: AttnInputs) -> dict[str, tuple[int, int, int]]:
        rows = self.plan.pre_warps * self.plan.pre_rows
        return {
            "attn_bwd_pre": (-(-self.nq_padded(dims.Nq) // rows), dims.H, dims.B),  # (common.cuh: ac_grid_bh)
            "attn_bwd_kv": (-(-dims.Nk // self.plan.block_n), dims.H_kv, dims.B),
            "attn_bwd_dq_out": (-(-dims.Nq // DQ_OUT_ROWS), dims.H, dims.B),
        }

    @property
    def dq_tiles(self) -> DqTiles | None:
        """The tiled dQ accumulator's layout (``dq_red`` 2), or None: (B, H, Nq, D) rows."""
        if self.plan.dq_red != 2:
            return None
        chunk = self.plan.dq_chunk
        return DqTiles(DQ_TILE_ROWS, chunk, chunk + self.plan.dq_pad, self.plan.dq_pad == 0)

    def turn_counters(self, dims: AttnInputs) -> int:
        """int32 turn counters the launch needs (deterministic: one per (b, h, 64-row query block)), else 0."""
        return dims.B * dims.H * (self.nq_padded(dims.Nq) // 64) if self.plan.deterministic else 0

    def maps(self, params: Any, bwd_params: Any, dims: AttnInputs, packed_rows: tuple[int, int] | None = None) -> Any:
        """``struct V3BwdMaps`` of the launch (:func:`bwd_maps`); ``packed_rows`` = (total_q, total_k) of packed
        sequences, whose maps span every row of the batch."""
        return bwd_maps(params, bwd_params, dims, self.plan.dtype, self.plan.block_n, self.plan.block_m,
                        packed_rows=packed_rows)


def render_v3_bwd(ir: AttentionIR, plan: V3BwdPlan, target: Target, *, varlen: bool = False) -> V3BwdKernelSource:
    """CUDA source of the v3 backward kernels of ``ir`` under ``plan`` (sm_90a); ``varlen``: the packed-sequence
    kernels (runtime/varlen.py)."""
    src = render_source(
        TEMPLATE,
        name=ir.name,
        prelude=render_prelude(ir, backward=True),
        bwd_params=c_struct("AttnBwdParams", BWD_PARAM_FIELDS),
        plan_text=plan.describe(),
        ptx_type=PTX_TYPES[ir.dtype],
        head_dim=ir.head_dim,
        head_dim_v=ir.head_dim_v,
        split_dim=split_width(ir.head_dim, plan.dkv_split),
        split_dim_v=split_width(ir.head_dim_v, plan.dkv_split),
        block_m=plan.block_m,
        block_n=plan.block_n,
        consumers=plan.consumers,
        stages=plan.stages,
        producer_regs=plan.producer_regs,
        consumer_regs=plan.consumer_regs,
        dq_split_n=plan.dq_split_n,
        dkv_split=plan.dkv_split,
        dkv_roles=plan.dkv_roles,
        dq_stages=plan.dq_stages,
        dq_chunk=plan.dq_chunk,
        dq_pad=plan.dq_pad,
        dq_wide=plan.dq_wide,
        dq_red=plan.dq_red,
        dq_defer=plan.dq_defer,
        deterministic=plan.deterministic,
        pre_warps=plan.pre_warps,
        pre_rows=plan.pre_rows,
        smem_bytes=plan.smem_bytes,
        varlen=bool(varlen),
    )
    # wgmma and setmaxnreg exist only on the arch-specific target
    return V3BwdKernelSource("sm_90a", src, plan, bool(varlen))


def bwd_maps(params: Any, bwd_params: Any, dims: AttnInputs, dtype: str, block_n: int, block_m: int, *,
             packed_rows: tuple[int, int] | None = None) -> Any:
    """``struct V3BwdMaps``: q and dO in boxes of ``block_m`` rows, k and v in boxes of ``block_n`` rows, from the
    packed pointers and element strides.  ``packed_rows`` = (total_q, total_k): packed sequences, each map
    (head dim, total rows, heads, 1) with the batch stride unused (the kernel adds the sequence's first row)."""
    from ..runtime.tma import maps_struct

    P, bp = params, bwd_params
    if packed_rows is None:
        B, nq, nk = dims.B, dims.Nq, dims.Nk
        sb = (P.q_sb, P.k_sb, P.v_sb, bp.do_sb)
    else:
        (B, (nq, nk)), sb = (1, packed_rows), (0, 0, 0, 0)
    return maps_struct((
        ("q", P.q, (B, dims.H, nq, dims.D), (sb[0], P.q_sh, P.q_sn), dtype, block_m),
        ("k", P.k, (B, dims.H_kv, nk, dims.D), (sb[1], P.k_sh, P.k_sn), dtype, block_n),
        ("v", P.v, (B, dims.H_kv, nk, dims.DV), (sb[2], P.v_sh, P.v_sn), dtype, block_n),
        ("dout", bp.dout, (B, dims.H, nq, dims.DV), (sb[3], bp.do_sh, bp.do_sn), dtype, block_m),
    ))
