"""Host cost of a decode call (what ``schedule="auto"`` runs for Nq <= 16 against a long K/V) while the GPU is busy:
microseconds per call taking the recorded launch (runtime/fastpath.py) and per call on the full path (the recipes
cleared before each), beside torch SDPA's call; then the kernels' GPU time per call (CUDA events over a loop).

    PYTHONPATH=. python3 benchmarks/host_decode.py ["B,H,H_kv,Nq,Nk;..."] [--calls 300]

Shapes default to one generated token at batch 1 and 8 over 4k and 32k keys, d = 128, bf16.
"""
from __future__ import annotations

import argparse

import torch
from host_forward import _busy_time


def main(argv: list[str] | None = None) -> int:
    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="?", default="1,32,8,1,4096;8,32,8,1,4096;1,32,8,1,32768")
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args(argv)
    kern = ac.compile(presets.causal(128))  # schedule "auto": decode at these shapes
    print(f"# {torch.cuda.get_device_name()}, causal d128 bf16, schedule auto; us per call", flush=True)
    for shape in args.shapes.split(";"):
        B, H, H_kv, Nq, Nk = (int(x) for x in shape.split(","))
        q = torch.randn(B, H, Nq, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, H_kv, Nk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for _ in range(5):
            kern(q, k, v)
        torch.cuda.synchronize()

        def full() -> None:
            kern._recipes.clear()
            kern(q, k, v)

        recorded = _busy_time(lambda: kern(q, k, v), args.calls)
        slow = _busy_time(full, args.calls)
        kr, vr = (t.repeat_interleave(H // H_kv, dim=1) for t in (k, v))  # SDPA's flash path wants equal heads
        sdpa = _busy_time(lambda: torch.nn.functional.scaled_dot_product_attention(q, kr, vr), args.calls)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            kern(q, k, v)
        end.record()
        torch.cuda.synchronize()
        print(f"B={B} H={H} H_kv={H_kv} Nq={Nq} Nk={Nk}: host recorded {recorded:.1f}, full path {slow:.1f}, "
              f"SDPA {sdpa:.1f}; GPU+gaps {start.elapsed_time(end) * 1e3 / 50:.1f} per call back to back",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
