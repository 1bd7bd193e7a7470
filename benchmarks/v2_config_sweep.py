"""Device script: correctness + speed of hand-picked v2 forward tile configs (no planner involved).

    PYTHONPATH=. python3 benchmarks/v2_config_sweep.py [--configs "D,BM,BN,W,QR,STAGES;..."] [--rounds 2]
                                                       [--no-hooks] [--profile]

Renders the v2 template with a fixed plain/causal prelude, compiles with NVRTC (all kernels first,
in parallel worker processes, into the on-disk cubin cache), checks against float64 attention
(N = 113 and 1023, output and LSE poisoned first) and times B*N = 16k tokens, H*d = 2048, N = 16k
bf16.  Each config is timed in --rounds rounds alternating with SDPA's flash backend on the same
inputs (the GPU's clock drifts by a few percent over a run, so only adjacent timings are compared);
cuDNN is timed once per config for reference.  The hooks check compiles real specs (score_mod,
mask_mod, dropout) through the pipeline with the planner's tiles and STAGES = 1 and 2 and runs
attncompiler.testing.check_kernel on them (Nq == Nk and Nq != Nk, fully masked rows).  --profile
launches each config twice at the timed shape and nothing else (for ncu).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F

from attncompiler.codegen.render import render_source
from attncompiler.ir.types import AttentionIR
from attncompiler.runtime.compiler import allow_dynamic_smem, compile_kernel
from attncompiler.runtime.launch import AttnInputs, launch, pack_params
from attncompiler.runtime.params import PARAM_FIELDS, c_struct

# (D, BLOCK_M, BLOCK_N, num_warps, Q in regs, STAGES)
DEFAULT_CONFIGS = [  # best first per head dim (docs/perf-notes.md), then the runners-up
    (128, 128, 64, 4, 0, 2), (128, 128, 48, 4, 0, 2), (128, 128, 64, 4, 0, 1), (128, 128, 32, 4, 0, 2),
    (64, 128, 64, 4, 1, 2), (64, 128, 128, 4, 0, 2), (64, 128, 64, 4, 1, 1),
    (256, 128, 128, 8, 0, 1), (256, 128, 64, 8, 0, 2), (256, 128, 64, 8, 0, 1),
]


def smem_bytes(D: int, DV: int, BM: int, BN: int, stages: int) -> int:
    """The v2 kernel's shared memory (templates/v2_fwd.cu.j2)."""
    return (BM * (max(D, DV) + 8) + stages * BN * ((D + 8) + (DV + 8))) * 2


def prelude(causal: bool) -> str:
    return "\n".join([
        "typedef __nv_bfloat16 ac_elem_t;", c_struct("AttnParams", PARAM_FIELDS), c_struct("AttnBuffers", ()),
        "struct Variant {",
        "  static constexpr bool kHasScoreMod = false;",
        f"  static constexpr bool kHasMask = {'true' if causal else 'false'};",
        "  static constexpr bool kHasDropout = false;",
        "  static __device__ __forceinline__ float score_mod(float score, int b, int h, int q_idx, int kv_idx, const AttnParams& p, const AttnBuffers& buf) { return score; }",
        "  static __device__ __forceinline__ bool mask(int b, int h, int q_idx, int kv_idx, const AttnParams& p, const AttnBuffers& buf) { return q_idx + p.Nk - p.Nq >= kv_idx; }",
        "  static __device__ __forceinline__ int tile_class(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi, const AttnParams& p, const AttnBuffers& buf) {",
        "    int d = p.Nk - p.Nq; if (q_hi + d < kv_lo) return AC_TILE_EMPTY; if (q_lo + d >= kv_hi) return AC_TILE_FULL; return AC_TILE_PARTIAL; }",
        "};"])


def source(D, BM, BN, W, QR, S, causal) -> str:
    return render_source("v2_fwd.cu.j2", name="sweep", prelude=prelude(causal), plan_text="sweep", head_dim=D,
                         head_dim_v=D, block_m=BM, block_n=BN, num_warps=W, q_in_regs=bool(QR), min_ctas=1,
                         smem_bytes=smem_bytes(D, D, BM, BN, S), stages=S)


def _prewarm_one(args):
    """Worker: NVRTC-compile one source into the disk cache compile_kernel reads (no CUDA context)."""
    src, arch = args
    from attncompiler import env
    from attncompiler.runtime import compiler as C
    path = env.cache_dir() / "cubin" / f"{C._disk_key(src, arch)}.cubin"
    if path.exists():
        return 0.0
    t0 = time.time()
    cubin, _ = C._nvrtc_cubin(src, arch, "attn_fwd")
    C._atomic_write(path, cubin)
    return time.time() - t0


def prewarm(sources: list[str], arch: str) -> None:
    t0 = time.time()
    try:
        with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as ex:
            cts = list(ex.map(_prewarm_one, [(s, arch) for s in sources]))
        print(f"prewarm: {len(sources)} kernels, NVRTC {sum(cts):.0f} s of CPU in {time.time() - t0:.0f} s wall, "
              f"max {max(cts):.1f} s", flush=True)
    except Exception as e:  # the cache is an optimization; compile_kernel compiles on a miss
        print(f"prewarm failed ({type(e).__name__}: {e}); compiling serially", flush=True)


def build(src: str, smem: int):
    t0 = time.time()
    k = compile_kernel(src, "sm_%d%d" % torch.cuda.get_device_capability(), torch.cuda.current_device())
    allow_dynamic_smem(k.ptr, smem, torch.cuda.current_device())
    return k, time.time() - t0


def func_regs(kern) -> str:
    """Registers per thread and local memory (spill) bytes per thread of the loaded kernel."""
    try:
        from cupy.cuda import driver
        return f"{driver.funcGetAttribute(4, kern.ptr)}r/{driver.funcGetAttribute(3, kern.ptr)}B-local"
    except Exception as e:  # informational only
        return f"? ({type(e).__name__})"


def run(kern, smem, BM, W, q, k, v):
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    ir = AttentionIR(head_dim=D, head_dim_v=D, dtype="bf16", scale=1 / math.sqrt(D), score_expr=None, mask_expr=None, dropout_p=0.0)
    dims = AttnInputs(B, H, H, N, N, D, D)
    P, Bf = pack_params(q, k, v, o, lse, None, dims, scale=1 / math.sqrt(D), dropout_p=0.0, seed=0, offset=0, ir=ir, buffers=[])
    grid = ((N + BM - 1) // BM, B * H, 1)
    return (lambda: launch(kern.ptr, grid, 32 * W, smem, P, Bf, q.device)), o, lse


def tflops(fn, B, H, N, D, causal, rep=200):
    from triton.testing import do_bench
    ms = do_bench(fn, warmup=25, rep=rep, return_mode="median")
    return 4 * B * H * N * N * D / (2 if causal else 1) / ms / 1e9


MMA_PEAK_SRC = r"""
extern "C" __global__ void mma_peak(float* out, int iters) {
  unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u, b0 = a0 ^ 0x3f803f80u, b1 = b0 + 1u;
  float d[8][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(d[k][0]), "+f"(d[k][1]), "+f"(d[k][2]), "+f"(d[k][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) s += d[k][0] + d[k][1] + d[k][2] + d[k][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def mma_peak() -> float:
    """mma.sync m16n8k16 bf16 issue ceiling of this GPU: 8 independent accumulators per warp,
    8 warps per block, 4 blocks per SM, registers only."""
    import cupy as cp
    from triton.testing import do_bench
    k = cp.RawKernel(MMA_PEAK_SRC, "mma_peak", options=("-arch=sm_%d%d" % torch.cuda.get_device_capability(),))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid, block, iters = sms * 4, 256, 4096
    out = cp.zeros(grid * block, dtype=cp.float32)
    fn = lambda: k((grid,), (block,), (out, cp.int32(iters)))  # noqa: E731
    fn(); cp.cuda.Device().synchronize()
    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
    return grid * (block // 32) * iters * 8 * 2 * 16 * 8 * 16 / ms / 1e9


HOOK_SPECS = ("softcap", "dropout", "alibi", "sliding_window", "document")


def hook_kernels(stages_list, target=None):
    """(label, CompiledAttention) for real specs through the pipeline, re-rendered with each STAGES."""
    import attncompiler as ac
    from attncompiler.codegen.hooks import render_prelude
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    out = []
    for name in HOOK_SPECS:
        mod = __import__(name)
        spec = mod.make_spec(head_dim=128) if name == "dropout" else mod.make_spec()
        base = ac.compile(spec, "v2", target=target, build=False)
        pl, ir, ks = base.plan, base.ir, base.kernel_source
        for S in stages_list:
            bn = pl.block_n
            smem = smem_bytes(ir.head_dim, ir.head_dim_v, pl.block_m, bn, S)
            src = render_source("v2_fwd.cu.j2", name=ir.name, prelude=render_prelude(ir), plan_text=pl.describe(),
                                head_dim=ir.head_dim, head_dim_v=ir.head_dim_v, block_m=pl.block_m,
                                block_n=bn, num_warps=pl.num_warps, q_in_regs=bool(pl.q_in_regs),
                                min_ctas=1, smem_bytes=smem, stages=S)
            kern = dataclasses.replace(base, kernel_source=dataclasses.replace(ks, source=src, smem_bytes=smem),
                                       _loaded={}, _lock=threading.Lock())
            out.append((f"{name} D={ir.head_dim} BM={pl.block_m} BN={bn} W={pl.num_warps} "
                         f"QR={int(bool(pl.q_in_regs))} S={S}", kern))
    return out


def flash_fn(q, k, v, causal, backend):
    from torch.nn.attention import sdpa_kernel, SDPBackend
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def fn():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


def check(kern, smem, c, causal) -> bool:
    D, BM, BN, W, QR, S = c
    ok = True
    for N in (113, 1023):
        q, k, v = (torch.randn(2, 3, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fn, o, lse = run(kern, smem, BM, W, q, k, v)
        o.fill_(float("nan")); lse.fill_(float("nan")); fn(); torch.cuda.synchronize()
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        eag = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal).bfloat16()
        err = (o.double() - ref).abs().max().item(); eerr = (eag.double() - ref).abs().max().item()
        s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
        if causal:
            s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        lerr = (lse.double() - torch.logsumexp(s, -1)).abs().max().item()
        good = err <= 2 * eerr + 1e-3 and lerr < 1e-3 and not math.isnan(err) and not math.isnan(lerr)
        ok &= good
        print(f"check D={D} BM={BM} BN={BN} W={W} QR={QR} S={S} causal={causal} N={N}: err {err:.2e} "
              f"eager {eerr:.2e} lse {lerr:.1e} {'OK' if good else 'FAIL'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="", help='"D,BM,BN,W,QR,STAGES;..." (default: the built-in list)')
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds, each ours then flash")
    ap.add_argument("--no-hooks", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="for ncu: no checks or timing, each config (non-causal, then causal) launched twice")
    args = ap.parse_args()
    configs = ([tuple(int(x) for x in c.split(",")) for c in args.configs.split(";") if c.strip()]
               if args.configs else DEFAULT_CONFIGS)
    torch.manual_seed(0)
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    print(torch.cuda.get_device_name(), arch, time.strftime("%Y-%m-%d %H:%M"), flush=True)

    srcs = {(c, causal): source(*c, causal) for c in configs for causal in (False, True)}
    if args.profile:
        prewarm(list(srcs.values()), arch)
        for (c, causal), src in srcs.items():
            D, BM, BN, W, QR, S = c
            smem = smem_bytes(D, D, BM, BN, S)
            kern, _ = build(src, smem)
            q, k, v = (torch.randn(1, 2048 // D, 16384, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fn, o, lse = run(kern, smem, BM, W, q, k, v)
            fn(); fn(); torch.cuda.synchronize()
            print(f"profiled D={D} BM={BM} BN={BN} W={W} QR={QR} S={S} causal={causal} {func_regs(kern)}", flush=True)
        return 0
    hooks = []
    if not args.no_hooks:
        try:
            hooks = hook_kernels([1, 2])
        except Exception as e:
            print(f"hooks: could not build the specs ({type(e).__name__}: {e})", flush=True)
    prewarm(list(srcs.values()) + [k.source for _, k in hooks], arch)

    ok_all = True
    for label, kern in hooks:
        from attncompiler.testing import check_kernel
        for (Nq, Nk) in ((113, 113), (1023, 1023), (200, 1023), (1023, 200)):
            r = check_kernel(kern, 2, 3, Nq, Nk)
            ok_all &= r.ok
            print(f"hooks {label}: {r} {'OK' if r.ok else 'FAIL'}", flush=True)

    try:
        print(f"mma.sync m16n8k16 bf16 ceiling: {mma_peak():.0f} TFLOP/s", flush=True)
    except Exception as e:
        print(f"mma peak: failed ({type(e).__name__}: {e})", flush=True)
    rows = []
    for c in configs:
        D, BM, BN, W, QR, S = c
        for causal in (False, True):
            smem = smem_bytes(D, D, BM, BN, S)
            kern, ct = build(srcs[(c, causal)], smem)
            ok = check(kern, smem, c, causal)
            ok_all &= ok
            N = 16384; H = 2048 // D; B = 16384 // N
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fn, o, lse = run(kern, smem, BM, W, q, k, v)
            ours, flash = [], []
            for _ in range(args.rounds):
                ours.append(tflops(fn, B, H, N, D, causal))
                flash.append(tflops(flash_fn(q, k, v, causal, "flash"), B, H, N, D, causal))
            cudnn = tflops(flash_fn(q, k, v, causal, "cudnn"), B, H, N, D, causal)
            o_med, f_med = sorted(ours)[len(ours) // 2], sorted(flash)[len(flash) // 2]
            rows.append((D, BM, BN, W, QR, S, causal, o_med, f_med, cudnn, ok, smem, func_regs(kern)))
            print(f"time D={D} BM={BM} BN={BN} W={W} QR={QR} S={S} causal={causal}: ours "
                  f"{' '.join(f'{x:.0f}' for x in ours)} flash {' '.join(f'{x:.0f}' for x in flash)} cudnn "
                  f"{cudnn:.0f} TFLOP/s", flush=True)

    print("\nD BM BN W QR S causal | ours flash cudnn TFLOP/s (median of rounds) | ours/flash | ok smem regs")
    for r in rows:
        print(*r[:7], "|", f"{r[7]:.0f} {r[8]:.0f} {r[9]:.0f}", "|", f"{r[7] / r[8]:.3f}", "|",
              "OK" if r[10] else "FAIL", r[11], r[12])
    print("ALL OK" if ok_all else "SOME CHECKS FAILED")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
