"""Where a small training step's host time goes: each piece of ``kern(q, k, v).backward(do)`` timed with the GPU
kept busy (a long ``torch.cuda._sleep`` queued first, so no call waits on a kernel and a hidden synchronization
shows as a loop that takes the sleep's length), beside torch SDPA's pieces.

    PYTHONPATH=. python3 benchmarks/host_step_parts.py [--steps 200] [--n 256]
"""
from __future__ import annotations

import argparse

import torch
from host_forward import _busy_time


def main(argv: list[str] | None = None) -> int:
    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--n", type=int, default=256)
    args = ap.parse_args(argv)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    kern = ac.compile(presets.causal(128))
    shape = (1, 16, args.n, 128)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    out = kern(q, k, v)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        sout = sdpa(q, k, v, is_causal=True)

    def ours_step() -> None:
        kern(q, k, v).backward(do)

    def ours_fwd() -> None:
        kern(q, k, v)

    def ours_nograd() -> None:
        with torch.no_grad():
            kern(q, k, v)

    def ours_grad_only() -> None:
        torch.autograd.grad(kern(q, k, v), (q, k, v), do)

    def sdpa_step() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sdpa(q, k, v, is_causal=True).backward(do)

    def sdpa_fwd() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sdpa(q, k, v, is_causal=True)

    def sdpa_grad_only() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), do)

    class Nop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, c):
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, g):
            return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)

    def nop_step() -> None:
        Nop.apply(q, k, v).backward(do)

    items = {"ours step": ours_step, "ours fwd (grad)": ours_fwd, "ours fwd (no_grad)": ours_nograd,
             "ours autograd.grad": ours_grad_only, "sdpa step": sdpa_step, "sdpa fwd (grad)": sdpa_fwd,
             "sdpa autograd.grad": sdpa_grad_only, "no-op Function step": nop_step}
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  causal d=128 {shape} bf16; host us per call, "
          f"GPU busy")
    for r in range(2):
        for name, fn in items.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            print(f"  round {r} {name:22s} {_busy_time(fn, args.steps):8.1f}", flush=True)
    del out, sout
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
