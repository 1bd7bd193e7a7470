"""Repeated forward calls: what a call with an already-seen signature still has to do on the host.

A forward call checks its inputs, packs the kernel's parameter struct, looks up the loaded function, the grid, the
TMA maps and the tile list, and launches. On an H200's host that was 84-107 µs a call (thirty-seventh session,
``benchmarks/host_forward.py --parts``), against 16 µs for torch's SDPA: longer than many kernels it launches, so
the GPU waited for the host (a sliding-window kernel of 255 µs read 265 µs in do_bench, whose L2 flush between calls
takes less time than our host path did).

Everything but the pointers (and a dropout call's seed) is a function of the call's *signature*: the shapes,
strides, dtypes and devices of q, k and v (and of ``out=`` when the caller passes one), ``return_lse``, and the scale
and dropout asked for. The first call of a
signature runs the full path, which validates everything and records a :class:`ForwardRecipe` (the parameter
struct's bytes, the launch's function, grid and extra arguments, the versions of the kernel's captured buffers); a
later call with the same signature only re-checks what the signature does not fix (16-byte aligned base pointers,
the buffers' versions: one changed in place needs new device copies and tables, so the full path runs and records
again; an ``out=`` tensor 16-byte aligned, as the full path's check asks), allocates the output unless the caller
passed one, patches the pointers into a copy of the struct and launches. Inputs that fail a check
never get a recipe, so they keep failing with the full path's error.

Autograd's forward (the ``attncompiler::attention_fwd`` op, eager or under ``torch.compile``) records and takes
launches the same way when its buffers are the kernel's own. Not recorded (the full path runs every time): buffers
passed per call (``buffers=``: a recipe would hold each tensor alive), buffers made under ``torch.inference_mode()``
(no version counter to see their changes by), the backward (:mod:`.bwd_fastpath` records its own launches; packed
sequences record through :mod:`.varlen_fastpath`), kernels whose launch derives data from the inputs (the score
skip's row norms), and calls inside CUDA graph capture.
A ``schedule="auto"`` call that a sibling kernel answers (the decode schedule's split and combine kernels, or v2 for
layouts TMA cannot describe) is recorded under the called kernel's signature with the sibling's launch.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import torch

from .launch import device_index, launch_structs

__all__ = ["Launch", "FastLaunch", "ForwardRecipe", "MAX_RECIPES", "signature", "buffer_versions", "run", "recipe",
           "remember", "remembered", "maps_by_pointers", "stats"]

#: signatures remembered per compiled kernel (a full dictionary is cleared: a workload with more shapes than this
#: pays the full path more often, never a wrong launch)
MAX_RECIPES = 64
#: TMA map structs remembered per recipe, by (q, k, v, o) pointers
_MAX_MAPS = 16
_SEED_MASK = 2**64 - 1
#: calls launched from a recipe in this process (tests check that a repeated call took it)
stats = {"hits": 0}


class Launch(Protocol):
    """What a recipe launches: ``launch(params, device_index)`` queues the call's kernels on torch's current stream
    (:class:`FastLaunch`: one kernel; :class:`attncompiler.runtime.decode.DecodeLaunch`: split and combine)."""

    def launch(self, params: ctypes.Structure, device_index: int) -> None: ...


@dataclass
class FastLaunch:
    """One kernel's launch: function, grid, block, dynamic shared memory, and the by-value arguments for a packed
    parameter struct (``args(P)``: P first). ``keep``: what those arguments point to (buffer copies, a tile list),
    held as long as the launch is."""

    fn_ptr: int
    grid: tuple[int, int, int]
    threads: int
    smem: int
    args: Callable[[ctypes.Structure], tuple[Any, ...]]
    keep: tuple[Any, ...] = ()

    def launch(self, params: ctypes.Structure, device_index: int) -> None:
        launch_structs(self.fn_ptr, self.grid, self.threads, self.smem, self.args(params), device_index)


@dataclass
class ForwardRecipe:
    """A validated signature's launch (see the module's docstring)."""

    launch: Launch
    device_index: int
    template: bytes  # the packed AttnParams of the first call (pointers and seed patched per call)
    ptype: type[ctypes.Structure]
    o_shape: tuple[int, ...]  # allocation order: (B, N, H, DV) when o is heads-inner, else (B, H, N, DV)
    o_heads_inner: bool
    lse_shape: tuple[int, ...] | None
    p_drop: float
    dtype: torch.dtype
    device: torch.device
    workspace_floats: int = 0  # fp32 scratch the kernel needs (v1's O, l, m), allocated per call
    buffer_versions: tuple[int, ...] | None = ()  # of the kernel's captured buffers when recorded
    keep: tuple[Any, ...] = field(default=(), repr=False)


def signature(q: Any, k: Any, v: Any, return_lse: bool, scale: Any, dropout_p: Any,
              out: Any = None) -> tuple | None:
    """The key a recipe is stored under, or None where no recipe applies (an argument is not a plain tensor).
    ``out``: the caller's output tensor, if any (its shape, strides, dtype and device are part of the key)."""
    if not (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor):
        return None  # (a subclass may reinterpret shapes or pointers: the full path every time)
    if out is None:
        o_key: tuple | None = None
    elif type(out) is torch.Tensor:
        o_key = (out.shape, out.stride(), out.dtype, out.device)
    else:
        return None
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(),
            v.dtype, v.device, return_lse, scale, dropout_p, o_key)


def buffer_versions(buffers: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The in-place versions of a kernel's captured buffers (what a recipe's device copies and tables were made
    from); None when a buffer is an inference-mode tensor, which has no version counter: its changes cannot be seen,
    so no recorded launch may hold it (every call takes the full path)."""
    if not buffers:
        return ()
    if any(t.is_inference() for t in buffers.values()):
        return None
    return tuple(t._version for t in buffers.values())


def recordable(buffers: Mapping[str, Any]) -> bool:
    """Whether a launch with these captured ``buffers`` may be recorded (none is an inference-mode tensor); the
    full paths ask before building a recording that :func:`run` could never use."""
    return buffer_versions(buffers) is not None


def run(recipe: ForwardRecipe, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seed: int | None,
        offset: int, buffers: Mapping[str, Any], out: torch.Tensor | None = None, *,
        capture_checked: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, int] | None:
    """Launch ``recipe`` for these inputs and the kernel's captured ``buffers``, writing ``out`` when given (the
    recipe's signature fixed its shape, strides, dtype and device): (o, lse or None, the seed used), or None when
    the full path must run: a base pointer not 16-byte aligned (that path says so), a buffer changed in place since
    the recipe was recorded, or CUDA graph capture. A captured call takes the full path because the
    graph must hold the work that path does on the GPU per call (the granule tables of buffers the tile classifier
    reads, recomputed on every replay: tests/test_gpu_bufreads.py) and the device memory it pins (the tile list);
    capture happens once, so its host time does not matter. ``capture_checked``: the caller has already found
    that no capture runs (the packed path, which must know it before it checks replays)."""
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    op = out.data_ptr() if out is not None else 0
    versions = buffer_versions(buffers)
    if (qp | kp | vp | op) & 15 or versions is None or versions != recipe.buffer_versions:
        return None
    if not capture_checked and torch.cuda.is_current_stream_capturing():
        return None
    fl = recipe.launch
    if out is not None:
        o = out
    else:
        o = torch.empty(recipe.o_shape, device=recipe.device, dtype=recipe.dtype)
        if recipe.o_heads_inner:
            o = o.transpose(1, 2)
    lse = (torch.empty(recipe.lse_shape, device=recipe.device, dtype=torch.float32)
           if recipe.lse_shape is not None else None)
    ws = (torch.empty(recipe.workspace_floats, device=recipe.device, dtype=torch.float32)
          if recipe.workspace_floats else None)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item()) if recipe.p_drop > 0 else 0
    P = recipe.ptype.from_buffer_copy(recipe.template)
    if ws is not None:
        P.workspace = ws.data_ptr()  # (freed after the launch is queued, as on the full path: stream-ordered)
    P.q, P.k, P.v, P.o = qp, kp, vp, o.data_ptr()
    if lse is not None:
        P.lse = lse.data_ptr()
    P.seed = seed & _SEED_MASK
    P.offset = offset & _SEED_MASK
    idx = recipe.device_index
    stats["hits"] += 1
    if torch.cuda.current_device() == idx:
        fl.launch(P, idx)
    else:
        with torch.cuda.device(idx):
            fl.launch(P, idx)
    return o, lse, seed


def recipe(fl: Launch, params: ctypes.Structure, q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor | None,
           p_drop: float, workspace_floats: int, buffers: Mapping[str, Any], keep: tuple[Any, ...]) -> ForwardRecipe:
    """The recipe of a call the full path just launched with ``params`` (the output's allocation in q's layout, as
    that path allocates it; a call that passed ``out=`` has it in its signature and never allocates)."""
    heads_inner = q.stride(1) < q.stride(2)
    idx = device_index(q.device)
    return ForwardRecipe(fl, idx, bytes(params), type(params),
                         tuple(o.shape[i] for i in ((0, 2, 1, 3) if heads_inner else (0, 1, 2, 3))), heads_inner,
                         tuple(lse.shape) if lse is not None else None, p_drop, o.dtype, o.device,
                         workspace_floats, buffer_versions(buffers), keep)


def remember(recipes: dict, key: tuple, recipe: ForwardRecipe) -> None:
    """Store ``recipe`` under ``key`` (a full table is emptied first), unless this stream is being captured."""
    if torch.cuda.is_current_stream_capturing():
        return
    if len(recipes) >= MAX_RECIPES:
        recipes.clear()
    recipes[key] = recipe


def remembered(build: Callable[..., Any], key_of: Callable[..., tuple]) -> Callable[..., Any]:
    """``build(*structs)`` remembered by ``key_of(*structs)`` (the pointers the result describes), at most
    ``_MAX_MAPS`` of them (a full cache is emptied)."""
    cache: dict[tuple, Any] = {}

    def call(*structs: ctypes.Structure) -> Any:
        key = key_of(*structs)
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= _MAX_MAPS:
                cache.clear()
            hit = cache[key] = build(*structs)
        return hit

    return call


def maps_by_pointers(build: Callable[[ctypes.Structure], Any],
                     fields: tuple[str, ...] = ("q", "k", "v", "o")) -> Callable[[ctypes.Structure], Any]:
    """``build(P)`` (a TMA maps struct from P's pointers and strides) remembered by the pointers P holds in
    ``fields`` (those the maps describe): the strides are fixed by the recipe's signature."""
    return remembered(build, lambda P: tuple(getattr(P, f) for f in fields))
