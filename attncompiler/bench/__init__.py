"""Benchmark suite: attncompiler's schedules beside torch SDPA (flash, cuDNN, efficient) and FlexAttention.

    attncompiler bench [--quick] [--out DIR] [--only forward|backward|variants|latency|memory]
                       [--report-only bench.json]

Modules: :mod:`.grid` (the grids, the budget), :mod:`.measure` (timing, FLOPs, rotating inputs,
GEMM ceiling), :mod:`.peers` (SDPA, FlexAttention), :mod:`.ours` (attncompiler's kernels),
:mod:`.latency` (compile latency in fresh processes), :mod:`.memory` (peak memory against N),
:mod:`.report` (markdown and PNG plots), :mod:`.progress`, :mod:`.runner` (the command).
Importing this package imports neither torch nor matplotlib.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["main", "add_arguments"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``attncompiler bench`` with ``argv`` (the options after ``bench``)."""
    from .runner import main as _main

    return _main(argv)


def add_arguments(parser: Any) -> None:
    """Add the bench options to an argparse parser (``attncompiler bench``'s subparser)."""
    from .runner import add_arguments as _add

    _add(parser)
