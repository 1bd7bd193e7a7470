"""GPU: a training step under ``torch.compile(mode="reduce-overhead")`` (inductor's CUDA graph trees) with
attncompiler kernels inside. Without dropout the forward and backward kernels are captured and replayed; with dropout
(a seed read on the host) or packed sequences (cu_seqlens read on the host) inductor keeps those ops out of its graphs
(they carry the ``cudagraph_unsafe`` tag: the graph is split around them, or skipped). Either way every step on new
inputs matches the eager step. Captured buffers must be on the GPU there: a CPU one (ALiBi's slopes made on the CPU) is
saved for the backward as a CPU tensor, and inductor refuses to graph such a step ("Expected all cuda outputs in cuda
graph recording"; measured on an H200, 2026-11-30)."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import TransformerBlock

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

H, D = 4, 64


def _attend(name: str):
    if name == "packed":
        kern = ac.compile(presets.causal(D))

        def packed(q, k, v):
            B, _, N, _ = q.shape
            cu = torch.tensor([0, 100, N, N + 37, 2 * N], device=q.device, dtype=torch.int32)[: 2 * B + 1]
            pk = [t.transpose(1, 2).reshape(B * N, H, D) for t in (q, k, v)]
            return kern(*pk, cu_seqlens_q=cu, cu_seqlens_k=cu).view(B, N, H, D).transpose(1, 2)
        return packed
    spec = {"causal": presets.causal(D), "deterministic": presets.causal(D),
            "window": presets.sliding_window(100, D),
            "alibi": presets.alibi(presets.alibi_slopes(H).cuda(), D, causal=True),
            "dropout": ac.AttentionSpec(head_dim=D, causal=True, dropout_p=0.1, name="dropout")}[name]
    kern = ac.compile(spec)
    if name == "dropout":
        return lambda q, k, v: kern(q, k, v, seed=5)
    return lambda q, k, v: kern(q, k, v, deterministic=name == "deterministic")


def _step(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    y = model(x)
    y.float().square().mean().backward()
    return [y.detach().clone()] + [p.grad.clone() for p in model.parameters()]


@needs_cuda
@pytest.mark.parametrize("name,graphed", [("causal", True), ("deterministic", True), ("window", True),
                                          ("alibi", True), ("dropout", False), ("packed", False)])
def test_gpu_reduce_overhead_step_matches_eager(name: str, graphed: bool) -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = TransformerBlock(H * D, H, _attend(name)).cuda().to(torch.bfloat16)
    x = torch.randn(2, 300, H * D, device="cuda", dtype=torch.bfloat16)  # 300: no multiple of any block
    counters.clear()
    torch._dynamo.reset()
    comp = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for i in range(5):  # compile and warm up, record, replay on new contents of the same input
        x.copy_(torch.randn_like(x))
        got, want = _step(comp, x), _step(model, x)
        for j, (a, b) in enumerate(zip(got, want)):
            assert torch.isfinite(a).all(), f"{name} step {i} tensor {j}: not finite"
            torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2,
                                       msg=lambda m: f"{name} step {i} tensor {j}: {m}")
    graphs = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    kept_out = graphs.get("cudagraph_skips", 0) + graphs.get("cudagraph_partitions", 0)
    assert (kept_out == 0) == graphed, f"{name}: expected {'whole CUDA graphs' if graphed else 'ops kept out of them'}, " \
                                       f"got {graphs}"
