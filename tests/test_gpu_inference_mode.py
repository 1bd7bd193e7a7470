"""GPU: calls under ``torch.inference_mode()``, where tensors carry no version counter (``_version`` raises): kernels
whose captured buffers were made there, and packed sequences whose cu_seqlens were made there, run correctly on
every call, see changes made in place, and never launch from a recording (runtime/fastpath.py, varlen_fastpath.py)."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.runtime import fastpath
from attncompiler.spec import presets

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

H, D = 4, 64


def _alibi(scale: float = 1.0) -> ac.AttentionSpec:
    return presets.alibi(presets.alibi_slopes(H) * scale, D, causal=True)


@needs_cuda
def test_gpu_buffers_made_in_inference_mode() -> None:
    g = torch.Generator(device="cuda").manual_seed(3)
    with torch.inference_mode():
        kern = ac.compile(_alibi())
        name = next(iter(kern._buffers))
        assert kern._buffers[name].is_inference()
        q, k, v = (torch.randn(2, H, 300, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        hits = fastpath.stats["hits"]
        first, second = kern(q, k, v), kern(q, k, v)
        kern._buffers[name].mul_(2.0)  # in place, no version bump: the next call must still see it
        doubled = kern(q, k, v)
    assert fastpath.stats["hits"] == hits, "an inference-mode buffer must not launch from a recording"
    assert not kern._recipes, "no recording may be built that could never launch"
    assert torch.equal(first, ac.compile(_alibi())(q, k, v)) and torch.equal(second, first)
    assert torch.equal(doubled, ac.compile(_alibi(2.0))(q, k, v)) and not torch.equal(doubled, first)


@needs_cuda
def test_gpu_packed_cu_seqlens_made_in_inference_mode() -> None:
    kern = ac.compile(presets.causal(D))
    g = torch.Generator(device="cuda").manual_seed(4)
    lens = (113, 0, 300, 64)
    with torch.inference_mode():
        q, k, v = (torch.randn(sum(lens), H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
        hits = fastpath.stats["hits"]
        first = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
        second = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
        cu[1] += 50  # in place: sequence 0 longer, sequence 2 shorter (no version bump)
        cu[2] += 50
        moved = kern(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert fastpath.stats["hits"] == hits, "inference-mode cu_seqlens must not launch from a recording"
    assert torch.equal(first, second)
    fresh = cu.clone()  # (outside inference mode: a normal tensor)
    assert torch.equal(moved, kern(q, k, v, cu_seqlens_q=fresh, cu_seqlens_k=fresh)) and not torch.equal(moved, first)
