"""Every environment variable attncompiler reads, declared in one place.

=============================  =================================================================
variable                       meaning
=============================  =================================================================
ATTNCOMPILER_CACHE_DIR         where compiled cubins and tuned plans are kept
                               (default: $XDG_CACHE_HOME/attncompiler or ~/.cache/attncompiler)
ATTNCOMPILER_DISABLE_CACHE     "1": never read or write the disk cache (memory cache still used)
ATTNCOMPILER_CUDA_INCLUDE      extra include folder holding cuda_fp16.h / cuda_bf16.h for NVRTC
ATTNCOMPILER_NVCC              the nvcc used for offline compile checks (default: nvcc on PATH)
ATTNCOMPILER_VERBOSE           "1": print each compilation and its time to stderr
ATTNCOMPILER_TUNED_DIR         where autotuned plans are kept (default: <cache dir>/tuned)
ATTNCOMPILER_USE_TUNED         "0": ``compile(schedule="auto")`` ignores autotuned plans (default "1")
XDG_CACHE_HOME                 the cache root's parent when ATTNCOMPILER_CACHE_DIR is unset (default ~/.cache)
CUDA_PATH, CUDA_HOME           CUDA toolkits whose include/ folders NVRTC searches (after ATTNCOMPILER_CUDA_INCLUDE)
OUT                            ``attncompiler bench``'s output folder when --out is not given
=============================  =================================================================
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "disk_cache_enabled", "cuda_include_override", "cuda_toolkit_includes", "nvcc_path",
           "verbose", "tuned_dir", "use_tuned", "bench_out_dir", "ENV_VARS"]

ENV_VARS = (
    "ATTNCOMPILER_CACHE_DIR",
    "ATTNCOMPILER_DISABLE_CACHE",
    "ATTNCOMPILER_CUDA_INCLUDE",
    "ATTNCOMPILER_NVCC",
    "ATTNCOMPILER_VERBOSE",
    "ATTNCOMPILER_TUNED_DIR",
    "ATTNCOMPILER_USE_TUNED",
    "XDG_CACHE_HOME",
    "CUDA_PATH",
    "CUDA_HOME",
    "OUT",
)


def cache_dir() -> Path:
    """The on-disk cache root (not created here)."""
    override = os.environ.get("ATTNCOMPILER_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attncompiler"


def disk_cache_enabled() -> bool:
    return os.environ.get("ATTNCOMPILER_DISABLE_CACHE", "0") not in ("1", "true", "yes")


def cuda_include_override() -> str | None:
    return os.environ.get("ATTNCOMPILER_CUDA_INCLUDE") or None


def cuda_toolkit_includes() -> list[str]:
    """The include/ folders of the toolkits named by CUDA_PATH and CUDA_HOME, in that order."""
    return [os.path.join(os.environ[var], "include") for var in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(var)]


def nvcc_path() -> str:
    return os.environ.get("ATTNCOMPILER_NVCC", "nvcc")


def verbose() -> bool:
    return os.environ.get("ATTNCOMPILER_VERBOSE", "0") in ("1", "true", "yes")


def tuned_dir() -> Path:
    """Where autotuned plans are kept (not created here)."""
    override = os.environ.get("ATTNCOMPILER_TUNED_DIR")
    if override:
        return Path(override).expanduser()
    return cache_dir() / "tuned"


def use_tuned() -> bool:
    return os.environ.get("ATTNCOMPILER_USE_TUNED", "1") not in ("0", "false", "no")


def bench_out_dir() -> Path | None:
    """The benchmark output folder named by OUT, if set."""
    out = os.environ.get("OUT")
    return Path(out) if out else None
