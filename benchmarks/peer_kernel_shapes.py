"""Launch shapes of the kernels a call runs (name, grid, block, registers per thread, shared memory), from the
torch profiler's trace: what SDPA cuDNN launches for full attention and for a short K/V loop, beside v3.

    PYTHONPATH=. python3 benchmarks/peer_kernel_shapes.py

Why: on the short loop (dense attention over Nk = 1152 keys, the window 1024's tile span) cuDNN's cost per pair is
1.08x its full attention's and ours 1.20x (clock_power.py --set cudnn, twenty-ninth session); its grid (persistent
or one CTA per tile), CTA size and shared memory say how it hides a tile's start and end.
"""
from __future__ import annotations

import json
import tempfile


def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    import attncompiler as ac
    from attncompiler.spec import presets

    print(torch.cuda.get_device_name(), flush=True)
    kern = ac.compile(presets.plain(128), "v3")
    for nk in (16384, 1152):
        q = torch.randn(1, 16, 16384, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, 16, nk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        calls = {
            "cuDNN": lambda: F.scaled_dot_product_attention(q, k, v),
            "v3": lambda: kern(q, k, v),
        }
        for who, fn in calls.items():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                fn()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                prof.export_chrome_trace(f.name)
                events = json.load(open(f.name))["traceEvents"]
            for e in events:
                if e.get("cat") != "kernel":
                    continue
                a = e.get("args", {})
                print(f"Nk={nk} {who}: {e['name'][:90]} grid {a.get('grid')} block {a.get('block')} "
                      f"regs {a.get('registers per thread')} smem {a.get('shared memory')} "
                      f"blocks/SM {a.get('blocks per SM')} occupancy {a.get('est. achieved occupancy %')} "
                      f"{e.get('dur')} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
