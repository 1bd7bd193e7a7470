"""The whole benchmark suite in one process: attncompiler v1 / v2 beside torch SDPA and FlexAttention.

    PYTHONPATH=. python3 benchmarks/run_all.py [--quick] [--out DIR] [--only SECTION] [--report-only bench.json]

The same entry point as ``attncompiler bench`` (attncompiler/bench/runner.py): writes bench.json,
bench.md and PNG plots to --out (default $OUT, else ./bench_results).
"""
from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:  # run from a checkout without PYTHONPATH
        sys.path.insert(0, root)
    from attncompiler.bench import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
