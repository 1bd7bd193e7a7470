"""Shared by the v3 render / nvcc tests: the PTX nvcc makes of a generated translation unit for sm_90a."""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def ptx_sm90a(source: str) -> str:
    """nvcc -ptx of ``source`` for compute_90a (wgmma, setmaxnreg and the TMA instructions need the arch-specific
    target); raises CalledProcessError with nvcc's log when it does not compile."""
    with tempfile.TemporaryDirectory(prefix="ac-v3-ptx-") as d:
        src, out = Path(d) / "k.cu", Path(d) / "k.ptx"
        src.write_text(source)
        subprocess.run(["nvcc", "-ptx", "-std=c++17", "-DNDEBUG", "-gencode=arch=compute_90a,code=compute_90a",
                        "-o", str(out), str(src)], check=True, capture_output=True, text=True)
        return out.read_text()


def ptx_and_reports(sources: dict) -> tuple[dict, dict]:
    """``{name: PTX}`` and ``{name: nvcc report}`` (sm_90a cubin: registers, spills, ptxas log) of each generated
    translation unit in ``sources``, two nvcc processes at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from attncompiler.runtime.compiler import compile_with_nvcc

    with ThreadPoolExecutor(max_workers=2) as pool:
        ptx = dict(zip(sources, pool.map(ptx_sm90a, sources.values())))
        reps = dict(zip(sources, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), sources.values())))
    return ptx, reps
