"""Backward and forward+backward TFLOP/s of attncompiler's v2 and (sm_90) v3 backward beside torch SDPA
(flash = FlashAttention-2, cuDNN).

    PYTHONPATH=. python3 benchmarks/bench_backward.py [--quick] [--configs] [--check] [--head-dims 64,128] [--causal 0,1]

Grid: B*N = 16k tokens, H*d = 2048, N in {1k, 4k, 16k}, d in {64, 128}, causal and not, bf16, one
process.  FLOPs: forward 4*B*H*N^2*d, backward 2.5x that (5 matmuls instead of 2), halved when
causal.  "bwd" times ``torch.autograd.grad`` of a retained graph (backward only); "fwd+bwd" a
full step.  Timing: triton's do_bench median (CUDA events) with inputs rotated over several sets.
``--configs`` also times the deterministic mode and other dK/dV configurations (CONFIGS) at N = 16k;
``--check`` first checks their gradients on small problems.
Writes JSON lines to $OUT/bench_backward.jsonl (or /tmp) and prints a table with ratios.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _results import Results, device_banner


# --configs: backward plan options timed beside the default at N = 16k (infeasible ones are reported).
CONFIGS = (("v2_1d_as_before", {"layout": "1d", "dq_red_vec": 4, "dq_defer": False}), ("v2_1d", {"layout": "1d"}),
           ("v2_stage0", {"dq_stage": 0}), ("v2_stage2", {"dq_stage": 2}), ("v2_noreghalf", {"reg_half": False}))


def _check_specs(args) -> list:
    import attncompiler as ac
    from attncompiler.spec import presets

    out = []
    for d in (int(x) for x in args.head_dims.split(",")):
        out += [presets.causal(d), presets.plain(d), ac.AttentionSpec(head_dim=d, dropout_p=0.2, causal=True),
                presets.get_preset("document", head_dim=d, num_heads=3, seqlen=1023)]
    return out


def _check_configs(args) -> bool:
    """--check: gradients of every config (and the default) against float64 autograd on small
    problems (ragged lengths, causal, dropout, a document mask) before anything is timed."""
    import attncompiler as ac
    from attncompiler.testing import check_kernel_grads

    ok = True
    for d in (int(x) for x in args.head_dims.split(",")):
        specs = [s for s in _check_specs(args) if s.head_dim == d]
        for name, opts in (("v2", {}),) + CONFIGS:
            for spec in specs:
                kern = ac.compile(spec, "v2")
                kern.backward_options = {"schedule": "v2", **opts}
                try:
                    kern.backward_source()
                except Exception as e:  # infeasible on this head dim
                    print(f"check {name} d={d}: infeasible ({str(e)[:80]})", flush=True)
                    break
                for n in (113, 1023):
                    r = check_kernel_grads(kern, 2, 3, n)
                    ok = ok and r.ok
                    print(f"check {name} d={d} {spec.name} N={n}: {'ok' if r.ok else 'FAIL ' + str(r)}", flush=True)
    return ok


def _precompile(args, seqlens) -> None:
    """Every kernel the run needs, compiled in parallel processes into the disk cache."""
    from attncompiler.codegen.schedule import get_schedule
    from attncompiler.ir.build import build_ir
    from attncompiler.plan.targets import detect_target
    from attncompiler.runtime.backward import bwd_source
    from attncompiler.runtime.compiler import precompile_to_disk
    from attncompiler.spec import presets

    tgt = detect_target()
    jobs = []
    if args.check:
        for spec in _check_specs(args):
            ir = build_ir(spec)
            sched = get_schedule("v2")
            jobs.append((sched.render(ir, sched.make_plan(ir, tgt), tgt).source, tgt.nvrtc_arch))
            for _, opts in (("v2", {}),) + CONFIGS:
                try:
                    jobs.append((bwd_source(ir, tgt, options={"schedule": "v2", **opts}).source, tgt.nvrtc_arch))
                except Exception:
                    pass
    for d in (int(x) for x in args.head_dims.split(",")):
        for causal in (c == "1" for c in args.causal.split(",")):
            ir = build_ir(presets.causal(d) if causal else presets.plain(d))
            sched = get_schedule("v2")
            jobs.append((sched.render(ir, sched.make_plan(ir, tgt), tgt).source, tgt.nvrtc_arch))
            variants = [({"schedule": "v2"}, False), ({}, False)]
            if args.configs:
                variants += [({}, True)] + [({"schedule": "v2", **o}, False) for _, o in CONFIGS]
            for opts, det in variants:
                try:
                    jobs.append((bwd_source(ir, tgt, deterministic=det, options=opts).source, tgt.nvrtc_arch))
                except Exception:
                    pass
    precompile_to_disk(jobs)


def main(argv: list[str] | None = None) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="N = 16k only")
    ap.add_argument("--configs", action="store_true", help="also deterministic mode and other tile configs")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--check", action="store_true", help="check every config's gradients first (small problems)")
    args = ap.parse_args(argv)
    log = Results("bench_backward")
    dev = device_banner()
    rows, rec = log.rows, log.add

    seqlens = (16384,) if args.quick else (1024, 4096, 16384)
    _precompile(args, seqlens)
    if args.check and not _check_configs(args):
        print("# gradient check FAILED for some config (see above)", flush=True)
    for d in (int(x) for x in args.head_dims.split(",")):
        H = 2048 // d
        for N in seqlens:
            B = max(1, 16384 // N)
            nsets = 2
            sets = [tuple(torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
                          for _ in range(3)) for _ in range(nsets)]
            dout = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16)
            for causal in (c == "1" for c in args.causal.split(",")):
                fwd_flops = 4 * B * H * N * N * d / (2 if causal else 1)
                spec = presets.causal(d) if causal else presets.plain(d)
                fns = {"v2": ac.compile(spec, "v2")}
                fns["v2"].backward_options = {"schedule": "v2"}
                if torch.cuda.get_device_capability() == (9, 0):
                    fns["v3"] = ac.compile(spec)  # the forward and the backward "auto" picks: v3 on sm_90
                    fns["v3"].backward_options = {"schedule": "v3"}
                if args.configs and N == 16384:
                    fns["v2_det"] = lambda q, k, v, kern=fns["v2"]: kern(q, k, v, deterministic=True)
                    for name, opts in CONFIGS:
                        kern = ac.compile(spec, "v2")
                        kern.backward_options = {"schedule": "v2", **opts}
                        try:
                            kern.backward_source()
                        except Exception as e:  # infeasible on this head dim
                            rec(what=name, d=d, N=N, causal=causal, error=str(e)[:160])
                            continue
                        fns[name] = kern
                for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                    def peer(q, k, v, be=be):
                        with sdpa_kernel([be]):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    fns[name] = peer
                res = {}
                for name, fn in fns.items():
                    try:
                        outs = [fn(*s) for s in sets]  # graphs retained for backward-only timing
                        it = [0]

                        def bwd(outs=outs):
                            i = it[0] % nsets
                            it[0] += 1
                            return torch.autograd.grad(outs[i], sets[i], dout, retain_graph=True)

                        def step(fn=fn):
                            i = it[0] % nsets
                            it[0] += 1
                            return torch.autograd.grad(fn(*sets[i]), sets[i], dout)
                        ms_b = do_bench(bwd, warmup=10, rep=100, return_mode="median")
                        ms_s = do_bench(step, warmup=5, rep=100, return_mode="median")
                        del outs
                        res[name] = 2.5 * fwd_flops / ms_b / 1e9
                        res[name + "_step"] = 3.5 * fwd_flops / ms_s / 1e9
                        rec(what=name, d=d, N=N, B=B, H=H, causal=causal, bwd_ms=round(ms_b, 4),
                            bwd_tflops=round(res[name], 1), step_ms=round(ms_s, 4),
                            step_tflops=round(res[name + "_step"], 1))
                    except Exception as e:  # a failing peer is reported, not fatal
                        rec(what=name, d=d, N=N, causal=causal, error=str(e)[:300])
                    torch.cuda.empty_cache()
                rows.append(dict(summary=True, d=d, N=N, causal=causal, **res))
    print(f"\n# backward TFLOP/s (fwd+bwd step in brackets), bf16, {dev}; ratio = ours / peer (backward)")
    print(f"{'d':>4} {'N':>6} {'causal':>6} {'v2':>12} {'v3':>12} {'flash':>12} {'cudnn':>12} {'v2/cudnn':>8} "
          f"{'v3/flash':>8} {'v3/cudnn':>8}")
    for r in rows:
        if not r.get("summary"):
            continue
        g = lambda k: r.get(k, float("nan"))  # noqa: E731
        cell = lambda k: f"{g(k):5.0f} ({g(k + '_step'):4.0f})"  # noqa: E731
        print(f"{r['d']:>4} {r['N']:>6} {str(r['causal']):>6} {cell('v2'):>12} {cell('v3'):>12} {cell('sdpa_flash'):>12} "
              f"{cell('sdpa_cudnn'):>12} {g('v2') / g('sdpa_cudnn'):>8.2f} {g('v3') / g('sdpa_flash'):>8.2f} "
              f"{g('v3') / g('sdpa_cudnn'):>8.2f}")
        extra = [f"{k}={g(k):.0f}" for k in r if k.startswith("v2_") and not k.endswith("_step")]
        if extra:
            print(f"{'':>19} configs: " + ", ".join(extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
