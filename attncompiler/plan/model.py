"""Shared plan types: problem dimensions, the Plan base class, candidates and the occupancy model."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .targets import Target, get_target

__all__ = [
    "PlanError", "ProblemDims", "Plan", "Candidate", "Occupancy",
    "resolve_dims", "resolve_target", "elem_bytes", "occupancy", "ELEM_BYTES",
]

# bytes per element of each compute dtype (bf16 and fp16 are both 16-bit)
ELEM_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2}


class PlanError(ValueError):
    """No feasible plan (or an invalid request); the message carries the reason with numbers."""


@dataclass(frozen=True)
class ProblemDims:
    """The only facts of an attention variant the planner needs: head dims and dtype."""

    head_dim: int
    head_dim_v: int | None = None  # None: same as head_dim
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)
        for label, d in (("head_dim", self.head_dim), ("head_dim_v", self.head_dim_v)):
            if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
                raise PlanError(f"{label} must be a positive int, got {d!r}")
        if self.dtype not in ELEM_BYTES:
            raise PlanError(f"dtype {self.dtype!r} not supported; expected one of {', '.join(ELEM_BYTES)}")


def resolve_dims(ir_or_dims: Any) -> ProblemDims:
    """An AttentionIR (anything with head_dim, head_dim_v, dtype) or a ProblemDims -> ProblemDims."""
    if isinstance(ir_or_dims, ProblemDims):
        return ir_or_dims
    try:
        return ProblemDims(int(ir_or_dims.head_dim), int(ir_or_dims.head_dim_v), str(ir_or_dims.dtype))
    except AttributeError as e:
        raise PlanError(
            f"expected an AttentionIR or ProblemDims, got {type(ir_or_dims).__name__} ({e})"
        ) from None


def resolve_target(target: Target | str | None) -> Target:
    """A Target, a name for :func:`get_target`, or None for the current CUDA device."""
    if target is None:
        from .targets import detect_target
        return detect_target()
    return get_target(target)


def elem_bytes(dtype: str) -> int:
    return ELEM_BYTES[dtype]


@dataclass(frozen=True)
class Occupancy:
    """Resident CTAs per SM and which resource limits them (each limit as a count of CTAs)."""

    ctas_per_sm: int
    by_smem: int
    by_registers: int
    by_threads: int
    by_blocks: int

    def explain(self, target: Target, smem_bytes: int, regs: int, threads: int) -> str:
        alloc = _regs_alloc_per_thread(target, regs)
        return (
            f"occupancy on {target.name}: smem floor({target.smem_per_sm} / ({smem_bytes} + "
            f"{target.smem_reserved_per_block} reserved)) = {self.by_smem}, registers "
            f"floor({target.registers_per_sm} / ({alloc} x {threads})) = {self.by_registers}, threads "
            f"{target.max_threads_per_sm} / {threads} = {self.by_threads}, blocks <= {self.by_blocks} "
            f"-> {self.ctas_per_sm} CTA(s)/SM ({self.ctas_per_sm * threads // target.warp_size} warps)"
        )


def _regs_alloc_per_thread(target: Target, regs: int) -> int:
    """Registers really allocated per thread: per-warp allocation rounds up to 256 (8 per thread)."""
    unit = target.register_alloc_unit_per_warp // target.warp_size
    return -(-regs // unit) * unit


def occupancy(target: Target, smem_bytes: int, regs_per_thread: int, threads: int) -> Occupancy:
    """CTAs per SM allowed by shared memory, registers, threads and the block limit."""
    by_smem = target.smem_per_sm // (smem_bytes + target.smem_reserved_per_block)
    by_regs = target.registers_per_sm // (_regs_alloc_per_thread(target, regs_per_thread) * threads)
    by_threads = target.max_threads_per_sm // threads
    by_blocks = target.max_blocks_per_sm
    return Occupancy(min(by_smem, by_regs, by_threads, by_blocks), by_smem, by_regs, by_threads, by_blocks)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How one attention variant is tiled on one target, and why.

    ``block_m`` / ``block_n`` are the query / key tile sizes (FA1's B_r / B_c for v1).
    ``reasons`` are the planner's steps in words, with the numbers that drove them.
    """

    schedule: str
    target: str
    head_dim: int
    head_dim_v: int
    dtype: str
    block_m: int
    block_n: int
    num_warps: int
    num_threads: int
    smem_bytes: int
    est_registers_per_thread: int
    ctas_per_sm: int
    reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def needs_smem_optin(self) -> bool:
        """True when the kernel needs cudaFuncAttributeMaxDynamicSharedMemorySize (> 48 KiB)."""
        return self.smem_bytes > 48 * 1024

    def _config_lines(self) -> list[str]:
        return [
            f"  tiles: BLOCK_M={self.block_m} query rows x BLOCK_N={self.block_n} keys; "
            f"{self.num_warps} warps ({self.num_threads} threads)",
            f"  smem {self.smem_bytes} B/CTA{' (dynamic smem opt-in)' if self.needs_smem_optin else ''}; "
            f"~{self.est_registers_per_thread} registers/thread; ~{self.ctas_per_sm} CTA(s)/SM",
        ]

    def describe(self) -> str:
        """Multi-line explanation: the configuration, then the numbered reasons."""
        head = (f"{self.schedule} plan for {self.target}: head_dim={self.head_dim}, "
                f"head_dim_v={self.head_dim_v}, {self.dtype}")
        lines = [head, *self._config_lines(), "  why:"]
        lines += [f"   {i}. {r}" for i, r in enumerate(self.reasons, 1)]
        return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One configuration the v2 search looked at: accepted (feasible) or rejected, and why.

    ``mt`` is BLOCK_M / (16 * num_warps) (m16 mma tiles per warp) and may be fractional for a
    rejected combination.  ``score`` is the ranking key of an accepted candidate (higher is
    better); ``rank`` its 1-based position among the accepted ones (0 when rejected).
    """

    schedule: str
    block_m: int
    block_n: int
    num_warps: int
    num_threads: int
    mt: float
    q_in_regs: bool
    smem_bytes: int
    est_registers_per_thread: int
    ctas_per_sm: int
    accepted: bool
    reason: str
    score: tuple[int, ...] = ()
    rank: int = 0
    stages: int = 1  # K/V shared-memory buffers

    @property
    def config(self) -> tuple[int, int, int]:
        return (self.block_m, self.block_n, self.num_warps)

    @property
    def options(self) -> dict[str, Any]:
        """The plan options that force this candidate (``plan_v2(ir, target, **c.options)``)."""
        return {"block_m": self.block_m, "block_n": self.block_n, "num_warps": self.num_warps,
                "q_in_regs": self.q_in_regs, "stages": self.stages}
