"""The user-facing API: ``compile(spec)`` -> a callable kernel, and the functional ``attention``."""
from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .codegen.schedule import KernelSource, Schedule, ScheduleError, get_schedule
from .ir.build import build_ir
from .ir.types import AttentionIR
from .plan.model import Plan
from .plan.planner import auto_schedule
from .plan.targets import Target, detect_target, get_target
from .runtime.compiler import LoadedKernel, compile_kernel
from .runtime.launch import InputError, check_inputs, launch, pack_params, prepare_buffers
from .spec.spec import AttentionSpec

__all__ = ["compile", "attention", "CompiledAttention", "clear_caches"]

_MAX_DYNAMIC_SMEM_ATTR = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


@dataclass(eq=False)
class CompiledAttention:
    """A compiled attention variant.  Call it as ``kernel(q, k, v)``.

    q: (B, H, Nq, D), k: (B, H_kv, Nk, D), v: (B, H_kv, Nk, DV), any strides with a contiguous head
    dimension -- so both (B, H, N, d) tensors and (B, N, H, d) tensors viewed with ``.transpose(1, 2)``
    work; the output uses q's memory layout.  ``.source`` is the CUDA that runs, ``.plan`` why.
    """

    spec: AttentionSpec
    ir: AttentionIR
    schedule: str
    target: Target
    kernel_source: KernelSource
    _buffers: Mapping[str, torch.Tensor] = field(repr=False)
    _loaded: dict[int, LoadedKernel] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def source(self) -> str:
        return self.kernel_source.source

    @property
    def plan(self) -> Plan:
        return self.kernel_source.plan

    @property
    def compile_seconds(self) -> float:
        return max((k.compile_seconds for k in self._loaded.values()), default=0.0)

    def build(self, device: int | torch.device | None = None) -> LoadedKernel:
        """Compile (or fetch from cache) and load the kernel for ``device`` (default: current)."""
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        with self._lock:
            k = self._loaded.get(idx)
            if k is None:
                major, minor = torch.cuda.get_device_capability(idx)
                if (major, minor) != (self.target.major, self.target.minor):
                    raise ScheduleError(
                        f"kernel was planned for {self.target.name}, got a device of sm_{major}{minor} "
                        f"(cuda:{idx}); compile the spec for that device"
                    )
                k = compile_kernel(self.source, self.kernel_source.arch, idx, self.kernel_source.entry)
                if self.kernel_source.smem_bytes > 48 * 1024:
                    from cupy.cuda import Device, driver

                    with Device(idx):
                        driver.funcSetAttribute(k.ptr, _MAX_DYNAMIC_SMEM_ATTR, self.kernel_source.smem_bytes)
                self._loaded[idx] = k
            return k

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        return_lse: bool = False,
        scale: float | None = None,
        dropout_p: float | None = None,
        seed: int | None = None,
        offset: int = 0,
        buffers: Mapping[str, torch.Tensor] | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the kernel.  ``out`` (B, H, Nq, DV), if given, is written in place (any strides with a
        contiguous, 16-byte aligned head dim); ``buffers`` override the spec's captured tensors."""
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
            raise NotImplementedError(
                "attncompiler kernels are forward-only in this version: expected inputs without requires_grad "
                "(or torch.no_grad()), got a tensor that requires grad"
            )
        dims = check_inputs(q, k, v, self.ir)
        p_drop = self.ir.dropout_p if dropout_p is None else float(dropout_p)
        if (p_drop > 0.0) != (self.ir.dropout_p > 0.0):
            raise InputError(
                f"dropout_p: this kernel was compiled {'with' if self.ir.dropout_p > 0 else 'without'} dropout, "
                f"got dropout_p={p_drop}; compile a spec with dropout_p > 0 to use dropout"
            )
        if not 0.0 <= p_drop < 1.0:
            raise InputError(f"dropout_p: expected a value in [0, 1), got {p_drop}")
        sc = self.ir.scale if scale is None else float(scale)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item()) if p_drop > 0 else 0
        # Output in q's memory layout (B,H,N,d or B,N,H,d).
        if out is not None:
            want = (dims.B, dims.H, dims.Nq, dims.DV)
            if tuple(out.shape) != want or out.dtype != q.dtype or out.device != q.device:
                raise InputError(f"out: expected {want} {q.dtype} on {q.device}, got {tuple(out.shape)} "
                                 f"{out.dtype} on {out.device}")
            if out.numel() and (out.stride(-1) != 1 or any(s_ % 8 for s_ in out.stride()[:3]) or out.data_ptr() % 16):
                raise InputError(f"out: expected a contiguous head dim and 16-byte aligned rows, got strides "
                                 f"{out.stride()}")
            o = out
        elif q.stride(1) < q.stride(2):  # heads inner: (B, N, H, d) storage
            o = torch.empty(dims.B, dims.Nq, dims.H, dims.DV, device=q.device, dtype=q.dtype).transpose(1, 2)
        else:
            o = torch.empty(dims.B, dims.H, dims.Nq, dims.DV, device=q.device, dtype=q.dtype)
        lse = torch.empty(dims.B, dims.H, dims.Nq, device=q.device, dtype=torch.float32) if return_lse else None
        if dims.Nq == 0:
            return (o, lse) if return_lse else o
        if dims.Nk == 0:  # no keys: every row is empty
            o.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
            return (o, lse) if return_lse else o
        sched = get_schedule(self.schedule)
        loaded = self.build(q.device)
        values = dict(self._buffers)
        if buffers:
            values.update(buffers)
        bufs = prepare_buffers(self.ir, values, q.device)
        ws_n = sched.workspace_floats(self.kernel_source, dims)
        ws = torch.empty(ws_n, device=q.device, dtype=torch.float32) if ws_n else None
        P, Bf = pack_params(q, k, v, o, lse, ws, dims, scale=sc, dropout_p=p_drop, seed=seed, offset=offset,
                            ir=self.ir, buffers=bufs)
        with torch.cuda.device(q.device):
            launch(loaded.ptr, sched.grid(self.kernel_source, dims), self.kernel_source.threads,
                   self.kernel_source.smem_bytes, P, Bf, q.device)
        self.last_seed, self.last_offset = seed, offset
        return (o, lse) if return_lse else o


_cache_lock = threading.Lock()
_compiled: dict[tuple, CompiledAttention] = {}


def clear_caches() -> None:
    """Forget compiled kernels held in memory (the disk cache is kept)."""
    with _cache_lock:
        _compiled.clear()


def _resolve_target(target: Target | str | None) -> Target:
    if target is None:
        if not torch.cuda.is_available():
            raise ScheduleError(
                "no CUDA device: expected a GPU to compile for, got none; pass target='sm_90' (or another arch) "
                "to plan and render the source without a GPU"
            )
        return detect_target()
    return get_target(target)


def compile(
    spec: AttentionSpec,
    schedule: str = "auto",
    *,
    target: Target | str | None = None,
    build: bool | None = None,
    **plan_options: Any,
) -> CompiledAttention:
    """Compile ``spec`` with ``schedule`` ("auto", "v1" or "v2") for ``target`` (default: this GPU).

    Plan options (``block_m``, ``block_n``, ``num_warps``, ``q_in_regs`` for v2; ``sram_budget``
    for v1) override the planner's choice after the same feasibility checks.  ``build`` compiles
    eagerly (default: when ``target`` is the current GPU).  Kernels are cached by the IR's
    structure, schedule, plan and target: compiling an equal spec again compiles nothing.
    """
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
    tgt = _resolve_target(target)
    name = auto_schedule(tgt) if schedule == "auto" else schedule
    sched: Schedule = get_schedule(name)
    traced = spec.trace()
    ir = build_ir(spec)
    key = (ir.key(), name, tgt.name, tuple(sorted(plan_options.items())))
    with _cache_lock:
        hit = _compiled.get(key)
    if hit is None:
        plan = sched.make_plan(ir, tgt, **plan_options)
        ks = sched.render(ir, plan, tgt)
        hit = CompiledAttention(spec, ir, name, tgt, ks, dict(traced.buffer_values))
        with _cache_lock:
            hit = _compiled.setdefault(key, hit)
        compiled = hit
    else:  # same code; this spec's own scale, dropout and buffer values
        compiled = CompiledAttention(spec, ir, name, tgt, hit.kernel_source, dict(traced.buffer_values),
                                     hit._loaded, hit._lock)
    do_build = build if build is not None else (target is None)
    if do_build:
        compiled.build()
    return compiled


_fn_cache: dict[tuple, AttentionSpec] = {}


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    score_mod: Callable | None = None,
    mask_mod: Callable | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    schedule: str = "auto",
    return_lse: bool = False,
    seed: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Functional attention with FlexAttention-style mods; compiled kernels are cached.

    Tensors as for :class:`CompiledAttention`.  A mod is traced once per function object; tensors it
    captures are read at call time from the traced spec.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise InputError(f"q: expected a 4-d torch.Tensor (B, H, N, D), got {getattr(q, 'shape', type(q).__name__)}")
    if not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise InputError(f"v: expected a 4-d torch.Tensor (B, H, N, DV), got {getattr(v, 'shape', type(v).__name__)}")
    key = (q.shape[-1], v.shape[-1], q.dtype, causal, score_mod, mask_mod, dropout_p > 0, schedule)
    spec = _fn_cache.get(key)
    if spec is None:
        spec = AttentionSpec(head_dim=q.shape[-1], head_dim_v=v.shape[-1], dtype=q.dtype, causal=causal,
                             score_mod=score_mod, mask_mod=mask_mod, dropout_p=dropout_p)
        _fn_cache[key] = spec
    kern = compile(spec, schedule)
    return kern(q, k, v, return_lse=return_lse, scale=scale, dropout_p=dropout_p, seed=seed)
