"""Shared scaffolding of the brute-force mask tests (test_bounds.py: tile classes, test_ranges.py: index
ranges): test masks written twice -- a sympy expression for the code under test and a plain Python
predicate for brute force, so a check does not depend on the code under test -- and the host (g++) /
device (nvcc) builds that run the emitted CUDA against the Python side.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sympy
from hypothesis import strategies as st

from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN

Q, KV = Q_IDX, KV_IDX
DOC_BUF = sympy.IndexedBase("doc")
DOC = [(i * 7) // 45 for i in range(5000)]  # the document ids document() reads: a new one every 6 or 7 positions

Pred = Callable[[int, int, int, int, int, int], bool]  # (b, h, q, kv, q_len, kv_len) -> visible

BOTH, NONE = frozenset({"kv", "q"}), frozenset()


@dataclass(frozen=True)
class M:
    """A mask as sympy expression + Python predicate.  ``exact``: the tile classification must be tight
    (test_bounds); ``tight``: the axes along which the derived index range must be exactly the hull of
    the visible indices, empty exactly when nothing is visible (test_ranges)."""

    expr: sympy.Basic
    fn: Pred
    exact: bool = True
    tight: frozenset[str] = BOTH

    def __and__(self, o: "M") -> "M":  # range: intersection of hulls, sound but not tight in general
        return M(sympy.And(self.expr, o.expr), lambda *a: self.fn(*a) and o.fn(*a), False, NONE)

    def __or__(self, o: "M") -> "M":  # range: hull of the union, tight where both are
        return M(sympy.Or(self.expr, o.expr), lambda *a: self.fn(*a) or o.fn(*a), False, self.tight & o.tight)

    def __invert__(self) -> "M":
        return M(sympy.Not(self.expr), lambda *a: not self.fn(*a), self.exact, NONE)


def causal() -> M:
    return M(Q >= KV, lambda b, h, q, kv, ql, kl: q >= kv)


def bottom_right() -> M:
    return M(Q + KV_LEN - Q_LEN >= KV, lambda b, h, q, kv, ql, kl: q + kl - ql >= kv)


def sliding(w: int) -> M:  # presets.sliding_window
    return M((Q >= KV) & (Q - KV <= w), lambda b, h, q, kv, ql, kl: 0 <= q - kv <= w)


def sliding_br(w: int) -> M:
    d = Q + KV_LEN - Q_LEN - KV
    return M((d >= 0) & (d < w), lambda b, h, q, kv, ql, kl: 0 <= q + kl - ql - kv < w)


def sym_window(w: int) -> M:
    return M(sympy.Abs(Q - KV) <= w, lambda b, h, q, kv, ql, kl: abs(q - kv) <= w)


def prefix(n: int) -> M:  # presets.prefix_lm
    return M((KV < n) | (Q >= KV), lambda b, h, q, kv, ql, kl: kv < n or q >= kv)


def chunked(c: int) -> M:
    return M(sympy.Eq(sympy.floor(Q / c), sympy.floor(KV / c)), lambda b, h, q, kv, ql, kl: q // c == kv // c)


def chunked_causal(c: int) -> M:
    return M(sympy.floor(Q / c) >= sympy.floor(KV / c), lambda b, h, q, kv, ql, kl: q // c >= kv // c)


def striped(m: int, r: int) -> M:
    return M(sympy.Mod(KV, m) < r, lambda b, h, q, kv, ql, kl: kv % m < r, tight=NONE)


def diag_mod(m: int) -> M:
    return M(sympy.Eq(sympy.Mod(Q - KV, m), 0), lambda b, h, q, kv, ql, kl: (q - kv) % m == 0, tight=NONE)


def capped(n: int) -> M:
    return M(KV <= sympy.Min(Q, n), lambda b, h, q, kv, ql, kl: kv <= min(q, n))


def half(k: int) -> M:
    return M(KV * 2 < Q + k, lambda b, h, q, kv, ql, kl: 2 * kv < q + k)


def rational(k: int) -> M:
    return M(KV <= Q / 3 + sympy.Rational(k, 2), lambda b, h, q, kv, ql, kl: 6 * kv <= 2 * q + 3 * k)


def head_causal() -> M:
    return M(sympy.Eq(H, 0) | (Q >= KV), lambda b, h, q, kv, ql, kl: h == 0 or q >= kv)


def batch_window(w: int) -> M:
    return M(Q - KV <= w + 3 * B, lambda b, h, q, kv, ql, kl: q - kv <= w + 3 * b)


def head_shift(k: int) -> M:
    return M(KV <= sympy.Piecewise((Q, H > 1), (Q - k, True)),
             lambda b, h, q, kv, ql, kl: kv <= (q if h > 1 else q - k))


def document() -> M:
    return M(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV]), lambda b, h, q, kv, ql, kl: DOC[q] == DOC[kv], False, NONE)


def float_mask() -> M:
    return M(Q >= KV * sympy.Float(0.5), lambda b, h, q, kv, ql, kl: q >= kv * 0.5, False, NONE)


small = st.integers(0, 80)


def combined(base: st.SearchStrategy[M]) -> st.SearchStrategy[M]:
    """Masks built from ``base`` with &, | and ~ (up to four leaves)."""
    return st.recursive(
        base,
        lambda kids: st.one_of(st.tuples(kids, kids).map(lambda t: t[0] & t[1]),
                               st.tuples(kids, kids).map(lambda t: t[0] | t[1]), kids.map(lambda m: ~m)),
        max_leaves=4,
    )


# ---------------------------------------------------------------------------------------------
# Emitted CUDA on the host (g++, with the real common.cuh when the CUDA headers exist) and on nvcc
# ---------------------------------------------------------------------------------------------
GXX = shutil.which("g++")
NVCC = shutil.which("nvcc")
ROOT = Path(__file__).resolve().parents[1]
CUDA_INC = next((p for p in (os.environ.get("CUDA_HOME", "") + "/include", "/usr/local/cuda/include")
                 if Path(p, "cuda_fp16.h").exists()), None)
PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <algorithm>
#define __device__
#define __forceinline__ inline
#ifdef AC_REAL_COMMON
#define AC_HOST_DEVICE
#include "attncompiler/common.cuh"
#else
#define AC_TILE_EMPTY 0
#define AC_TILE_PARTIAL 1
#define AC_TILE_FULL 2
inline int ac_clamp(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
inline int ac_floordiv(int a, int b) { int q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
inline int ac_mod(int a, int b) { int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
#endif
using std::min;
using std::max;
struct AttnParams { int Nq, Nk; };
"""
#: PRELUDE without a struct AttnBuffers, for tests that declare their own buffers
HOST_PRELUDE = PRELUDE
PRELUDE += "struct AttnBuffers { const int* doc; int doc_d0; };\n"
DEVICE_PRELUDE = ('#include "attncompiler/common.cuh"\nstruct AttnParams { int Nq, Nk; };\n'
                  "struct AttnBuffers { const int* doc; int doc_d0; };\n")


def host_run(source: str, stdin: str, tmp: Path, extra_flags: tuple[str, ...] = ()) -> str:
    """Build ``source`` (PRELUDE + emitted functions + a main reading ``stdin``) with g++ -Wall -Werror
    and return what it prints."""
    src, exe = tmp / "t.cpp", tmp / "t"
    src.write_text(source)
    cmd = [GXX, "-std=c++17", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter", "-Wno-unused-function",
           *extra_flags, "-I", str(ROOT / "templates/include"), str(src), "-o", str(exe)]
    if CUDA_INC:
        cmd[1:1] = ["-DAC_REAL_COMMON", "-isystem", CUDA_INC]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:] + "\n" + source[-4000:]
    return subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout


def cuda_classes_match_python(source: str, work: Sequence[tuple[int, ...]], tmp: Path, masks: Sequence[object],
                              python: Callable[[tuple[int, ...]], int]) -> list[int]:
    """Run ``source`` (:func:`host_run`; it prints one tile class per input line) on ``work``, one line
    per tuple of ints whose first is the index into ``masks``, and assert that every class it prints
    equals ``python(w)``, the classifier's verdict in Python.  Returns the printed classes, in order."""
    out = host_run(source, "".join(" ".join(map(str, w)) + "\n" for w in work), tmp).split()
    assert len(out) == len(work)
    bad = []
    for w, got in zip(work, out):
        want = python(w)
        if int(got) != want:
            bad.append(f"{masks[w[0]]} {w}: cuda {got} python {want}")
    assert not bad, "\n".join(bad[:20])
    return [int(g) for g in out]


def nvcc_compile(source: str, tmp: Path, prelude: str = DEVICE_PRELUDE) -> None:
    """``source`` (device functions and a kernel) after ``prelude`` compiles as device code for sm_80
    against the real common.cuh, every warning an error (no GPU needed)."""
    src = tmp / "k.cu"
    src.write_text(prelude + source)
    res = subprocess.run([NVCC, "-arch=sm_80", "-std=c++17", "-Werror", "all-warnings", "-I",
                          str(ROOT / "templates/include"), "-c", str(src), "-o", str(tmp / "k.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]


def nvcc_compile_classifiers(bodies: list[str], tmp: Path, prelude: str = DEVICE_PRELUDE) -> None:
    """Emitted tile_class bodies, each as a device function called from one kernel, compile with
    :func:`nvcc_compile`."""
    fns = "".join(
        f"static __device__ __forceinline__ int tc{i}(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi,"
        f" const AttnParams& p, const AttnBuffers& buf) {{\n{body}\n}}\n"
        for i, body in enumerate(bodies))
    calls = "".join(f"  c += tc{i}(t & 1, t & 3, t, t + 63, 2 * t, 2 * t + 63, p, buf);\n" for i in range(len(bodies)))
    nvcc_compile(fns + 'extern "C" __global__ void k(const AttnParams p, const AttnBuffers buf, int* out) {\n'
                 "  const int t = threadIdx.x;\n  int c = 0;\n" + calls + "  out[t] = c;\n}\n", tmp, prelude)
