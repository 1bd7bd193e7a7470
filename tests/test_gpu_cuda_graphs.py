"""GPU: attncompiler kernels in CUDA graphs: a training step under ``torch.compile(mode="reduce-overhead")``
(inductor's CUDA graph trees), and calls captured with ``torch.cuda.graph``. The forward and backward kernels are
captured and replayed, dropout included: its [seed, offset] pair is made on the GPU inside the graph and read by the
kernels there, so every replay drops a fresh mask (attncompiler/runtime/rng.py). Packed sequences without max_seqlen
(cu_seqlens read on the host for the grid) are kept out of inductor's graphs (their ops carry the ``cudagraph_unsafe``
tag: the graph is split around them); with both max_seqlen the step is graphed whole (tests/test_gpu_varlen_graphs.py
replays such calls on new cu_seqlens). Every step on new inputs matches the eager step (at the same seed, for
dropout). Captured buffers must be on the GPU there: a CPU one (ALiBi's slopes made on the CPU) is saved for the backward as a CPU tensor, and inductor
refuses to graph such a step ("Expected all cuda outputs in cuda graph recording"; measured on an H200, 2026-11-30)."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import TransformerBlock

from _graphs import capture  # shared with test_gpu_varlen_graphs.py

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

H, D = 4, 64


def _attend(name: str):
    if name in ("packed", "packed_max"):
        kern = ac.compile(presets.causal(D))

        def packed(q, k, v):
            B, _, N, _ = q.shape
            cu = torch.tensor([0, 100, N, N + 37, 2 * N], device=q.device, dtype=torch.int32)[: 2 * B + 1]
            pk = [t.transpose(1, 2).reshape(B * N, H, D) for t in (q, k, v)]
            mx = {"max_seqlen_q": N, "max_seqlen_k": N} if name == "packed_max" else {}
            return kern(*pk, cu_seqlens_q=cu, cu_seqlens_k=cu, **mx).view(B, N, H, D).transpose(1, 2)
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
                                          ("alibi", True), ("dropout", True), ("packed", False),
                                          ("packed_max", True)])
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


def _dropout_kernel(schedule: str = "auto", causal: bool = True, head_dim: int = D) -> ac.CompiledAttention:
    return ac.compile(ac.AttentionSpec(head_dim=head_dim, causal=causal, dropout_p=0.2, name="dropout"), schedule)


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@needs_cuda
@pytest.mark.parametrize("schedule", ["v1", "v2", "v3", "decode"])
def test_gpu_captured_dropout_draws_a_fresh_mask_per_replay(schedule: str) -> None:
    """A random-seed dropout forward captured with torch.cuda.graph: each replay draws a new seed on the GPU, and its
    output is bit-identical to an eager call with that seed (read back from the kernel's device pair)."""
    if schedule == "v3" and not _hopper():
        pytest.skip("v3 needs sm_90")
    kern = _dropout_kernel(schedule, causal=schedule != "decode")
    torch.manual_seed(1)
    nq, nk = (4, 3000) if schedule == "decode" else (300, 300)
    q = torch.randn(2, H, nq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, H, nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    g, out = capture(lambda: kern(q, k, v))
    state = kern.last_rng_state
    assert kern.last_seed is None and state is not None and state.is_cuda, "the captured call read a host seed"
    seeds = set()
    for rep in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        seed, offset = state.tolist()
        seeds.add(seed)
        want = kern(q, k, v, seed=seed, offset=offset)
        assert torch.equal(out, want), f"{schedule} replay {rep}: differs from the eager call at seed {seed}"
    assert len(seeds) == 3, f"{schedule}: replays drew seeds {seeds}, expected three different ones"


@needs_cuda
@pytest.mark.parametrize("schedule,head_dim", [("v2", 64), ("v2", 128), ("v3", 64), ("v3", 128), ("v3", 256)])
def test_gpu_captured_dropout_training_step_matches_eager_at_its_seed(schedule: str, head_dim: int) -> None:
    """Forward and backward captured together (random seed, deterministic backward): each replay's output and
    gradients equal an eager step at the seed the replay drew, and two replays draw different masks."""
    if schedule == "v3" and not _hopper():
        pytest.skip("v3 needs sm_90")
    kern = _dropout_kernel(schedule, head_dim=head_dim)
    torch.manual_seed(2)
    leaves = [torch.randn(2, H, 300, head_dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
              for _ in range(3)]
    go = torch.randn(2, H, 300, head_dim, device="cuda", dtype=torch.bfloat16)

    def step():
        out = kern(*leaves, deterministic=True)
        return (out, *torch.autograd.grad(out, leaves, go))

    g, res = capture(step)
    state = kern.last_rng_state
    assert state is not None and state.is_cuda, "the captured step read a host seed"
    outs = []
    for rep in range(2):
        for t in res:
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        seed, offset = state.tolist()
        out = kern(*leaves, seed=seed, offset=offset, deterministic=True)
        want = (out, *torch.autograd.grad(out, leaves, go))
        for j, (a, b) in enumerate(zip(res, want)):
            assert torch.equal(a, b), (f"{schedule} d{head_dim} replay {rep} tensor {j}: differs from eager at "
                                       f"seed {seed}")
        outs.append(res[0].clone())
    assert not torch.equal(outs[0], outs[1]), f"{schedule} d{head_dim}: two replays dropped the same mask"


@needs_cuda
def test_gpu_reduce_overhead_dropout_draws_fresh_masks() -> None:
    """Random-seed dropout under reduce-overhead: inductor graphs the whole step, and replays on the same input
    differ from one another (fresh masks) while staying finite and near the eager step."""
    from torch._dynamo.utils import counters

    torch.manual_seed(3)
    kern = _dropout_kernel()
    model = TransformerBlock(H * D, H, lambda q, k, v: kern(q, k, v)).cuda().to(torch.bfloat16)
    x = torch.randn(2, 300, H * D, device="cuda", dtype=torch.bfloat16)
    counters.clear()
    torch._dynamo.reset()
    comp = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    ys = [_step(comp, x)[0] for _ in range(5)]  # warm-up, record, three replays
    graphs = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    assert graphs.get("cudagraph_skips", 0) + graphs.get("cudagraph_partitions", 0) == 0, graphs
    eager = _step(model, x)[0].float()
    for i, y in enumerate(ys):
        assert torch.isfinite(y).all(), f"step {i}: not finite"
        dev = (y.float() - eager).abs().mean() / eager.abs().mean()
        assert dev < 0.1, f"step {i}: mean deviation {dev:.3f} from an eager dropout step"
    for i in range(2, 5):
        assert not torch.equal(ys[i], ys[i - 1]), f"steps {i - 1} and {i} dropped the same mask"


@needs_cuda
def test_gpu_device_pair_calls_skip_recorded_launches() -> None:
    """A call with a device pair runs the kernels that read it, on the full path: it neither takes nor records a
    recorded launch (those hold the by-value kernels), and gives the by-value call's output at the same seed."""
    from attncompiler.runtime import fastpath
    from attncompiler.runtime.rng import device_rng

    kern = _dropout_kernel("v2")
    q, k, v = (torch.randn(2, H, 300, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = kern(q, k, v, seed=7, offset=2)
    kern(q, k, v, seed=7, offset=2)  # recorded
    hits, n = fastpath.stats["hits"], len(kern._recipes)
    got = kern._launch_forward(q, k, v, return_lse=False, scale=None, dropout_p=None, seed=None, offset=0,
                               buffers=kern._buffers, out=None, record=True, rng_state=device_rng(7, 2, q.device))
    assert torch.equal(got, want)
    assert fastpath.stats["hits"] == hits and len(kern._recipes) == n
    assert torch.equal(kern(q, k, v, seed=7, offset=2), want) and fastpath.stats["hits"] == hits + 1
