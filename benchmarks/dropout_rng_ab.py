"""Dropout forward time with the seed passed by value (the kernels eager calls run) against the kernels that read
the device pair a CUDA graph replays (AttnParams.rng_state, attncompiler/runtime/rng.py), same seed, same output.
bf16, B*N = 16k, H*d = 2048.

    PYTHONPATH=. python3 benchmarks/dropout_rng_ab.py [--sass]

``--sass``: count some opcodes in both kernels' machine code at v3 d128 causal (nvcc -cubin, cuobjdump -sass).
"""
from __future__ import annotations

import sys

import torch


def _sass_counts(source: str) -> str:
    import collections
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        src, cub = Path(d) / "k.cu", Path(d) / "k.cubin"
        src.write_text(source)
        subprocess.run(["nvcc", "-cubin", "-std=c++17", "-DNDEBUG", "-gencode=arch=compute_90a,code=sm_90a", "-o",
                        str(cub), str(src)], check=True, capture_output=True)
        sass = subprocess.run(["cuobjdump", "-sass", str(cub)], check=True, capture_output=True, text=True).stdout
    line = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")  # offset, predicate, opcode
    ops = collections.Counter(m.group(1).split(".")[0] for m in line.finditer(sass))
    keys = ("IADD3", "UIADD3", "LOP3", "ULOP3", "IMAD", "REDUX", "LDG", "R2UR", "BRA")
    return f"{sum(ops.values())} instrs; " + ", ".join(f"{k} {ops.get(k, 0)}" for k in keys)


def main(argv: list[str] | None = None) -> int:
    import triton.testing

    import attncompiler as ac
    from attncompiler.runtime.rng import device_rng, device_rng_variant

    args = argv if argv is not None else sys.argv[1:]
    n = 16384
    for sched, d, causal in (("v3", 128, True), ("v3", 128, False), ("v3", 64, True), ("v2", 128, True)):
        kern = ac.compile(ac.AttentionSpec(head_dim=d, causal=causal, dropout_p=0.1, name="dropout"), sched)
        h = 2048 // d
        q, k, v = (torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        state = device_rng(5, 0, q.device)

        def host():
            return kern(q, k, v, seed=5)

        def dev():
            return kern._launch_forward(q, k, v, return_lse=False, scale=None, dropout_p=None, seed=None, offset=0,
                                        buffers=kern._buffers, out=None, rng_state=state)
        assert torch.equal(host(), dev()), f"{sched} d{d} causal={causal}: device pair differs from host seed"
        flops = 4 * h * n * n * d * (0.5 if causal else 1.0)
        if "--sass" in args and (sched, d, causal) == ("v3", 128, True):
            for what, ks in (("by value", kern.kernel_source), ("device pair", device_rng_variant(kern.kernel_source))):
                print(f"{sched} d{d} causal={int(causal)} SASS, {what}: {_sass_counts(ks.source)}", flush=True)
        t_host = triton.testing.do_bench(host, warmup=50, rep=300)
        t_dev = triton.testing.do_bench(dev, warmup=50, rep=300)
        print(f"{sched} d{d} causal={int(causal)}: host seed {t_host:.3f} ms ({flops / t_host * 1e-9:.0f} TFLOP/s), "
              f"device pair {t_dev:.3f} ms ({flops / t_dev * 1e-9:.0f}), ratio {t_dev / t_host:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
