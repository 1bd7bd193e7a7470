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


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cupy_cuda_major() -> int | None:
    """The CUDA major version of the installed CuPy wheel (cupy-cuda13x -> 13), None without one."""
    for major in (13, 12, 11):
        if _version(f"cupy-cuda{major}x") is not None:
            return major
    return None


def _need_nvrtc() -> None:
    """Skip where neither the test extra's NVRTC wheel nor another NVRTC is installed; where the wheel is
    installed for CuPy's CUDA major version (``pip install -e ".[test]"`` on Linux with cupy-cuda13x, as CI
    does), NVRTC must load."""
    why = nvrtc_unavailable()
    if why is None:
        return
    wheel = _version("nvidia-cuda-nvrtc")
    if wheel is not None and int(wheel.split(".")[0]) == _cupy_cuda_major():
        pytest.fail(f"nvidia-cuda-nvrtc {wheel} is installed for CuPy's CUDA {_cupy_cuda_major()} but {why}")
    pytest.skip(f"{why} (pip install -e '.[test]' installs NVRTC for CUDA 13 on Linux)")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_offline_check_catches_what_only_nvrtc_refuses() -> None:
    _need_nvrtc()
    assert compile_with_nvcc(_NVCC_ONLY, "sm_80", nvrtc=False).nvrtc_checked is False  # nvcc alone takes it
    with pytest.raises(CompileError, match="(?s)NVRTC failed.*host functions are not allowed in JIT mode"):
        compile_with_nvcc(_NVCC_ONLY, "sm_80")
    fixed = _NVCC_ONLY.replace("auto& x", "float& x")
    assert compile_with_nvcc(fixed, "sm_90a").nvrtc_checked is True


class _FakeDevice:
    """Stands in for cupy.cuda.Device: records the device a call was made under."""

    current: list[int] = []

    def __init__(self, index: int) -> None:
        self.index = index

    def __enter__(self) -> None:
        _FakeDevice.current.append(self.index)

    def __exit__(self, *exc: object) -> None:
        _FakeDevice.current.pop()


@pytest.mark.parametrize("nbytes, expect_call", [(0, False), (48 * 1024, False), (48 * 1024 + 16, True),
                                                 (232448, True)])
def test_allow_dynamic_smem_opts_in_above_48k(monkeypatch: pytest.MonkeyPatch, nbytes: int, expect_call: bool) -> None:
    cupy_cuda = pytest.importorskip("cupy.cuda")
    from attncompiler.runtime import compiler

    calls: list[tuple[int, int, int, list[int]]] = []
    monkeypatch.setattr(cupy_cuda, "Device", _FakeDevice)
    monkeypatch.setattr(cupy_cuda.driver, "funcSetAttribute",
                        lambda ptr, attr, value: calls.append((ptr, attr, value, list(_FakeDevice.current))))
    compiler.allow_dynamic_smem(0x1234, nbytes, 3)
    if expect_call:
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES is 8 in the driver's enum; set under the kernel's device
        assert calls == [(0x1234, 8, nbytes, [3])]
    else:
        assert calls == []


def _fake_disk(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The disk cache in tmp_path, keyed by the source text (no NVRTC needed)."""
    from attncompiler.runtime import compiler

    monkeypatch.setenv("ATTNCOMPILER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNCOMPILER_DISABLE_CACHE", raising=False)
    monkeypatch.setattr(compiler, "_disk_paths",
                        lambda src, arch: (tmp_path / f"{src}-{arch}.cubin", tmp_path / f"{src}-{arch}.json"))


def test_precompile_compiles_only_what_the_disk_lacks(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from attncompiler.runtime import compiler

    _fake_disk(monkeypatch, tmp_path)
    calls: list = []
    monkeypatch.setattr(compiler, "_compile_in_pool", lambda jobs, workers: calls.append((list(jobs), workers)))
    for name in ("a-sm_90a.cubin", "a-sm_90a.json", "b-sm_90a.cubin"):  # b's report is missing
        (tmp_path / name).write_bytes(b"x")
    jobs = [("a", "sm_90a"), ("b", "sm_90a"), ("c", "sm_90a"), ("a", "sm_90a")]
    assert compiler.precompile_to_disk(jobs, workers=3) == 3
    assert calls == [([("b", "sm_90a"), ("c", "sm_90a")], 3)]
    for name in ("b-sm_90a.json", "c-sm_90a.cubin", "c-sm_90a.json"):
        (tmp_path / name).write_bytes(b"x")
    assert compiler.precompile_to_disk(jobs) == 3 and len(calls) == 1  # all on disk: no pool at all


def test_precompiles_take_turns(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Two precompiles at once (xdist workers: processes; here threads, which the file lock excludes alike): the
    second waits for the first and then finds its kernels on disk."""
    import threading
    import time

    from attncompiler.runtime import compiler

    _fake_disk(monkeypatch, tmp_path)
    active, log = [0], []

    def pool(jobs, workers):
        active[0] += 1
        log.append((tuple(jobs), active[0]))
        time.sleep(0.3)
        for src, arch in jobs:
            for p in compiler._disk_paths(src, arch):
                p.write_bytes(b"x")
        active[0] -= 1

    monkeypatch.setattr(compiler, "_compile_in_pool", pool)
    jobs = [("k1", "sm_90a"), ("k2", "sm_90a")]
    threads = [threading.Thread(target=compiler.precompile_to_disk, args=(jobs,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert log == [(tuple(jobs), 1)]  # one compile, never two at once
