"""attncompiler's side of the benchmark: the spec of each case, its compiled kernel as an Impl, and a
parallel NVRTC precompile of every kernel a run needs (so the grid times kernels, not compilers).

The specs are the presets, with the same parameters the peers get (:class:`~.grid.VariantParams`).
Captured buffers (ALiBi slopes, document ids) are passed to the kernel on the GPU, in the dtype the
kernel reads, so no call copies them from the host.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable

from .grid import Case, VariantParams
from .measure import Impl

__all__ = ["spec_for", "ours_impl", "kernel_sources", "precompile"]

DROPOUT_SEED = 1234  # a fixed seed: no per-call random draw (and host sync) inside the timing


def spec_for(case: Case, params: VariantParams) -> Any:
    """The AttentionSpec of ``case`` (bf16)."""
    from ..spec import presets as P

    d, v = case.d, case.variant
    if v == "plain":
        return P.plain(d)
    if v == "causal":
        return P.causal(d)
    if v == "alibi":
        return P.alibi(P.alibi_slopes(case.H), d, causal=case.causal)
    if v == "softcap":
        return P.softcap(params.softcap, d, causal=case.causal)
    if v == "sliding_window":
        return P.sliding_window(params.window, d)
    if v == "document":
        return P.document(P.document_ids(case.N, params.num_docs), d)
    if v == "dropout":
        return P.plain(d, dropout_p=params.dropout_p)
    raise ValueError(f"variant: expected plain, causal or one of the variants, got {v!r}")


def ours_impl(schedule: str, case: Case, params: VariantParams, device: str = "cuda") -> Impl:
    """Compile (cached in memory and on disk) the kernel of ``case`` with ``schedule`` ("v1"/"v2"/"v3")."""
    import torch

    from ..api import compile as ac_compile

    kern = ac_compile(spec_for(case, params), schedule)
    bufs = {}
    for name, t in kern._buffers.items():
        want = torch.float32 if t.is_floating_point() else torch.int32
        bufs[name] = t.to(device=device, dtype=want).contiguous()
    seed = DROPOUT_SEED if kern.ir.dropout_p > 0 else None

    def call(q: Any, k: Any, v: Any) -> Any:
        return kern(q, k, v, buffers=bufs or None, seed=seed)
    p = kern.plan
    plan = f"{getattr(p, 'block_m', '?')}x{getattr(p, 'block_n', '?')} w{getattr(p, 'num_warps', '?')}"
    return Impl(schedule, call, note=f"plan {plan}")


def kernel_sources(cases: Iterable[Case], params: VariantParams, target: Any, *,
                   schedules: Iterable[str] = ("v1", "v2", "v3"), backward: bool = True,
                   v1_max_n: int = 2048) -> list[tuple[str, str]]:
    """(source, arch) of every forward kernel (per schedule) and v2 backward the cases need, deduplicated."""
    from ..codegen.schedule import get_schedule
    from ..ir.build import build_ir
    from ..runtime.backward import bwd_source

    jobs: dict[tuple[str, str], None] = {}
    seen: set[tuple[str, int, str]] = set()
    for case in cases:
        for sched in schedules:
            if sched == "v1" and case.N > v1_max_n:
                continue
            key = (case.variant, case.d, sched) if case.variant != "document" else (f"doc{case.N}", case.d, sched)
            if key in seen:
                continue
            seen.add(key)
            try:
                ir = build_ir(spec_for(case, params))
                s = get_schedule(sched)
                ks = s.render(ir, s.make_plan(ir, target), target)
                jobs[(ks.source, ks.arch)] = None
                if backward and sched == "v2":
                    jobs[(bwd_source(ir, target).source, target.nvrtc_arch)] = None
            except Exception as e:  # the measurement will report it
                print(f"[bench] precompile: {case.label()} {sched}: {type(e).__name__}: {e}"[:200], file=sys.stderr)
    return list(jobs)


def precompile(cases: Iterable[Case], params: VariantParams, *, schedules: Iterable[str] = ("v1", "v2", "v3"),
               backward: bool = True, v1_max_n: int = 2048) -> int:
    """NVRTC-compile every kernel the cases need into the disk cache, in parallel processes.
    Returns how many kernels; 0 (and a message) when it fails -- the kernels then compile on first use."""
    try:
        from ..plan.targets import detect_target
        from ..runtime.compiler import precompile_to_disk

        jobs = kernel_sources(cases, params, detect_target(), schedules=schedules, backward=backward,
                              v1_max_n=v1_max_n)
        return precompile_to_disk(jobs)
    except Exception as e:
        print(f"[bench] precompile failed ({type(e).__name__}: {e}); kernels compile on first use"[:300],
              file=sys.stderr)
        return 0
