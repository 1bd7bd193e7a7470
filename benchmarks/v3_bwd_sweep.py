"""Sweep backward plan options at N = 16k, bf16, B*N = 16k, H*d = 2048; prints backward TFLOP/s per config.

    PYTHONPATH=. python3 benchmarks/v3_bwd_sweep.py "128:causal,128:causal:dq_split_n=false,64:plain:schedule=v2" [ROUNDS]

Each item is ``d:variant[:option=value...]``: the variant is ``plain``, ``causal``, ``fullmask`` (a mask
that hides nothing: mask code compiled in, every tile FULL) or ``cudnn`` / ``cudnn_causal`` (torch SDPA's cuDNN
backend, the reference); the options are the backward's (``schedule`` "v2" / "v3" / "auto",
v3's ``consumers``, ``stages``, ``dq_split_n``, ``dq_red``, ``dkv_split``, ``dq_wide``, ``dq_chunk``, ``dq_pad``, or
v2's plan options; ``n=4096`` sets the sequence length, B = 16384 // n; ``dv=128`` sets V's head dim (default d;
FLOPs then 2.5 x 2 B H N^2 (d + dv)); ``deterministic=true`` calls the kernel
with ``deterministic=True``; ``define=NAME`` renders the backward with ``#define NAME 1`` in front, for A/B runs of
source-level variants).  FLOPs: backward = 2.5 x the forward's 4 B H N^2 d, halved when causal.  Each config times
``torch.autograd.grad`` of a retained graph (backward only; triton's do_bench median over two input sets); with
ROUNDS > 1 configs are timed once per round in order, and the median over the rounds is printed last.
"""
from __future__ import annotations

import dataclasses
import sys

import torch
import torch.nn.functional as F
from _results import option_value, print_round_medians
from v3_sweep import _visible_pairs, bwd_define


def main(argv: list[str]) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.spec import presets

    rounds = int(argv[1]) if len(argv) > 1 else 1
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    inputs: dict[tuple[int, int], tuple] = {}
    times: dict[str, list[float]] = {}
    for item in argv[0].split(",") * rounds:
        d_s, var, *opts = item.split(":")
        d = int(d_s)
        options = {k: option_value(v) for k, v in (o.split("=") for o in opts)}
        N = int(options.pop("n", 16384))
        dv = int(options.pop("dv", d))
        det = bool(options.pop("deterministic", False))
        define = options.pop("define", None)
        B, H = max(1, 16384 // N), 2048 // d
        if (d, dv, N) not in inputs:
            sets = [tuple(torch.randn(B, H, N, x, device="cuda", dtype=torch.bfloat16).requires_grad_()
                          for x in (d, d, dv)) for _ in range(2)]
            inputs[(d, dv, N)] = (sets, torch.randn(B, H, N, dv, device="cuda", dtype=torch.bfloat16))
        sets, dout = inputs[(d, dv, N)]
        causal = var.endswith("causal")
        flops = 2.5 * 2 * B * H * N * N * (d + dv) / (2 if causal else 1)
        if var.startswith("sliding_window"):
            flops = 2.5 * 2 * B * H * (d + dv) * _visible_pairs(var, N)
        try:
            if var.startswith("cudnn"):
                def fn(q, k, v):
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            else:
                if var == "fullmask":  # a mask that hides nothing: the mask code compiled in, every tile FULL
                    spec = presets.plain(d, mask_mod=lambda b, h, q, kv: kv <= q + 2**30, name="fullmask")
                else:
                    spec = presets.causal(d) if causal else presets.plain(d)
                    if var.startswith("sliding_window"):  # window W (1024 unless named); FLOPs: its band
                        spec = presets.sliding_window(int(var[len("sliding_window"):] or 1024), d)
                if dv != d:
                    spec = dataclasses.replace(spec, head_dim_v=dv)
                fn = ac.compile(spec)
                fn.backward_options = options
            outs = [fn(*s, deterministic=True) if det else fn(*s) for s in sets]
            it = [0]

            def bwd(outs=outs, define=define):
                i = it[0] % 2
                it[0] += 1
                with bwd_define(define):
                    return torch.autograd.grad(outs[i], sets[i], dout, retain_graph=True)

            ms = do_bench(bwd, warmup=10, rep=200, return_mode="median")
            del outs
            times.setdefault(item, []).append(flops / ms / 1e9)
            print(f"{item}: {flops / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)", flush=True)
        except Exception as e:  # noqa: BLE001 - one failing config must not end the sweep
            print(f"{item}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
        torch.cuda.empty_cache()
    print_round_medians(times, rounds, "backward TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
