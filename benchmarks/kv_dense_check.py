"""GPU check of Variant::kKvDense (ir/ranges.py kv_dense): for masks whose K/V range holds no EMPTY block, the
walks skip the EMPTY search, and must visit the same blocks in the same order as with it. Each case runs the
kernel and its copy compiled with ``#define AC_KV_ALWAYS_SEARCH`` (the search kept) on the same inputs: outputs
and LSE bit-identical, and the kernel within the error-ratio rule of the float64 reference.

    PYTHONPATH=. python3 benchmarks/kv_dense_check.py
"""
from __future__ import annotations

import sys

import torch
from v3_sweep import with_define


def main() -> int:
    import attncompiler as ac
    from attncompiler import presets
    from attncompiler.testing import check_kernel, check_kernel_grads

    bad = 0
    cases = [  # (spec, schedule, plan options, (B, H, Nq, Nk), H_kv)
        (presets.causal(128), "v3", {}, (2, 4, 1023, 1023), None),
        (presets.causal(128), "v3", {}, (1, 4, 300, 1000), 2),           # bottom-right, GQA
        (presets.sliding_window(100, 128), "v3", {}, (2, 4, 1023, 1023), None),
        (presets.sliding_window(1024, 128), "v3", {}, (1, 2, 4100, 4100), None),
        (presets.sliding_window(700, 64), "v3", dict(block_m=192, block_n=64), (1, 2, 2500, 2500), None),
        (presets.causal(256), "v3", {}, (1, 2, 1023, 1023), None),
        (presets.causal(64), "v3", dict(persistent=True), (2, 4, 1023, 1023), None),
        (presets.causal(128), "v3", dict(kv_descending=True), (1, 4, 1023, 1023), None),
        (presets.softcap(30.0, 128, causal=True), "v3", {}, (2, 2, 1023, 1023), None),
        (presets.sliding_window(100, 64), "v2", {}, (2, 4, 1023, 1023), None),
        (presets.causal(128), "v2", {}, (1, 4, 113, 700), None),
    ]
    for spec, sched, opts, (B, H, Nq, Nk), H_kv in cases:
        kern = ac.compile(spec, sched, **opts)
        assert "kKvDense = true" in kern.source, spec.name
        other = with_define(kern, "AC_KV_ALWAYS_SEARCH")
        g = torch.Generator(device="cuda").manual_seed(B * 1000 + Nq)
        hk = H_kv or H
        q = torch.randn(B, H, Nq, spec.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, hk, Nk, spec.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, hk, Nk, spec.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
        o1, l1 = kern(q, k, v, return_lse=True)
        o2, l2 = other(q, k, v, return_lse=True)
        same = torch.equal(o1, o2) and torch.equal(l1, l2)
        res = check_kernel(kern, B, H, Nq, Nk, H_kv=H_kv)
        ok = same and res.ok
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {spec.name} {sched} {opts} {(B, H, Nq, Nk, H_kv)}: bit-identical to the search: "
              f"{same}; {res}", flush=True)
    kern = ac.compile(presets.causal(64), "v2")  # the v2 deterministic backward's dQ kernel walks with kv_next_block
    kern.backward_options = {"schedule": "v2"}
    res = check_kernel_grads(kern, 2, 2, 1023, deterministic=True)
    bad += not res.ok
    print(f"{'ok  ' if res.ok else 'FAIL'} causal d64 v2 deterministic backward: {res}", flush=True)
    print(f"{bad} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
