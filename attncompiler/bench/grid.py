"""The benchmark grids (frozen dataclasses), what each case measures, and the time budget they fit in.

Nothing here touches torch or the GPU: the grids, the list of planned measurements and the runtime
estimate are plain data, so they are tested on the CPU and printed before a run starts.

Standard grid (the FlashAttention papers' setup): B·N = 16k tokens, H·d = 2048, bf16, N from 512 to
16k, d in {64, 128, 256}, causal and not, forward / backward / forward+backward.  Variant grid: ALiBi,
softcap, sliding window, document mask and dropout at d = 128, N in {1k, 4k, 16k}.  v1 runs only the
forward at N <= 2k (it is FlashAttention-1's loop order with scalar FMA: slow by design); a v1
forward's backward is v2's, so the backward is measured once, as v2.  v3 (the Hopper schedule,
sm_90a) is a forward schedule: it runs in the forward rows (elsewhere its rows say why not).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

__all__ = [
    "TOKENS", "HIDDEN", "SCHEDULES", "SDPA_IMPLS", "PEERS", "IMPLS", "MODES", "VARIANTS", "SECTIONS",
    "IMPL_LABELS", "MODE_LABELS", "Case", "VariantParams", "StandardGrid", "VariantGrid", "LatencyGrid",
    "MemoryGrid", "Suite", "Measurement", "unsupported_reason", "grid_measurements", "suite_measurements",
    "flex_compile_keys", "estimate_seconds", "full_suite", "quick_suite", "restrict", "parse_only", "ONLY_CHOICES",
]

TOKENS = 16384  # B * N
HIDDEN = 2048  # H * d
SCHEDULES = ("v1", "v2", "v3")
SDPA_IMPLS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
PEERS = (*SDPA_IMPLS, "flex")
IMPLS = (*SCHEDULES, *PEERS)
MODES = ("fwd", "bwd", "fwdbwd")
VARIANTS = ("alibi", "softcap", "sliding_window", "document", "dropout")
SECTIONS = ("latency", "forward", "backward", "variants", "memory")  # the order a run takes

IMPL_LABELS = {
    "v1": "attncompiler v1", "v2": "attncompiler v2", "v3": "attncompiler v3", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA efficient", "flex": "FlexAttention", "sdpa_math": "SDPA math",
}
MODE_LABELS = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}

# Seconds, for the budget: one timed measurement (do_bench: 5-call estimate, warmup, ~60 ms of
# repeats, the first call and Python around it; a backward also builds one graph per input set), a
# v1 one (tens of ms per call), one FlexAttention torch.compile (inductor + triton, per mask/score_mod,
# head dim and grad mode), its recompile for B = 1 (dynamo's 0/1 specialization; the triton kernels
# come from the cache), one latency subprocess, one memory probe, and the fixed part (imports, GEMM
# ceiling, parallel NVRTC precompile, report and plots).
COST_MEASURE_S = {"fwd": 0.2, "bwd": 0.3, "fwdbwd": 0.3}
COST_V1_S = 0.6
COST_FLEX_COMPILE_S = 6.0
COST_FLEX_RECOMPILE_S = 2.0
COST_LATENCY_S = {"v1": 10.0, "v2": 14.0, "v3": 14.0, "flex": 30.0}
COST_MEMORY_S = 0.4
COST_FIXED_S = 30.0


@dataclass(frozen=True)
class Case:
    """One attention problem: a variant at one shape (bf16, q/k/v of shape (B, H, N, d))."""

    section: str  # "standard" | "variants"
    variant: str  # "plain" | "causal" | one of VARIANTS
    d: int
    N: int
    B: int
    H: int
    causal: bool

    @property
    def mask(self) -> str:
        """The panel a case is plotted in: the mask for the standard grid, the variant otherwise."""
        if self.section == "standard":
            return "causal" if self.causal else "non-causal"
        return self.variant

    def label(self) -> str:
        return f"{self.variant} d={self.d} N={self.N} B={self.B} H={self.H}"


@dataclass(frozen=True)
class VariantParams:
    """The variants' parameters (the same for attncompiler and every peer)."""

    window: int = 1024  # sliding window: q - window <= kv <= q
    num_docs: int = 4  # document mask: equal-length documents packed into N
    softcap: float = 30.0  # cap * tanh(score / cap), causal (as in Gemma 2)
    dropout_p: float = 0.1  # non-causal
    alibi_causal: bool = True  # ALiBi's usual language-model form

    def causal(self, variant: str) -> bool:
        return {"alibi": self.alibi_causal, "softcap": True, "sliding_window": True}.get(variant, False)


def _shape(N: int, d: int, tokens: int, hidden: int) -> tuple[int, int]:
    return max(1, tokens // N), max(1, hidden // d)


@dataclass(frozen=True)
class StandardGrid:
    head_dims: tuple[int, ...] = (64, 128, 256)
    seqlens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    causal: tuple[bool, ...] = (False, True)
    modes: tuple[str, ...] = MODES
    impls: tuple[str, ...] = IMPLS
    #: impls left out of the forward+backward step (the step is fwd + bwd, both measured alone too)
    step_skip: tuple[str, ...] = ("sdpa_efficient",)
    tokens: int = TOKENS
    hidden: int = HIDDEN
    v1_max_n: int = 2048

    def cases(self) -> list[Case]:
        out = []
        for d in self.head_dims:
            for N in self.seqlens:
                B, H = _shape(N, d, self.tokens, self.hidden)
                for c in self.causal:
                    out.append(Case("standard", "causal" if c else "plain", d, N, B, H, c))
        return out


@dataclass(frozen=True)
class VariantGrid:
    variants: tuple[str, ...] = VARIANTS
    seqlens: tuple[int, ...] = (1024, 4096, 16384)
    head_dim: int = 128
    modes: tuple[str, ...] = ("fwd", "bwd")
    impls: tuple[str, ...] = IMPLS
    step_skip: tuple[str, ...] = ()
    params: VariantParams = field(default_factory=VariantParams)
    tokens: int = TOKENS
    hidden: int = HIDDEN
    v1_max_n: int = 2048

    def cases(self) -> list[Case]:
        out = []
        for v in self.variants:
            for N in self.seqlens:
                B, H = _shape(N, self.head_dim, self.tokens, self.hidden)
                out.append(Case("variants", v, self.head_dim, N, B, H, self.params.causal(v)))
        return out


@dataclass(frozen=True)
class LatencyGrid:
    """Compile latency: each impl's first call in a fresh process with empty caches, and warm."""

    impls: tuple[str, ...] = ("v1", "v2", "v3", "flex")
    head_dim: int = 128
    seqlen: int = 4096
    heads: int = 16
    batch: int = 4
    causal: bool = True
    timeout_s: float = 150.0


@dataclass(frozen=True)
class MemoryGrid:
    """Peak memory of one sequence (B = 1) against N, beside SDPA's math backend."""

    seqlens: tuple[int, ...] = tuple(1024 << i for i in range(8))  # 1k .. 128k
    head_dim: int = 128
    heads: int = 16
    batch: int = 1
    causal: bool = True
    modes: tuple[str, ...] = ("fwd", "fwdbwd")
    impls: tuple[str, ...] = ("v2", "sdpa_flash", "sdpa_math")


@dataclass(frozen=True)
class Suite:
    name: str
    standard: StandardGrid = field(default_factory=StandardGrid)
    variants: VariantGrid = field(default_factory=VariantGrid)
    latency: LatencyGrid = field(default_factory=LatencyGrid)
    memory: MemoryGrid = field(default_factory=MemoryGrid)
    sections: tuple[str, ...] = SECTIONS
    budget_s: float = 470.0  # soft: measurements past it are recorded as skipped (whole run < 8 min)
    warmup_ms: float = 15.0
    rep_ms: float = 60.0
    flex_dynamic: bool = True  # one FlexAttention compile per mask/score_mod, not one per shape


@dataclass(frozen=True)
class Measurement:
    case: Case
    mode: str
    impl: str
    unsupported: str | None = None  # the reason, when the impl cannot express the case (a row, no timing)


def unsupported_reason(impl: str, variant: str) -> str | None:
    """Why ``impl`` cannot run ``variant`` (None: it can)."""
    if impl.startswith("sdpa_") and variant == "softcap":
        return "SDPA has no score_mod (softcap)"
    if impl == "sdpa_flash" and variant in ("alibi", "sliding_window", "document"):
        return "SDPA's flash backend takes no attn_mask"
    if impl == "flex" and variant == "dropout":
        return "FlexAttention has no dropout"
    return None


def grid_measurements(grid: StandardGrid | VariantGrid, modes: Sequence[str] | None = None) -> list[Measurement]:
    """Every (case, mode, impl) of a grid, in run order (cases of one shape together)."""
    modes = tuple(m for m in grid.modes if modes is None or m in modes)
    out = []
    for case in grid.cases():
        for mode in modes:
            for impl in grid.impls:
                if impl == "v1" and (mode != "fwd" or case.N > grid.v1_max_n):
                    continue  # v1's backward is v2's; v1 is slow by design at long N
                if impl == "v3" and mode != "fwd":
                    continue  # v3 is a forward schedule (Hopper); its backward is v2's
                if mode == "fwdbwd" and impl in grid.step_skip:
                    continue
                out.append(Measurement(case, mode, impl, unsupported_reason(impl, case.variant)))
    return out


def suite_measurements(suite: Suite) -> dict[str, list[Measurement]]:
    """The timed measurements of each grid section that ``suite`` runs."""
    out: dict[str, list[Measurement]] = {}
    if "forward" in suite.sections:
        out["forward"] = grid_measurements(suite.standard, ("fwd",))
    if "backward" in suite.sections:
        out["backward"] = grid_measurements(suite.standard, ("bwd", "fwdbwd"))
    if "variants" in suite.sections:
        out["variants"] = grid_measurements(suite.variants)
    return out


def flex_compile_keys(ms: Iterable[Measurement], dynamic: bool = True) -> set[tuple]:
    """The distinct FlexAttention compilations ``ms`` need: per head dim, mask/score_mod and grad mode
    (the backward and the step share the training graph); with dynamic shapes once more for B = 1
    (dynamo specializes a size-1 dimension), with static shapes once per shape."""
    keys = set()
    for m in ms:
        if m.impl != "flex" or m.unsupported:
            continue
        shape = (m.case.B == 1,) if dynamic else (m.case.B, m.case.N)
        keys.add((m.case.d, m.case.variant, m.mode == "fwd", *shape))
    return keys


def estimate_seconds(suite: Suite) -> dict[str, float]:
    """Expected wall time per section and in total (the constants above), for budgeting the grids."""
    est: dict[str, float] = {"fixed": COST_FIXED_S}
    flex_seen: set[tuple] = set()
    for section, ms in suite_measurements(suite).items():
        t = 0.0
        for m in ms:
            if not m.unsupported:
                t += COST_V1_S if m.impl == "v1" else COST_MEASURE_S[m.mode]
        keys = flex_compile_keys(ms, suite.flex_dynamic) - flex_seen
        flex_seen |= keys
        b1 = sum(1 for k in keys if suite.flex_dynamic and k[-1] is True)  # the B = 1 recompiles
        est[section] = t + COST_FLEX_COMPILE_S * (len(keys) - b1) + COST_FLEX_RECOMPILE_S * b1
    if "latency" in suite.sections:
        est["latency"] = sum(COST_LATENCY_S.get(i, 10.0) for i in suite.latency.impls)
    if "memory" in suite.sections:
        mg = suite.memory
        est["memory"] = COST_MEMORY_S * len(mg.seqlens) * len(mg.modes) * len(mg.impls)
    est["total"] = sum(est.values())
    return est


def full_suite() -> Suite:
    """The default run: every section, sized to finish in under 8 minutes on an H100 / H200."""
    return Suite("full")


def quick_suite() -> Suite:
    """A smoke run (~2 minutes): d = 128, N in {1k, 4k, 16k}, the sliding window, v2's compile latency."""
    return Suite(
        "quick",
        standard=StandardGrid(head_dims=(128,), seqlens=(1024, 4096, 16384), modes=("fwd", "bwd")),
        variants=VariantGrid(variants=("sliding_window",), seqlens=(4096,)),
        latency=LatencyGrid(impls=("v2",)),
        memory=MemoryGrid(seqlens=(1024, 4096, 16384, 32768), impls=("v2", "sdpa_math")),
        budget_s=120.0,
    )


ONLY_CHOICES = ("forward", "backward", "variants", "latency", "memory")


def parse_only(values: Sequence[str] | None) -> tuple[str, ...]:
    """``--only`` values (repeatable, or comma-separated) -> sections, validated."""
    if not values:
        return SECTIONS
    chosen = []
    for v in values:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            if part not in ONLY_CHOICES:
                raise ValueError(f"--only: expected one of {', '.join(ONLY_CHOICES)}, got {part!r}")
            chosen.append(part)
    return tuple(s for s in SECTIONS if s in chosen)


def restrict(suite: Suite, sections: Sequence[str]) -> Suite:
    """``suite`` running only ``sections`` (in the suite's order)."""
    return replace(suite, sections=tuple(s for s in SECTIONS if s in sections))
