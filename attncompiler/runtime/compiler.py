"""Run-time compilation: NVRTC (through CuPy's bindings) to a cubin, loaded with CuPy.

Two cache levels: an in-process dict of loaded kernels keyed by (source digest, arch, device),
and an on-disk cubin cache keyed by a digest of (source, options, NVRTC version, arch), written
atomically (temporary file + ``os.replace``) so concurrent processes never read a torn file.
``compile_with_nvcc`` is the offline path used without a GPU (CI): it builds a cubin with nvcc and
reports registers, spills and shared memory, and compiles the same source with NVRTC too where NVRTC loads
(it needs no GPU: CuPy's bindings and the ``nvidia-cuda-nvrtc`` wheel), because the two front ends differ:
NVRTC compiles in JIT mode, where code nvcc takes (a generic lambda nested in a device lambda) is host code.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import env

__all__ = ["CompileError", "LoadedKernel", "NvccReport", "compile_kernel", "compile_functions", "compile_with_nvcc",
           "nvrtc_options", "nvrtc_unavailable", "compile_stats", "precompile_to_disk", "allow_dynamic_smem",
           "DEFAULT_DYNAMIC_SMEM", "PtxasReport", "ptxas_report"]

_NVRTC_FLAGS = ("-std=c++17", "-DNDEBUG")
#: bytes of dynamic shared memory a kernel may launch with before it must opt in (every sm_70+ GPU)
DEFAULT_DYNAMIC_SMEM = 48 * 1024
_MAX_DYNAMIC_SMEM_ATTR = 8  # the driver's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class CompileError(RuntimeError):
    """The generated source did not compile; the message carries the compiler log."""


@dataclass(frozen=True)
class LoadedKernel:
    """A compiled, loaded kernel function (CUfunction handle) on one device."""

    function: object = field(repr=False)  # cupy.cuda.function.Function
    module: object = field(repr=False)  # keeps the CUmodule alive
    arch: str
    device: int
    compile_seconds: float
    from_disk_cache: bool

    @property
    def ptr(self) -> int:
        return int(self.function.ptr)


_lock = threading.Lock()
_memory: dict[tuple[str, str, int, str], LoadedKernel] = {}
# cubins that ptxas_report built, by (source digest, arch): compile_kernel takes them instead of compiling again
_cubins: dict[tuple[str, str], bytes] = {}
_stats = {"nvrtc_compiles": 0, "disk_hits": 0, "memory_hits": 0}


def compile_stats() -> dict[str, int]:
    """Counters: NVRTC compilations, disk-cache hits and memory-cache hits in this process."""
    return dict(_stats)


def _cuda_include_dirs() -> list[str]:
    cands: list[str] = []
    if env.cuda_include_override():
        cands.append(env.cuda_include_override() or "")
    cands += env.cuda_toolkit_includes()
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent / "include"))
    cands += ["/usr/local/cuda/include", "/opt/cuda/include"]
    try:  # CUDA headers from pip wheels (nvidia-cuda-runtime / cuda-toolkit)
        import nvidia  # type: ignore

        for root in getattr(nvidia, "__path__", []):
            cands += [str(p.parent) for p in Path(root).glob("*/include/cuda_fp16.h")]
    except ImportError:
        pass
    out: list[str] = []
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "cuda_fp16.h")) and c not in out:
            out.append(c)
    return out


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """NVRTC options for ``arch`` (e.g. ``sm_90a``): C++17, cubin for that arch, CUDA headers."""
    return (*_NVRTC_FLAGS, f"--gpu-architecture={arch}", *(f"-I{d}" for d in _cuda_include_dirs()))


def _nvrtc_cubin(source: str, arch: str, name: str, *, verbose: bool = False) -> tuple[bytes, str]:
    """NVRTC's cubin and log; ``verbose``: with ptxas's resource report in the log (the cubin is the same)."""
    from cupy_backends.cuda.libs import nvrtc  # lazy: CuPy is only needed to run on a GPU

    opts = (*nvrtc_options(arch), "--ptxas-options=-v") if verbose else nvrtc_options(arch)
    prog = nvrtc.createProgram(source, f"{name}.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(opts))
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed to compile {name} for {arch}: {e}\n{log}") from None
        return bytes(nvrtc.getCUBIN(prog)), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def nvrtc_unavailable() -> str | None:
    """None when NVRTC loads in this process (no GPU needed), else why it does not."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # ImportError without CuPy; a CuPy error naming the library when libnvrtc is missing
        return f"NVRTC does not load: {type(e).__name__}: {e}"
    return None


def _disk_key(source: str, arch: str) -> str:
    from cupy_backends.cuda.libs import nvrtc

    h = hashlib.sha256()
    for part in (source, arch, repr(nvrtc_options(arch)), repr(nvrtc.getVersion())):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def compile_kernel(source: str, arch: str, device: int, entry: str = "attn_fwd") -> LoadedKernel:
    """Compile (or fetch from cache) ``source`` for ``arch`` and load ``entry`` on ``device``."""
    from cupy.cuda import Device, function

    digest = hashlib.sha256(source.encode()).hexdigest()
    mkey = (digest, arch, device, entry)
    with _lock:
        hit = _memory.get(mkey)
        if hit is not None:
            _stats["memory_hits"] += 1
            return hit
        t0 = time.perf_counter()
        cubin: bytes | None = None
        path: Path | None = None
        if env.disk_cache_enabled():
            path = env.cache_dir() / "cubin" / f"{_disk_key(source, arch)}.cubin"
            if path.is_file():
                cubin = path.read_bytes()
                _stats["disk_hits"] += 1
        from_disk = cubin is not None
        if cubin is None:
            cubin = _cubins.pop((digest, arch), None)  # built by ptxas_report (the same source and options)
        if cubin is None:
            cubin, _log = _nvrtc_cubin(source, arch, entry)
            _stats["nvrtc_compiles"] += 1
        if not from_disk:
            if path is not None:
                _atomic_write(path, cubin)
        with Device(device):
            mod = function.Module()
            mod.load(cubin)
            fn = mod.get_function(entry)
        dt = time.perf_counter() - t0
        if env.verbose():
            src = "disk cache" if from_disk else "NVRTC"
            print(f"[attncompiler] {entry} for {arch} on cuda:{device}: {dt * 1e3:.0f} ms ({src})", file=sys.stderr)
        loaded = LoadedKernel(fn, mod, arch, device, dt, from_disk)
        _memory[mkey] = loaded
        return loaded


def compile_functions(source: str, arch: str, device: int, entries: tuple[str, ...]) -> dict[str, LoadedKernel]:
    """Compile ``source`` once (cached as :func:`compile_kernel`) and load each of ``entries`` from
    the same module (a translation unit holding several kernels, e.g. the backward's)."""
    if not entries:
        raise ValueError("compile_functions: expected at least one entry name, got none")
    first = compile_kernel(source, arch, device, entries[0])
    out = {entries[0]: first}
    digest = hashlib.sha256(source.encode()).hexdigest()
    with _lock:
        for e in entries[1:]:
            key = (digest, arch, device, e)
            hit = _memory.get(key)
            if hit is None:
                from cupy.cuda import Device

                with Device(device):
                    fn = first.module.get_function(e)  # type: ignore[attr-defined]
                hit = LoadedKernel(fn, first.module, arch, device, first.compile_seconds, first.from_disk_cache)
                _memory[key] = hit
            out[e] = hit
    return out


def _disk_paths(source: str, arch: str) -> tuple[Path, Path]:
    """Where the disk cache keeps the cubin of (source, arch) and ptxas's report of it."""
    dkey = _disk_key(source, arch)
    return env.cache_dir() / "cubin" / f"{dkey}.cubin", env.cache_dir() / "ptxas" / f"{dkey}.json"


def _nvrtc_to_disk(source: str, arch: str) -> str:
    """Worker of :func:`precompile_to_disk` (a separate process): NVRTC -> the disk cache, the cubin and ptxas's
    report both (``compile`` asks for the report of every v3 kernel it builds: without it on disk, each would be
    compiled again, one at a time)."""
    path, report = _disk_paths(source, arch)
    if path.is_file() and report.is_file():
        return str(path)
    ptxas_report(source, arch)  # (its cubin stays in memory: the same compile)
    cubin = _cubins.pop((hashlib.sha256(source.encode()).hexdigest(), arch), None)
    if not path.is_file():
        if cubin is None:  # (the report was on disk already)
            cubin, _ = _nvrtc_cubin(source, arch, "precompile")
        _atomic_write(path, cubin)
    return str(path)


#: how long :func:`precompile_to_disk` waits for another process's precompile before compiling unlocked
PRECOMPILE_LOCK_S = 900.0


def _compile_in_pool(jobs: list[tuple[str, str]], workers: int) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(_nvrtc_to_disk, *zip(*jobs)))


def precompile_to_disk(jobs: list[tuple[str, str]], workers: int | None = None) -> int:
    """Compile (source, arch) pairs with NVRTC in parallel processes into the disk cache, so that
    later :func:`compile_kernel` calls only load.  Returns how many were compiled (or found).

    One process at a time precompiles (a file lock in the cache folder), and only what the disk does not hold
    yet: the GPU suite's workers (pytest-xdist) each run a module's precompiling fixture, and without the lock
    they compiled the same kernels side by side, eight times over on 16 cores."""
    if not env.disk_cache_enabled() or not jobs:
        return 0
    from .filelock import FileLock, LockTimeout

    uniq = list(dict.fromkeys(jobs))
    env.cache_dir().mkdir(parents=True, exist_ok=True)
    lock = FileLock(env.cache_dir() / "precompile.lock", timeout=PRECOMPILE_LOCK_S, poll=0.2)
    try:
        lock.acquire()
    except LockTimeout:
        pass  # (another process has held it far too long: compile what is missing anyway)
    try:
        todo = [(src, arch) for src, arch in uniq if not all(p.is_file() for p in _disk_paths(src, arch))]
        if todo:
            _compile_in_pool(todo, workers or min(len(todo), os.cpu_count() or 1))
    finally:
        lock.release()
    return len(uniq)


@dataclass(frozen=True)
class NvccReport:
    """What ptxas said about one kernel compiled offline."""

    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int
    seconds: float
    log: str = field(repr=False)
    cubin: bytes = field(repr=False)
    # NVRTC (the runtime's compiler, its options) compiled the same source too; False where NVRTC does not load
    nvrtc_checked: bool = False


_REG_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK_RE = re.compile(r"(\d+) bytes stack frame")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def compile_with_nvcc(source: str, arch: str, *, extra: tuple[str, ...] = (), nvrtc: bool = True) -> NvccReport:
    """Compile ``source`` to a cubin with nvcc (no GPU needed) and parse ptxas's resource report.

    ``arch`` like ``sm_80`` or ``sm_90a`` (the latter is passed as ``-gencode`` so the
    arch-specific instructions assemble).  With ``nvrtc`` (the default) the source is compiled with NVRTC
    as well, exactly as the runtime does, wherever NVRTC loads (``nvrtc_checked`` says whether it did); a
    source that only NVRTC refuses raises :class:`CompileError` with NVRTC's log."""
    nvcc = shutil.which(env.nvcc_path())
    if nvcc is None:
        raise CompileError(f"nvcc not found (looked for {env.nvcc_path()!r}; set ATTNCOMPILER_NVCC)")
    num = arch.removeprefix("sm_")
    target = [f"-gencode=arch=compute_{num},code=sm_{num}"]
    with tempfile.TemporaryDirectory(prefix="attncompiler-nvcc-") as d:
        src = Path(d) / "kernel.cu"
        src.write_text(source)
        out = Path(d) / "kernel.cubin"
        cmd = [nvcc, "-cubin", "-std=c++17", "-DNDEBUG", *target, "-Xptxas", "-v", *extra, "-o", str(out), str(src)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed for {arch} (exit {proc.returncode}):\n{log}")
        regs = max((int(x) for x in _REG_RE.findall(log)), default=0)
        spills = _SPILL_RE.findall(log)
        st = sum(int(a) for a, _ in spills)
        ld = sum(int(b) for _, b in spills)
        stack = max((int(x) for x in _STACK_RE.findall(log)), default=0)
        smem = max((int(x) for x in _SMEM_RE.findall(log)), default=0)
        checked = nvrtc and nvrtc_unavailable() is None
        if checked:
            _nvrtc_cubin(source, arch, "kernel")  # raises CompileError with NVRTC's log
        return NvccReport(arch, regs, st, ld, stack, smem, dt, log, out.read_bytes(), checked)


def allow_dynamic_smem(func_ptr: int, nbytes: int, device: int) -> None:
    """Let the loaded function ``func_ptr`` launch with ``nbytes`` of dynamic shared memory on ``device``: above
    :data:`DEFAULT_DYNAMIC_SMEM` the driver needs the opt-in attribute first (cuFuncSetAttribute); below it there is
    nothing to do."""
    if nbytes <= DEFAULT_DYNAMIC_SMEM:
        return
    from cupy.cuda import Device, driver

    with Device(device):
        driver.funcSetAttribute(func_ptr, _MAX_DYNAMIC_SMEM_ATTR, nbytes)


@dataclass(frozen=True)
class PtxasReport:
    """ptxas's resource report of one kernel source compiled by NVRTC (the runtime's own compiler and options)."""

    arch: str
    registers: int
    spill_stores: int
    spill_loads: int

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads


_reports: dict[tuple[str, str], PtxasReport] = {}


def ptxas_report(source: str, arch: str) -> PtxasReport | None:
    """Registers and spills of ``source``'s kernels for ``arch`` (the largest over its entry points), from NVRTC with
    ptxas's verbose report; None where NVRTC does not load or prints no report.  Needs no GPU.  Reports are kept on
    disk beside the cubins (``env.cache_dir()/ptxas``), so a later process asks NVRTC nothing.  The cubin is kept for
    :func:`compile_kernel`, so a kernel checked here and then built is compiled once."""
    if nvrtc_unavailable() is not None:
        return None
    key = (hashlib.sha256(source.encode()).hexdigest(), arch)
    with _lock:
        hit = _reports.get(key)
    if hit is not None:
        return hit
    path = env.cache_dir() / "ptxas" / f"{_disk_key(source, arch)}.json" if env.disk_cache_enabled() else None
    if path is not None and path.is_file():  # a process before this one compiled it (its cubin is on disk too)
        try:
            rep = PtxasReport(**json.loads(path.read_text()))
        except (ValueError, TypeError, OSError):
            rep = None
        if rep is not None and rep.arch == arch:
            with _lock:
                _reports[key] = rep
            return rep
    cubin, log = _nvrtc_cubin(source, arch, "ptxas_report", verbose=True)
    if not _REG_RE.search(log):
        # No report: an NVRTC that caches its compilations (seen on the device machine: a source compiled before,
        # in this process or another, came back with an empty log) did not run ptxas. A comment makes the source
        # new to that cache without changing the code.
        _cubin2, log = _nvrtc_cubin(f"{source}\n// ptxas report {os.getpid()} {time.time_ns()}\n", arch,
                                    "ptxas_report", verbose=True)
        if not _REG_RE.search(log):
            return None
    spills = _SPILL_RE.findall(log)
    rep = PtxasReport(arch, max((int(x) for x in _REG_RE.findall(log)), default=0),
                      max((int(a) for a, _ in spills), default=0), max((int(b) for _, b in spills), default=0))
    if path is not None:
        _atomic_write(path, json.dumps(asdict(rep)).encode())
    with _lock:
        _reports[key] = rep
        _cubins[key] = cubin
        while len(_cubins) > 64:  # (built but never loaded: drop the oldest)
            _cubins.pop(next(iter(_cubins)))
    return rep
