"""Dropout's seed and offset for launches a CUDA graph replays.

A kernel launch captured in a CUDA graph keeps the parameters it was captured with, so a seed passed by value would
drop the same mask on every replay. Under ``torch.compile`` and under ``torch.cuda.graph`` capture, a dropout call
instead makes its [seed, offset] pair on the device, by kernels on torch's current stream: torch's CUDA generator is
graph-safe (a captured ``randint`` draws from a Philox offset that advances on every replay), so each replay
refills the pair. The launch passes the pair's address (``AttnParams.rng_state``) to a variant of the kernels built
to read the key and the counter offset from it (:func:`device_rng_variant`: ``AC_DROPOUT_RNG_ON_DEVICE`` in
``templates/include/attncompiler/philox.cuh``), and the backward reads the same pair, saved for it by the forward.
Such calls take the full launch path, never a recorded launch (those hold the by-value kernels).

Eager calls outside a capture keep host values and the by-value kernels: they cost no kernel, and the seed a call
used stays readable (``CompiledAttention.last_seed``).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Optional, TypeVar

import torch

__all__ = ["wants_device_rng", "device_rng", "signed64", "host_values", "rng_parts", "device_rng_variant",
           "DEVICE_RNG_DEFINE"]

#: prepended to a translation unit: philox.cuh then reads dropout's key and offset from ``AttnParams.rng_state``
DEVICE_RNG_DEFINE = "#define AC_DROPOUT_RNG_ON_DEVICE 1\n"

_S = TypeVar("_S")
_variants: dict[Any, Any] = {}
_lock = threading.Lock()


def device_rng_variant(src: _S) -> _S:
    """``src`` (a rendered forward or backward: a frozen dataclass with a ``source``) as kernels that read
    dropout's [seed, offset] from the device pair ``AttnParams.rng_state``; the same object for the same ``src``
    (the compile caches key on the text)."""
    with _lock:
        hit = _variants.get(src)
        if hit is None:
            hit = _variants.setdefault(src, dataclasses.replace(src, source=DEVICE_RNG_DEFINE + src.source))
    return hit


def signed64(x: int) -> int:
    """``x`` modulo 2**64 as a two's complement int64 (how an int64 tensor holds a 64-bit seed)."""
    x &= 2**64 - 1
    return x - 2**64 if x >= 2**63 else x


def wants_device_rng(device: Optional[torch.device]) -> bool:
    """Whether a dropout call on ``device`` makes its [seed, offset] on the device: a CUDA device under
    ``torch.compile`` tracing or while torch's current stream is capturing a CUDA graph."""
    if device is None or device.type != "cuda":
        return False
    return torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()


def device_rng(seed: Optional[int], offset: int, device: torch.device) -> torch.Tensor:
    """int64 [seed, offset] on ``device``, made by ops (a fresh seed from torch's CUDA generator when ``seed`` is
    None), so that a CUDA graph records them and refills the pair on replay; a traced constant would not be."""
    off = torch.full((1,), signed64(offset), dtype=torch.int64, device=device)
    if seed is None:
        s = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)
    else:
        s = torch.full((1,), signed64(seed), dtype=torch.int64, device=device)
    return torch.cat([s, off])


def captured_rng(p_drop: float, seed: Optional[int], offset: int, device: torch.device) -> Optional[torch.Tensor]:
    """The device pair a dropout call without a seed draws while torch's current stream captures a CUDA graph
    (a host seed would drop the same mask on every replay); None for every other call, which keeps host values."""
    if p_drop > 0 and seed is None and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return device_rng(None, offset, device)
    return None


def host_values(rng: Optional[torch.Tensor]) -> tuple[int, int]:
    """(seed, offset) of a pair as unsigned 64-bit values, read on the host (a device sync for a GPU pair); (0, 0)
    without dropout."""
    if rng is None:
        return 0, 0
    seed, offset = (int(x) & (2**64 - 1) for x in rng.tolist())
    return seed, offset


def rng_parts(rng: Optional[torch.Tensor]) -> tuple[int, int, Optional[torch.Tensor]]:
    """(seed, offset, device pair) of an op's ``rng`` argument: host values of a CPU pair (0, 0 without dropout),
    or (0, 0, the pair) for a pair on the GPU, which the kernels read in place (nothing is read on the host)."""
    if rng is None:
        return 0, 0, None
    if rng.device.type == "cuda":
        if rng.dtype != torch.int64 or rng.numel() != 2 or not rng.is_contiguous():
            raise ValueError(f"rng: expected a contiguous int64 [seed, offset] pair, got {rng.dtype} "
                             f"{tuple(rng.shape)}")
        return 0, 0, rng
    return (*host_values(rng), None)
