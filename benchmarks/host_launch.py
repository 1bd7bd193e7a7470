"""Host µs of one kernel launch, piece by piece: what ``runtime.launch.launch_structs`` costs against the driver call
itself, with the GPU busy (a long ``torch.cuda._sleep`` ahead, so no launch waits for the device).

    PYTHONPATH=. python3 benchmarks/host_launch.py [--n 300] [--rounds 5]

A no-op kernel takes a parameter struct by value (the size of the forward's AttnParams and a TMA maps struct);
each row is the median over rounds of the mean over ``n`` calls.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from typing import Callable

import torch

SRC = r"""
struct Blob { unsigned long long w[%d]; };
extern "C" __global__ void nop1(Blob a) {}
extern "C" __global__ void nop2(Blob a, Blob b) {}
"""


def per_call(fn: Callable[[], object], n: int) -> float:
    torch.cuda._sleep(int(2e8))  # keeps the device busy for every launch below
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


def _with_device(idx: int) -> None:
    with torch.cuda.device(idx):
        pass


def main() -> None:
    from cupy.cuda import driver

    from attncompiler.runtime.compiler import compile_functions
    from attncompiler.runtime.launch import launch_structs, raw_stream

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    words = 64  # 512 bytes (AttnParams is ~400-500)
    idx = torch.cuda.current_device()
    arch = "sm_%d%d" % torch.cuda.get_device_capability(idx)
    fns = compile_functions(SRC % words, arch, idx, ("nop1", "nop2"))
    f1, f2 = fns["nop1"].ptr, fns["nop2"].ptr

    class Blob(ctypes.Structure):
        _fields_ = [("w", ctypes.c_uint64 * words)]

    P, M = Blob(), Blob()
    lib = ctypes.CDLL("libcuda.so.1")
    cu_launch = lib.cuLaunchKernel
    cu_launch.restype = ctypes.c_int
    cu_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                                                    ctypes.c_void_p]
    args1 = (ctypes.c_void_p * 1)(ctypes.addressof(P))
    args2 = (ctypes.c_void_p * 2)(ctypes.addressof(P), ctypes.addressof(M))
    stream = raw_stream(idx)

    def ctypes_launch() -> None:
        rc = cu_launch(f1, 132, 1, 1, 384, 1, 1, 0, stream, args1, None)
        if rc:
            raise RuntimeError(f"cuLaunchKernel: {rc}")

    cases: list[tuple[str, Callable[[], object]]] = [
        ("launch_structs, 1 struct", lambda: launch_structs(f1, (132, 1, 1), 384, 0, (P,), idx)),
        ("launch_structs, 2 structs", lambda: launch_structs(f2, (132, 1, 1), 384, 0, (P, M), idx)),
        ("cupy driver.launchKernel, args prebuilt", lambda: driver.launchKernel(
            f1, 132, 1, 1, 384, 1, 1, 0, stream, ctypes.addressof(args1), 0)),
        ("ctypes cuLaunchKernel, args prebuilt", ctypes_launch),
        ("raw_stream(idx)", lambda: raw_stream(idx)),
        ("ctypes args array of 2", lambda: (ctypes.c_void_p * 2)(ctypes.addressof(P), ctypes.addressof(M))),
        ("Blob.from_buffer_copy", lambda: Blob.from_buffer_copy(P)),
        ("with torch.cuda.device(idx)", lambda: _with_device(idx)),
        ("torch.cuda.current_device()", torch.cuda.current_device),
        ("torch.empty 1x16x256x128 bf16", lambda: torch.empty(1, 16, 256, 128, device="cuda", dtype=torch.bfloat16)),
    ]
    res: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(a.rounds):
        for name, fn in cases:
            res[name].append(per_call(fn, a.n))
    print(f"# {torch.cuda.get_device_name(idx)}: host µs per call, median of {a.rounds} rounds x {a.n} calls")
    for name, _ in cases:
        xs = res[name]
        print(f"{name:45s} {statistics.median(xs):7.2f}  (min {min(xs):.2f}, max {max(xs):.2f})")


if __name__ == "__main__":
    main()
