"""The v1 schedule: FlashAttention-1's loop order (templates/v1_fwd.cu.j2, include/attncompiler/v1_fwd.cuh).

One CTA per (batch, head); outer loop over K/V blocks, inner loop over Q blocks, with O, l and m
kept in an fp32 HBM workspace between iterations, exactly as Algorithm 1 of the FA1 paper.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.types import AttentionIR
from ..plan.planner import plan_v1
from ..plan.targets import Target
from ..runtime.launch import AttnInputs
from .hooks import render_prelude
from .render import render_source
from .schedule import KernelSource

__all__ = ["SCHEDULE", "V1Schedule"]


@dataclass(frozen=True)
class V1Schedule:
    name: str = "v1"
    template: str = "v1_fwd.cu.j2"

    def make_plan(self, ir: AttentionIR, target: Target, **options: Any):
        return plan_v1(ir, target, **options)

    def render(self, ir: AttentionIR, plan, target: Target) -> KernelSource:
        src = render_source(
            self.template,
            name=ir.name,
            prelude=render_prelude(ir),
            plan_text=plan.describe(),
            head_dim=ir.head_dim,
            head_dim_v=ir.head_dim_v,
            block_r=plan.block_r,
            block_c=plan.block_c,
        )
        return KernelSource(self.name, "attn_fwd", target.nvrtc_arch, src, plan, plan.num_threads, plan.smem_bytes)

    def grid(self, ks: KernelSource, dims: AttnInputs) -> tuple[int, int, int]:
        return (dims.B * dims.H, 1, 1)

    def workspace_floats(self, ks: KernelSource, dims: AttnInputs) -> int:
        # O (fp32, normalized after every K/V block), then l, then m -- see v1_fwd.cuh.
        return dims.B * dims.H * dims.Nq * (dims.DV + 2)


SCHEDULE = V1Schedule()
