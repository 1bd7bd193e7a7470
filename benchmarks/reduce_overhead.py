"""A training step under ``torch.compile(mode="reduce-overhead")`` (inductor's CUDA graphs) with an attncompiler
kernel inside: does inductor capture the step, do outputs and gradients match eager, and what does a step cost?

    PYTHONPATH=. python3 benchmarks/reduce_overhead.py [--steps 30] [--shape 2,256,256] [--only dropout,causal]

For each variant (causal, also deterministic; a sliding window; causal with dropout, a fixed seed and a random one;
ALiBi with its slopes captured on the CPU and on the GPU; packed sequences) it prints inductor's cudagraph counters
(a skip is counted, and logged with its reason under TORCH_LOGS=perf_hints), the largest difference from the eager
step over six steps on new inputs (for the random seed, that of different masks), and the median step time eager,
compiled (default mode) and compiled with CUDA graphs. ``--only``: the variants whose names hold one of these words. Shape: batch, tokens, model width (4 heads).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch


def variants(heads: int, d: int) -> dict[str, Callable[..., torch.Tensor]]:
    import attncompiler as ac
    from attncompiler.spec import presets

    causal = ac.compile(presets.causal(d))
    window = ac.compile(presets.sliding_window(100, d))
    drop = ac.compile(ac.AttentionSpec(head_dim=d, causal=True, dropout_p=0.1, name="dropout"))
    alibi_cpu = ac.compile(presets.alibi(presets.alibi_slopes(heads), d, causal=True))
    alibi_gpu = ac.compile(presets.alibi(presets.alibi_slopes(heads).cuda(), d, causal=True))
    packed = ac.compile(presets.causal(d))

    def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_seqlen: bool = False) -> torch.Tensor:
        B, H, N, _ = q.shape  # the batch's rows as two packed sequences of each row's length
        cu = torch.arange(0, 2 * B + 1, device=q.device, dtype=torch.int32) * (N // 2)
        cu[-1] = B * N
        pk = [t.transpose(1, 2).reshape(B * N, H, d) for t in (q, k, v)]
        mx = {"max_seqlen_q": N, "max_seqlen_k": N} if max_seqlen else {}  # with both: graph-safe (runtime/varlen.py)
        return packed(*pk, cu_seqlens_q=cu, cu_seqlens_k=cu, **mx).view(B, N, H, d).transpose(1, 2)

    return {
        "causal": lambda q, k, v: causal(q, k, v),
        "causal, deterministic": lambda q, k, v: causal(q, k, v, deterministic=True),
        "sliding window 100": lambda q, k, v: window(q, k, v),
        "dropout (seed 11)": lambda q, k, v: drop(q, k, v, seed=11),
        "dropout (random seed)": lambda q, k, v: drop(q, k, v),
        "alibi, slopes on the CPU": lambda q, k, v: alibi_cpu(q, k, v),
        "alibi, slopes on the GPU": lambda q, k, v: alibi_gpu(q, k, v),
        "packed sequences": varlen,
        "packed sequences, max_seqlen given": lambda q, k, v: varlen(q, k, v, max_seqlen=True),
    }


def step_fn(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], list[torch.Tensor]]:
    """One training step on ``x`` (its contents may change between calls): output and parameter gradients."""
    def step() -> list[torch.Tensor]:
        for p in model.parameters():
            p.grad = None
        y = model(x)
        y.float().square().mean().backward()
        return [y.detach().clone()] + [p.grad.clone() for p in model.parameters()]
    return step


def median_ms(fn: Callable[[], Any], steps: int) -> float:
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from torch._dynamo.utils import counters

    from attncompiler.testing import TransformerBlock

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--shape", default="2,256,256")
    ap.add_argument("--only", default="", help="comma-separated words; run the variants whose names hold one")
    args = ap.parse_args(argv)
    B, N, C = (int(x) for x in args.shape.split(","))
    heads = 4
    words = [w for w in args.only.split(",") if w]
    for name, attend in variants(heads, C // heads).items():
        if words and not any(w in name for w in words):
            continue
        torch.manual_seed(0)
        model = TransformerBlock(C, heads, attend).cuda().to(torch.bfloat16)
        x = torch.randn(B, N, C, device="cuda", dtype=torch.bfloat16)
        eager = step_fn(model, x)
        row = [f"{name}:"]
        for mode in ("default", "reduce-overhead"):
            counters.clear()
            torch._dynamo.reset()
            comp = torch.compile(model, mode=None if mode == "default" else mode, fullgraph=True)
            step = step_fn(comp, x)
            err = 0.0
            try:
                for i in range(6):  # compile, warm up, record, then replays, each on new contents of x
                    x.copy_(torch.randn_like(x))
                    got, want = step(), eager()
                    err = max(err, *(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want)))
            except Exception as e:  # noqa: BLE001 - reported, then the next variant
                row.append(f"{mode}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            graphs = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
            row.append(f"{mode}: max |diff| vs eager over 6 steps {err:.3g}, cudagraph counters {graphs}, "
                       f"{median_ms(step, args.steps):.3f} ms/step")
        row.append(f"eager: {median_ms(eager, args.steps):.3f} ms/step")
        print("\n  ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
