"""Which head dims each schedule can plan on each target -- and, where not, the planner's reason.

    python3 -m attncompiler.plan.support          # the markdown table of docs/shapes.md

:func:`head_dim_support` asks the planners themselves (v2 forward, v1 forward, v2 backward), so the
answer is exactly what ``attncompiler.compile`` / ``.backward()`` would do; :func:`format_support_table`
renders it for docs/shapes.md (a CPU test keeps the two in step).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .model import PlanError, ProblemDims
from .targets import get_target
from .v1 import plan_v1
from .v2 import plan_v2
from .v2_bwd import plan_v2_bwd

__all__ = ["Support", "head_dim_support", "format_support_table", "SUPPORT_ARCHS", "SUPPORT_HEAD_DIMS", "main"]

SUPPORT_ARCHS: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
#: (head_dim, head_dim_v) rows of the table: the issue's list, dv != dqk pairs, and a non-multiple of 16.
SUPPORT_HEAD_DIMS: tuple[tuple[int, int], ...] = (
    (32, 32), (64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128), (128, 64), (256, 128), (40, 40),
)
_PLANNERS = (("v2", plan_v2), ("v1", plan_v1), ("backward", plan_v2_bwd))


@dataclass(frozen=True)
class Support:
    """One (target, D, DV): whether each of v2 forward, v1 forward and the backward plans, and why not."""

    arch: str
    head_dim: int
    head_dim_v: int
    planned: tuple[bool, bool, bool]  # v2, v1, backward
    reasons: tuple[str, ...]  # the PlanError message of each one that does not plan

    @property
    def cell(self) -> str:
        return "/".join("yes" if ok else "no" for ok in self.planned)


def head_dim_support(arch: str, head_dim: int, head_dim_v: int | None = None, dtype: str = "bf16") -> Support:
    """Plan (D, DV) with every schedule on ``arch``; keep each refusal's message."""
    dims, tgt = ProblemDims(head_dim, head_dim_v, dtype), get_target(arch)
    ok, reasons = [], []
    for name, planner in _PLANNERS:
        try:
            planner(dims, tgt)
            ok.append(True)
        except PlanError as e:
            ok.append(False)
            reasons.append(f"{name}: {e}")
    return Support(tgt.name, head_dim, int(dims.head_dim_v or head_dim), (ok[0], ok[1], ok[2]), tuple(reasons))


def format_support_table(archs: tuple[str, ...] = SUPPORT_ARCHS,
                         head_dims: tuple[tuple[int, int], ...] = SUPPORT_HEAD_DIMS) -> str:
    """Markdown: one row per (D, DV), one column per target, cells "v2/v1/backward" yes/no; then the
    planner's reason (first 160 characters) for every "no"."""
    lines = ["| D x DV | " + " | ".join(archs) + " |", "|---" * (len(archs) + 1) + "|"]
    notes: dict[str, list[str]] = {}
    for d, dv in head_dims:
        row = [head_dim_support(a, d, dv) for a in archs]
        lines.append(f"| {d}x{dv} | " + " | ".join(s.cell for s in row) + " |")
        for s in row:
            for r in s.reasons:
                notes.setdefault(_short(r), []).append(f"{d}x{dv} {s.arch}")
    if notes:
        lines.append("")
        lines.append("Why not (the planner's message, shortened):")
        lines.append("")
        for reason, where in notes.items():
            lines.append(f"* {', '.join(where)} -- {reason}")
    return "\n".join(lines)


def _short(reason: str, n: int = 160) -> str:
    """The gist of a planner message: the shared-memory overflows of the rejected candidates when
    there are any, else the message's first ``n`` characters."""
    one = " ".join(reason.split())
    name = one.split(":", 1)[0]
    over = [(int(a), int(b)) for a, b in re.findall(r"smem (\d+) B > (\d+) B", one)]
    if over and "feasible" in one:
        need, limit = min(over)
        return (f"{name}: candidates overflow shared memory (from {need} B; the limit is {limit} B per block), "
                f"the PlanError lists every candidate and why")
    return one if len(one) <= n else one[: n - 3] + "..."


def main() -> int:
    print(format_support_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
