"""Decode (Nq = 1) against a long K/V: attncompiler's split-KV schedule beside torch SDPA and FlexAttention.

    PYTHONPATH=. python3 benchmarks/bench_decode.py [--quick] [--no-flex]

Grid: KV length in {32k, 64k, 128k}, bf16, d = 128, (B, H, H_kv) in {(1, 32, 8), (4, 32, 8), (8, 32, 32)},
plain attention (with Nq = 1 a bottom-right causal mask sees every key, so plain == causal).  In the same
process: the device's copy bandwidth (torch copy of a 2 GiB buffer, bytes read + written / time), torch
SDPA with its default dispatch (the backend it picks is named, by ``torch._fused_sdp_choice``) and
FlexAttention (``torch.compile(flex_attention)``, which takes its decode path for short queries).
Timing: triton's do_bench median (CUDA events).  Every K/V set is larger than the L2 cache, so repeated
runs over one set read HBM.  Achieved bandwidth = bytes of Q + K + V + O / time.  Writes JSON lines to
$OUT/bench_decode.jsonl (or /tmp) and prints a table last.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _results import Results, device_banner

CONFIGS = ((1, 32, 8), (4, 32, 8), (8, 32, 32))
KV_LENS = (32768, 65536, 131072)
D = 128


def copy_bandwidth(do_bench) -> float:
    """Bytes read + written per second of a device-to-device copy of 2 GiB."""
    n = 2 * 1024**3 // 2
    x = torch.randn(n // 1024, 1024, device="cuda", dtype=torch.float32).to(torch.bfloat16).view(-1)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    del x, y
    return 2 * n * 2 / (ms * 1e-3)


def graph_ms(do_bench, fn) -> float:
    """Median ms of a CUDA-graph replay of ``fn`` (GPU time without the host's launch path)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=200, return_mode="median")


def graph_batch_ms(do_bench, fns, calls: int = 20) -> float:
    """Median ms per call of a CUDA graph holding ``calls`` back-to-back calls (cycling over ``fns``, one
    per K/V set): the GPU time of a call in a stream of calls, with the graph's launch latency (several
    us, paid once per replay) spread over ``calls``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fns[i % len(fns)]()
    return do_bench(g.replay, warmup=10, rep=200, return_mode="median") / calls


def host_us(fn, n: int = 200) -> float:
    """Host microseconds per call of ``fn`` (no synchronization inside the loop)."""
    import time

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def sdpa_backend_name(q, k, v) -> str:
    from torch.nn.attention import SDPBackend

    try:
        idx = torch._fused_sdp_choice(q, k, v, None, 0.0, False, enable_gqa=q.shape[1] != k.shape[1])
        return SDPBackend(idx).name
    except Exception as e:  # noqa: BLE001 - informational only
        return f"unknown ({type(e).__name__})"


def main(argv: list[str] | None = None) -> int:
    from triton.testing import do_bench

    import attncompiler as ac
    from attncompiler.runtime import decode as rt
    from attncompiler.runtime.launch import AttnInputs
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="KV 32k and 128k only")
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args(argv)
    log = Results("bench_decode")
    bw_copy = copy_bandwidth(do_bench)
    dev = device_banner(f"; copy bandwidth {bw_copy / 1e12:.3f} TB/s (read + write)")
    log.meta(device=dev, copy_bw=bw_copy)

    kern = ac.compile(presets.plain(D))  # schedule "auto": picks decode for Nq = 1 and a long K/V
    flex = None
    if not args.no_flex:
        from torch import _dynamo
        from torch.nn.attention.flex_attention import flex_attention

        _dynamo.config.cache_size_limit = 64
        flex = torch.compile(flex_attention, dynamic=False)
    rows = log.rows
    for B, H, H_kv in CONFIGS:
        for N in (KV_LENS[0], KV_LENS[-1]) if args.quick else KV_LENS:
            torch.manual_seed(0)
            q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, H_kv, N, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, H_kv, N, D, device="cuda", dtype=torch.bfloat16)
            nbytes = (q.numel() * 2) * 2 + (k.numel() + v.numel()) * 2  # Q + O + K + V
            gqa = H != H_kv
            rec = {"B": B, "H": H, "H_kv": H_kv, "Nk": N, "bytes": nbytes}
            out = kern(q, k, v)
            assert kern._decode is not None, "expected schedule auto to pick decode"
            choice = rt.split_choice(kern._decode.plan, AttnInputs(B, H, H_kv, 1, N, D, D))
            rec["splits"] = choice.num_splits
            ms = do_bench(lambda: kern(q, k, v), warmup=25, rep=200, return_mode="median")
            rec["ours_ms"] = ms
            rec["ours_graph_ms"] = graph_ms(do_bench, lambda: kern(q, k, v))
            rec["ours_host_us"] = host_us(lambda: kern(q, k, v))
            # a stream of calls over two K/V sets (each larger than L2 from 32k on)
            k2, v2 = torch.randn_like(k), torch.randn_like(v)
            rec["ours_batch_ms"] = graph_batch_ms(do_bench, [lambda: kern(q, k, v), lambda: kern(q, k2, v2)])
            rec["sdpa_batch_ms"] = graph_batch_ms(do_bench, [
                lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa),
                lambda: F.scaled_dot_product_attention(q, k2, v2, enable_gqa=gqa)])
            del k2, v2
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
            rec["sdpa_backend"] = sdpa_backend_name(q, k, v)
            rec["max_abs_diff_vs_sdpa"] = float((out.float() - ref.float()).abs().max())
            rec["sdpa_ms"] = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa), warmup=25,
                                      rep=200, return_mode="median")
            rec["sdpa_graph_ms"] = graph_ms(do_bench, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa))
            if flex is not None:
                try:
                    flex(q, k, v, enable_gqa=gqa)
                    rec["flex_ms"] = do_bench(lambda: flex(q, k, v, enable_gqa=gqa), warmup=25, rep=200,
                                              return_mode="median")
                except Exception as e:  # noqa: BLE001 - a peer that cannot run is recorded, not fatal
                    rec["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rec["ours_bw"] = nbytes / (ms * 1e-3)
            rec["pct_copy_bw"] = 100 * rec["ours_bw"] / bw_copy
            rec["ours_graph_bw"] = nbytes / (rec["ours_graph_ms"] * 1e-3)
            rec["pct_copy_bw_graph"] = 100 * rec["ours_graph_bw"] / bw_copy
            rec["pct_copy_bw_batch"] = 100 * nbytes / (rec["ours_batch_ms"] * 1e-3) / bw_copy
            log.add(**rec)
            del q, k, v, out, ref
            torch.cuda.empty_cache()
    print(f"\n{dev}; copy bandwidth {bw_copy / 1e12:.3f} TB/s; bf16, d={D}, Nq=1; CUDA-graph replays "
          f"(GPU time; FlexAttention eager)")
    print(f"{'B':>2} {'H':>3} {'Hkv':>3} {'Nk':>7} {'splits':>6} {'ours us':>8} {'TB/s':>6} {'%copy':>6} "
          f"{'sdpa us':>8} {'x sdpa':>7} {'host us':>7}")
    for r in rows:
        g = r["ours_graph_ms"]
        print(f"{r['B']:>2} {r['H']:>3} {r['H_kv']:>3} {r['Nk']:>7} {r['splits']:>6} {g * 1e3:>8.1f} "
              f"{r['ours_graph_bw'] / 1e12:>6.2f} {r['pct_copy_bw_graph']:>6.1f} {r['sdpa_graph_ms'] * 1e3:>8.1f} "
              f"{r['sdpa_graph_ms'] / g:>7.2f} {r['ours_host_us']:>7.1f}")
    print(f"\nstreams of 20 calls in one CUDA graph (per call; two K/V sets alternating)")
    print(f"{'B':>2} {'H':>3} {'Hkv':>3} {'Nk':>7} {'splits':>6} {'ours us':>8} {'%copy':>6} {'sdpa us':>8} {'x sdpa':>7}")
    for r in rows:
        print(f"{r['B']:>2} {r['H']:>3} {r['H_kv']:>3} {r['Nk']:>7} {r['splits']:>6} {r['ours_batch_ms'] * 1e3:>8.1f} "
              f"{r['pct_copy_bw_batch']:>6.1f} {r['sdpa_batch_ms'] * 1e3:>8.1f} "
              f"{r['sdpa_batch_ms'] / r['ours_batch_ms']:>7.2f}")
    print(f"\neager calls (do_bench of the Python call; includes the host launch path)")
    print(f"{'B':>2} {'H':>3} {'Hkv':>3} {'Nk':>7} {'splits':>6} {'ours us':>8} {'TB/s':>6} {'%copy':>6} "
          f"{'sdpa us':>8} {'backend':>18} {'x sdpa':>7} {'flex us':>8} {'x flex':>7}")
    for r in rows:
        fl = r.get("flex_ms")
        print(f"{r['B']:>2} {r['H']:>3} {r['H_kv']:>3} {r['Nk']:>7} {r['splits']:>6} {r['ours_ms'] * 1e3:>8.1f} "
              f"{r['ours_bw'] / 1e12:>6.2f} {r['pct_copy_bw']:>6.1f} {r['sdpa_ms'] * 1e3:>8.1f} "
              f"{r['sdpa_backend']:>18} {r['sdpa_ms'] / r['ours_ms']:>7.2f} "
              f"{(fl * 1e3) if fl else float('nan'):>8.1f} {(fl / r['ours_ms']) if fl else float('nan'):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
