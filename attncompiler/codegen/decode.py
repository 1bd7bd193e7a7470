"""The decode schedule: split-KV flash-decoding forward for few query rows (templates/decode_fwd.cu.j2,
include/attncompiler/decode.cuh): a split kernel over (splits, B*H_kv, row blocks) and a combine kernel
that merges the partial results by LSE (or, with the plan's ``fold_combine``, the split kernel's last CTA
of each unit merges them: one launch).  ``schedule="auto"`` runs it when Nq <= 16 and the K/V is long
(:func:`attncompiler.plan.decode.decode_applies`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..ir.types import AttentionIR
from ..plan.decode import DECODE_MAX_SPLITS, plan_decode
from ..plan.targets import Target
from ..runtime import decode as rt
from ..runtime.launch import AttnInputs, device_index
from ..runtime.params import c_struct
from .hooks import render_prelude
from .render import render_source
from .schedule import KernelSource

__all__ = ["SCHEDULE", "DecodeSchedule"]


@dataclass(frozen=True)
class DecodeSchedule:
    name: str = "decode"
    template: str = "decode_fwd.cu.j2"

    def make_plan(self, ir: AttentionIR, target: Target, **options: Any):
        return plan_decode(ir, target, **options)

    def render(self, ir: AttentionIR, plan, target: Target) -> KernelSource:
        src = render_source(
            self.template,
            name=ir.name,
            prelude=render_prelude(ir),
            decode_struct=c_struct("DecodeParams", rt.DECODE_PARAM_FIELDS),
            plan_text=plan.describe(),
            head_dim=ir.head_dim,
            head_dim_v=ir.head_dim_v,
            block_n=plan.block_n,
            num_warps=plan.num_warps,
            stages=plan.stages,
            q_in_regs=bool(plan.q_in_regs),
            l2_hint=int(plan.l2_hint),
            loader=str(plan.loader),
            fold_combine=bool(plan.fold_combine),
            min_ctas=plan.min_ctas,
            combine_warps=plan.combine_warps,
            max_splits=DECODE_MAX_SPLITS,
            smem_bytes=plan.smem_bytes,
        )
        return KernelSource(self.name, "attn_fwd", target.nvrtc_arch, src, plan, plan.num_threads, plan.smem_bytes)

    def grid(self, ks: KernelSource, dims: AttnInputs) -> tuple[int, int, int]:
        """The split kernel's grid (splits chosen for the plan's device, :func:`choose_splits`)."""
        c = rt.split_choice(ks.plan, dims)
        return rt.split_grid(c, dims)

    def workspace_floats(self, ks: KernelSource, dims: AttnInputs) -> int:
        return rt.workspace_floats(rt.split_choice(ks.plan, dims), dims, ks.plan)

    def forward_launch(self, ks: KernelSource, dims: AttnInputs, buffers: Any,
                       device: torch.device) -> rt.DecodeLaunch:
        """The split (and, with several splits and no ``fold_combine``, the combine) kernel's launch for ``dims``
        (:class:`attncompiler.runtime.decode.DecodeLaunch`); ``params.workspace`` must hold
        :meth:`workspace_floats` floats (with ``fold_combine`` its counter slice is zeroed on the launch's stream
        when no zeroed counters are at hand)."""
        idx = device_index(device)
        key = (ks.source, ks.arch, idx)  # str hashes are cached: a hit is cheap (no sha256 of the source)
        fns = _FUNCTIONS.get(key)
        if fns is None:
            from ..runtime.compiler import compile_functions

            loaded = compile_functions(ks.source, ks.arch, idx, ("attn_fwd", rt.COMBINE_ENTRY))
            fns = _FUNCTIONS.setdefault(key, (loaded["attn_fwd"].ptr, loaded[rt.COMBINE_ENTRY].ptr))
        return rt.DecodeLaunch(ks, fns[0], fns[1], rt.split_choice(ks.plan, dims), dims, buffers, keep=(buffers,))


#: (source, arch, device) -> (split, combine) function pointers of loaded modules (kept loaded by the
#: compiler's in-memory cache)
_FUNCTIONS: dict[tuple[str, str, int], tuple[int, int]] = {}


SCHEDULE = DecodeSchedule()
