"""Shared by the v3 GPU tests: the Hopper check and the presets they run."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets


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
