"""MUFU (XU pipe) throughput on this GPU: tanh and ex2 in f32, f16 and the packed f16x2 / bf16x2 forms.

    python3 benchmarks/mufu_rates.py

Why: a softcap softmax needs two MUFU ops per score (tanh, exp2) where plain needs one, so packing two
scores per op would halve that cost -- if the hardware had packed MUFU ops.  On sm_90 ptxas splits every
``.f16x2`` / ``.bf16x2`` tanh and ex2 into two scalar ``MUFU.*.F16`` / ``.BF16`` ops, and this
measures that the 16-bit scalar ops issue no faster than the f32 ones (H100, 2026-11-21: 16 ops per SM
per clock for f32 and f16 alike, 8 packed pairs per clock).  Each thread runs 8 independent chains.
"""
from __future__ import annotations

_SRC = r'''
extern "C" __global__ void k_%(name)s(unsigned* out, int iters) {
  unsigned v[8];
  for (int i = 0; i < 8; ++i) v[i] = 0x3c003c00u ^ (threadIdx.x * 7 + i);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) { %(body)s }
  }
  unsigned r = 0;
  for (int i = 0; i < 8; ++i) r ^= v[i];
  if (r == 0x12345678u) out[0] = r;  // keeps the chains live
}
'''

#: one PTX instruction per chain step; x2 forms compute two values
_BODIES = {
    "tanh.approx.f32": 'float x = __uint_as_float(v[i]); asm volatile("tanh.approx.f32 %0, %0;" : "+f"(x)); '
                       'v[i] = __float_as_uint(x);',
    "tanh.approx.f16": 'unsigned short x = (unsigned short)v[i]; asm volatile("tanh.approx.f16 %0, %0;" : "+h"(x)); '
                       'v[i] = x;',
    "tanh.approx.f16x2": 'asm volatile("tanh.approx.f16x2 %0, %0;" : "+r"(v[i]));',
    "tanh.approx.bf16x2": 'asm volatile("tanh.approx.bf16x2 %0, %0;" : "+r"(v[i]));',
    "ex2.approx.ftz.f32": 'float x = __uint_as_float(v[i]); asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x)); '
                          'v[i] = __float_as_uint(x);',
    "ex2.approx.f16x2": 'asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(v[i]));',
    "ex2.approx.ftz.bf16x2": 'asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(v[i]));',
}


def main(iters: int = 4096) -> None:
    import cupy as cp
    import numpy as np
    import torch

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"-arch=sm_{major}{minor}"
    out = cp.zeros(1, dtype=cp.uint32)
    grid, block = sms * 8, 256
    print(f"# {props.name}: PTX instructions per second per SM (8 chains per thread, {grid} x {block} threads)")
    base = None
    for i, (name, body) in enumerate(_BODIES.items()):
        fn = cp.RawModule(code=_SRC % {"name": i, "body": body}, options=(arch,)).get_function(f"k_{i}")
        fn((grid,), (block,), (out, np.int32(iters)))  # warm-up (and clocks up)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn((grid,), (block,), (out, np.int32(iters)))
        stop.record()
        stop.synchronize()
        ms = cp.cuda.get_elapsed_time(start, stop)
        rate = grid * block * iters * 8 / (ms * 1e-3) / sms
        base = base or rate
        print(f"{name:24s} {ms:8.3f} ms  {rate / 1e9:7.2f} G instr/s/SM  ({rate / base:.2f}x tanh.approx.f32)")


if __name__ == "__main__":
    main()
