"""Helpers of the GPU tests that capture calls with ``torch.cuda.graph`` (not a test module)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch


def capture(run: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(graph, what ``run()`` returned while captured), after a warm-up call on a side stream (compiles, loads)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = run()
    return g, res


def replay(g: torch.cuda.CUDAGraph, outputs: tuple[torch.Tensor, ...], state: Optional[torch.Tensor]) -> dict:
    """Poison ``outputs``, replay ``g`` and wait for it; the keyword arguments (seed, offset) of an eager call at the
    dropout pair ``state`` the replay drew (none without dropout)."""
    for t in outputs:
        t.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    if state is None:
        return {}
    seed, offset = state.tolist()
    return {"seed": seed, "offset": offset}
