"""CPU: every offline compile check (``compile_with_nvcc``) also compiles the source with NVRTC, the runtime's own
compiler, so that code nvcc accepts but NVRTC refuses fails in CI rather than on the first GPU run."""
from __future__ import annotations

import importlib.metadata
import shutil

import pytest

from attncompiler.runtime.compiler import CompileError, compile_with_nvcc, nvrtc_unavailable

# nvcc takes this; NVRTC (JIT mode) compiles the generic lambda nested in a device lambda as host code and stops
_NVCC_ONLY = """
extern "C" __global__ void k(float* out) {
  auto outer = [&](int i) {
    auto inner = [&](auto& x, int j) { x += j; };
    float v = 0.f;
    inner(v, i);
    return v;
  };
  out[threadIdx.x] = outer(threadIdx.x);
}
"""


def _need_nvrtc() -> None:
    """Skip where neither the test extra's NVRTC wheel nor another NVRTC is installed; where the wheel is
    installed (``pip install -e ".[test]"`` on Linux, as CI does), NVRTC must load."""
    why = nvrtc_unavailable()
    try:
        wheel = importlib.metadata.version("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        wheel = None
    if why is not None:
        assert wheel is None, f"nvidia-cuda-nvrtc {wheel} is installed but {why}"
        pytest.skip(f"{why} (pip install -e '.[test]' installs it on Linux)")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_offline_check_catches_what_only_nvrtc_refuses() -> None:
    _need_nvrtc()
    assert compile_with_nvcc(_NVCC_ONLY, "sm_80", nvrtc=False).nvrtc_checked is False  # nvcc alone takes it
    with pytest.raises(CompileError, match="(?s)NVRTC failed.*host functions are not allowed in JIT mode"):
        compile_with_nvcc(_NVCC_ONLY, "sm_80")
    fixed = _NVCC_ONLY.replace("auto& x", "float& x")
    assert compile_with_nvcc(fixed, "sm_90a").nvrtc_checked is True
