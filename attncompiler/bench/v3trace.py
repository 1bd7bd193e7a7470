"""Per-tile phase records of a v3 kernel: the ``AC_V3_TRACE`` build (templates/include/attncompiler/v3_trace.cuh).

:func:`run_traced` compiles the kernel's source once more with ``#define AC_V3_TRACE 1`` (each mark: one
``%globaltimer`` read and one store by one thread into ``ac_v3_trace[tile * 16 + slot]``), runs it after a
warm-up with the trace array zeroed, and returns the array as (TRACE_TILES, 16) uint64 rows.  Used by
``benchmarks/v3_trace.py`` (phase timings) and the GPU tests (blocks visited per tile, slot
``kTraceBlocks``).  Non-persistent kernels number their tiles ``(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["run_traced", "TRACE_TILES", "SLOT_BLOCKS", "SLOTS", "tile_boundaries", "grid_tail"]

TRACE_TILES = 8192   # AC_V3_TRACE_TILES: tiles past it are not recorded
SLOT_BLOCKS = 9      # kTraceBlocks: K/V blocks consumer 0 visited
#: the slot names of a trace row, in v3_trace.cuh's order (kTraceSm ... kTraceCta)
SLOTS = ("sm", "start", "q", "s0", "softmax0", "loop", "pv", "epi0", "epi1", "blocks", "issue", "epi_scale",
         "epi_sts", "epi_bar", "cta")


def tile_boundaries(tiles: list[dict[str, int]]) -> list[int]:
    """The persistent grid's tile boundaries, in timer ticks: for each CTA (slot ``cta``, the CTA plus one; 0 where
    the traced build did not record it), its tiles in the order their first softmax finished, and from each tile's
    main loop done (``loop``) to the next tile's first softmax done (``softmax0``). Tiles without those marks (no
    K/V block) are left out."""
    runs: dict[int, list[dict[str, int]]] = {}
    for t in tiles:
        if t.get("cta") and t.get("loop") and t.get("softmax0"):
            runs.setdefault(t["cta"], []).append(t)
    out: list[int] = []
    for run in runs.values():
        run.sort(key=lambda t: t["softmax0"])
        out += [nxt["softmax0"] - t["loop"] for t, nxt in zip(run, run[1:])]
    return out


def grid_tail(tiles: list[dict[str, int]]) -> list[int]:
    """The persistent grid's tail, in timer ticks: for each CTA (slot ``cta``; 0: not recorded), the launch's last
    epilogue mark minus the CTA's own last one, smallest first (0 for the CTA that ends the launch)."""
    ends: dict[int, int] = {}
    for t in tiles:
        if t.get("cta"):
            ends[t["cta"]] = max(ends.get(t["cta"], 0), t["epi0"], t["epi1"])
    last = max(ends.values(), default=0)
    return sorted(last - e for e in ends.values())


def run_traced(kern: Any, q: Any, k: Any, v: Any, *, defines: tuple[str, ...] = (), warmup: int = 1,
               **call: Any) -> Any:
    """Run the traced build of the v3 kernel ``kern`` (a CompiledAttention) on ``q, k, v`` (``call``: more
    keyword arguments of the call, e.g. ``buffers``); ``defines``: more ``#define`` lines before the source.
    Returns a numpy (TRACE_TILES, 16) uint64 array: each tile's slots (v3_trace.cuh), 0 where unset."""
    import cupy
    import torch

    from ..runtime.compiler import compile_kernel

    ks = kern.kernel_source
    prefix = "".join(f"#define {x}\n" for x in ("AC_V3_TRACE 1", *defines))
    traced_ks = dataclasses.replace(ks, source=prefix + ks.source)
    traced = dataclasses.replace(kern, kernel_source=traced_ks, _loaded={})
    for _ in range(max(1, warmup)):
        traced(q, k, v, **call)
    mod = compile_kernel(traced_ks.source, traced_ks.arch, torch.cuda.current_device(), traced_ks.entry).module
    n_words = TRACE_TILES * 16
    mem = cupy.cuda.UnownedMemory(int(mod.get_global_var("ac_v3_trace")), n_words * 8, mod)
    arr = cupy.ndarray((n_words,), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0))
    torch.cuda.synchronize()
    arr.fill(0)
    cupy.cuda.runtime.deviceSynchronize()
    traced(q, k, v, **call)
    torch.cuda.synchronize()
    return arr.get().reshape(TRACE_TILES, 16)
