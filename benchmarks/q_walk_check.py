"""GPU check of the backward's query-block walk (ranges.cuh q_walk_skip): positions outside Variant::q_range of a
K/V block are jumped over instead of classified one at a time, and the walk must visit the same tiles in the same
order. Each case runs the backward twice on the same inputs, once rendered with ``#define AC_Q_WALK_SCAN`` (every
position classified): with ``deterministic=True`` dQ, dK and dV are bit-identical; without it dK and dV are (dQ's
atomic adds may round in another order), and the kernel passes the error-ratio rule against float64 autograd.

    cd benchmarks && PYTHONPATH=.. python3 q_walk_check.py
"""
from __future__ import annotations

import sys

import torch
from v3_sweep import bwd_define


def main() -> int:
    import attncompiler as ac
    from attncompiler import presets
    from attncompiler.testing import check_kernel_grads

    def doc(b, h, q_idx, kv_idx):  # noqa: ANN001 - mask_mod signature; documents of 300 tokens, causal inside
        return (q_idx // 300 == kv_idx // 300) & (kv_idx <= q_idx)

    bad = 0
    cases = [  # (spec, backward options, (B, H, Nq, Nk), H_kv, deterministic)
        (presets.causal(128), {"schedule": "v3"}, (2, 4, 1023, 1023), None, False),
        (presets.causal(128), {"schedule": "v3"}, (1, 4, 700, 1000), 2, False),       # bottom-right, GQA
        (presets.causal(64), {"schedule": "v3"}, (2, 2, 1023, 1023), None, True),
        (presets.causal(256), {"schedule": "v3"}, (1, 2, 1023, 1023), None, False),
        (presets.sliding_window(100, 128), {"schedule": "v3"}, (2, 2, 1500, 1500), None, False),
        (presets.sliding_window(100, 128), {"schedule": "v3"}, (1, 2, 1500, 1500), None, True),
        (presets.prefix_lm(200, 128), {"schedule": "v3"}, (1, 2, 1023, 1023), None, False),
        (presets.plain(128, mask_mod=doc, name="doc300"), {"schedule": "v3"}, (1, 2, 1500, 1500), None, False),
        (presets.causal(64), {"schedule": "v2"}, (2, 2, 1023, 1023), None, False),
        (presets.sliding_window(100, 64), {"schedule": "v2"}, (1, 2, 1500, 1500), None, True),
    ]
    for spec, opts, (B, H, Nq, Nk), H_kv, det in cases:
        kern = ac.compile(spec)
        kern.backward_options = opts
        g = torch.Generator(device="cuda").manual_seed(B * 1000 + Nq)
        hk = H_kv or H
        x = [torch.randn(B, hh, n, spec.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
             for hh, n in ((H, Nq), (hk, Nk), (hk, Nk))]
        dout = torch.randn(B, H, Nq, spec.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
        grads = []
        for define in (None, "AC_Q_WALK_SCAN"):
            leaves = [t.clone().requires_grad_() for t in x]
            with bwd_define(define):
                out = kern(*leaves, deterministic=True) if det else kern(*leaves)
                grads.append(torch.autograd.grad(out, leaves, dout))
        same = all(torch.equal(a, b) for a, b in zip(grads[0][int(not det):], grads[1][int(not det):]))
        res = check_kernel_grads(kern, B, H, Nq, Nk, H_kv=H_kv, deterministic=det)
        ok = same and res.ok
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {spec.name} {opts} det={det} {(B, H, Nq, Nk, H_kv)}: "
              f"{'dQ, ' if det else ''}dK, dV bit-identical to the scan: {same}; {res}", flush=True)
    print(f"{bad} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
