"""Tile classification: sound against brute force, tight on the standard masks, CUDA == Python.

Each test mask is written twice -- as the sympy expression the classifier reads and as a plain
Python predicate for brute force -- so the check does not depend on the code under test.
"""
from __future__ import annotations

import functools
import random
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
from attncompiler.spec.symbols import B, H, KV_LEN, Q_LEN

from _bruteforce import (  # shared with test_ranges.py
    DOC_BUF, GXX, KV, NVCC, PRELUDE, Q, M, batch_window, bottom_right, capped, causal, chunked, chunked_causal,
    combined, cuda_classes_match_python, diag_mod, document, float_mask, half, head_causal, head_shift,
    nvcc_compile_classifiers, prefix, rational, sliding, sliding_br, small, striped, sym_window,
)

DOC = [(i * 7) // 45 for i in range(1000)]  # the first 1000 of document()'s ids, as buffer values


base_masks = st.one_of(
    st.just(causal()), st.just(bottom_right()), st.just(head_causal()), st.just(document()),
    st.just(float_mask()), small.map(sliding), small.map(sliding_br), small.map(sym_window),
    small.map(prefix), st.integers(1, 70).map(chunked), st.integers(1, 70).map(chunked_causal),
    st.tuples(st.integers(1, 20), st.integers(0, 20)).map(lambda t: striped(*t)),
    st.integers(1, 9).map(diag_mod), small.map(capped), st.integers(-5, 5).map(half),
    st.integers(-5, 5).map(rational), small.map(batch_window), small.map(head_shift),
)
masks = combined(base_masks)


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

    def python(w: tuple[int, ...]) -> int:
        i, b, h, ql, qh, kl, kh, nq, nk = w
        return classifiers[i].classify(ql, qh, kl, kh, b=b, h=h, q_len=nq, kv_len=nk)

    out = cuda_classes_match_python(source, work, tmp_path, CUDA_MASKS, python)
    seen = set(out)
    assert seen == {TILE_EMPTY, TILE_PARTIAL, TILE_FULL}


def test_cuda_text_causal() -> None:
    text = tile_classifier(Q >= KV).to_cuda()
    assert "const int lo0 = q_lo - kv_hi;" in text and "const int hi0 = q_hi - kv_lo;" in text
    assert "return t0;" in text
    assert tile_classifier(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV])).to_cuda().strip().endswith("return AC_TILE_PARTIAL;")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_cuda_emission_compiles_with_nvcc(tmp_path: Path) -> None:
    """The bodies compile as device code against the real common.cuh (no GPU needed)."""
    nvcc_compile_classifiers([tile_classifier(m).to_cuda() for m in CUDA_MASKS], tmp_path)


# ---------------------------------------------------------------------------------------------
# masks reading an int buffer (attncompiler/ir/bufreads.py): value ranges from the buffer itself
# ---------------------------------------------------------------------------------------------
KINDS = {"doc": "int"}
Maker = Callable[[tuple[int, ...]], M]  # buffer values -> mask over them


def _at(vals: tuple[int, ...], i: int) -> int:
    return vals[min(max(i, 0), len(vals) - 1)]  # the kernels clamp buffer indices into range


def _buf_leaves() -> list[Maker]:
    d = DOC_BUF
    return [
        lambda vs: M(sympy.Eq(d[Q], d[KV]), lambda b, h, q, kv, ql, kl: _at(vs, q) == _at(vs, kv), False),
        lambda vs: M(sympy.Ne(d[Q], d[KV]), lambda b, h, q, kv, ql, kl: _at(vs, q) != _at(vs, kv), False),
        lambda vs: M(d[Q + 5] >= d[KV], lambda b, h, q, kv, ql, kl: _at(vs, q + 5) >= _at(vs, kv), False),
        lambda vs: M(sympy.Eq(d[sympy.floor(Q / 2)], d[KV - 3]),
                     lambda b, h, q, kv, ql, kl: _at(vs, q // 2) == _at(vs, kv - 3), False),
        lambda vs: M(sympy.Ne(d[KV], 0), lambda b, h, q, kv, ql, kl: _at(vs, kv) != 0, False),
        lambda vs: M(d[Q] - d[KV] <= 2, lambda b, h, q, kv, ql, kl: _at(vs, q) - _at(vs, kv) <= 2, False),
        lambda vs: M(sympy.Eq(d[H], 1) | (Q >= KV), lambda b, h, q, kv, ql, kl: _at(vs, h) == 1 or q >= kv, False),
        lambda vs: M(sympy.Eq(d[Q], d[KV]) & (Q >= KV),
                     lambda b, h, q, kv, ql, kl: _at(vs, q) == _at(vs, kv) and q >= kv, False),
    ]


def _const_maker(m: M) -> Maker:
    return lambda vs: m


_plain_makers = base_masks.filter(lambda m: not m.expr.has(sympy.Indexed)).map(_const_maker)  # not document()
buf_makers = st.recursive(  # at least one buffer leaf, combined with buffer and index masks
    st.sampled_from(_buf_leaves()),
    lambda kids: st.one_of(
        st.tuples(kids, st.one_of(kids, _plain_makers)).map(lambda t: (lambda vs: t[0](vs) & t[1](vs))),
        st.tuples(kids, st.one_of(kids, _plain_makers)).map(lambda t: (lambda vs: t[0](vs) | t[1](vs))),
        kids.map(lambda f: (lambda vs: ~f(vs)))),
    max_leaves=3,
)


@st.composite
def buffers(draw: st.DrawFn) -> tuple[str, tuple[int, ...]]:
    """(kind, values): sorted document ids with random lengths, unsorted ids, constant ids, or ids
    near the classifier's value guard (+-INDEX_LIMIT)."""
    kind = draw(st.sampled_from(["sorted", "unsorted", "constant", "huge"]))
    n = draw(st.integers(1, 400))
    if kind == "sorted":
        start, cuts = draw(st.integers(-3, 3)), draw(st.lists(st.integers(1, n), max_size=12))
        vals = tuple(start + sum(1 for c in cuts if c <= i) for i in range(n))
    elif kind == "unsorted":
        vals = tuple(draw(st.lists(st.integers(-2, 5), min_size=n, max_size=n)))
    elif kind == "constant":
        vals = (draw(st.integers(-5, 5)),) * n
    else:
        big = st.sampled_from([INDEX_LIMIT - 1, INDEX_LIMIT, -INDEX_LIMIT, 1 - INDEX_LIMIT, 0, 1])
        vals = tuple(draw(st.lists(big, min_size=n, max_size=n)))
    return kind, vals


@functools.lru_cache(maxsize=None)
def buffer_classifier(expr: sympy.Basic) -> TileClassifier:
    return tile_classifier(expr, KINDS)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(buf_makers, buffers(), tiles())
def test_buffer_masks_sound_against_brute_force(maker: Maker, buf: tuple[str, tuple[int, ...]], t: Tile) -> None:
    """Nothing classified EMPTY holds a visible element, nothing classified FULL a masked one."""
    kind, vals = buf
    m = maker(vals)
    c = buffer_classifier(m.expr)
    got = c.classify(t.q_lo, t.q_hi, t.kv_lo, t.kv_hi, b=t.b, h=t.h, q_len=t.q_len, kv_len=t.kv_len,
                     buffers={"doc": vals})
    truth = brute_force(m, t)
    assert got == truth or got == TILE_PARTIAL, (m.expr, kind, t, got, truth)


@settings(max_examples=200, deadline=None)
@given(buffers(), tiles())
def test_document_mask_tight_on_sorted_and_constant_ids(buf: tuple[str, tuple[int, ...]], t: Tile) -> None:
    """Sorted ids: EMPTY exactly when the tile's two id ranges share no id, FULL exactly when both are
    one and the same id (so as tight as a precomputed block mask); constant ids: always FULL."""
    kind, vals = buf
    m = _buf_leaves()[0](vals)
    got = buffer_classifier(m.expr).classify(t.q_lo, t.q_hi, t.kv_lo, t.kv_hi, buffers={"doc": vals})
    if kind in ("sorted", "constant"):
        assert got == brute_force(m, t), (kind, t, got)
    if kind == "constant":
        assert got == TILE_FULL


def test_buffer_mask_classified_from_values() -> None:
    doc = sympy.Eq(DOC_BUF[Q], DOC_BUF[KV])
    c = tile_classifier(doc, KINDS)
    assert [r.name for r in c.reads] == ["doc", "doc"] and c.inputs() == {Q_LO, Q_HI, KV_LO, KV_HI}
    vals = {"doc": DOC}  # ids (7 i) // 45: a new document every 6 or 7 positions (0 .. 6, 7 .. 12, ...)
    assert c.classify(0, 5, 0, 5, buffers=vals) == TILE_FULL
    assert c.classify(0, 5, 7, 12, buffers=vals) == TILE_EMPTY
    assert c.classify(0, 63, 0, 63, buffers=vals) == TILE_PARTIAL
    assert c.classify(0, 5, 0, 5) == TILE_PARTIAL  # no values given: unknown
    both = tile_classifier((Q >= KV) & doc, KINDS)
    assert both.classify(0, 5, 7, 12, buffers=vals) == TILE_EMPTY  # causal alone: EMPTY too
    assert both.classify(700, 705, 600, 605, buffers=vals) == TILE_EMPTY  # causal alone: FULL
    assert both.classify(700, 705, 700, 705, buffers=vals) == TILE_PARTIAL  # the diagonal
    assert both.classify(6, 6, 0, 5, buffers=vals) == TILE_FULL  # positions 0 .. 6: document 0
    assert both.classify(7, 7, 0, 6, buffers=vals) == TILE_EMPTY  # position 7: document 1
    assert tile_classifier(doc, {"doc": "float"}).reads == ()  # float buffers: PARTIAL as before
    assert tile_classifier(doc).classify(0, 5, 0, 5, buffers=vals) == TILE_PARTIAL  # kinds unknown
    cuda = c.to_cuda()
    assert "buf.doc_gminmax != nullptr" in cuda and "rd0_ok && rd1_ok" in cuda


def test_buffer_read_guards() -> None:
    n = 100
    big = {"doc": [INDEX_LIMIT] * n}
    c = tile_classifier(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV]), KINDS)
    assert c.classify(0, 9, 0, 9, buffers=big) == TILE_PARTIAL  # values beyond the guard: unknown
    assert c.classify(0, 9, 0, 9, buffers={"doc": [INDEX_LIMIT - 1] * n}) == TILE_FULL
    assert c.classify(0, 9, 500, 509, buffers={"doc": list(range(n))}) == TILE_EMPTY  # clamped: 99 only
    assert c.classify(95, 120, 500, 509, buffers={"doc": list(range(n))}) == TILE_PARTIAL
    assert tile_classifier(DOC_BUF[Q] * 1000 >= KV, KINDS).reads == ()  # could overflow int32
    two = sympy.IndexedBase("m")
    assert tile_classifier(sympy.Ne(two[Q, KV], 0), {"m": "int"}).reads == ()  # two ranged indices
    with pytest.raises(ValueError, match="expected 1 dims"):
        c.classify(0, 9, 0, 9, buffers={"doc": [[1, 2], [3, 4]]})
    with pytest.raises(ValueError, match="int or bool entries"):
        c.classify(0, 9, 0, 9, buffers={"doc": [1.5, 2.0]})
