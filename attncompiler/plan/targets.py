"""GPU targets as data: one frozen :class:`Target` per compute capability the planner knows.

Every number is a named, commented hardware constant with its source, so that a plan's reasons can
quote it ("smem 241664 B > 232448 B per-block limit on sm_90").  Sources:

* [CCT]  CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" table
         (shared memory per SM / per block, threads, blocks and registers per SM).  Since sm_80
         the driver reserves 1 KB of shared memory per block, which is why the per-block opt-in
         limit is the per-SM capacity minus 1 KB.
* [A100] NVIDIA A100 Tensor Core GPU datasheet / Ampere GA100 architecture whitepaper.
* [GA102] NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3090; A10 / RTX A6000 share GA102).
* [L40S] NVIDIA L40S datasheet; [ADA] Ada Lovelace (AD102) architecture whitepaper (RTX 4090).
* [H100] NVIDIA H100 Tensor Core GPU datasheet (SXM5) / Hopper architecture whitepaper.
* [B200] NVIDIA DGX/HGX B200 datasheet (per-GPU figures).  Data only, untested.
* [GB202] NVIDIA RTX Blackwell (GB202) architecture whitepaper (RTX 5090).  Data only, untested.

Peak FLOP/s are *dense* (no 2:4 sparsity) bf16/fp16 multiply-adds with fp32 accumulation,
counted as 2 FLOPs per multiply-add.  Nothing here touches CUDA at import time;
:func:`detect_target` imports torch lazily.
"""
from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = ["Target", "TargetError", "TARGETS", "get_target", "detect_target", "target_names"]

KiB = 1024
MiB = 1024 * 1024

# [CCT] Limits common to every compute capability >= 8.0.
STATIC_SMEM_PER_BLOCK = 48 * KiB  # static __shared__ limit; more needs the dynamic-smem opt-in
SMEM_RESERVED_PER_BLOCK = 1 * KiB  # system use, per resident block (sm_80+)
REGISTERS_PER_SM = 64 * KiB  # 65536 32-bit registers per SM
MAX_REGISTERS_PER_THREAD = 255
MAX_THREADS_PER_BLOCK = 1024
WARP_SIZE = 32
REGISTER_ALLOC_UNIT_PER_WARP = 256  # registers are allocated per warp in units of 256


class TargetError(ValueError):
    """An unknown target name, or no usable CUDA device for :func:`detect_target`."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """One GPU architecture (compute capability) as plain data.

    ``sm_count``, ``l2_bytes``, bandwidth and FLOP/s are *product* facts (the product named first
    in ``products``); the other fields are compute-capability facts from [CCT].
    """

    name: str  # "sm_90"
    major: int
    minor: int
    products: tuple[str, ...]  # examples; the first is the one the product facts describe
    sm_count: int
    smem_per_sm: int  # bytes of shared memory per SM (max carveout)
    max_smem_per_block_optin: int  # bytes, max dynamic smem per block (cudaFuncAttributeMaxDynamicSharedMemorySize)
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_bytes: int
    hbm_bandwidth: float  # bytes / s
    mma_sync_flops: float | None  # dense bf16 mma.sync FLOP/s (None: not characterized)
    wgmma_flops: float | None  # dense bf16 wgmma FLOP/s (None: no wgmma)
    fp32_flops: float  # CUDA-core fp32 FMA FLOP/s (the v1 kernel computes with scalar FMAs)
    supports_cp_async: bool
    supports_tma: bool
    supports_wgmma: bool
    nvrtc_arch: str  # --gpu-architecture value for NVRTC ("sm_90a" on Hopper)
    static_smem_per_block: int = STATIC_SMEM_PER_BLOCK
    smem_reserved_per_block: int = SMEM_RESERVED_PER_BLOCK
    registers_per_sm: int = REGISTERS_PER_SM
    max_registers_per_thread: int = MAX_REGISTERS_PER_THREAD
    max_threads_per_block: int = MAX_THREADS_PER_BLOCK
    warp_size: int = WARP_SIZE
    register_alloc_unit_per_warp: int = REGISTER_ALLOC_UNIT_PER_WARP
    tested: bool = True  # False: the numbers are data only, no kernel has run there

    @property
    def compute_capability(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def peak_tensor_flops(self) -> float | None:
        """Best dense bf16 tensor-core rate (wgmma where present, else mma.sync)."""
        return self.wgmma_flops if self.wgmma_flops is not None else self.mma_sync_flops

    def describe(self) -> str:
        def tf(x: float | None) -> str:
            return "n/a" if x is None else f"{x / 1e12:.0f} TFLOP/s"

        return "\n".join([
            f"{self.name} (compute capability {self.compute_capability}; {', '.join(self.products)})"
            + ("" if self.tested else "  [data only, untested]"),
            f"  SMs {self.sm_count}, smem {self.smem_per_sm} B/SM, {self.max_smem_per_block_optin} B/block opt-in"
            f" ({self.static_smem_per_block} B static)",
            f"  registers {self.registers_per_sm}/SM, <= {self.max_registers_per_thread}/thread;"
            f" threads <= {self.max_threads_per_block}/block, {self.max_threads_per_sm}/SM;"
            f" blocks <= {self.max_blocks_per_sm}/SM",
            f"  L2 {self.l2_bytes / MiB:.0f} MiB, HBM {self.hbm_bandwidth / 1e12:.2f} TB/s,"
            f" mma.sync {tf(self.mma_sync_flops)}, wgmma {tf(self.wgmma_flops)}, fp32 {tf(self.fp32_flops)}",
            f"  cp.async {self.supports_cp_async}, TMA {self.supports_tma}, wgmma {self.supports_wgmma};"
            f" nvrtc arch {self.nvrtc_arch}",
        ])


_TARGET_LIST: tuple[Target, ...] = (
    Target(
        name="sm_80", major=8, minor=0,
        products=("A100 SXM4 80GB", "A100 PCIe", "A800", "A30"),
        sm_count=108,                        # [A100] 108 SMs
        smem_per_sm=164 * KiB,               # [CCT] 8.0: 164 KB per SM
        max_smem_per_block_optin=163 * KiB,  # [CCT] 8.0: 163 KB per block = 166912 B
        max_threads_per_sm=2048,             # [CCT] 8.0: 64 warps
        max_blocks_per_sm=32,                # [CCT]
        l2_bytes=40 * MiB,                   # [A100] 40 MB L2
        hbm_bandwidth=2.039e12,              # [A100] 80GB SXM: 2039 GB/s (40GB: 1555 GB/s)
        mma_sync_flops=312e12,               # [A100] BF16 tensor core 312 TFLOPS dense
        wgmma_flops=None,
        fp32_flops=19.5e12,                  # [A100] FP32 19.5 TFLOPS
        supports_cp_async=True, supports_tma=False, supports_wgmma=False,
        nvrtc_arch="sm_80",
    ),
    Target(
        name="sm_86", major=8, minor=6,
        products=("RTX 3090", "RTX 3090 Ti", "RTX A6000", "A10"),
        sm_count=82,                         # [GA102] RTX 3090: 82 SMs (3090 Ti / A6000: 84, A10: 72)
        smem_per_sm=100 * KiB,               # [CCT] 8.6: 100 KB per SM
        max_smem_per_block_optin=99 * KiB,   # [CCT] 8.6: 99 KB per block = 101376 B
        max_threads_per_sm=1536,             # [CCT] 8.6: 48 warps
        max_blocks_per_sm=16,                # [CCT]
        l2_bytes=6 * MiB,                    # [GA102] 6 MB L2
        hbm_bandwidth=936e9,                 # [GA102] RTX 3090 GDDR6X 936 GB/s
        mma_sync_flops=71e12,                # [GA102] RTX 3090 FP16/BF16 tensor, FP32 accumulate, dense
        wgmma_flops=None,
        fp32_flops=35.6e12,                  # [GA102] RTX 3090 FP32 35.6 TFLOPS
        supports_cp_async=True, supports_tma=False, supports_wgmma=False,
        nvrtc_arch="sm_86",
    ),
    Target(
        name="sm_89", major=8, minor=9,
        products=("L40S", "L4", "RTX 4090", "RTX 6000 Ada"),
        sm_count=142,                        # [L40S] 142 SMs (RTX 4090: 128)
        smem_per_sm=100 * KiB,               # [CCT] 8.9: 100 KB per SM
        max_smem_per_block_optin=99 * KiB,   # [CCT] 8.9: 99 KB per block = 101376 B
        max_threads_per_sm=1536,             # [CCT] 8.9: 48 warps
        max_blocks_per_sm=24,                # [CCT]
        l2_bytes=96 * MiB,                   # [L40S] 96 MB L2 (RTX 4090: 72 MB)
        hbm_bandwidth=864e9,                 # [L40S] GDDR6 864 GB/s (RTX 4090: 1008 GB/s)
        mma_sync_flops=362e12,               # [L40S] BF16 tensor 362 TFLOPS dense
        wgmma_flops=None,
        fp32_flops=91.6e12,                  # [L40S] FP32 91.6 TFLOPS
        supports_cp_async=True, supports_tma=False, supports_wgmma=False,
        nvrtc_arch="sm_89",
    ),
    Target(
        name="sm_90", major=9, minor=0,
        products=("H100 SXM5", "H100 PCIe", "H800", "GH200"),
        sm_count=132,                        # [H100] SXM5: 132 SMs (PCIe: 114)
        smem_per_sm=228 * KiB,               # [CCT] 9.0: 228 KB per SM
        max_smem_per_block_optin=227 * KiB,  # [CCT] 9.0: 227 KB per block = 232448 B
        max_threads_per_sm=2048,             # [CCT] 9.0: 64 warps
        max_blocks_per_sm=32,                # [CCT]
        l2_bytes=50 * MiB,                   # [H100] 50 MB L2
        hbm_bandwidth=3.35e12,               # [H100] SXM5 HBM3 3.35 TB/s
        mma_sync_flops=660e12,               # estimate: Ampere-style mma.sync reaches ~2/3 of the wgmma peak
        wgmma_flops=989e12,                  # [H100] SXM5 BF16 tensor 989 TFLOPS dense
        fp32_flops=67e12,                    # [H100] SXM5 FP32 67 TFLOPS
        supports_cp_async=True, supports_tma=True, supports_wgmma=True,
        nvrtc_arch="sm_90a",                 # arch-specific: wgmma / setmaxnreg need sm_90a
    ),
    Target(
        name="sm_100", major=10, minor=0,
        products=("B200", "GB200"),
        sm_count=148,                        # [B200] 148 SMs
        smem_per_sm=228 * KiB,               # [CCT] 10.0: 228 KB per SM
        max_smem_per_block_optin=227 * KiB,  # [CCT] 10.0: 227 KB per block
        max_threads_per_sm=2048,             # [CCT] 10.0: 64 warps
        max_blocks_per_sm=32,                # [CCT]
        l2_bytes=126 * MiB,                  # [B200] ~126 MB L2 (both dies; approximate)
        hbm_bandwidth=8.0e12,                # [B200] HBM3e 8 TB/s
        mma_sync_flops=None,                 # legacy mma.sync rate on Blackwell not characterized
        wgmma_flops=None,                    # no wgmma on sm_100 (tcgen05 instead: ~2.25 PFLOP/s dense bf16 [B200])
        fp32_flops=80e12,                    # [B200] FP32 ~80 TFLOPS (approximate)
        supports_cp_async=True, supports_tma=True, supports_wgmma=False,
        nvrtc_arch="sm_100",
        tested=False,
    ),
    Target(
        name="sm_120", major=12, minor=0,
        products=("RTX 5090", "RTX PRO 6000 Blackwell"),
        sm_count=170,                        # [GB202] RTX 5090: 170 SMs
        smem_per_sm=100 * KiB,               # [CCT] 12.0: 100 KB per SM
        max_smem_per_block_optin=99 * KiB,   # [CCT] 12.0: 99 KB per block = 101376 B
        max_threads_per_sm=1536,             # [CCT] 12.0: 48 warps
        max_blocks_per_sm=32,                # [CCT]
        l2_bytes=96 * MiB,                   # [GB202] RTX 5090: 96 MB L2
        hbm_bandwidth=1.792e12,              # [GB202] RTX 5090 GDDR7 1792 GB/s
        mma_sync_flops=209.5e12,             # [GB202] RTX 5090 FP16/BF16 tensor, FP32 accumulate, dense (approximate)
        wgmma_flops=None,
        fp32_flops=104.8e12,                 # [GB202] RTX 5090 FP32 104.8 TFLOPS
        supports_cp_async=True, supports_tma=True, supports_wgmma=False,
        nvrtc_arch="sm_120",
        tested=False,
    ),
)

TARGETS: dict[str, Target] = {t.name: t for t in _TARGET_LIST}

# Product-name aliases (lower case, spaces / dashes / underscores removed) -> target name.
_PRODUCT_ALIASES: dict[str, str] = {
    "a100": "sm_80", "a800": "sm_80", "a30": "sm_80",
    "a10": "sm_86", "a6000": "sm_86", "rtxa6000": "sm_86", "3090": "sm_86", "rtx3090": "sm_86",
    "3090ti": "sm_86", "rtx3090ti": "sm_86",
    "l40s": "sm_89", "l40": "sm_89", "l4": "sm_89", "4090": "sm_89", "rtx4090": "sm_89",
    "h100": "sm_90", "h800": "sm_90", "gh200": "sm_90",
    "b200": "sm_100", "gb200": "sm_100",
    "5090": "sm_120", "rtx5090": "sm_120",
}


def target_names() -> tuple[str, ...]:
    """Canonical target names, oldest first."""
    return tuple(TARGETS)


def _parse_arch(text: str) -> tuple[int, int] | None:
    """'sm_90a' / 'sm90' / 'compute_90' / '90' / '9.0' -> (9, 0); None if not an arch spelling."""
    s = text.strip().lower()
    m = re.fullmatch(r"(\d+)\.(\d+)", s)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"(?:sm_?|compute_?)?(\d{2,3})[af]?", s)
    if m:
        digits = m.group(1)
        return int(digits[:-1]), int(digits[-1])
    return None


def get_target(name: str | Target) -> Target:
    """Look a target up by arch ('sm_90', 'sm_90a', '90', '9.0') or product ('h100'), any case.

    A :class:`Target` passes through unchanged.  Unknown names raise :class:`TargetError` listing
    the valid ones.
    """
    if isinstance(name, Target):
        return name
    if not isinstance(name, str):
        raise TargetError(f"target must be a name or a Target, got {type(name).__name__}")
    arch = _parse_arch(name)
    if arch is not None:
        key = f"sm_{arch[0]}{arch[1]}"
        if key in TARGETS:
            return TARGETS[key]
    else:
        product = re.sub(r"[\s_\-]", "", name.strip().lower())
        for prefix in ("nvidia", "geforce", "tesla"):
            product = product.removeprefix(prefix)
        if product in _PRODUCT_ALIASES:
            return TARGETS[_PRODUCT_ALIASES[product]]
    raise TargetError(
        f"unknown target {name!r}; valid names: {', '.join(TARGETS)} "
        f"(also spelled like 'sm_90a', '90', '9.0', or a product: {', '.join(sorted(_PRODUCT_ALIASES))})"
    )


def detect_target(device: Any = None) -> Target:
    """The :class:`Target` of a CUDA device (default: the current one), via torch.

    The entry for the device's compute capability is used with the device's own SM count (and,
    where torch reports them, its L2 size and shared-memory limits) in place of the table's.  An
    arch the table lacks falls back to the nearest lower entry, with a warning.  Raises
    :class:`TargetError` when torch or CUDA is unavailable, or the device is older than sm_80.
    """
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a dependency
        raise TargetError("detect_target needs torch with CUDA; pass a target such as 'sm_90' instead") from e
    if not torch.cuda.is_available():
        raise TargetError(
            "detect_target: no CUDA device is available (torch.cuda.is_available() is False); "
            f"pass a target explicitly, e.g. get_target('sm_90') (valid: {', '.join(TARGETS)})"
        )
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    major, minor = int(props.major), int(props.minor)
    key = f"sm_{major}{minor}"
    base = TARGETS.get(key)
    changes: dict[str, Any] = {}
    if base is None:
        lower = [t for t in _TARGET_LIST if (t.major, t.minor) < (major, minor)]
        if not lower:
            raise TargetError(
                f"device {props.name!r} has compute capability {major}.{minor}; attncompiler needs sm_80 "
                f"or newer (cp.async, bf16 mma.sync); known targets: {', '.join(TARGETS)}"
            )
        base = lower[-1]
        warnings.warn(
            f"compute capability {major}.{minor} ({props.name}) is not in the target table; "
            f"using {base.name}'s numbers (nearest lower entry)",
            stacklevel=2,
        )
        changes.update(name=key, major=major, minor=minor, nvrtc_arch=key, tested=False,
                       supports_wgmma=False)
    changes["products"] = (str(props.name),) + tuple(p for p in base.products if p != props.name)
    changes["sm_count"] = int(props.multi_processor_count)
    for attr, field in (("L2_cache_size", "l2_bytes"),
                        ("shared_memory_per_block_optin", "max_smem_per_block_optin"),
                        ("shared_memory_per_multiprocessor", "smem_per_sm"),
                        ("max_threads_per_multi_processor", "max_threads_per_sm"),
                        ("regs_per_multiprocessor", "registers_per_sm")):
        value = getattr(props, attr, None)
        if isinstance(value, int) and value > 0:
            changes[field] = value
    return dataclasses.replace(base, **changes)
