"""Sweep v3 plan options per variant at N = 16k, bf16, B = 1, H*d = 2048; prints TFLOP/s per config.

    PYTHONPATH=. python3 benchmarks/v3_sweep.py "128:plain,128:softcap:exp2_poly=4,64:causal:block_n=176:stages=2" [ROUNDS]

Each item is ``d:variant[:option=value...]``: the variant is one of bench_v3's (plain, causal, alibi,
alibi_causal, softcap, sliding_window
(window 1024) or sliding_windowW (window W), fullmask, or a preset name; ``cudnn`` / ``cudnn_causal``: torch SDPA's
cuDNN backend, the reference), the options are plan_v3's (block_n, stages,
persistent, exp2_poly, block_m, late_pv_wait, ...; omitted ones take the planner's choice; ``n=2048`` is not a plan
option but the sequence length, with B = 16384 // n so that B*N stays 16k tokens; ``dv=128`` sets V's head dim (default
d; FLOPs then 2 B H (d + dv) per visible pair); ``smem=BYTES`` launches with that much
dynamic shared memory (the plan's layout, the rest unused: the L1 carve-out's cost); ``deal=lpt`` / ``deal=in_order``
the tile list's dealing rule (plan option tile_list; attncompiler/runtime/tile_list.py); ``define=NAME``
(``define=A+B``: both) compiles the kernel with ``#define NAME 1`` in front, for A/B runs of source-level variants).  FLOPs count the visible pairs (causal:
N(N+1)/2; sliding window 1024: its band).  Triton's do_bench median over three rotated input sets.
With ROUNDS > 1 every config is timed once per round, in order, and the median over the rounds is
printed last (interleaving spreads clock and thermal drift over all configs: ratios between configs
of one run are then comparable to a few percent).
"""
from __future__ import annotations

import dataclasses
import sys

import torch
from _results import option_value, print_round_medians
from bench_v3 import _spec


def _visible_pairs(var: str, N: int) -> float:
    if var in ("causal", "alibi_causal"):
        return N * (N + 1) / 2
    if var.startswith("sliding_window"):  # q - W <= kv <= q (presets.sliding_window(W)), W = 1024 unless named
        w = int(var[len("sliding_window"):] or 1024)
        return sum(min(i + 1, w + 1) for i in range(N))
    return float(N) * N


def with_define(kern, name: str):
    """A copy of the CompiledAttention ``kern`` whose source starts with ``#define name 1`` (its own loaded
    functions: the compile cache's object, shared with other callers, stays as it was)."""
    import threading

    lines = "".join(f"#define {n} 1\n" for n in name.split("+"))  # define=A+B: both
    ks = dataclasses.replace(kern.kernel_source, source=lines + kern.kernel_source.source)
    return dataclasses.replace(kern, kernel_source=ks, _loaded={}, _lock=threading.Lock(), _op_id=0, _decode=None,
                               _v2=None, _decode_cp=None)


def with_smem(kern, smem_bytes: int):
    """A copy of ``kern`` launched with ``smem_bytes`` of dynamic shared memory (its own loaded functions; the kernel
    uses only its own layout): the cost of the shared-memory size alone (the L1 carve-out it leaves)."""
    import threading

    ks = dataclasses.replace(kern.kernel_source, smem_bytes=smem_bytes)
    return dataclasses.replace(kern, kernel_source=ks, _loaded={}, _lock=threading.Lock(), _op_id=0, _decode=None,
                               _v2=None, _decode_cp=None)


class bwd_define:
    """``with bwd_define("NAME"):`` -- backward kernels rendered inside the block start with ``#define NAME 1`` (their
    own compiled functions: runtime/backward.py caches loaded kernels by source text), for same-process A/B runs of
    source-level variants of the backward. ``None``: no change."""

    def __init__(self, name: str | None) -> None:
        self.name = name

    def __enter__(self) -> None:
        from attncompiler.runtime import backward

        self._orig = backward.bwd_source
        if self.name:
            orig, name = self._orig, self.name

            def patched(*a, **k):  # noqa: ANN002, ANN003 - bwd_source's arguments
                src = orig(*a, **k)
                return dataclasses.replace(src, source=f"#define {name} 1\n" + src.source)

            backward.bwd_source = patched

    def __exit__(self, *exc: object) -> None:
        from attncompiler.runtime import backward

        backward.bwd_source = self._orig


class _Cudnn:
    """torch SDPA's cuDNN attention, called as a kernel of ours is."""

    def __init__(self, causal: bool) -> None:
        self.causal = causal

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def main(argv: list[str]) -> int:
    from triton.testing import do_bench

    import attncompiler as ac

    tokens = 16384
    rounds = int(argv[1]) if len(argv) > 1 else 1
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    sets_by_d: dict[tuple[int, int], list] = {}
    times: dict[str, list[float]] = {}
    from attncompiler.runtime import tile_list

    default_deal = tile_list.DEAL
    for item in argv[0].split(",") * rounds:
        d_s, var, *opts = item.split(":")
        d = int(d_s)
        options = {k: option_value(v) for k, v in (o.split("=") for o in opts)}
        N = int(options.pop("n", tokens))
        define = options.pop("define", None)  # a source-level variant: "#define NAME 1" before the kernel
        smem = options.pop("smem", None)  # launch with this much dynamic shared memory (not less than the plan's)
        deal = options.pop("deal", None)  # tile_list's dealing rule (runtime/tile_list.py DEALS), set per call
        dv = int(options.pop("dv", d))
        B, H = tokens // N, 2048 // d
        if (d, dv, N) not in sets_by_d:
            sets_by_d[(d, dv, N)] = [tuple(torch.randn(B, H, N, x, device="cuda", dtype=torch.bfloat16)
                                           for x in (d, d, dv)) for _ in range(3)]
        sets = sets_by_d[(d, dv, N)]
        flops = 2 * B * H * (d + dv) * _visible_pairs(var.replace("cudnn_", ""), N)
        try:
            if var.startswith("cudnn"):
                kern = _Cudnn(var == "cudnn_causal")
            else:
                spec = _spec(var, d, H, N)
                kern = ac.compile(dataclasses.replace(spec, head_dim_v=dv) if dv != d else spec, "v3", **options)
            if define:
                kern = with_define(kern, define)
            if smem:
                kern = with_smem(kern, max(int(smem), kern.kernel_source.smem_bytes))
            it = [0]

            def step(kern=kern, deal=deal):
                q, k, v = sets[it[0] % 3]
                it[0] += 1
                tile_list.DEAL = deal or default_deal  # (every config sets it: a kernel compiled anew each round
                # records its launch, tile list included, at its first call, under the rule in force then)
                return kern(q, k, v)

            ms = do_bench(step, warmup=50, rep=300, return_mode="median")
            times.setdefault(item, []).append(flops / ms / 1e9)
            if isinstance(kern, _Cudnn):
                print(f"d={d} dv={dv} N={N} {var}: {flops / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)", flush=True)
                continue
            plan = kern.kernel_source.plan
            print(f"d={d} N={N} {var} {options} -> BM={plan.block_m} BN={plan.block_n} stages={plan.stages} poly={plan.exp2_poly}"
                  f"{' persistent' if plan.persistent else ''}: {flops / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)",
                  flush=True)
        except Exception as e:  # noqa: BLE001 - one failing config must not end the sweep
            print(f"d={d} {var} {options}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
    print_round_medians(times, rounds, "TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
