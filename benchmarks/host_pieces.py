"""Host cost of each piece of the launch path (microseconds per call, wall clock over many calls, synchronized at
both ends), at a small causal d = 128 shape whose kernels are short: what a forward+backward step spends where.

    PYTHONPATH=. python3 benchmarks/host_pieces.py [--n 1000]

Also splits a step's wall time between the forward, the backward call, our backward function and run_backward
(wrappers timing them inside the step).
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
from host_step import time_steps as per_call  # (benchmarks/ on sys.path when run as a script)


def main() -> None:
    import attncompiler as ac
    from attncompiler import autograd as A
    from attncompiler.codegen.schedule import get_schedule
    from attncompiler.runtime import backward as RB
    from attncompiler.runtime import launch as L
    from attncompiler.runtime.tma import attn_maps
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    n = ap.parse_args().n
    kern = ac.compile(presets.causal(128))
    ir, dev = kern.ir, torch.device("cuda")
    q, k, v = (torch.randn(1, 16, 256, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 16, 256, 128, device=dev, dtype=torch.bfloat16)
    dims = L.check_inputs(q, k, v, ir)
    o, lse = kern(q.detach(), k.detach(), v.detach(), return_lse=True)
    P, Bf = L.pack_params(q, k, v, o, lse, None, dims, scale=ir.scale, dropout_p=0.0, seed=0, offset=0, ir=ir,
                          buffers=[])
    sched = get_schedule(kern.schedule)
    rows: list[tuple[str, float]] = []

    def add(name: str, fn: Callable[[], object]) -> None:
        rows.append((name, per_call(fn, n)))

    class Noop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.randn(4, device=dev, requires_grad=True)
    add("control: no-op autograd.Function fwd+bwd", lambda: Noop.apply(x).backward(torch.ones_like(x)))
    add("control: torch.empty (B,H,N,d) bf16", lambda: torch.empty(1, 16, 256, 128, device=dev, dtype=torch.bfloat16))
    add("check_inputs", lambda: L.check_inputs(q, k, v, ir))
    add("_tma_fallback + _decode_kernel", lambda: (kern._decode_kernel(dims, k, v), kern._tma_fallback(q, k, v)))
    add("pack_params", lambda: L.pack_params(q, k, v, o, lse, None, dims, scale=ir.scale, dropout_p=0.0, seed=0,
                                             offset=0, ir=ir, buffers=[]))
    add("attn_maps (TMA maps, cached)", lambda: attn_maps(P, dims, "bf16", kern.plan.block_m, kern.plan.block_n))
    add("launch_forward (maps + launch)", lambda: sched.launch_forward(kern.kernel_source, dims, P, Bf, dev))
    add("make_rng", lambda: A.make_rng(0, 0))
    def device_ctx() -> None:
        with torch.cuda.device(dev):
            pass

    add("torch.cuda.device(dev) context", device_ctx)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    add("forward, no grad", lambda: kern(qd, kd, vd))
    add("forward with grad (output dropped)", lambda: kern(q, k, v))
    add("run_backward", lambda: RB.run_backward(ir, kern.target, do, qd, kd, vd, o, lse, None, {}, scale=ir.scale,
                                                 dropout_p=0.0, seed=0, offset=0))

    def step() -> None:
        q.grad = k.grad = v.grad = None
        kern(q, k, v).backward(do)

    add("step: forward + backward (grads None)", step)
    import gc

    gc.collect()
    gc.disable()
    add("step, gc disabled", step)
    gc.enable()
    add("step, gc enabled again", step)
    with torch.autograd.set_multithreading_enabled(False):
        add("step, autograd multithreading off", step)
    add("step, autograd multithreading on again", step)
    # time spent inside our backward (the Python function the engine calls) and inside run_backward, per step
    spent = {"_backward": 0.0, "run_backward": 0.0, "forward": 0.0, "engine": 0.0}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper

    A._backward = timed("_backward", A._backward)
    RB.run_backward = timed("run_backward", RB.run_backward)  # _attention_bwd_impl imports it per call
    m = 200
    for _ in range(m):
        q.grad = k.grad = v.grad = None
        t0 = time.perf_counter()
        out = kern(q, k, v)
        t1 = time.perf_counter()
        out.backward(do)
        t2 = time.perf_counter()
        spent["forward"] += t1 - t0
        spent["engine"] += t2 - t1
    torch.cuda.synchronize()
    print("per step, us: " + ", ".join(f"{k_} {v_ / m * 1e6:.0f}" for k_, v_ in spent.items())
          + " (engine = the whole .backward() call)")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}; causal d=128 (1, 16, 256, 128) bf16, "
          f"{kern.schedule}; us per call")
    for name, us in rows:
        print(f"  {name:44s} {us:8.1f}")


if __name__ == "__main__":
    main()
