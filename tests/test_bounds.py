"""Tile classification: sound against brute force, tight on the standard masks, CUDA == Python.

Each test mask is written twice -- as the sympy expression the classifier reads and as a plain
Python predicate for brute force -- so the check does not depend on the code under test.
"""
from __future__ import annotations

import functools
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attncompiler.ir.bounds import (
    INDEX_LIMIT, KV_HI, KV_LO, Q_HI, Q_LO, TILE_EMPTY, TILE_FULL, TILE_PARTIAL, TileClassifier, bound,
    tile_box, tile_classifier,
)
from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN

Q, KV = Q_IDX, KV_IDX
DOC_BUF = sympy.IndexedBase("doc")
DOC = [(i * 7) // 45 for i in range(1000)]

Pred = Callable[[int, int, int, int, int, int], bool]  # (b, h, q, kv, q_len, kv_len) -> visible


@dataclass(frozen=True)
class M:
    """A mask as sympy expression + Python predicate; ``exact``: classification must be tight."""

    expr: sympy.Basic
    fn: Pred
    exact: bool = True

    def __and__(self, o: "M") -> "M":
        return M(sympy.And(self.expr, o.expr), lambda *a: self.fn(*a) and o.fn(*a), False)

    def __or__(self, o: "M") -> "M":
        return M(sympy.Or(self.expr, o.expr), lambda *a: self.fn(*a) or o.fn(*a), False)

    def __invert__(self) -> "M":
        return M(sympy.Not(self.expr), lambda *a: not self.fn(*a), self.exact)


def causal() -> M:
    return M(Q >= KV, lambda b, h, q, kv, ql, kl: q >= kv)


def bottom_right() -> M:
    return M(Q + KV_LEN - Q_LEN >= KV, lambda b, h, q, kv, ql, kl: q + kl - ql >= kv)


def sliding(w: int) -> M:
    return M((Q >= KV) & (Q - KV <= w), lambda b, h, q, kv, ql, kl: 0 <= q - kv <= w)


def sliding_br(w: int) -> M:
    d = Q + KV_LEN - Q_LEN - KV
    return M((d >= 0) & (d < w), lambda b, h, q, kv, ql, kl: 0 <= q + kl - ql - kv < w)


def sym_window(w: int) -> M:
    return M(sympy.Abs(Q - KV) <= w, lambda b, h, q, kv, ql, kl: abs(q - kv) <= w)


def prefix(n: int) -> M:
    return M((KV < n) | (Q >= KV), lambda b, h, q, kv, ql, kl: kv < n or q >= kv)


def chunked(c: int) -> M:
    return M(sympy.Eq(sympy.floor(Q / c), sympy.floor(KV / c)), lambda b, h, q, kv, ql, kl: q // c == kv // c)


def chunked_causal(c: int) -> M:
    return M((sympy.floor(Q / c) >= sympy.floor(KV / c)), lambda b, h, q, kv, ql, kl: q // c >= kv // c)


def striped(m: int, r: int) -> M:
    return M(sympy.Mod(KV, m) < r, lambda b, h, q, kv, ql, kl: kv % m < r)


def diag_mod(m: int) -> M:
    return M(sympy.Eq(sympy.Mod(Q - KV, m), 0), lambda b, h, q, kv, ql, kl: (q - kv) % m == 0)


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
    return M(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV]), lambda b, h, q, kv, ql, kl: DOC[q] == DOC[kv], False)


def float_mask() -> M:
    return M(Q >= KV * sympy.Float(0.5), lambda b, h, q, kv, ql, kl: q >= kv * 0.5, False)


small = st.integers(0, 80)
base_masks = st.one_of(
    st.just(causal()), st.just(bottom_right()), st.just(head_causal()), st.just(document()),
    st.just(float_mask()), small.map(sliding), small.map(sliding_br), small.map(sym_window),
    small.map(prefix), st.integers(1, 70).map(chunked), st.integers(1, 70).map(chunked_causal),
    st.tuples(st.integers(1, 20), st.integers(0, 20)).map(lambda t: striped(*t)),
    st.integers(1, 9).map(diag_mod), small.map(capped), st.integers(-5, 5).map(half),
    st.integers(-5, 5).map(rational), small.map(batch_window), small.map(head_shift),
)
masks = st.recursive(
    base_masks,
    lambda kids: st.one_of(st.tuples(kids, kids).map(lambda t: t[0] & t[1]),
                           st.tuples(kids, kids).map(lambda t: t[0] | t[1]), kids.map(lambda m: ~m)),
    max_leaves=4,
)


@dataclass(frozen=True)
class Tile:
    q_lo: int
    q_hi: int
    kv_lo: int
    kv_hi: int
    b: int
    h: int
    q_len: int
    kv_len: int


@st.composite
def tiles(draw: st.DrawFn) -> Tile:
    q_lo, kv_lo = draw(st.integers(0, 300)), draw(st.integers(0, 300))
    q_hi, kv_hi = q_lo + draw(st.integers(0, 11)), kv_lo + draw(st.integers(0, 11))
    return Tile(q_lo, q_hi, kv_lo, kv_hi, draw(st.integers(0, 2)), draw(st.integers(0, 3)),
                draw(st.integers(1, 400)), draw(st.integers(1, 400)))


def brute_force(m: M, t: Tile) -> int:
    vis = [m.fn(t.b, t.h, q, kv, t.q_len, t.kv_len)
           for q in range(t.q_lo, t.q_hi + 1) for kv in range(t.kv_lo, t.kv_hi + 1)]
    return TILE_FULL if all(vis) else (TILE_EMPTY if not any(vis) else TILE_PARTIAL)


@functools.lru_cache(maxsize=None)
def cached_classifier(expr: sympy.Basic) -> TileClassifier:
    return tile_classifier(expr)


def classify(m: M, t: Tile) -> int:
    return cached_classifier(m.expr).classify(t.q_lo, t.q_hi, t.kv_lo, t.kv_hi, b=t.b, h=t.h,
                                            q_len=t.q_len, kv_len=t.kv_len)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masks, tiles())
def test_sound_against_brute_force(m: M, t: Tile) -> None:
    got, truth = classify(m, t), brute_force(m, t)
    assert got == truth or got == TILE_PARTIAL, (m.expr, t, got, truth)
    if m.exact:
        assert got == truth, (m.expr, t, got, truth)


@settings(max_examples=300, deadline=None)
@given(base_masks, st.lists(tiles(), min_size=8, max_size=8))
def test_base_masks_tight(m: M, ts: list[Tile]) -> None:
    for t in ts:
        truth = brute_force(m, t)
        if m.exact:
            assert classify(m, t) == truth, (m.expr, t, truth)


def test_mask_sanity_expressions_match_predicates() -> None:
    """The sympy side of each test mask means what its predicate says (spot check via subs)."""
    rng = random.Random(1)
    for m in [causal(), bottom_right(), sliding(7), sliding_br(5), sym_window(4), prefix(9), chunked(8),
              chunked_causal(5), striped(6, 2), diag_mod(3), capped(20), half(-2), rational(3),
              head_causal(), batch_window(4), head_shift(7), document(), ~(causal() & prefix(4)) | sliding(3)]:
        for _ in range(40):
            b, h, q, kv, ql, kl = (rng.randint(0, 2), rng.randint(0, 2), rng.randint(0, 60), rng.randint(0, 60),
                                   rng.randint(1, 70), rng.randint(1, 70))
            e = m.expr.xreplace({B: b, H: h, Q: q, KV: kv, Q_LEN: ql, KV_LEN: kl})
            e = e.replace(lambda x: isinstance(x, sympy.Indexed), lambda x: sympy.Integer(DOC[int(x.indices[0])]))
            assert bool(e) == m.fn(b, h, q, kv, ql, kl), (m.expr, b, h, q, kv, ql, kl)


@pytest.mark.parametrize("tile", [16, 64, 128])
def test_causal_tightness(tile: int) -> None:
    c = tile_classifier(Q >= KV)
    for i in range(6):
        for j in range(6):
            got = c.classify(i * tile, (i + 1) * tile - 1, j * tile, (j + 1) * tile - 1)
            assert got == (TILE_FULL if i > j else TILE_EMPTY if i < j else TILE_PARTIAL)


def test_sliding_window_tightness() -> None:
    w, t = 128, 64
    c = tile_classifier((Q >= KV) & (Q - KV <= w))
    for i in range(8):
        for j in range(8):
            d_lo, d_hi = (i - j) * t - (t - 1), (i - j) * t + (t - 1)  # range of q - kv on the tile
            want = TILE_FULL if 0 <= d_lo and d_hi <= w else TILE_EMPTY if d_hi < 0 or d_lo > w else TILE_PARTIAL
            assert c.classify(i * t, i * t + t - 1, j * t, j * t + t - 1) == want, (i, j)
    assert c.classify(256, 319, 192, 255) == TILE_FULL  # d in [1, 127]
    assert c.classify(512, 575, 0, 63) == TILE_EMPTY


def test_prefix_lm_tightness() -> None:
    n, t = 128, 64
    c = tile_classifier((KV < n) | (Q >= KV))
    for i in range(6):
        for j in range(6):
            want = TILE_FULL if (j + 1) * t <= n or i > j else (TILE_PARTIAL if i == j else TILE_EMPTY)
            assert c.classify(i * t, i * t + t - 1, j * t, j * t + t - 1) == want, (i, j)


def test_bottom_right_tightness() -> None:
    c = tile_classifier(Q + KV_LEN - Q_LEN >= KV)  # q_len 64, kv_len 256: q sees kv <= q + 192
    assert c.classify(0, 63, 0, 127, q_len=64, kv_len=256) == TILE_FULL
    assert c.classify(0, 63, 192, 255, q_len=64, kv_len=256) == TILE_PARTIAL
    assert c.classify(0, 31, 256, 319, q_len=64, kv_len=256) == TILE_EMPTY
    with pytest.raises(ValueError, match="kv_len, q_len"):
        c.classify(0, 63, 0, 63)


def test_buffer_mask_is_partial() -> None:
    c = tile_classifier(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV]))
    assert all(c.classify(q, q + 63, kv, kv + 63) == TILE_PARTIAL for q in (0, 64, 640) for kv in (0, 64, 640))
    both = tile_classifier((Q >= KV) & sympy.Eq(DOC_BUF[Q], DOC_BUF[KV]))
    assert both.classify(0, 63, 64, 127) == TILE_EMPTY and both.classify(64, 127, 0, 63) == TILE_PARTIAL


def test_trivial_masks() -> None:
    for m in (None, True, sympy.true):
        c = tile_classifier(m)
        assert c.classify(0, 10, 5, 99) == TILE_FULL and c.to_cuda().endswith("return AC_TILE_FULL;")
    assert tile_classifier(sympy.false).classify(0, 1, 0, 1) == TILE_EMPTY
    assert tile_classifier(Q >= KV * sympy.Float(0.5)).classify(100, 101, 0, 1) == TILE_PARTIAL


def test_overflow_guard() -> None:
    c = tile_classifier(Q >= KV)
    big = INDEX_LIMIT
    assert c.classify(big, big + 5, 0, 3) == TILE_PARTIAL  # outside the guarded range: say nothing
    assert c.classify(big - 10, big - 1, 0, 3) == TILE_FULL
    assert tile_classifier(Q * KV >= 5).classify(10, 20, 10, 20) == TILE_PARTIAL  # could overflow int32
    assert tile_classifier(1000 * Q >= KV).classify(10, 20, 10, 20) == TILE_PARTIAL
    assert tile_classifier(100 * Q >= KV).classify(10, 20, 10, 20) == TILE_FULL


def test_bound_symbolic_and_numeric() -> None:
    assert bound(Q - KV) == (Q_LO - KV_HI, Q_HI - KV_LO)
    box = {Q: (3, 9), KV: (5, 6), Q_LEN: (10, 10), KV_LEN: (20, 20)}
    assert bound(Q + KV_LEN - Q_LEN - KV, box) == (7, 14)
    assert bound(sympy.Abs(Q - KV), box) == (0, 4)
    assert bound(sympy.floor(Q / 4) - 2 * KV, box) == (-12, -8)
    assert bound(sympy.Mod(Q, 16), box) == (3, 9)
    assert bound(sympy.Mod(Q, 4), box) == (0, 3)
    assert bound((Q - KV) ** 2, box) == (0, 16)
    assert bound(sympy.Max(Q, KV) - sympy.Min(Q, 5), box) == (0, 6)  # sum of ranges, uncorrelated
    assert bound(DOC_BUF[Q], box) is None and bound(Q + sympy.Symbol("score", real=True), box) is None
    assert bound(B + Q, tile_box()) == (B + Q_LO, B + Q_HI)


GXX = shutil.which("g++")
ROOT = Path(__file__).resolve().parents[1]
CUDA_INC = next((p for p in (os.environ.get("CUDA_HOME", "") + "/include", "/usr/local/cuda/include")
                 if Path(p, "cuda_fp16.h").exists()), None)
PRELUDE = r"""
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
struct AttnBuffers { const int* doc; int doc_d0; };
"""

CUDA_MASKS = [
    None, Q >= KV, Q + KV_LEN - Q_LEN >= KV, sliding(100).expr, sliding_br(64).expr, sym_window(33).expr,
    prefix(128).expr, chunked(64).expr, chunked(37).expr, chunked_causal(48).expr, striped(256, 128).expr,
    striped(5, 2).expr, diag_mod(4).expr, capped(300).expr, half(3).expr, rational(-1).expr,
    head_causal().expr, batch_window(17).expr, head_shift(30).expr, document().expr, (causal() & document()).expr,
    (~(prefix(64) | sliding(20)) & bottom_right()).expr, sympy.Xor(Q > KV, KV < 100), float_mask().expr,
    sympy.Eq(sympy.Mod(DOC_BUF[Q], 4), 7), (Q * KV >= 5), sympy.Piecewise((Q >= KV, H > 0), (KV < 50, True)),
]


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_cuda_emission_matches_python(tmp_path: Path) -> None:
    rng = random.Random(0)
    classifiers = [tile_classifier(m) for m in CUDA_MASKS]
    fns = "".join(
        f"static int tile_class_{i}(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi,"
        f" const AttnParams& p, const AttnBuffers& buf) {{\n{c.to_cuda()}\n}}\n"
        for i, c in enumerate(classifiers))
    calls = "\n".join(f"      case {i}: r = tile_class_{i}(b, h, ql, qh, kl, kh, p, buf); break;"
                      for i in range(len(classifiers)))
    source = PRELUDE + fns + (
        "int main() {\n  int fn, b, h, ql, qh, kl, kh, nq, nk;\n"
        "  const AttnBuffers buf = {nullptr, 0};\n"
        "  while (std::scanf(\"%d %d %d %d %d %d %d %d %d\", &fn, &b, &h, &ql, &qh, &kl, &kh, &nq, &nk) == 9) {\n"
        "    const AttnParams p = {nq, nk};\n    int r = -1;\n    switch (fn) {\n" + calls +
        "\n      default: return 1;\n    }\n    std::printf(\"%d\\n\", r);\n  }\n  return 0;\n}\n")
    work = []
    for i in range(len(classifiers)):
        for _ in range(400):
            span = rng.choice([1, 16, 64, 128, 1000, INDEX_LIMIT])
            ql, kl = rng.randrange(span), rng.randrange(span)
            tq, tk = rng.choice([(0, 0), (15, 15), (63, 63), (127, 63), (rng.randrange(50), rng.randrange(50))])
            nq, nk = rng.randrange(0, span + 300), rng.randrange(0, span + 300)  # 0: outside the guard
            work.append((i, rng.randrange(3), rng.randrange(4), ql, ql + tq, kl, kl + tk, nq, nk))
    src, exe = tmp_path / "t.cpp", tmp_path / "t"
    src.write_text(source)
    cmd = [GXX, "-std=c++17", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter", "-Wno-unused-function",
           "-I", str(ROOT / "templates/include"), str(src), "-o", str(exe)]
    if CUDA_INC:
        cmd[1:1] = ["-DAC_REAL_COMMON", "-isystem", CUDA_INC]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:] + "\n" + source[-4000:]
    out = subprocess.run([str(exe)], input="".join(" ".join(map(str, w)) + "\n" for w in work),
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(work)
    bad = []
    for w, got in zip(work, out):
        i, b, h, ql, qh, kl, kh, nq, nk = w
        want = classifiers[i].classify(ql, qh, kl, kh, b=b, h=h, q_len=nq, kv_len=nk)
        if int(got) != want:
            bad.append(f"{CUDA_MASKS[i]} {w}: cuda {got} python {want}")
    assert not bad, "\n".join(bad[:20])
    seen = {int(g) for g in out}
    assert seen == {TILE_EMPTY, TILE_PARTIAL, TILE_FULL}


def test_cuda_text_causal() -> None:
    text = tile_classifier(Q >= KV).to_cuda()
    assert "const int lo0 = q_lo - kv_hi;" in text and "const int hi0 = q_hi - kv_lo;" in text
    assert "return t0;" in text
    assert tile_classifier(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV])).to_cuda().strip().endswith("return AC_TILE_PARTIAL;")


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_cuda_emission_compiles_with_nvcc(tmp_path: Path) -> None:
    """The bodies compile as device code against the real common.cuh (no GPU needed)."""
    fns = "".join(
        f"static __device__ __forceinline__ int tc{i}(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi,"
        f" const AttnParams& p, const AttnBuffers& buf) {{\n{tile_classifier(m).to_cuda()}\n}}\n"
        for i, m in enumerate(CUDA_MASKS))
    calls = "".join(f"  c += tc{i}(t & 1, t & 3, t, t + 63, 2 * t, 2 * t + 63, p, buf);\n"
                    for i in range(len(CUDA_MASKS)))
    src = tmp_path / "k.cu"
    src.write_text(
        '#include "attncompiler/common.cuh"\nstruct AttnParams { int Nq, Nk; };\n'
        "struct AttnBuffers { const int* doc; int doc_d0; };\n" + fns +
        'extern "C" __global__ void k(const AttnParams p, const AttnBuffers buf, int* out) {\n'
        "  const int t = threadIdx.x;\n  int c = 0;\n" + calls + "  out[t] = c;\n}\n")
    res = subprocess.run([NVCC, "-arch=sm_80", "-std=c++17", "-Werror", "all-warnings", "-I",
                          str(ROOT / "templates/include"), "-c", str(src), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
