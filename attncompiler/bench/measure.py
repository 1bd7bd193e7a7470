"""Timing, FLOP counting, rotating inputs and the GEMM ceiling.

FLOPs follow the FlashAttention papers: forward = 4·B·H·N²·d (two matmuls), halved when causal;
for masks whose visible (q, k) pairs are known exactly (sliding window, document) the forward
counts 4·B·H·d·pairs instead.  The backward counts 2.5x the forward (five matmuls instead of two),
forward+backward 3.5x.  Every implementation is credited with the same FLOPs for a case, so TFLOP/s
compare like times.

Timing: ``triton.testing.do_bench`` median when triton is importable (it also clears L2 between
calls), else a median of CUDA-event-timed calls.  Inputs rotate over enough sets that their total
size exceeds twice the L2 cache (read from the device properties), so repeated calls do not run out
of L2.  torch is imported inside functions: importing this module costs nothing.
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from .grid import Case, VariantParams

if TYPE_CHECKING:
    import torch

__all__ = [
    "MODE_FLOP_FACTOR", "window_pairs", "document_pairs", "visible_pairs", "forward_flops", "case_flops",
    "Timer", "make_timer", "cuda_event_bench", "l2_bytes", "rotation_count", "InputSets", "make_inputs",
    "gemm_tflops", "classify_error", "is_fatal_cuda_error", "is_compile_failure", "Impl", "measure_mode",
]

MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}

Timer = Callable[[Callable[[], Any]], float]  # fn -> median milliseconds per call


# ----------------------------------------------------------------------------------- FLOPs
def window_pairs(n: int, window: int) -> int:
    """(q, k) pairs with 0 <= q - k <= window, for q, k in [0, n)."""
    if n <= 0:
        return 0
    w = min(max(window, 0), n - 1)
    return w * (w + 1) // 2 + (n - w) * (w + 1)  # rows q < w see q + 1 keys, the rest w + 1


def document_pairs(n: int, num_docs: int) -> int:
    """(q, k) pairs in the same document for ``presets.document_ids(n, num_docs)`` (id = i·D // n)."""
    starts = [-(-j * n // num_docs) for j in range(num_docs + 1)]  # first i with i·D // n >= j
    return sum((starts[j + 1] - starts[j]) ** 2 for j in range(num_docs))


def visible_pairs(case: Case, params: VariantParams) -> int | None:
    """Exact visible (q, k) pairs of masks counted exactly; None for dense / the causal convention."""
    if case.variant == "sliding_window":
        return window_pairs(case.N, params.window)
    if case.variant == "document":
        return document_pairs(case.N, params.num_docs)
    return None


def forward_flops(B: int, H: int, N: int, d: int, causal: bool = False, pairs: int | None = None) -> float:
    """4·B·H·N²·d (halved when causal), or 4·B·H·d·pairs when the visible pairs are given."""
    if pairs is not None:
        return 4.0 * B * H * d * pairs
    return 4.0 * B * H * N * N * d / (2 if causal else 1)


def case_flops(case: Case, mode: str, params: VariantParams | None = None) -> float:
    pairs = visible_pairs(case, params or VariantParams())
    return MODE_FLOP_FACTOR[mode] * forward_flops(case.B, case.H, case.N, case.d, case.causal, pairs)


# ----------------------------------------------------------------------------------- timing
def cuda_event_bench(fn: Callable[[], Any], warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    """Median ms of ``fn`` over CUDA-event-timed calls (about ``rep_ms`` of them after ``warmup_ms``)."""
    import torch

    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(3):
        fn()
    e1.record()
    torch.cuda.synchronize()
    est = max(e0.elapsed_time(e1) / 3, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = max(3, min(1000, int(rep_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def make_timer(warmup_ms: float = 25.0, rep_ms: float = 100.0, prefer: str = "auto") -> tuple[Timer, str]:
    """(timer, description): triton's do_bench median when available (``prefer`` "auto" or "triton"),
    else CUDA events ("events")."""
    if prefer in ("auto", "triton"):
        try:
            from triton.testing import do_bench
        except ImportError:
            if prefer == "triton":
                raise
        else:
            def triton_timer(fn: Callable[[], Any]) -> float:
                try:
                    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
                except TypeError:  # an older triton without return_mode
                    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5]))
            return triton_timer, f"triton.testing.do_bench median (warmup {warmup_ms:g} ms, rep {rep_ms:g} ms)"

    def event_timer(fn: Callable[[], Any]) -> float:
        return cuda_event_bench(fn, warmup_ms, rep_ms)
    return event_timer, f"CUDA events median (warmup {warmup_ms:g} ms, rep {rep_ms:g} ms)"


def l2_bytes(device: int | None = None, default: int = 50 * 2**20) -> int:
    """The GPU's L2 cache size in bytes (``default`` when the properties do not say)."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
    return int(getattr(props, "L2_cache_size", 0) or default)


def rotation_count(set_bytes: int, l2: int, factor: float = 2.0, max_sets: int = 8) -> int:
    """Input sets to rotate so that together they exceed ``factor`` x L2 (at least 2, at most ``max_sets``)."""
    if set_bytes <= 0:
        return 2
    return int(min(max_sets, max(2, math.ceil(factor * l2 / set_bytes))))


@dataclass
class InputSets:
    """Rotating (q, k, v) sets (requires_grad, so the same sets serve the backward) and one dout."""

    sets: list[tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]]
    dout: "torch.Tensor"
    i: int = 0

    def next_index(self) -> int:
        j = self.i % len(self.sets)
        self.i += 1
        return j

    def next(self) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        return self.sets[self.next_index()]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.sets for t in s) + self.dout.numel() * 2


def make_inputs(B: int, H: int, N: int, d: int, *, device: str = "cuda", l2: int = 50 * 2**20,
                dtype: Any = None, seed: int = 0) -> InputSets:
    """Enough (q, k, v) sets of shape (B, H, N, d) to exceed 2x ``l2`` bytes, plus a dout."""
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    g = torch.Generator(device=device).manual_seed(seed)
    elt = torch.finfo(dtype).bits // 8
    n = rotation_count(3 * B * H * N * d * elt, l2)
    sets = [tuple(torch.randn(B, H, N, d, device=device, dtype=dtype, generator=g).requires_grad_()
                  for _ in range(3)) for _ in range(n)]
    dout = torch.randn(B, H, N, d, device=device, dtype=dtype, generator=g)
    return InputSets(sets, dout)  # type: ignore[arg-type]


def gemm_tflops(timer: Timer, n: int = 8192, device: str = "cuda") -> float:
    """bf16 n x n x n matrix product (cuBLAS) TFLOP/s: the ceiling rows are compared with."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    ms = timer(lambda: torch.matmul(a, b, out=c))
    return 2.0 * n ** 3 / ms / 1e9


# ----------------------------------------------------------------------------------- errors
_FATAL = ("illegal memory access", "unspecified launch failure", "misaligned address", "illegal instruction",
          "device-side assert", "launch timed out", "uncorrectable ecc")
_UNSUPPORTED = ("no available kernel", "no viable backend", "not supported", "unsupported", "notimplementederror")


_COMPILE = ("compileerror", "nvrtc", "backendcompilerfailed", "inductorerror", "out of resource", "compil")


def is_compile_failure(message: str) -> bool:
    """An error row's message that names a compiler (NVRTC, inductor / triton): retrying the same
    kernel at another shape would fail the same way after the same compile time."""
    low = message.lower()
    return any(s in low for s in _COMPILE)


def is_fatal_cuda_error(exc: BaseException) -> bool:
    """A sticky CUDA error: the context is lost and every later GPU call fails."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(s in text for s in _FATAL)


def classify_error(exc: BaseException) -> tuple[str, str]:
    """(status, one-line message): "oom", "unsupported" (the backend refuses these inputs) or "error"."""
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    low = f"{name} {text}".lower()
    if "outofmemory" in name.lower() or "out of memory" in low:
        status = "oom"
    elif isinstance(exc, NotImplementedError) or any(s in low for s in _UNSUPPORTED):
        status = "unsupported"
    else:
        status = "error"
    return status, f"{name}: {text}"[:300]


# ----------------------------------------------------------------------------------- one measurement
@dataclass
class Impl:
    """Something to time: ``call(q, k, v) -> out`` under ``context()`` (e.g. an SDPA backend choice)."""

    name: str
    call: Callable[..., Any]
    context: Callable[[], ContextManager[Any]] = nullcontext
    note: str = ""


def measure_mode(impl: Impl, inputs: InputSets, mode: str, timer: Timer,
                 sync: Callable[[], None]) -> tuple[float, float]:
    """(median ms, first-call seconds) of ``impl`` in ``mode``: "fwd" (no grad), "bwd" (the backward
    of retained graphs, one per input set) or "fwdbwd" (a full training step).  The first call is
    timed on its own (it includes any compilation) and is not part of the median."""
    import torch

    with impl.context():
        if mode == "fwd":
            with torch.no_grad():
                t0 = time.perf_counter()
                impl.call(*inputs.next())
                sync()
                first = time.perf_counter() - t0
                ms = timer(lambda: impl.call(*inputs.next()))
            return ms, first
        if mode == "bwd":
            t0 = time.perf_counter()  # the first forward and backward (a compiler's training graph)
            outs = [impl.call(*inputs.sets[0])]
            torch.autograd.grad(outs[0], inputs.sets[0], inputs.dout, retain_graph=True)
            sync()
            first = time.perf_counter() - t0
            outs += [impl.call(*s) for s in inputs.sets[1:]]

            def bwd() -> Any:
                j = inputs.next_index()
                return torch.autograd.grad(outs[j], inputs.sets[j], inputs.dout, retain_graph=True)
            try:
                return timer(bwd), first
            finally:
                del outs
        if mode == "fwdbwd":
            def step() -> Any:
                s = inputs.next()
                return torch.autograd.grad(impl.call(*s), s, inputs.dout)
            t0 = time.perf_counter()
            step()
            sync()
            first = time.perf_counter() - t0
            return timer(step), first
    raise ValueError(f"mode: expected one of {sorted(MODE_FLOP_FACTOR)}, got {mode!r}")
