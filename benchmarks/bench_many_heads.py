"""Many short sequences in one launch: B * H past the grid's old y limit of 65535 (windowed vision attention,
a large decode batch), ours against torch's SDPA backends in the same process.

    PYTHONPATH=. python3 benchmarks/bench_many_heads.py [ROUNDS]
    PYTHONPATH=. python3 benchmarks/bench_many_heads.py --sweep [ROUNDS]   # where 64-row query tiles pay, over N

Shapes (bf16, forward, no mask): Swin-style windows of 7 x 7 = 49 tokens (B = 4096 windows, H = 32, d = 32, then
H = 16, d = 64), and 64-token windows (B = 2048, H = 64, d = 64). Triton's do_bench median (ms), interleaved over
ROUNDS rounds; the last lines are the medians and ours / each peer as a speedup. MANY_HEADS_ALTERNATIVES=1 adds
other plans of ours (v3 on its one-tile-per-CTA grid, v3 at 64 query rows, v2, v2 at 64 rows); MANY_HEADS_PACKED=1 adds
the same batch as packed sequences (cu_seqlens) with max_seqlen_q = N ("ours-packed": the 64-row sibling where N <= 64)
and with max_seqlen_q = 65 ("ours-packed-tall": the kernel's own plan). FLOPs: 4 B H N^2 d. HBM bytes: q, k,
v read and o written once (4 B H N d x 2 bytes), which bound kernels this short more than their FLOPs do.
"""
from __future__ import annotations

import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attncompiler as ac
from attncompiler.spec import presets

SHAPES = ((4096, 32, 49, 32), (4096, 16, 49, 64), (2048, 64, 64, 64))
#: our kernels: "ours" is schedule="auto"; the alternatives are named "ours-..."
OURS = {"ours": ("auto", {})}
if os.environ.get("MANY_HEADS_ALTERNATIVES"):
    OURS.update({"ours-v3-grid": ("v3", {"persistent": False}), "ours-v3-bm64": ("v3", {"block_m": 64}),
                 "ours-v2": ("v2", {}), "ours-v2-bm64": ("v2", {"block_m": 64})})
PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}


def _time(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100))


def _sdpa(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    def run() -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return run


def main(rounds: int = 3) -> None:
    torch.manual_seed(0)
    cases = []
    for B, H, N, d in SHAPES:
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        fns = {}
        for label, (schedule, opts) in OURS.items():
            kern = ac.compile(presets.plain(d), schedule, **opts)
            assert (kern(q, k, v).float() - ref).abs().max().item() < 0.05, (label, B, H, N, d)
            fns[label] = lambda kern=kern, q=q, k=k, v=v: kern(q, k, v)
        if os.environ.get("MANY_HEADS_PACKED"):
            kern = ac.compile(presets.plain(d))
            pq, pk, pv = (t.transpose(1, 2).reshape(B * N, H, d) for t in (q, k, v))
            cu = torch.arange(0, (B + 1) * N, N, device="cuda", dtype=torch.int32)
            for label, mq in (("ours-packed", N), ("ours-packed-tall", 65)):
                got = kern(pq, pk, pv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mq, max_seqlen_k=N)
                assert (got.view(B, N, H, d).transpose(1, 2).float() - ref).abs().max().item() < 0.05, label
                fns[label] = lambda kern=kern, mq=mq, pq=pq, pk=pk, pv=pv, cu=cu, N=N: kern(
                    pq, pk, pv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mq, max_seqlen_k=N)
        for name, be in PEERS.items():
            try:
                _sdpa(be, q, k, v)()
                fns[name] = _sdpa(be, q, k, v)
            except RuntimeError as e:  # a backend that refuses the shape
                print(f"B={B} H={H} N={N} d={d}: {name} refused ({str(e).splitlines()[0][:80]})")
        cases.append(((B, H, N, d), fns, {n: [] for n in fns}))
    for r in range(rounds):
        for (B, H, N, d), fns, times in cases:
            for name, fn in fns.items():
                times[name].append(_time(fn))
    for (B, H, N, d), fns, times in cases:
        med = {n: statistics.median(t) for n, t in times.items()}
        flops, nbytes = 4 * B * H * N * N * d, 4 * B * H * N * d * 2
        parts = ", ".join(f"{n} {m:.3f} ms ({flops / m / 1e9:.0f} TFLOP/s, {nbytes / m / 1e6:.0f} GB/s)"
                          for n, m in med.items())
        ratios = ", ".join(f"ours/{n} {med[n] / med['ours']:.2f}x" for n in med if n != "ours")
        print(f"B={B} H={H} N={N} d={d} (B*H={B * H}): {parts}; speedup {ratios}")


def sweep(rounds: int = 3, tokens: int = 1 << 18) -> None:
    """Where short query tiles pay: ours (schedule "auto") against v3 at 64 and at 128 query rows over N, B * N =
    ``tokens``, H = 16, d = 64 and 128, no mask and causal; prints each median and the ratios to ours."""
    plans = {"ours": ("auto", {}), "v3-bm64": ("v3", {"block_m": 64}), "v3-bm128": ("v3", {"block_m": 128})}
    cases = []
    for d in (64, 128):
        base = [torch.randn(tokens * 16 * d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]  # shared views
        for causal in (False, True):
            spec = presets.causal(d) if causal else presets.plain(d)
            kerns = {n: ac.compile(spec, s, **o) for n, (s, o) in plans.items()}
            for N in (49, 64, 96, 113, 128, 192, 256, 512):
                B = max(1, tokens // N)
                q, k, v = (t[:B * 16 * N * d].view(B, 16, N, d) for t in base)
                cases.append(((d, causal, N, B), {n: (lambda kk=kk, q=q, k=k, v=v: kk(q, k, v))
                                                 for n, kk in kerns.items()}, {n: [] for n in kerns}))
    for _ in range(rounds):
        for _, fns, times in cases:
            for n, fn in fns.items():
                times[n].append(_time(fn))
    for (d, causal, N, B), _, times in cases:
        med = {n: statistics.median(t) for n, t in times.items()}
        print(f"d={d} {'causal' if causal else 'plain'} N={N} B={B}: "
              + ", ".join(f"{n} {m:.3f} ms" for n, m in med.items()) + "; "
              + ", ".join(f"ours/{n} {med[n] / med['ours']:.2f}x" for n in med if n != "ours"))


if __name__ == "__main__":
    if "--sweep" in sys.argv:
        sweep(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 3)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
