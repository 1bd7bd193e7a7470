"""The v2 schedule: FlashAttention-2 forward (templates/v2_fwd.cu.j2, include/attncompiler/v2_fwd.cuh)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.types import AttentionIR
from ..plan.planner import plan_v2
from ..plan.v2 import V2_BLOCK_N_CHOICES
from ..plan.targets import Target
from ..runtime.launch import AttnInputs
from ..runtime.scoreskip import prepare_score_skip
from ..runtime.spills import MIN_REPLAN_BLOCK_N
from .hooks import render_prelude
from .render import render_source
from .schedule import KernelSource

__all__ = ["SCHEDULE", "V2Schedule"]


@dataclass(frozen=True)
class V2Schedule:
    name: str = "v2"
    template: str = "v2_fwd.cu.j2"

    def make_plan(self, ir: AttentionIR, target: Target, **options: Any):
        return plan_v2(ir, target, **options)

    def replan_widths(self, plan) -> tuple[int, ...]:
        """The key-tile widths a plan whose machine code spills is tried at (runtime/spills.py), widest first: the
        planner's narrower BLOCK_N choices down to MIN_REPLAN_BLOCK_N (each planned again, so BLOCK_M, warps, stages
        and Q in registers may change with it)."""
        return tuple(w for w in sorted(V2_BLOCK_N_CHOICES, reverse=True) if MIN_REPLAN_BLOCK_N <= w < plan.block_n)

    def render(self, ir: AttentionIR, plan, target: Target, *, varlen: bool = False) -> KernelSource:
        """The translation unit; ``varlen`` renders the packed-sequence kernel (runtime/varlen.py)."""
        src = render_source(
            self.template,
            name=ir.name,
            prelude=render_prelude(ir),
            plan_text=plan.describe(),
            head_dim=ir.head_dim,
            head_dim_v=ir.head_dim_v,
            block_m=plan.block_m,
            block_n=plan.block_n,
            num_warps=plan.num_warps,
            q_in_regs=bool(plan.q_in_regs),
            stages=int(plan.stages),
            min_ctas=1,
            smem_bytes=plan.smem_bytes,
            varlen=bool(varlen),
            score_skip=bool(plan.score_skip),
        )
        return KernelSource(self.name, "attn_fwd", target.nvrtc_arch, src, plan, plan.num_threads,
                            plan.smem_bytes)

    def grid(self, ks: KernelSource, dims: AttnInputs) -> tuple[int, int, int]:
        return (-(-dims.Nq // ks.plan.block_m), dims.H, dims.B)  # (common.cuh: ac_grid_bh)

    def workspace_floats(self, ks: KernelSource, dims: AttnInputs) -> int:
        return 0

    prepare_forward = staticmethod(prepare_score_skip)  # the score skip's per-call row norms


SCHEDULE = V2Schedule()
