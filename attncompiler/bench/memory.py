"""Peak GPU memory against sequence length, beside SDPA's math backend (which materializes N x N scores).

One sequence (B = 1, H = 16, d = 128, causal, bf16) at N = 1k .. 128k.  For each impl and mode
("fwd": a forward without grad; "fwdbwd": forward + backward) the probe allocates the inputs,
resets ``torch.cuda`` peak statistics and reports ``max_memory_allocated`` minus what was allocated
before the call: the memory the attention itself needs (output, LSE, scores, workspaces, gradients).
An out-of-memory becomes an "oom" row, and larger N of that impl and mode are recorded as skipped.
"""
from __future__ import annotations

import gc
from typing import Any, Callable

from .grid import Case, MemoryGrid, VariantParams
from .measure import classify_error, is_fatal_cuda_error

__all__ = ["Probe", "cuda_probe", "run_memory"]

# probe(impl, mode, case) -> (peak bytes above the baseline, input bytes); raises on OOM
Probe = Callable[[str, str, Case], tuple[int, int]]


def cuda_probe(params: VariantParams | None = None, device: str = "cuda") -> Probe:
    """The real probe: torch.cuda memory statistics around one call."""
    import torch

    from .ours import ours_impl
    from .peers import sdpa_impl

    params = params or VariantParams()
    impls: dict[tuple[str, Case], Any] = {}

    def probe(impl: str, mode: str, case: Case) -> tuple[int, int]:
        key = (impl, case)
        if key not in impls:
            impls.clear()  # one case at a time: no kernels or masks of other shapes kept alive
            impls[key] = (sdpa_impl(impl, case.causal) if impl.startswith("sdpa_")
                          else ours_impl(impl, case, params, device))
        fn = impls[key]
        q, k, v = (torch.randn(case.B, case.H, case.N, case.d, device=device, dtype=torch.bfloat16,
                               requires_grad=mode != "fwd") for _ in range(3))
        dout = torch.randn_like(q) if mode != "fwd" else None
        inputs = sum(t.numel() * t.element_size() for t in (q, k, v))
        try:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            with fn.context():
                if mode == "fwd":
                    with torch.no_grad():
                        out = fn.call(q, k, v)
                else:
                    out = fn.call(q, k, v)
                    torch.autograd.grad(out, (q, k, v), dout)  # gradients freed after the peak is taken
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            del out
        finally:
            del q, k, v, dout
            gc.collect()
            torch.cuda.empty_cache()
        return int(peak), int(inputs)
    return probe


def run_memory(grid: MemoryGrid, probe: Probe, record: Callable[..., None], *,
               step: Callable[[str], None] | None = None, expired: Callable[[], Any] | None = None) -> None:
    """Every (impl, mode, N) of ``grid`` through ``probe``; OOM stops that impl and mode.  ``expired()``
    returns a reason to skip the rest (a str, or True for "time budget"), falsy to go on."""
    stopped: dict[tuple[str, str], str] = {}
    fatal = ""
    for mode in grid.modes:
        for impl in grid.impls:
            for N in sorted(grid.seqlens):
                case = Case("memory", "causal" if grid.causal else "plain", grid.head_dim, N, grid.batch,
                            grid.heads, grid.causal)
                base = dict(section="memory", impl=impl, mode=mode, d=case.d, N=N, B=case.B, H=case.H,
                            causal=case.causal)
                why = stopped.get((impl, mode)) or fatal or (expired() if expired is not None else "")
                why = "time budget" if why is True else why
                if why:
                    record(**base, status="skipped", error=why)
                else:
                    try:
                        peak, inputs = probe(impl, mode, case)
                        record(**base, status="ok", peak_bytes=peak, input_bytes=inputs)
                    except Exception as e:
                        status, msg = classify_error(e)
                        record(**base, status=status, error=msg)
                        if status == "oom":
                            stopped[(impl, mode)] = f"OOM at N={N}"
                        if is_fatal_cuda_error(e):
                            fatal = f"CUDA context lost ({msg[:80]})"
                if step is not None:
                    step(f"memory {mode} {impl} N={N}")
