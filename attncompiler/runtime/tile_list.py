"""The persistent v3 grid's tile list (plan option ``tile_list``): which CTA runs which tiles, dealt on the host.

Without a list CTA c of the persistent grid runs tiles c, c + G, c + 2G, ... (G CTAs, a static round robin). When
the tiles differ in length -- a sliding window's first query blocks see fewer keys than the rest -- the CTAs that
draw a sixteenth full tile finish last while others idle: sliding window 1024 at N = 16k, d = 128 (2048 tiles of 1-9
key blocks on 132 CTAs) keeps the SMs busy 94.5 % of the kernel's time by the cost model below; dealt in order
97 %, longest first 99 %.

:func:`deal_in_order` (the default, :data:`DEAL`) is greedy list scheduling: each tile, in the kernel's order
(``v3_tile``), to the CTA with the least work so far (the lowest index among equals). :func:`deal_tiles` is LPT
(longest processing time first): the same after a stable sort by cost, longest first. Equal costs give the round
robin's assignment either way. In order, the tiles that run at the same time stay neighbours in the kernel's order
(one head's K/V in L2); LPT gathers the short tiles of every head at the end. Measured (H200, 2026-11-29, window 1024
d128, round robin / in order / LPT, TFLOP/s): N = 16k 471.7 / 484.4 / 487.2, N = 4096 462.2 / 475.3 / 473.6, N = 2048
444.9 / 464.7 / 443.8. Again on 2026-11-30 (``benchmarks/deal_timing.py``; LPT's time over in order's): 1.00 under
do_bench and 0.98 back to back at N = 16k, 1.04 at N = 2048 (docs/perf-notes.md, forty-seventh session). A tile's
cost is its visited K/V blocks (from the mask's K/V range, as the kernel's walk)
plus :data:`TILE_BOUNDARY_BLOCKS` for its start and end.

:func:`tile_list` returns the device tensor the kernel reads (``int32``): ``G + 1`` slot offsets (CTA c runs slots
``list[c] .. list[c + 1] - 1``), then the tiles, one per slot. Lists are cached per device and shape (LRU); inside
CUDA graph capture an uncached list is not built (the copy to the device cannot be captured): the caller passes a
null pointer and the kernel runs the round robin; a cached list a capture uses is kept for the process's life.
"""
from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

__all__ = ["TILE_BOUNDARY_BLOCKS", "DEALS", "deal_tiles", "deal_in_order", "tile_costs", "tile_list", "makespan"]

#: a tile's start and end (its first S GEMM and softmax, last P V and epilogue) in K/V blocks of the main loop:
#: traced on an H200 (2026-11-29, docs/perf-notes.md, thirty-second session) 2.94 us per tile boundary against
#: 1.44 us per block of dense 9-block tiles at d = 128. The window's tiles traced on 2026-11-30 took 1.6 k + 1.5 us for
#: k blocks, nearer one block; LPT deals the same tiles with either weight (N = 2048, 4096, 16k).
TILE_BOUNDARY_BLOCKS = 2
#: how :func:`tile_list` deals: "lpt" (:func:`deal_tiles`) or "in_order" (:func:`deal_in_order`); benchmarks switch it
DEAL = "in_order"
_CACHE_MAX = 64
_cache: OrderedDict[tuple, Any] = OrderedDict()
_pinned: dict[tuple, Any] = {}  # lists a CUDA graph captured (their device memory must outlive the graph)
_lock = threading.Lock()


def deal_tiles(costs: Sequence[int], ctas: int) -> list[list[int]]:
    """Per CTA, the tile indices it runs, in order: longest first onto the least-loaded CTA (ties: the lower CTA
    index, and tiles keep their order), so equal costs give the round robin's assignment."""
    if ctas <= 0:
        raise ValueError(f"expected a positive CTA count, got {ctas}")
    order = sorted(range(len(costs)), key=lambda t: -costs[t])  # stable: ties keep the kernel's order
    heap = [(0, c) for c in range(ctas)]
    runs: list[list[int]] = [[] for _ in range(ctas)]
    for t in order:
        load, c = heapq.heappop(heap)
        runs[c].append(t)
        heapq.heappush(heap, (load + costs[t], c))
    return runs


def deal_in_order(costs: Sequence[int], ctas: int) -> list[list[int]]:
    """Per CTA, its tiles: each tile in the kernel's order onto the least-loaded CTA (greedy list scheduling, no
    sort), so tiles that run at the same time stay neighbours in the kernel's order (one head's K/V in L2)."""
    if ctas <= 0:
        raise ValueError(f"expected a positive CTA count, got {ctas}")
    heap = [(0, c) for c in range(ctas)]
    runs: list[list[int]] = [[] for _ in range(ctas)]
    for t, cost in enumerate(costs):
        load, c = heapq.heappop(heap)
        runs[c].append(t)
        heapq.heappush(heap, (load + cost, c))
    return runs


DEALS = {"lpt": deal_tiles, "in_order": deal_in_order}


def makespan(costs: Sequence[int], runs: Sequence[Sequence[int]]) -> int:
    """The busiest CTA's work (cost units) under the assignment ``runs``."""
    return max((sum(costs[t] for t in run) for run in runs), default=0)


def round_robin(n_tiles: int, ctas: int) -> list[list[int]]:
    """The kernel's assignment without a list: CTA c runs tiles c, c + ctas, ..."""
    return [list(range(c, n_tiles, ctas)) for c in range(ctas)]


def _tile_order(num_qb: int, n_bh: int, by_head: bool) -> list[tuple[int, int]]:
    """(query block, batch*head) of tile 0, 1, ... (templates/include/attncompiler/v3_rows.cuh v3_tile)."""
    if by_head:
        return [(num_qb - 1 - t % num_qb, t // num_qb) for t in range(num_qb * n_bh)]
    return [(num_qb - 1 - t // n_bh, t % n_bh) for t in range(num_qb * n_bh)]


def tile_costs(kv_range: Any, Nq: int, Nk: int, B: int, H: int, block_m: int, block_n: int,
               by_head: bool) -> list[int]:
    """Each tile's cost in K/V blocks (the kernel's order): the BLOCK_N-aligned blocks that meet the mask's K/V range
    of its query rows (``kv_range``: :class:`attncompiler.ir.ranges.KvRange`, or None: every block), plus
    :data:`TILE_BOUNDARY_BLOCKS`. A range that cannot be evaluated (buffer masks) counts every block."""
    num_qb = -(-Nq // block_m)
    all_blocks = -(-Nk // block_n)
    per_head = False
    if kv_range is not None:
        from ..spec.symbols import B as B_SYM, H as H_SYM

        per_head = bool(kv_range.inputs() & {B_SYM, H_SYM})  # else one evaluation per query block

    def blocks(q_block: int, bh: int) -> int:
        if kv_range is None or kv_range.is_full():
            return all_blocks
        q0 = q_block * block_m
        b, h = (bh // H, bh % H) if per_head else (0, 0)
        try:
            lo, hi = kv_range.evaluate(q0, min(q0 + block_m, Nq) - 1, b, h, q_len=Nq, kv_len=Nk)
        except ValueError:
            return all_blocks
        lo, hi = max(lo, 0), min(hi, Nk - 1)
        return 0 if lo > hi else hi // block_n - lo // block_n + 1

    memo: dict[tuple[int, int], int] = {}
    out = []
    for q_block, bh in _tile_order(num_qb, B * H, by_head):
        key = (q_block, bh if per_head else 0)
        if key not in memo:
            memo[key] = blocks(*key)
        out.append(memo[key] + TILE_BOUNDARY_BLOCKS)
    return out


def build_list(costs: Sequence[int], ctas: int, deal: str = "lpt") -> list[int]:
    """The list's integers: ``ctas + 1`` slot offsets into the whole list, then the tiles (``deal``: a key of
    :data:`DEALS`)."""
    runs = DEALS[deal](costs, ctas)
    offsets, pos = [], ctas + 1
    for run in runs:
        offsets.append(pos)
        pos += len(run)
    offsets.append(pos)
    return offsets + [t for run in runs for t in run]


def tile_list(kv_range: Any, Nq: int, Nk: int, B: int, H: int, block_m: int, block_n: int, by_head: bool,
              ctas: int, device: Any) -> Any:
    """The device ``int32`` tensor of :func:`build_list` for these sizes (cached), or None inside CUDA graph capture
    when not cached (the kernel then runs the round robin)."""
    import torch

    key = (id(kv_range), Nq, Nk, B, H, block_m, block_n, by_head, ctas, str(device), DEAL)
    capturing = torch.cuda.is_current_stream_capturing()
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is kv_range:
            _cache.move_to_end(key)
            if capturing:
                _pinned[key] = hit  # a captured graph holds the pointer: never freed
            return hit[1]
    if capturing:
        return None
    ints = build_list(tile_costs(kv_range, Nq, Nk, B, H, block_m, block_n, by_head), ctas, DEAL)
    from .persistent import persistent_copy

    t = persistent_copy(torch.tensor(ints, dtype=torch.int32), device)  # (outside a CUDA graph's pool)
    with _lock:
        _cache[key] = (kv_range, t)  # the range is held, so its id is not reused while the entry lives
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)  # (an entry a graph captured stays alive in _pinned)
    return t
