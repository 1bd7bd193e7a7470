"""The set-up the benchmark scripts share (bench_forward.py, bench_backward.py, bench_decode.py, the sweeps): the
device banner, the JSON-lines result log, the sweeps' median summary and the parser of plan-option values.  Imported as a sibling module (``from _results import ...``:
the scripts run as ``PYTHONPATH=. python3 benchmarks/<script>.py``, which puts benchmarks/ on the path).
"""
from __future__ import annotations

import json
import os
from typing import Any

import torch


def option_value(v: str) -> Any:
    """A plan option's value as written on a command line (``true`` / ``false``, an int, else the string)."""
    if v in ("true", "false"):
        return v == "true"
    return int(v) if v.lstrip("-").isdigit() else v


def sweep_item(item: str) -> tuple[int, str, dict[str, Any], int, int, int]:
    """``d:variant[:option=value...]`` as the sweeps write it: (d, variant, plan options, N, B, H), with ``n=`` the
    sequence length (default 16k) and B*N = 16k tokens, H*d = 2048."""
    d_s, var, *opts = item.split(":")
    d = int(d_s)
    options = {k: option_value(v) for k, v in (o.split("=") for o in opts)}
    N = int(options.pop("n", 16384))
    return d, var, options, N, 16384 // N, 2048 // d


def device_banner(extra: str = "") -> str:
    """Print ``# <device>, torch <version><extra>`` and return the device name."""
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}{extra}", flush=True)
    return dev


def print_round_medians(times: dict[str, list[float]], rounds: int, what: str = "TFLOP/s") -> None:
    """The sweeps' summary (v3_sweep.py, v3_bwd_sweep.py): per config, the median of its ``rounds``
    interleaved measurements with their range (nothing when there was one round)."""
    if rounds <= 1:
        return
    print(f"# median {what} over {rounds} interleaved rounds")
    for item, ts in times.items():
        ts = sorted(ts)
        print(f"{item}: {ts[len(ts) // 2]:.1f} (min {ts[0]:.1f}, max {ts[-1]:.1f})", flush=True)


class Results:
    """One run's records: each kept in ``rows``, appended as a JSON line to $OUT/<name>.jsonl (or
    /tmp/<name>.jsonl; never truncated, so runs accumulate) and printed as it comes."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(os.environ.get("OUT", "/tmp"), f"{name}.jsonl")
        self._file = open(self.path, "a")
        self.rows: list[dict[str, Any]] = []

    def add(self, **rec: Any) -> None:
        self.rows.append(rec)
        self.meta(**rec)
        print(json.dumps(rec), flush=True)

    def meta(self, **info: Any) -> None:
        """A line for the file only (not a row, not printed): the device, a reference bandwidth."""
        self._file.write(json.dumps(info) + "\n")
        self._file.flush()
