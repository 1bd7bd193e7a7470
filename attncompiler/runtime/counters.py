"""Zeroed int32 counters that outlive a call, for kernels that leave their counters at zero again.

The decode kernel's folded combine (``plan.fold_combine``) counts its splits in on one int32 per
(batch, K/V head, row block); the last split merges and resets the counter to 0.  Its counters must be
zero when the kernel starts.  Zeroing them per call costs a memset (a graph node of its own, ~1 us at
small decode shapes); counters that are zero once and that the kernel leaves zero need none, as long
as no two launches that may run at the same time share a counter.  So:

* an eager launch uses its stream's own slice: launches on one stream run one after another, and
  each leaves the slice zero for the next;
* a launch captured into a CUDA graph gets a slice of its own, never handed out again (a graph keeps
  the address and may be replayed on any stream, next to other graphs and eager calls);
* the slices come from per-device arenas of :data:`ARENA_INTS` counters, zeroed once when created and
  never freed (captured graphs hold addresses into them).  An arena is only created outside a capture
  (allocating inside one would tie it to the graph's memory pool); when a capture finds no arena with
  room, :func:`counters` returns None and the caller zeroes counters of its own in the call.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["ARENA_INTS", "counters", "arena_stats"]

#: int32 counters per arena (256 KB); a decode call takes B * H_kv * row_blocks of them
ARENA_INTS = 1 << 16


@dataclass
class _Arena:
    tensor: Any  # torch.int32 tensor of ARENA_INTS zeros, kept alive for the process
    used: int = 0

    def take(self, count: int) -> int | None:
        if self.used + count > ARENA_INTS:
            return None
        addr = self.tensor.data_ptr() + 4 * self.used
        self.used += count
        return addr


_lock = threading.Lock()
_arenas: dict[int, list[_Arena]] = {}  # device index -> arenas, newest last
_per_stream: dict[tuple[int, int], tuple[int, int]] = {}  # (device index, stream handle) -> (address, count)


def _new_arena(device: Any) -> _Arena:
    import torch

    from .persistent import persistent_zeros

    t = persistent_zeros(ARENA_INTS, torch.int32, device)  # (outside a CUDA graph's pool: runtime/persistent.py)
    # zeroed on this stream; other streams may take slices next: wait once for the memset
    torch.cuda.current_stream(device).synchronize()
    arena = _Arena(t)
    _arenas.setdefault(t.device.index, []).append(arena)
    return arena


def counters(device: Any, count: int) -> int | None:
    """The address of ``count`` zeroed int32 counters for a launch on torch's current stream of
    ``device``, which the launched kernel must leave zero; None inside a CUDA graph capture when no arena
    has room (the caller then zeroes counters of its own, in the call)."""
    import torch

    from .launch import device_index, raw_stream

    if count <= 0:
        raise ValueError(f"expected a positive number of counters, got {count}")
    if count > ARENA_INTS:
        raise ValueError(f"expected at most {ARENA_INTS} counters per launch, got {count}")
    index = device if isinstance(device, int) else device_index(torch.device(device))
    stream = raw_stream(index)  # (the handle without a Stream object: a decode call's host time)
    capturing = torch.cuda.is_current_stream_capturing()
    with _lock:
        arenas = _arenas.get(index, [])
        if capturing:  # a slice of its own; no allocation while capturing
            return arenas[-1].take(count) if arenas else None
        key = (index, stream)
        have = _per_stream.get(key)
        if have is not None and have[1] >= count:
            return have[0]
        addr = arenas[-1].take(count) if arenas else None
        if addr is None:
            addr = _new_arena(torch.device("cuda", index)).take(count)
        assert addr is not None
        _per_stream[key] = (addr, count)
        return addr


def arena_stats(device: Any = None) -> dict[str, int]:
    """Arenas and counters handed out on ``device`` (default: the current one): for tests and curiosity."""
    import torch

    index = torch.device(device).index if device is not None else torch.cuda.current_device()
    with _lock:
        arenas = _arenas.get(index, [])
        return {"arenas": len(arenas), "used": sum(a.used for a in arenas),
                "streams": sum(1 for d, _ in _per_stream if d == index)}
