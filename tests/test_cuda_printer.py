"""The CUDA printer, checked by compiling its output with g++ and comparing with sympy.

Every expression is printed into a C++ function, compiled on the host (stand-ins for the CUDA
keywords, the real common.cuh helpers when the CUDA headers are present), run over a grid of
(score, b, h, q_idx, kv_idx, q_len, kv_len) and compared with sympy's exact evaluation: float
results within 1e-5 relative, ints and bools exactly.  decltype checks the C type of each.
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import sympy

from attncompiler.codegen.cuda_printer import PrinterError, cuda_type, print_cuda
from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE

ROOT = Path(__file__).resolve().parents[1]
GXX = shutil.which("g++")
CUDA_INC = next((p for p in (os.environ.get("CUDA_HOME", "") + "/include", "/usr/local/cuda/include")
                 if Path(p, "cuda_fp16.h").exists()), None)

S, Q, KV = SCORE, Q_IDX, KV_IDX
slopes = sympy.IndexedBase("slopes")
doc = sympy.IndexedBase("doc")
m2 = sympy.IndexedBase("m2")
BUFFERS = {"slopes": "float", "doc": "int", "m2": "float"}
SLOPES = [0.5, 0.25, 0.125, 0.0625]
DOC = [i // 37 for i in range(200)]
M2 = [[0.5 * r - 0.25 * c for c in range(5)] for r in range(3)]

# (name, expression, expected C type, kind passed to print_cuda)
CASES: list[tuple[str, sympy.Basic, str, str | None]] = [
    ("alibi", S + slopes[H] * (KV - Q), "float", None),
    ("softcap", 30 * sympy.tanh(S / 30), "float", None),
    ("causal", Q >= KV, "bool", None),
    ("sliding", (Q >= KV) & (Q - KV <= 256), "bool", None),
    ("document", sympy.Eq(doc[Q], doc[KV]), "bool", None),
    ("document_ne", sympy.Ne(doc[Q], doc[KV]), "bool", None),
    ("prefix", (KV < 256) | (Q >= KV), "bool", None),
    ("chunked", sympy.Eq(sympy.floor(Q / 64), sympy.floor(KV / 64)), "bool", None),
    ("parity", sympy.Eq(sympy.Mod(Q, 2), 0), "bool", None),
    ("bottom_right", Q + KV_LEN - Q_LEN >= KV, "bool", None),
    ("bottom_right_window", (Q + KV_LEN - Q_LEN >= KV) & (Q + KV_LEN - Q_LEN - KV < 100), "bool", None),
    ("where_float", sympy.Piecewise((S, Q > KV), (S / 2, True)), "float", None),
    ("where_int", sympy.Piecewise((Q - KV, Q > KV), (KV - 3 * Q, KV > 100), (0, True)), "int", None),
    ("where_neg_inf", sympy.Piecewise((S, Q >= KV), (-sympy.oo, True)), "float", None),
    ("minmax_float", sympy.Min(S, 3) + sympy.Max(S, -1, Q / 100), "float", None),
    ("minmax_int", sympy.Max(Q, KV) - sympy.Min(Q, KV, 50), "int", None),
    ("abs_int", sympy.Abs(Q - KV), "int", None),
    ("abs_float", sympy.Abs(S) - sympy.Abs(S - Q), "float", None),
    ("transcendental", sympy.exp(S / 4) + sympy.log(Q + 1) + sympy.sqrt(KV + 2), "float", None),
    ("sigmoid", 1 / (1 + sympy.exp(-S)), "float", None),
    ("rational", S * sympy.Rational(3, 7) + Q / 3 - sympy.Rational(1, 2), "float", None),
    ("rational_cmp", KV < Q / 2, "bool", None),
    ("rational_cmp2", sympy.Rational(2, 3) * Q + 1 >= KV / 5, "bool", None),
    ("float_const", S * sympy.Float(0.1) + sympy.Float(2.5), "float", None),
    ("pow_int", (Q - KV) ** 2 - 3 * KV**3, "int", None),
    ("pow_float", S**2 - S**7 / 1000 + sympy.Abs(S) ** sympy.Rational(3, 2), "float", None),
    ("pow_neg", (S**2 + 1) ** -2 + 1 / (Q + 1), "float", None),
    ("pow_sym", (sympy.Abs(S) + 1) ** (H + sympy.Rational(1, 3)), "float", None),
    ("floordiv_neg", sympy.floor((Q - KV) / 64) + sympy.floor((Q + 3) / 7), "int", None),
    ("mod_neg", sympy.Mod(Q - KV, 5), "int", None),
    ("ceil_neg", sympy.ceiling((Q - KV) / 7), "int", None),
    ("floor_len", sympy.floor(Q * KV_LEN / Q_LEN), "int", None),
    ("floor_float", sympy.floor(S) + sympy.ceiling(S / 2), "float", None),
    ("mod_float", sympy.Mod(S, 3), "float", None),
    ("buffer_2d", m2[Q, KV] * S, "float", None),
    ("buffer_int_arith", doc[Q] - 2 * doc[KV], "int", None),
    ("buffer_int_div", doc[Q] / 2 + sympy.floor(doc[KV] / 3), "float", None),
    ("buffer_index_expr", slopes[sympy.Mod(H + Q, 4)] * (Q - KV), "float", None),
    ("not_or", ~(Q < KV) | sympy.Eq(Q, 0), "bool", None),
    ("xor", sympy.Xor(Q > KV, sympy.Eq(sympy.Mod(KV, 3), 0)), "bool", None),
    ("nested_bool", ((Q >= KV) & ~sympy.Eq(B, 1)) | ((H > 1) & (KV < 10)), "bool", None),
    ("true", sympy.true, "bool", None),
    ("false", sympy.false, "bool", None),
    ("sign", sympy.sign(Q - KV), "int", None),
    ("neg_mul", -S * Q * KV / 1000 - 2 * Q, "float", None),
    ("pi", sympy.pi * S, "float", None),
    ("kind_float", Q - KV, "float", "float"),
    ("kind_float_bool", Q >= KV, "float", "float"),
    ("kind_bool", Q - KV, "bool", "bool"),
    ("kind_int_bool", Q >= KV, "int", "int"),
]

SCORES = [-5.25, -1.0, 0.0, 0.75, 3.125, 40.5]
IDX = [0, 1, 5, 63, 64, 100, 255, 257, 300]
LENS = [(301, 301), (40, 310)]
TOL = 1e-5

PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <type_traits>
#include <utility>
#define __device__
#define __forceinline__ inline
#ifdef AC_REAL_COMMON
#define AC_HOST_DEVICE
#include "attncompiler/common.cuh"
#undef AC_NEG_INF
#else
#define AC_TILE_EMPTY 0
#define AC_TILE_PARTIAL 1
#define AC_TILE_FULL 2
inline int ac_clamp(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
inline int ac_floordiv(int a, int b) { int q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
inline int ac_mod(int a, int b) { int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
inline float ac_i2f(int i) { return (float)i; }
inline float ac_tanhf(float x) { return tanhf(x); }
#endif
// the fast printer's device intrinsics, on the host
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define AC_NEG_INF (-INFINITY)
using std::min;
using std::max;
struct AttnParams { int Nq, Nk; };
"""


def compile_and_run(source: str, stdin: str, tmp: Path) -> str:
    src, exe = tmp / "t.cpp", tmp / "t"
    src.write_text(source)
    cmd = [GXX, "-std=c++17", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter", "-Wno-unused-function",
           "-I", str(ROOT / "templates/include"), str(src), "-o", str(exe)]
    if CUDA_INC:
        cmd[1:1] = ["-DAC_REAL_COMMON", "-isystem", CUDA_INC]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:] + "\n" + source[-3000:]
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True)
    return run.stdout


def _clamp(i: int, n: int) -> int:
    return min(max(i, 0), n - 1)


def _lookup(e: sympy.Indexed) -> sympy.Expr:
    name, idx = str(e.base.label), [int(i) for i in e.indices]
    if name == "slopes":
        return sympy.Rational(SLOPES[_clamp(idx[0], len(SLOPES))])
    if name == "doc":
        return sympy.Integer(DOC[_clamp(idx[0], len(DOC))])
    return sympy.Rational(M2[_clamp(idx[0], len(M2))][_clamp(idx[1], len(M2[0]))])


def reference(expr: sympy.Basic, pt: tuple) -> float | int | bool:
    score, b, h, q, kv, nq, nk = pt
    vals = {SCORE: sympy.Rational(score), B: b, H: h, Q_IDX: q, KV_IDX: kv, Q_LEN: nq, KV_LEN: nk}
    e = expr.xreplace({k: sympy.sympify(v) for k, v in vals.items()})
    e = e.replace(lambda x: isinstance(x, sympy.Indexed), _lookup)
    if isinstance(e, sympy.logic.boolalg.Boolean):
        return bool(e)
    return float(e)


def points(expr: sympy.Basic) -> list[tuple]:
    free = expr.free_symbols
    scores = SCORES if SCORE in free else [0.5]
    bs = [0, 1] if B in free else [0]
    hs = [0, 1, 3] if H in free else [0]
    lens = LENS if free & {Q_LEN, KV_LEN} else LENS[:1]
    return [(s, b, h, q, kv, nq, nk) for s, b, h, q, kv, (nq, nk) in
            itertools.product(scores, bs, hs, IDX, IDX, lens)]


def _c_type(ctype: str) -> str:
    return {"bool": "bool", "int": "int", "float": "float"}[ctype]


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_printed_expressions_match_sympy(tmp_path: Path, fast: bool) -> None:
    """C (g++, the real common.cuh when the CUDA headers are found) agrees with sympy at sample points;
    fast=True as the kernels' hooks print (ac_i2f runs its bit trick on the host too)."""
    fns, cases = [], []
    for i, (name, expr, ctype, kind) in enumerate(CASES):
        text = print_cuda(expr, kind=kind, buffers=BUFFERS, fast=fast)
        if kind is None:
            assert cuda_type(expr, buffers=BUFFERS) == ctype, name
        fns.append(
            f"// {name}: {expr}\n"
            f"static auto f{i}(float score, int b, int h, int q_idx, int kv_idx, const AttnParams& p,"
            f" const AttnBuffers& buf) {{ return {text}; }}\n"
            f"static_assert(std::is_same<decltype(f{i}(0.0f, 0, 0, 0, 0, std::declval<const AttnParams&>(),"
            f" std::declval<const AttnBuffers&>())), {_c_type(ctype)}>::value, \"type of {name}\");\n"
        )
        cases.append(f"      case {i}: emit(f{i}(score, b, h, q, kv, p, buf)); break;")
    m2 = ", ".join(f"{v}f" for row in M2 for v in row)
    source = PRELUDE + (
        "struct AttnBuffers { const float* slopes; int slopes_d0; const int* doc; int doc_d0;"
        " const float* m2; int m2_d0; int m2_d1; };\n"
        "static void emit(float v) { std::printf(\"%.9g\\n\", v); }\n"
        "static void emit(int v) { std::printf(\"%d\\n\", v); }\n"
        "static void emit(bool v) { std::printf(\"%d\\n\", v ? 1 : 0); }\n"
        + "".join(fns)
        + "int main() {\n"
        f"  static const float slopes[] = {{{', '.join(f'{v}f' for v in SLOPES)}}};\n"
        f"  static const int doc[] = {{{', '.join(map(str, DOC))}}};\n"
        f"  static const float m2[] = {{{m2}}};\n"
        f"  const AttnBuffers buf = {{slopes, {len(SLOPES)}, doc, {len(DOC)}, m2, {len(M2)}, {len(M2[0])}}};\n"
        "  int fn, b, h, q, kv, nq, nk; float score;\n"
        "  while (std::scanf(\"%d %f %d %d %d %d %d %d\", &fn, &score, &b, &h, &q, &kv, &nq, &nk) == 8) {\n"
        "    const AttnParams p = {nq, nk};\n"
        "    switch (fn) {\n" + "\n".join(cases) + "\n      default: return 1;\n    }\n  }\n  return 0;\n}\n"
    )
    work = [(i, pt) for i, (_, expr, _, _) in enumerate(CASES) for pt in points(expr)]
    stdin = "".join(f"{i} {pt[0]!r} {' '.join(map(str, pt[1:]))}\n" for i, pt in work)
    out = compile_and_run(source, stdin, tmp_path).split()
    assert len(out) == len(work)
    failures = []
    for (i, pt), got_text in zip(work, out):
        name, expr, ctype, kind = CASES[i]
        want = reference(expr, pt)
        if ctype == "float":
            got, want = float(got_text), float(want)
            ok = got == want or abs(got - want) <= TOL * max(1.0, abs(want))
        elif ctype == "bool" and kind == "bool":
            got, want, ok = got_text, want != 0, int(got_text) == int(want != 0)
        else:
            got = int(got_text)
            ok = got == int(want)
        if not ok:
            failures.append(f"{name} at {pt}: C {got} vs sympy {want}")
    assert not failures, "\n".join(failures[:30])


def test_fast_spelling() -> None:
    """fast=True: bounded index arithmetic converts with ac_i2f, constant divisors become reciprocal
    products, tanh is tanh.approx; unbounded int products keep the exact conversion."""
    from attncompiler.codegen.cuda_printer import uses_fast_index
    alibi = print_cuda(S + slopes[H] * (KV - Q), buffers=BUFFERS, fast=True)
    assert alibi == "score + buf.slopes[ac_clamp(h, buf.slopes_d0)] * ac_i2f(kv_idx - q_idx)"
    assert uses_fast_index(alibi)
    assert print_cuda(30 * sympy.tanh(S / 30), fast=True) == "30.0f * ac_tanhf(0.033333335f * score)"
    assert print_cuda(S / slopes[H], buffers=BUFFERS, fast=True) == (
        "__fdividef(score, buf.slopes[ac_clamp(h, buf.slopes_d0)])")
    big = print_cuda(S + 3 * Q * KV, fast=True)  # |3 q kv| is not below 2^22: exact I2F
    assert "(float)(3 * kv_idx * q_idx)" in big and not uses_fast_index(big)
    assert print_cuda(S + Q + KV_LEN - Q_LEN, fast=True).count("ac_i2f(") == 3
    assert print_cuda(S * sympy.Abs(KV - Q), fast=True) == "score * ac_i2f(abs(kv_idx - q_idx))"
    assert print_cuda(S + 2 * Q - KV, fast=True) == "ac_i2f(2 * q_idx) - ac_i2f(kv_idx) + score"  # term by term
    assert print_cuda(S * (4 * Q - KV), fast=True) == "score * (float)(4 * q_idx - kv_idx)"  # up to 5 * 2^21
    assert print_cuda(S * Q / 7, fast=True) == "0.14285715f * score * ac_i2f(q_idx)"


def test_examples_spelling() -> None:
    assert print_cuda(S + slopes[H] * (KV - Q), buffers=BUFFERS) == (
        "score + buf.slopes[ac_clamp(h, buf.slopes_d0)] * (kv_idx - q_idx)")
    assert print_cuda(30 * sympy.tanh(S / 30)) == "30.0f * tanhf(score / 30.0f)"
    assert print_cuda(sympy.Eq(sympy.floor(Q / 64), sympy.floor(KV / 64))) == (
        "ac_floordiv(q_idx, 64) == ac_floordiv(kv_idx, 64)")
    assert print_cuda(sympy.Eq(sympy.Mod(Q, 2), 0)) == "ac_mod(q_idx, 2) == 0"
    assert print_cuda(Q + KV_LEN - Q_LEN >= KV) == "p.Nk + q_idx - p.Nq >= kv_idx"
    assert print_cuda(m2[Q, KV]) == (
        "buf.m2[ac_clamp(q_idx, buf.m2_d0) * buf.m2_d1 + ac_clamp(kv_idx, buf.m2_d1)]")
    assert print_cuda(sympy.Piecewise((S, Q > KV), (0, True))) == "(kv_idx < q_idx ? score : 0.0f)"
    assert print_cuda(sympy.Rational(1, 2) * S) == "score / 2.0f"
    assert print_cuda(sympy.Float(0.5)) == "0.5f"
    assert print_cuda(sympy.true) == "true" and print_cuda(False) == "false"
    assert print_cuda(KV < Q / 2) == "2 * kv_idx < q_idx"


def test_float_literals_are_never_integer_division() -> None:
    for e in (sympy.Rational(1, 2), Q / 2, S / 3, sympy.Rational(7, 3) * KV):
        text = print_cuda(e)
        assert "/ 2)" not in text and not any(f"/ {d}" in text and f"/ {d}." not in text for d in (2, 3))
        assert cuda_type(e) == "float"


def test_deterministic() -> None:
    for _, expr, _, kind in CASES:
        a = print_cuda(expr, kind=kind, buffers=BUFFERS)
        rebuilt = sympy.sympify(sympy.srepr(expr), locals={"IndexedBase": sympy.IndexedBase})
        assert print_cuda(rebuilt, kind=kind, buffers=BUFFERS) == a


def test_buffer_kinds() -> None:
    assert cuda_type(doc[Q]) == "float"  # unknown buffers default to float
    assert cuda_type(doc[Q], buffers=BUFFERS) == "int"
    assert cuda_type(sympy.IndexedBase("ids", integer=True)[Q]) == "int"
    with pytest.raises(PrinterError, match="not an integer"):
        print_cuda(slopes[S])


@pytest.mark.parametrize("expr", [
    sympy.gamma(S), sympy.Symbol("x") + 1, sympy.Piecewise((S, Q > KV)), sympy.zoo * S,
    sympy.Function("f")(Q), sympy.nan, sympy.Integral(S, S),
])
def test_unsupported_raises(expr: sympy.Basic) -> None:
    with pytest.raises(PrinterError):
        print_cuda(expr)


def test_unsupported_message() -> None:
    with pytest.raises(PrinterError, match="cannot print sympy node gamma .* to CUDA: supported are"):
        print_cuda(sympy.gamma(S))


def test_kind_int_rejects_float() -> None:
    with pytest.raises(PrinterError):
        print_cuda(S + 1, kind="int")


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_printed_expressions_compile_with_nvcc(tmp_path: Path, fast: bool) -> None:
    """The same expressions compile as device code against the real common.cuh (no GPU needed)."""
    fns, uses = [], []
    for i, (_, expr, _, kind) in enumerate(CASES):
        text = print_cuda(expr, kind=kind, buffers=BUFFERS, fast=fast)
        fns.append(f"static __device__ __forceinline__ auto f{i}(float score, int b, int h, int q_idx, int kv_idx,"
                   f" const AttnParams& p, const AttnBuffers& buf) {{ return {text}; }}\n")
        uses.append(f"  acc += (float)f{i}(s, t & 1, t & 3, t, 3 * t, p, buf);\n")
    src = tmp_path / "k.cu"
    src.write_text(
        '#include "attncompiler/common.cuh"\nstruct AttnParams { int Nq, Nk; };\n'
        "struct AttnBuffers { const float* slopes; int slopes_d0; const int* doc; int doc_d0;"
        " const float* m2; int m2_d0; int m2_d1; };\n" + "".join(fns) +
        'extern "C" __global__ void k(const AttnParams p, const AttnBuffers buf, float* out) {\n'
        "  const int t = threadIdx.x;\n  const float s = out[t];\n  float acc = 0.0f;\n" + "".join(uses) +
        "  out[t] = acc;\n}\n")
    res = subprocess.run([NVCC, "-arch=sm_80", "-std=c++17", "-Werror", "all-warnings", "-I",
                          str(ROOT / "templates/include"), "-c", str(src), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
