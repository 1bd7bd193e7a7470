"""Shared by the v3 tests: the sm_90 render, the Hopper check and the presets the GPU tests run."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.codegen.schedule import get_schedule
from attncompiler.ir.build import build_ir
from attncompiler.plan.targets import get_target
from attncompiler.spec import presets


def render_v3(spec: ac.AttentionSpec, **opts):
    """The v3 forward's KernelSource for ``spec`` on sm_90 with plan options ``opts``."""
    tgt = get_target("sm_90")
    ir = build_ir(spec)
    sched = get_schedule("v3")
    return sched.render(ir, sched.make_plan(ir, tgt, **opts), tgt)


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not hopper(), reason="v3 needs an sm_90 GPU")
GPU_PRESETS = ("plain", "causal", "sliding_window", "document", "dropout", "alibi_causal", "softcap")


def v3_gpu_spec(name: str, head_dim: int, dtype: str = "bf16", seqlen: int = 1024, heads: int = 3) -> ac.AttentionSpec:
    """The spec of GPU_PRESETS entry ``name`` (dropout 0.2; ALiBi causal with ``heads`` slopes)."""
    if name == "dropout":
        return ac.AttentionSpec(head_dim=head_dim, dtype=dtype, dropout_p=0.2, name="dropout")
    if name == "alibi_causal":
        return presets.alibi(presets.alibi_slopes(heads), head_dim, dtype=dtype, causal=True)
    return presets.get_preset(name, head_dim=head_dim, dtype=dtype, num_heads=heads, seqlen=seqlen)


def same_outputs(kern_a, kern_b, B: int, H: int, N: int, d: int, seed: int, dtype=torch.bfloat16,
                 Nk: int | None = None, H_kv: int | None = None) -> bool:
    """Whether two compiled kernels give bit-identical O and LSE on the same random q, k, v (drawn on the GPU from
    ``seed``: q of (B, H, N, d), k and v of (B, H_kv or H, Nk or N, d))."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, N, d, device="cuda", generator=g).to(dtype)
    k, v = (torch.randn(B, H_kv or H, Nk or N, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    a, b = kern_a(q, k, v, return_lse=True), kern_b(q, k, v, return_lse=True)
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
