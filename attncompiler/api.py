"""The user-facing API: ``compile(spec)`` -> a callable kernel, and the functional ``attention``."""
from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from . import autograd as _autograd
from .codegen.schedule import KernelSource, Schedule, ScheduleError, get_schedule
from .ir.build import build_ir
from .ir.types import AttentionIR
from .plan.model import Plan
from .plan.planner import check_plan_options, choose_auto
from .plan.short import SHORT_BLOCK_M, short_applies, short_reason
from .plan.targets import Target, detect_target, get_target
from .runtime import fastpath as _fastpath
from .runtime import spills as _spills
from .runtime.compiler import LoadedKernel, allow_dynamic_smem, compile_kernel
from .runtime.launch import InputError, check_inputs, check_out, device_index, pack_params, prepare_buffers
from .runtime.rng import captured_rng, device_rng_variant
from .spec.spec import AttentionSpec

__all__ = ["compile", "attention", "CompiledAttention", "clear_caches"]


@dataclass(eq=False)
class CompiledAttention:
    """A compiled attention variant.  Call it as ``kernel(q, k, v)``.

    q: (B, H, Nq, D), k: (B, H_kv, Nk, D), v: (B, H_kv, Nk, DV), any strides with a contiguous head
    dimension -- so both (B, H, N, d) tensors and (B, N, H, d) tensors viewed with ``.transpose(1, 2)``
    work; the output uses q's memory layout.  ``.source`` is the CUDA that runs, ``.plan`` why.
    After a dropout call: ``last_seed``, ``last_offset``; a call captured in a CUDA graph draws its seed on the GPU
    (``last_seed`` None, ``last_rng_state`` the int64 [seed, offset] pair each replay refills).
    """

    spec: AttentionSpec
    ir: AttentionIR
    schedule: str
    target: Target
    kernel_source: KernelSource
    _buffers: Mapping[str, torch.Tensor] = field(repr=False)
    _loaded: dict[int, LoadedKernel] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: (source, device) -> the loaded variants of kernel_source (runtime/rng.py: dropout's device pair)
    _variants: dict[tuple[str, int], LoadedKernel] = field(default_factory=dict, repr=False)
    #: options of the backward: "schedule" ("auto", "v2", "v3") and the chosen backward's plan options (v2: block_m,
    #: num_warps, mtk, split_dkv, ...; v3: consumers, stages, dq_split_n); None: the automatic choice
    backward_options: dict[str, Any] | None = field(default=None, repr=False)
    _op_id: int = field(default=0, repr=False)
    #: compiled with schedule="auto": calls with Nq <= 16 against a long K/V run the decode schedule
    #: (plan/decode.py decode_applies), and a v3 kernel's calls whose strides TMA cannot describe run
    #: v2; each compiled on first use
    auto_decode: bool = field(default=False, repr=False)
    _decode: "CompiledAttention | None" = field(default=None, repr=False)
    _v2: "CompiledAttention | None" = field(default=None, repr=False)  # auto: v3's per-call fallback
    _decode_cp: "CompiledAttention | None" = field(default=None, repr=False)  # auto: decode's cp.async fallback
    #: compiled with schedule="auto", no block_m, and a plan taller than the 64-row one, which exists for the variant:
    #: calls whose queries fit one 64-row tile run that kernel (plan/short.py), compiled on first use into ``_short``
    auto_short: bool = field(default=False, repr=False)
    _short: "CompiledAttention | None" = field(default=None, repr=False)
    #: forward launches by call signature (runtime/fastpath.py): a repeated call skips the checks and the packing
    _recipes: dict[tuple, Any] = field(default_factory=dict, repr=False)
    #: backward launches by call signature (runtime/bwd_fastpath.py), for backwards with the kernel's own buffers
    _bwd_recipes: dict[tuple, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _autograd.register_kernel(self)  # the custom op refers to this kernel by id

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
        idx = device_index(dev)
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
                allow_dynamic_smem(k.ptr, self.kernel_source.smem_bytes, idx)
                self._loaded[idx] = k
            return k

    def _build_variant(self, ks: KernelSource, device: torch.device) -> LoadedKernel:
        """Compile (or fetch) and load a variant of kernel_source (:func:`device_rng_variant`), after build's check."""
        idx = device_index(device)
        k = self._variants.get((ks.source, idx))  # (the text's hash is cached: no sha256 per call)
        if k is None:
            self.build(device)
            k = compile_kernel(ks.source, ks.arch, idx, ks.entry)
            allow_dynamic_smem(k.ptr, ks.smem_bytes, idx)
            k = self._variants.setdefault((ks.source, idx), k)
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
        deterministic: bool | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_k: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the kernel.  ``out`` (B, H, Nq, DV), if given, is written in place (any strides with a
        contiguous, 16-byte aligned head dim); ``buffers`` override the spec's captured tensors.

        Differentiable: when q, k, v (or a float buffer) require grad, eager calls go through a
        ``torch.autograd.Function`` and ``torch.compile`` (or a tensor subclass) through the
        ``attncompiler::attention_fwd`` custom op, over the same implementations; ``.backward()`` runs the
        v2 backward kernels (also for a v1 forward); under ``torch.compile`` the op is traced without a
        graph break.
        ``deterministic`` (default: ``torch.are_deterministic_algorithms_enabled()``) makes the
        gradients bit-identical run to run (dQ in a separate pass instead of fp32 atomics).
        ``out=`` is for the forward-only path (no autograd, no torch.compile).

        Arguments are validated before anything touches CUDA (:class:`InputError`, saying what was
        expected and what was got); docs/shapes.md lists the accepted layouts and edge cases.

        Packed sequences (varlen): with ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32, length B+1),
        q is (total_q, H, D), k / v (total_k, H_kv, D / DV), out (total_q, H, DV), lse (H, total_q);
        ``max_seqlen_*`` default to the longest sequence (see :mod:`attncompiler.varlen`)."""
        self._check_call_args(scale=scale, dropout_p=dropout_p, seed=seed, offset=offset, buffers=buffers,
                              out=out, deterministic=deterministic)
        values = dict(self._buffers)
        if buffers:
            values.update(buffers)
        if not (cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None and max_seqlen_k is None):
            from .varlen import call_varlen

            return call_varlen(self, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, return_lse=return_lse,
                               scale=scale, dropout_p=dropout_p, seed=seed, offset=offset, buffers=values, out=out,
                               deterministic=deterministic)
        needs_grad = False
        if torch.is_grad_enabled():
            for t in (q, k, v, *values.values()):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    needs_grad = True
        if not (needs_grad or torch.compiler.is_compiling()):
            return self._launch_forward(q, k, v, return_lse=return_lse, scale=scale, dropout_p=dropout_p, seed=seed,
                                        offset=offset, buffers=values, out=out, record=not buffers)
        _require_cuda(q, k, v)
        if out is not None:
            raise InputError("out: expected None when inputs require grad or under torch.compile (the output is "
                             "allocated by the autograd op), got a tensor")
        p_drop = self.ir.dropout_p if dropout_p is None else float(dropout_p)
        self._check_dropout(p_drop)
        sc = self.ir.scale if scale is None else float(scale)
        det = torch.are_deterministic_algorithms_enabled() if deterministic is None else bool(deterministic)
        rng = None  # (None: no rng tensor in a CUDA graph)
        if p_drop > 0:  # learnable buffers' gradients are torch's, from the seed on the host: a CPU pair for those
            learnable = any(t.requires_grad and t.is_floating_point() for t in values.values())
            rng = _autograd.make_rng(seed, offset, None if learnable else q.device)
        o, lse = _autograd.attention_op(self, q, k, v, scale=sc, dropout_p=p_drop, rng=rng, buffers=values,
                                        deterministic=det)
        return (o, lse) if return_lse else o

    def _check_call_args(self, *, scale: Any, dropout_p: Any, seed: Any, offset: Any, buffers: Any, out: Any,
                         deterministic: Any) -> None:
        """The non-tensor arguments of ``__call__`` and the buffer overrides (CPU-only checks)."""
        if scale is not None and not isinstance(scale, torch.SymFloat):  # symbolic under torch.compile: unchecked
            ok = isinstance(scale, numbers.Real) and not isinstance(scale, bool)
            if not ok or not math.isfinite(float(scale)) or float(scale) <= 0.0:
                raise InputError(f"scale: expected a finite float > 0 (or None for the spec's {self.ir.scale:.6g}), "
                                 f"got {scale!r}")
        if dropout_p is not None and (isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real)
                                      or not 0.0 <= float(dropout_p) < 1.0):
            raise InputError(f"dropout_p: expected a value in [0, 1) (or None for the spec's {self.ir.dropout_p}), "
                             f"got {dropout_p!r}")
        if dropout_p is not None:
            self._check_dropout(float(dropout_p))
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (numbers.Integral, torch.SymInt))):
            raise InputError(f"seed: expected an int (or None for a random seed), got {type(seed).__name__} {seed!r}")
        if isinstance(offset, bool) or not isinstance(offset, (numbers.Integral, torch.SymInt)):
            raise InputError(f"offset: expected an int, got {type(offset).__name__} {offset!r}")
        if deterministic is not None and not isinstance(deterministic, bool):
            raise InputError(f"deterministic: expected True, False or None, got {deterministic!r}")
        if out is not None and not isinstance(out, torch.Tensor):
            raise InputError(f"out: expected a torch.Tensor or None, got {type(out).__name__}")
        if buffers is None:
            return
        if not isinstance(buffers, Mapping):
            raise InputError(f"buffers: expected a mapping name -> torch.Tensor, got {type(buffers).__name__}")
        infos = {b.name: b for b in self.ir.buffers}
        for name, t in buffers.items():
            info = infos.get(name)
            if info is None:
                raise InputError(f"buffers: expected names among the spec's captured buffers {sorted(infos)}, "
                                 f"got {name!r}")
            if not isinstance(t, torch.Tensor):
                raise InputError(f"buffer {name!r}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dim() != info.ndim:
                raise InputError(f"buffer {name!r}: expected {info.ndim} dims (as captured), "
                                 f"got shape {tuple(t.shape)}")
            if t.numel() == 0:
                raise InputError(f"buffer {name!r}: expected a non-empty tensor, got shape {tuple(t.shape)}")
            if t.dtype.is_complex or (info.kind == "int" and t.is_floating_point()):
                kind = "a float or int" if info.kind == "float" else "an int or bool"
                raise InputError(f"buffer {name!r}: expected {kind} tensor (the spec captured a {info.kind} "
                                 f"buffer), got dtype {t.dtype}")

    def _check_dropout(self, p_drop: float) -> None:
        if (p_drop > 0.0) != (self.ir.dropout_p > 0.0):
            raise InputError(
                f"dropout_p: this kernel was compiled {'with' if self.ir.dropout_p > 0 else 'without'} dropout, "
                f"got dropout_p={p_drop}; compile a spec with dropout_p > 0 to use dropout"
            )
        if not 0.0 <= p_drop < 1.0:
            raise InputError(f"dropout_p: expected a value in [0, 1), got {p_drop}")

    def _launch_forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_lse: bool, scale: float | None,
        dropout_p: float | None, seed: int | None, offset: int, buffers: Mapping[str, torch.Tensor],
        out: torch.Tensor | None, dims: Any = None, record: bool = False,
        record_in: tuple[dict, tuple] | None = None, rng_state: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The forward launch (no autograd): validates, allocates and runs the kernel.  ``dims``: the
        inputs' :func:`check_inputs` result when a sibling kernel of the same spec already checked them;
        ``record`` (``buffers`` are the kernel's own captured tensors): a call whose signature launched before takes
        the launch recorded then, and a launch that needs nothing per call but pointers is recorded
        (runtime/fastpath.py); ``record_in``: (recipes, key) of the kernel that handed this call to its sibling
        (decode, or v2 for layouts TMA cannot describe), where the sibling's launch is recorded.  ``rng_state``:
        dropout's [seed, offset] on the device, read by the kernel in place of ``seed`` and ``offset``
        (:mod:`attncompiler.runtime.rng`); a random-seed dropout call captured in a CUDA graph makes one."""
        recipe_key = None
        if record and dims is None and rng_state is None:  # (recordings hold the kernels with a by-value seed)
            recipe_key = _fastpath.signature(q, k, v, return_lse, scale, dropout_p, out)
            recipe = self._recipes.get(recipe_key) if recipe_key is not None else None
            done = _fastpath.run(recipe, q, k, v, seed, offset, self._buffers, out) if recipe is not None else None
            if done is not None:
                o, lse, self.last_seed = done
                self.last_offset, self.last_rng_state = offset, None
                return (o, lse) if return_lse else o
        if record_in is None and recipe_key is not None:
            record_in = (self._recipes, recipe_key)
        if dims is None:
            dims = check_inputs(q, k, v, self.ir)
        if self.auto_decode and self.schedule != "decode":
            # split-KV decode, or v2 for strides TMA cannot describe (same semantics and lse)
            dec = self._decode_kernel(dims, k, v) or self._tma_fallback(q, k, v) or self._short_kernel(dims.Nq)
            if dec is not None:
                res = dec._launch_forward(q, k, v, return_lse=return_lse, scale=scale, dropout_p=dropout_p,
                                          seed=seed, offset=offset, buffers=buffers, out=out, dims=dims,
                                          record_in=record_in, rng_state=rng_state)  # (the same checks)
                if hasattr(dec, "last_seed"):
                    self.last_seed, self.last_offset = dec.last_seed, dec.last_offset
                    self.last_rng_state = dec.last_rng_state
                return res
        p_drop = self.ir.dropout_p if dropout_p is None else float(dropout_p)
        self._check_dropout(p_drop)
        sc = self.ir.scale if scale is None else float(scale)
        if rng_state is None:
            rng_state = captured_rng(p_drop, seed, offset, q.device)
        ks = self.kernel_source
        if rng_state is not None:
            seed, ks, record_in = None, device_rng_variant(ks), None  # (kernels that read the pair; not recorded)
        elif seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item()) if p_drop > 0 else 0
        # Output in q's memory layout (B,H,N,d or B,N,H,d).
        if out is not None:
            o = check_out(out, (dims.B, dims.H, dims.Nq, dims.DV), q)
        elif q.stride(1) < q.stride(2):  # heads inner: (B, N, H, d) storage
            o = torch.empty(dims.B, dims.Nq, dims.H, dims.DV, device=q.device, dtype=q.dtype).transpose(1, 2)
        else:
            o = torch.empty(dims.B, dims.H, dims.Nq, dims.DV, device=q.device, dtype=q.dtype)
        lse = torch.empty(dims.B, dims.H, dims.Nq, device=q.device, dtype=torch.float32) if return_lse else None
        if dims.Nq == 0 or dims.B * dims.H == 0:  # nothing to compute (and a grid of 0 CTAs cannot launch)
            return (o, lse) if return_lse else o
        if dims.Nk == 0:  # no keys: every row is empty
            o.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
            return (o, lse) if return_lse else o
        sched = get_schedule(self.schedule)
        loaded = self.build(q.device) if ks is self.kernel_source else self._build_variant(ks, q.device)
        bufs = prepare_buffers(self.ir, buffers, q.device)
        ws_n = sched.workspace_floats(self.kernel_source, dims)
        ws = torch.empty(ws_n, device=q.device, dtype=torch.float32) if ws_n else None
        P, Bf = pack_params(q, k, v, o, lse, ws, dims, scale=sc, dropout_p=p_drop, seed=seed or 0, offset=offset,
                            ir=self.ir, buffers=bufs, rng_state=rng_state)
        # per-call inputs a schedule derives from q, k, v (the score skip's bound); alive until the launch is queued
        prepare = getattr(sched, "prepare_forward", None)
        extra = prepare(self.kernel_source, dims, P, q, k, v) if prepare is not None else None
        with torch.cuda.device(q.device):
            if hasattr(sched, "forward_launch"):  # more arguments than (params, buffers), or several kernels
                fl = sched.forward_launch(ks, dims, Bf, q.device)
            else:
                fl = _fastpath.FastLaunch(loaded.ptr, sched.grid(ks, dims), ks.threads, ks.smem_bytes,
                                          lambda P, Bf=Bf: (P, Bf), keep=(loaded, Bf))
            fl.launch(P, device_index(q.device))
        if record_in is not None and extra is None and _fastpath.recordable(buffers):
            _fastpath.remember(record_in[0], record_in[1], _fastpath.recipe(fl, P, q, o, lse, p_drop, ws_n, buffers,
                                                                          keep=(bufs,)))
        del extra
        self.last_seed, self.last_offset, self.last_rng_state = seed, offset, rng_state
        return (o, lse) if return_lse else o

    def _decode_kernel(self, dims: Any, k: torch.Tensor | None = None,
                       v: torch.Tensor | None = None) -> "CompiledAttention | None":
        """The decode-schedule kernel of this spec when ``schedule="auto"`` picks decode for ``dims``; its
        cp.async-loader sibling when the plan's TMA loader cannot describe k / v (e.g. ``.expand()``)."""
        from .plan.decode import decode_applies

        if not decode_applies(self.ir, dims.Nq, dims.Nk)[0]:
            return None
        dec = self._sibling("_decode", "decode")
        if getattr(dec.plan, "loader", "") == "tma" and k is not None and v is not None:
            from .runtime.tma import tma_layout_error

            if any(tma_layout_error(n, t) is not None for n, t in (("k", k), ("v", v))):
                return self._sibling("_decode_cp", "decode", loader="cp_async")
        return dec

    def _tma_fallback(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> "CompiledAttention | None":
        """Under ``schedule="auto"``, the v2 kernel of this spec for a v3 kernel's call whose q / k / v
        strides the TMA copy engine cannot describe (K/V broadcast by ``.expand()``: stride 0)."""
        if self.schedule != "v3":
            return None
        from .runtime.tma import tma_layout_error

        if all(tma_layout_error(n, t) is None for n, t in (("q", q), ("k", k), ("v", v))):
            return None
        return self._sibling("_v2", "v2")

    def _short_kernel(self, nq: int) -> "CompiledAttention | None":
        """Under ``auto_short``, this schedule's kernel at 64 query rows for a call whose ``nq`` queries (per
        sequence: packed sequences pass max_seqlen_q) fit one such tile (:func:`attncompiler.plan.short.short_applies`),
        else None."""
        if not self.auto_short or not short_applies(self.schedule, self.plan, nq)[0]:
            return None
        return self._sibling("_short", self.schedule, block_m=SHORT_BLOCK_M)

    def _sibling(self, attr: str, schedule: str, **plan_options: Any) -> "CompiledAttention":
        """This spec's kernel for ``schedule`` (unbuilt; ``plan_options`` as compile's), compiled on first use
        and cached in ``attr``; a kernel another thread cached first wins."""
        with self._lock:
            sib = getattr(self, attr)
        if sib is None:
            sib = compile(self.spec, schedule, target=self.target, build=False, **plan_options)
            with self._lock:
                sib = getattr(self, attr) or sib
                setattr(self, attr, sib)
        return sib

    def backward_source(self, deterministic: bool = False) -> str:
        """The CUDA of the backward kernels: v3 on sm_90 where it applies, else v2, whatever the forward schedule
        (``backward_options["schedule"]`` chooses)."""
        from .runtime.backward import bwd_source

        return bwd_source(self.ir, self.target, deterministic=deterministic, options=self.backward_options).source


def _require_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            raise InputError(f"{name}: expected a CUDA tensor, got {getattr(t, 'device', type(t).__name__)}; "
                             f"move it with .cuda()")


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
    seqlen_hint: int | None = None,
    **plan_options: Any,
) -> CompiledAttention:
    """Compile ``spec`` with ``schedule`` ("auto", "v1", "v2", "v3" or "decode") for ``target``
    (default: this GPU).

    ``schedule="auto"`` picks the prefill schedule: a plan autotuned on this GPU when one exists
    (below), else :func:`attncompiler.plan.planner.choose_auto` -- v3 on sm_90 (H100 / H200) when
    v3 supports the spec (head dims multiples of 16 up to 256) and the plan options, otherwise v2,
    the reason first in ``.plan.reasons``.  Per call it still runs the split-KV "decode" schedule
    when Nq <= 16 and Nk >= 512 (:func:`attncompiler.plan.decode.decode_applies`), the v2 varlen
    kernels for packed sequences (``cu_seqlens_*``), and the v2 kernel for a v3 kernel's inputs
    the TMA copy engine cannot describe (K/V broadcast with ``.expand()``: stride 0); each compiled
    on first such call.  The backward runs from the forward's out and lse, whatever schedule ran the forward: on
    sm_90 the v3 backward (TMA + wgmma) for head dims 64 and 128, elsewhere (other head dims, other GPUs,
    ``deterministic=True``, packed sequences) the v2 backward; ``kernel.backward_options = {"schedule": "v2"}``
    (or "v3", or v3's plan options ``consumers``, ``stages``, ``dq_split_n``) chooses.

    Plan options (``block_m``, ``block_n``, ``num_warps``, ``q_in_regs``, ``stages`` for v2;
    ``block_m`` (64: one consumer warpgroup and two CTAs per SM; 128, 192), ``block_n``, ``stages``,
    ``persistent``, ``exp2_poly``, ``kv_descending``, ``score_skip``, ``q_prescale``, ``late_pv_wait``,
    ``tma_store_o``, ``softmax_copies``, ``half_blocks``, ``tiles_by_head``, ``q_prefetch``, ``tile_list`` for v3:
    :data:`attncompiler.plan.v3.V3_OPTIONS`;
    ``sram_budget`` for
    v1) override the planner's
    choice after the same feasibility checks.  With ``schedule="auto"`` and no plan options, a plan
    autotuned on this GPU (:func:`attncompiler.runtime.autotune.autotune`; entries tuned with
    "auto", "v3" or "v2", whichever schedule won: :func:`attncompiler.runtime.tuned.find_tuned`) is
    used when one exists: the one tuned for ``seqlen_hint``'s bucket (the query length the kernel
    will mostly see), else the nearest tuned bucket (``seqlen_hint`` None: the largest); otherwise
    the model's choice.  Any tuned plan is correct at every length -- the hint only picks the
    fastest.  ``build`` compiles eagerly (default: when ``target`` is the current GPU); with
    :data:`attncompiler.runtime.spills.SPILL_REPLAN` (on) a v2 or v3 kernel it builds whose machine code spills
    :data:`~attncompiler.runtime.spills.MIN_SPILL_BYTES` or more is planned again at a narrower BLOCK_N (the reason
    first in ``.plan.reasons``).  Kernels
    are cached by the IR's structure, schedule, plan and target: compiling an equal spec again
    compiles nothing.
    """
    import dataclasses

    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
    if seqlen_hint is not None and (isinstance(seqlen_hint, bool) or not isinstance(seqlen_hint, int)
                                    or seqlen_hint < 1):
        raise TypeError(f"seqlen_hint: expected a positive int or None, got {seqlen_hint!r}")
    tgt = _resolve_target(target)
    if schedule != "auto":
        get_schedule(schedule)  # an unknown name fails before tracing
    traced = spec.trace()
    ir = build_ir(spec)
    ir_key = ir.key()
    auto_reasons: tuple[str, ...] = ()
    tuned_reason = None
    name = schedule
    if schedule == "auto":
        choice = choose_auto(ir, tgt, **plan_options)
        name, auto_reasons = choice.schedule, (choice.reason,)
        if not plan_options:
            from .runtime.autotune import find_tuned

            found = find_tuned(ir, tgt, seqlen_hint, schedule="auto", ir_key=ir_key)
            if found is not None:
                name, plan_options = found.schedule, dict(found.options)
                tuned_reason = (f"autotuned on {found.key.gpu_name} for seqlen bucket {found.key.seqlen_bucket}"
                                f"{'' if seqlen_hint is None else f' (hint {seqlen_hint})'}: {found.schedule} "
                                f"{found.ms:.4g} ms vs the model's {found.default_schedule} {found.default_ms:.4g} ms "
                                f"({found.path or 'in memory'})")
                auto_reasons = (f"without a tuned plan: {choice.reason}",)
    sched: Schedule = get_schedule(name)
    auto_short = schedule == "auto" and "block_m" not in plan_options  # (plan/short.py; a tuned block_m stays)
    do_build = build if build is not None else (target is None)
    key = (ir_key, name, tgt.name, tuple(sorted(plan_options.items())), schedule == "auto")
    with _cache_lock:
        hit = _compiled.get(key)
    if hit is None:
        try:
            check_plan_options(name, plan_options, "; ".join(auto_reasons))
            plan = sched.make_plan(ir, tgt, **plan_options)
        except ValueError:
            if tuned_reason is None:
                raise
            choice = choose_auto(ir, tgt)  # a stale tuned plan: the model's choice
            name, auto_reasons, tuned_reason = choice.schedule, (choice.reason,), None
            sched = get_schedule(name)
            plan = sched.make_plan(ir, tgt)
        reasons = ((tuned_reason,) if tuned_reason is not None else ()) + auto_reasons
        short = short_reason(lambda **o: sched.make_plan(ir, tgt, **o), name, plan) if auto_short else None
        reasons += (short,) if short is not None else ()
        if reasons:
            plan = dataclasses.replace(plan, reasons=(*reasons, *plan.reasons))
        ks = sched.render(ir, plan, tgt)
        if do_build and _spills.SPILL_REPLAN:  # checked where it is compiled anyway (v2, v3: replan_widths)
            better = _spills.replan_spilling(sched, ir, tgt, plan_options, plan, ks)
            if better is not None:
                plan = dataclasses.replace(better, reasons=(*reasons, *better.reasons))
                ks = sched.render(ir, plan, tgt)
        hit = CompiledAttention(spec, ir, name, tgt, ks, dict(traced.buffer_values), auto_decode=schedule == "auto",
                                auto_short=short is not None)
        with _cache_lock:
            hit = _compiled.setdefault(key, hit)
        compiled = hit
    else:  # same code; this spec's own scale, dropout and buffer values
        compiled = CompiledAttention(spec, ir, hit.schedule, tgt, hit.kernel_source, dict(traced.buffer_values),
                                     hit._loaded, hit._lock, auto_decode=schedule == "auto", auto_short=hit.auto_short)
    if do_build:
        compiled.build()
    return compiled


_fn_cache: dict[tuple, AttentionSpec] = {}
_fn_kernels: dict[int, CompiledAttention] = {}


def _check_kernel_dtype(q: torch.Tensor) -> None:
    """The functional API compiles for q's dtype: bf16 or fp16 only (an InputError naming the cast, not the spec's
    dtype error)."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise InputError(f"q: expected dtype torch.bfloat16 or torch.float16 (the kernels compute in bf16 / fp16 with "
                         f"float32 accumulation), got {q.dtype}; cast q, k and v with .to(torch.bfloat16)")


@torch.compiler.assume_constant_result
def _functional_kernel_id(head_dim: int, head_dim_v: int, dtype: torch.dtype, causal: bool, score_mod: Callable | None,
                          mask_mod: Callable | None, dropout_p: float, schedule: str, seqlen_bucket: int = 0) -> int:
    """Compile (once per key) the functional API's kernel; returns its id.  Under torch.compile this
    runs at trace time and its result is a constant of the graph (no graph break)."""
    key = (head_dim, head_dim_v, dtype, causal, score_mod, mask_mod, dropout_p > 0, schedule)
    spec = _fn_cache.get(key)  # the spec does not depend on the seqlen; the (tuned) plan may
    if spec is None:
        spec = AttentionSpec(head_dim=head_dim, head_dim_v=head_dim_v, dtype=dtype, causal=causal,
                             score_mod=score_mod, mask_mod=mask_mod, dropout_p=dropout_p)
        _fn_cache[key] = spec
    kern = compile(spec, schedule, seqlen_hint=seqlen_bucket or None)
    with _cache_lock:
        _fn_kernels.setdefault(kern._op_id, kern)
    return kern._op_id


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
    deterministic: bool | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Functional attention with FlexAttention-style mods; compiled kernels are cached.

    Tensors as for :class:`CompiledAttention`; differentiable and usable under ``torch.compile``
    (fullgraph) like it.  A mod is traced once per function object; tensors it captures are read at
    call time from the traced spec.  The dropout probability itself is a run-time value.
    With ``cu_seqlens_q`` / ``cu_seqlens_k``, q, k, v are packed (total, heads, dim) tensors
    (:meth:`CompiledAttention.__call__`).
    """
    varlen = not (cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None and max_seqlen_k is None)
    if varlen:
        for name, t in (("q", q), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise InputError(f"{name}: expected a 3-d torch.Tensor (total, heads, dim) with cu_seqlens, got {got}")
        _check_kernel_dtype(q)
        n = int(max_seqlen_q) if isinstance(max_seqlen_q, int) and max_seqlen_q > 0 else int(q.shape[0])
        bucket = 1 << max(0, n - 1).bit_length()
        kid = _functional_kernel_id(int(q.shape[-1]), int(v.shape[-1]), q.dtype, causal, score_mod, mask_mod,
                                    float(dropout_p), schedule, bucket)
        return _fn_kernels[kid](q, k, v, return_lse=return_lse, scale=scale, dropout_p=dropout_p, seed=seed,
                                deterministic=deterministic, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise InputError(f"q: expected a 4-d torch.Tensor (B, H, N, D), got {getattr(q, 'shape', type(q).__name__)}")
    if not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise InputError(f"v: expected a 4-d torch.Tensor (B, H, N, DV), got {getattr(v, 'shape', type(v).__name__)}")
    _check_kernel_dtype(q)
    n = int(q.shape[2])
    bucket = 1 << max(0, n - 1).bit_length()  # tuned plans are kept per power-of-two seqlen bucket
    kid = _functional_kernel_id(int(q.shape[-1]), int(v.shape[-1]), q.dtype, causal, score_mod, mask_mod,
                                float(dropout_p), schedule, bucket)
    kern = _fn_kernels[kid]
    return kern(q, k, v, return_lse=return_lse, scale=scale, dropout_p=dropout_p, seed=seed,
                deterministic=deterministic)
