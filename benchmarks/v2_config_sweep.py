"""Device script: correctness + speed of hand-picked v2 forward tile configs (no planner involved).

    PYTHONPATH=. python3 benchmarks/v2_config_sweep.py

Renders the v2 template with a fixed plain/causal prelude, compiles with NVRTC, checks against
float64 attention on a small shape and times B*N = 16k, H*d = 2048 beside SDPA flash and cuDNN.
"""
from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F

from attncompiler.codegen.render import render_source
from attncompiler.runtime.compiler import compile_kernel
from attncompiler.runtime.launch import AttnInputs, launch, pack_params
from attncompiler.runtime.params import PARAM_FIELDS, c_struct
from attncompiler.ir.types import AttentionIR


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


def build(D, BM, BN, W, QR, causal):
    smem = (BM * (D + 8) + BN * (D + 8) + BN * (D + 8)) * 2
    src = render_source("v2_fwd.cu.j2", name="sweep", prelude=prelude(causal), plan_text="sweep", head_dim=D,
                        head_dim_v=D, block_m=BM, block_n=BN, num_warps=W, q_in_regs=bool(QR), min_ctas=1,
                        smem_bytes=smem)
    t0 = time.time()
    k = compile_kernel(src, "sm_%d%d" % torch.cuda.get_device_capability(), torch.cuda.current_device())
    from cupy.cuda import driver
    driver.funcSetAttribute(k.ptr, 8, smem)
    return k, smem, time.time() - t0


def run(kern, smem, BM, W, q, k, v, causal):
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    ir = AttentionIR(head_dim=D, head_dim_v=D, dtype="bf16", scale=1 / math.sqrt(D), score_expr=None, mask_expr=None, dropout_p=0.0)
    dims = AttnInputs(B, H, H, N, N, D, D)
    P, Bf = pack_params(q, k, v, o, lse, None, dims, scale=1 / math.sqrt(D), dropout_p=0.0, seed=0, offset=0, ir=ir, buffers=[])
    grid = ((N + BM - 1) // BM, B * H, 1)
    return (lambda: launch(kern.ptr, grid, 32 * W, smem, P, Bf, q.device)), o, lse


def main() -> None:
    from triton.testing import do_bench
    torch.manual_seed(0)
    configs = [(128, 128, 64, 4, 0), (128, 128, 32, 4, 0), (128, 128, 64, 8, 1), (128, 128, 64, 8, 0), (128, 128, 128, 8, 1),
               (64, 128, 64, 4, 1), (64, 128, 128, 4, 0), (64, 128, 128, 8, 1), (64, 128, 64, 8, 1),
               (256, 128, 64, 8, 0), (256, 64, 64, 4, 0), (256, 128, 32, 8, 0)]
    rows = []
    for (D, BM, BN, W, QR) in configs:
        for causal in (False, True):
            kern, smem, ct = build(D, BM, BN, W, QR, causal)
            # correctness, odd seqlen
            for N in (113, 1023):
                q, k, v = (torch.randn(2, 3, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                fn, o, lse = run(kern, smem, BM, W, q, k, v, causal)
                o.fill_(float("nan")); fn(); torch.cuda.synchronize()
                ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
                eag = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal).bfloat16()
                err = (o.double() - ref).abs().max().item(); eerr = (eag.double() - ref).abs().max().item()
                s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
                if causal:
                    s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
                lerr = (lse.double() - torch.logsumexp(s, -1)).abs().max().item()
                ok = err <= 2 * eerr + 1e-3 and lerr < 1e-3
                print(f"check D={D} BM={BM} BN={BN} W={W} QR={QR} causal={causal} N={N}: err {err:.2e} eager {eerr:.2e} lse {lerr:.1e} {'OK' if ok else 'FAIL'}", flush=True)
            N = 16384 if D != 256 else 16384
            H = 2048 // D; B = 16384 // N
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fn, o, lse = run(kern, smem, BM, W, q, k, v, causal)
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            fl = 4 * B * H * N * N * D / (2 if causal else 1)
            rows.append((D, BM, BN, W, QR, causal, fl / ms / 1e9, ct))
            print(f"time D={D} BM={BM} BN={BN} W={W} QR={QR} causal={causal}: {fl / ms / 1e9:.0f} TFLOP/s compile {ct:.2f}s", flush=True)
    from torch.nn.attention import sdpa_kernel, SDPBackend
    for D in (64, 128, 256):
        H = 2048 // D; N = 16384; B = 1
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                with sdpa_kernel([be]):
                    ms = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=100, return_mode="median")
                fl = 4 * B * H * N * N * D / (2 if causal else 1)
                print(f"peer {name} D={D} causal={causal}: {fl / ms / 1e9:.0f} TFLOP/s", flush=True)
    print("\nD BM BN W QR causal TFLOP/s")
    for r in rows:
        print(*r[:6], f"{r[6]:.0f}")


if __name__ == "__main__":
    sys.exit(main())
