"""K/V range of a query block and Q range of a K/V block: sound against brute force, tight on the
linear masks (causal, windows, prefix-LM, ...), CUDA == Python.

Each mask is written twice -- a sympy expression for the code under test and a plain Python
predicate for brute force -- and marked ``tight`` when the derived range must be exactly the hull of
the visible indices (empty exactly when nothing is visible).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attncompiler.ir.bounds import INDEX_LIMIT
from attncompiler.ir.ranges import IndexRange, index_range, kv_dense, kv_range, q_range
from attncompiler.spec.symbols import H

from _bruteforce import (  # shared with test_bounds.py
    GXX, KV, NONE, NVCC, PRELUDE, Q, M, batch_window, bottom_right, capped, causal, chunked, chunked_causal, combined,
    diag_mod, document, float_mask, half, head_causal, head_shift, host_run, nvcc_compile, prefix, rational, sliding,
    sliding_br, small, striped, sym_window,
)


# Masks of the range tests only (the others: tests/_bruteforce.py); ``tight`` as M's.
def chunk_shift(c: int, k: int) -> M:
    return M(sympy.Eq(sympy.floor((KV + k) / c), sympy.floor(Q / c)),
             lambda b, h, q, kv, ql, kl: (kv + k) // c == q // c)


def floor_band(n: int) -> M:
    return M(KV >= sympy.Max(Q - n, 0) / 2, lambda b, h, q, kv, ql, kl: 2 * kv >= max(q - n, 0))


def point_eq(k: int) -> M:
    return M(sympy.Eq(2 * KV, Q + k), lambda b, h, q, kv, ql, kl: 2 * kv == q + k,
             tight=frozenset({"kv"}))  # q = 2 kv - k steps by 2: the clamp to q_len - 1 may miss it


def late_rows(n: int) -> M:  # rows before n see nothing (fully masked rows)
    return M((Q >= n) & (KV <= Q), lambda b, h, q, kv, ql, kl: q >= n and kv <= q, tight=NONE)


def not_equal(k: int) -> M:
    return M(sympy.Ne(KV, Q + k), lambda b, h, q, kv, ql, kl: kv != q + k, tight=NONE)


base_masks = st.one_of(
    st.just(causal()), st.just(bottom_right()), st.just(head_causal()), st.just(document()),
    st.just(float_mask()), small.map(sliding), small.map(sliding_br), small.map(sym_window),
    small.map(prefix), st.integers(1, 70).map(chunked), st.integers(1, 70).map(chunked_causal),
    st.tuples(st.integers(1, 30), st.integers(-40, 40)).map(lambda t: chunk_shift(*t)),
    st.tuples(st.integers(1, 20), st.integers(0, 20)).map(lambda t: striped(*t)),
    st.integers(1, 9).map(diag_mod), small.map(capped), small.map(floor_band), st.integers(-5, 5).map(half),
    st.integers(-5, 5).map(rational), st.integers(-5, 5).map(point_eq), small.map(late_rows),
    small.map(batch_window), small.map(head_shift), st.integers(-5, 5).map(not_equal),
)
masks = combined(base_masks)


@dataclass(frozen=True)
class Block:
    lo: int
    hi: int
    b: int
    h: int
    q_len: int
    kv_len: int


@st.composite
def blocks(draw: st.DrawFn) -> Block:
    lo = draw(st.integers(0, 300))
    return Block(lo, lo + draw(st.integers(0, 40)), draw(st.integers(0, 2)), draw(st.integers(0, 3)),
                 draw(st.integers(1, 400)), draw(st.integers(1, 400)))


def visible(m: M, axis: str, blk: Block) -> list[int]:
    """Brute force: the solved indices with a visible element in the block's rows (columns)."""
    if axis == "kv":
        return [kv for kv in range(blk.kv_len)
                if any(m.fn(blk.b, blk.h, q, kv, blk.q_len, blk.kv_len) for q in range(blk.lo, blk.hi + 1))]
    return [q for q in range(blk.q_len)
            if any(m.fn(blk.b, blk.h, q, kv, blk.q_len, blk.kv_len) for kv in range(blk.lo, blk.hi + 1))]


_CACHE: dict[tuple[sympy.Basic, str], IndexRange] = {}


def derive(m: M, axis: str) -> IndexRange:
    key = (m.expr, axis)
    if key not in _CACHE:
        _CACHE[key] = index_range(m.expr, axis)
    return _CACHE[key]


def evaluate(m: M, axis: str, blk: Block) -> tuple[int, int]:
    return derive(m, axis).evaluate(blk.lo, blk.hi, b=blk.b, h=blk.h, q_len=blk.q_len, kv_len=blk.kv_len)


def check(m: M, axis: str, blk: Block) -> None:
    lo, hi = evaluate(m, axis, blk)
    n = blk.kv_len if axis == "kv" else blk.q_len
    vis = visible(m, axis, blk)
    assert 0 <= lo and hi <= n - 1, (m.expr, axis, blk, lo, hi)
    assert all(lo <= x <= hi for x in vis), (m.expr, axis, blk, (lo, hi), vis[:5], vis[-5:])
    if axis in m.tight and vis:  # a block with nothing visible may get a (sound) non-empty range
        want = (vis[0], vis[-1])
        got = (lo, hi) if lo <= hi else None
        assert got == want, (m.expr, axis, blk, got, want)


@pytest.mark.parametrize("axis", ["kv", "q"])
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=masks, blk=blocks())
def test_sound_against_brute_force(axis: str, m: M, blk: Block) -> None:
    check(m, axis, blk)


@pytest.mark.parametrize("axis", ["kv", "q"])
@settings(max_examples=300, deadline=None)
@given(m=base_masks, blks=st.lists(blocks(), min_size=6, max_size=6))
def test_base_masks_tight(axis: str, m: M, blks: list[Block]) -> None:
    for blk in blks:
        check(m, axis, blk)


def test_window_range_is_the_window() -> None:
    """The bench's case: rows [q0, q0 + 127] of a causal window 1024 see keys [q0 - 1024, q0 + 127]."""
    r = kv_range(sliding(1024).expr)
    assert r.evaluate(2048, 2175, kv_len=16384) == (1024, 2175)
    assert r.evaluate(0, 127, kv_len=16384) == (0, 127)
    assert r.evaluate(16256, 16383, kv_len=16384) == (15232, 16383)
    assert r.evaluate(2048, 2175, kv_len=100) == (1024, 99)  # clamped: lo > hi, nothing visible
    qr = q_range(sliding(1024).expr)
    assert qr.evaluate(1024, 1087, q_len=16384) == (1024, 2111)


def test_prefix_and_bottom_right() -> None:
    assert kv_range(prefix(128).expr).evaluate(0, 63, kv_len=1000) == (0, 127)
    assert kv_range(prefix(128).expr).evaluate(512, 575, kv_len=1000) == (0, 575)
    br = kv_range(bottom_right().expr)
    assert br.evaluate(0, 63, q_len=64, kv_len=256) == (0, 255)
    lo, hi = br.evaluate(0, 63, q_len=300, kv_len=100)  # q + 100 - 300 >= kv: rows < 200 see nothing
    assert lo > hi
    assert q_range(bottom_right().expr).evaluate(0, 63, q_len=300, kv_len=100) == (200, 299)


def test_unknown_masks_are_the_whole_range() -> None:
    for m in (document(), float_mask(), striped(5, 2), not_equal(3), diag_mod(4)):
        assert kv_range(m.expr).is_full(), m.expr
        assert kv_range(m.expr).evaluate(5, 9, kv_len=77) == (0, 76)
    assert kv_range(None).evaluate(0, 10, kv_len=5) == (0, 4)
    assert q_range(True).evaluate(0, 10, q_len=7) == (0, 6)
    lo, hi = kv_range(sympy.false).evaluate(0, 10, kv_len=5)
    assert lo > hi
    # a buffer conjunct does not hide the causal bound
    both = kv_range((causal() & document()).expr)
    assert both.evaluate(64, 127, kv_len=1000) == (0, 127)


def test_overflow_guard() -> None:
    r = kv_range(causal().expr)
    assert r.evaluate(INDEX_LIMIT, INDEX_LIMIT + 5, kv_len=100) == (0, 99)  # outside the guard: whole range
    assert r.evaluate(10, 20, kv_len=INDEX_LIMIT) == (0, INDEX_LIMIT - 1)
    assert r.evaluate(10, 20, kv_len=INDEX_LIMIT - 1) == (0, 20)
    assert kv_range(KV * 1000 <= Q).is_full() is False
    assert kv_range(Q * KV >= 5).is_full()  # non-linear
    assert kv_range(KV * 1000 <= Q * 1000).evaluate(3, 9, kv_len=50) == (0, 9)


def test_rendered_prelude_has_range_hooks() -> None:
    from attncompiler.codegen.hooks import render_prelude
    from attncompiler.ir.build import build_ir
    from attncompiler.spec import presets

    text = render_prelude(build_ir(presets.sliding_window(1024, 128)))
    assert "static __device__ __forceinline__ void kv_range(int b, int h, int q_lo, int q_hi" in text
    assert "lo = max(0, q_lo - 1024);" in text and "hi = min(q_hi, p.Nk - 1);" in text
    assert "static __device__ __forceinline__ void q_range(int b, int h, int kv_lo, int kv_hi" in text
    plain = render_prelude(build_ir(presets.plain(64)))
    assert "lo = 0;\n    hi = p.Nk - 1;" in plain


def kernel_blocks(m: M, bm: int, bn: int, q_len: int, kv_len: int, b: int = 0, h: int = 0, buffers=None,
                  gallop: bool = True, descending: bool = False) -> tuple[list, int]:
    """v2_fwd.cuh's K/V loop (ranges.cuh) replayed in Python for every query block: the blocks it visits (those
    of [kv_min / BN, kv_max / BN] that tile_class does not prove EMPTY) and its tile_class calls.
    ``gallop``: kv_next_block's walk (EMPTY runs crossed by doubling ranges); False: one block at a time.
    ``descending``: v3's walk from the last block down (KvWalk<BN, true>: kv_prev_block)."""
    from attncompiler.ir.bounds import TILE_EMPTY, tile_classifier

    kinds = {name: "int" for name in buffers} if buffers else None  # int buffers: classified from their values
    tc, kr = tile_classifier(m.expr, kinds), kv_range(m.expr)
    visits, calls = [], 0
    for q0 in range(0, q_len, bm):
        q_hi = min(q0 + bm, q_len) - 1
        lo, hi = kr.evaluate(q0, q_hi, b=b, h=h, q_len=q_len, kv_len=kv_len)
        lo, hi = max(lo, 0), min(hi, kv_len - 1)
        j_begin, j_end = lo // bn, (0 if lo > hi else hi // bn + 1)

        def empty(j_lo: int, j_hi: int) -> bool:
            nonlocal calls
            calls += 1
            return tc.classify(q0, q_hi, j_lo * bn, min(j_hi * bn, kv_len) - 1, b=b, h=h, q_len=q_len,
                               kv_len=kv_len, buffers=buffers) == TILE_EMPTY

        def next_block(j: int) -> int:
            s = 1
            while j < j_end:
                j_hi = min(j + s, j_end)
                if empty(j, j_hi):
                    j, s = j_hi, (2 * s if gallop else 1)
                elif s == 1:
                    break
                else:
                    s //= 2
            return j

        def prev_block(j: int) -> int:
            s = 1
            while j >= j_begin:
                j_lo = max(j - s + 1, j_begin)
                if empty(j_lo, j + 1):
                    j, s = j_lo - 1, (2 * s if gallop else 1)
                elif s == 1:
                    break
                else:
                    s //= 2
            return j

        if descending:
            j = prev_block(j_end - 1)
            while j >= j_begin:
                visits.append((q0, j))
                j = prev_block(j - 1)
        else:
            j = next_block(j_begin)
            while j < j_end:
                visits.append((q0, j))
                j = next_block(j + 1)
    return visits, calls


@pytest.mark.parametrize("m", [sliding(1024), sliding(100), sliding_br(77), prefix(96), chunked(48), sym_window(70),
                               late_rows(200), causal() | document(), bottom_right(), head_shift(40)],
                         ids=lambda m: str(m.expr)[:40])
@pytest.mark.parametrize("shape", [(128, 64, 2500, 2500), (64, 32, 300, 1000), (128, 64, 1000, 300), (64, 64, 1, 4096)])
def test_kernel_loop_visits_every_visible_tile(m: M, shape: tuple[int, int, int, int]) -> None:
    """No tile with a visible element is left out of the loop, and the range skips the EMPTY ones."""
    bm, bn, q_len, kv_len = shape
    visits, calls = kernel_blocks(m, bm, bn, q_len, kv_len, h=2)
    seen = set(visits)
    for q0 in range(0, q_len, bm):
        rows = range(q0, min(q0 + bm, q_len))
        for j in range(-(-kv_len // bn)):
            cols = range(j * bn, min(j * bn + bn, kv_len))
            if any(m.fn(0, 2, q, kv, q_len, kv_len) for q in rows for kv in cols):
                assert (q0, j) in seen, (m.expr, shape, q0, j)
    total = -(-q_len // bm) * -(-kv_len // bn)
    assert calls <= total


@pytest.mark.parametrize("doc_len", [1, 37, 300, 1000])
@pytest.mark.parametrize("causal_too", [False, True])
def test_gallop_visits_what_the_linear_scan_visits(doc_len: int, causal_too: bool) -> None:
    """Document masks (run-time classification from the buffer's range): galloping over the other
    documents' blocks visits exactly the blocks the one-at-a-time scan visits, and with long documents
    it classifies far fewer ranges."""
    from _bruteforce import DOC_BUF

    n, bm, bn = 4096, 128, 64
    docs = [i // doc_len for i in range(n)]
    m = M(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV]), lambda b, h, q, kv, ql, kl: docs[q] == docs[kv], False)
    if causal_too:
        m = m & causal()
    bufs = {"doc": docs}
    linear, linear_calls = kernel_blocks(m, bm, bn, n, n, buffers=bufs, gallop=False)
    galloped, calls = kernel_blocks(m, bm, bn, n, n, buffers=bufs)
    assert galloped == linear
    assert calls <= linear_calls + len(linear)  # a halving step costs at most one call per visited block
    if doc_len >= 300:  # long EMPTY runs (4096 keys, 64 per block: 2048 calls one block at a time)
        assert calls < 0.6 * linear_calls, (calls, linear_calls)


@pytest.mark.parametrize("m", [sliding(1024), prefix(96), chunked(48), sym_window(70), late_rows(200), bottom_right()],
                         ids=lambda m: str(m.expr)[:40])
@pytest.mark.parametrize("shape", [(128, 64, 2500, 2500), (64, 32, 300, 1000), (192, 112, 1000, 300)])
def test_descending_walk_visits_the_same_blocks(m: M, shape: tuple[int, int, int, int]) -> None:
    """kv_prev_block (v3's walk from the last block down) visits exactly kv_next_block's blocks, in reverse."""
    bm, bn, q_len, kv_len = shape
    up, _ = kernel_blocks(m, bm, bn, q_len, kv_len, h=2)
    down, _ = kernel_blocks(m, bm, bn, q_len, kv_len, h=2, descending=True)
    assert sorted(down) == sorted(up)
    for q0 in {q for q, _ in up}:
        assert [j for q, j in down if q == q0] == sorted((j for q, j in up if q == q0), reverse=True)


@pytest.mark.parametrize("doc_len", [1, 37, 300])
def test_descending_gallop_over_documents(doc_len: int) -> None:
    """Galloping down over other documents' blocks visits what the one-at-a-time scan visits."""
    from _bruteforce import DOC_BUF

    n, bm, bn = 4096, 128, 64
    docs = [i // doc_len for i in range(n)]
    m = M(sympy.Eq(DOC_BUF[Q], DOC_BUF[KV]), lambda b, h, q, kv, ql, kl: docs[q] == docs[kv], False) & causal()
    bufs = {"doc": docs}
    linear, _ = kernel_blocks(m, bm, bn, n, n, buffers=bufs, gallop=False, descending=True)
    galloped, _ = kernel_blocks(m, bm, bn, n, n, buffers=bufs, descending=True)
    up, _ = kernel_blocks(m, bm, bn, n, n, buffers=bufs)
    assert galloped == linear and sorted(galloped) == sorted(up)


def test_window_scan_cost_at_16k() -> None:
    """The bench's shape: the old loop evaluated tile_class on all 256 blocks per CTA (the scans to
    the first and after the last non-empty block); the range visits 18 (16 for the first rows)."""
    from attncompiler.ir.bounds import tile_classifier

    n, bm, bn = 16384, 128, 64
    visits, calls = kernel_blocks(sliding(1024), bm, bn, n, n)
    assert calls == len(visits)  # every in-range block holds a visible key
    per_cta = [sum(1 for q0, _ in visits if q0 == c * bm) for c in range(n // bm)]
    assert max(per_cta) == 18 and min(per_cta) == 2
    tc = tile_classifier(sliding(1024).expr)
    partial = sum(1 for q0, j in visits if tc.classify(q0, q0 + bm - 1, j * bn, j * bn + bn - 1) == 1)
    assert partial == 4 * (n // bm) - 2 * (1024 // bm)  # diagonal pair + window-edge pair (none in rows < 1024)


# ---------------------------------------------------------------------------------------------
# CUDA emission == Python (g++ on the host, with the real common.cuh when CUDA headers exist)
# ---------------------------------------------------------------------------------------------
CUDA_MASKS = [
    None, causal().expr, bottom_right().expr, sliding(1024).expr, sliding_br(64).expr, sym_window(33).expr,
    prefix(128).expr, chunked(64).expr, chunked(37).expr, chunked_causal(48).expr, chunk_shift(16, -5).expr,
    striped(256, 128).expr, capped(300).expr, floor_band(40).expr, half(3).expr, rational(-1).expr,
    point_eq(2).expr, head_causal().expr, late_rows(64).expr, batch_window(17).expr, head_shift(30).expr,
    document().expr, (causal() & document()).expr, (~(prefix(64) | sliding(20)) & bottom_right()).expr,
    sympy.Xor(Q > KV, KV < 100), float_mask().expr, sympy.Piecewise((Q >= KV, H > 0), (KV < 50, True)),
]


def _functions(axis: str) -> str:
    lo, hi = ("q_lo", "q_hi") if axis == "kv" else ("kv_lo", "kv_hi")
    return "".join(
        f"static __device__ __forceinline__ void {axis}_range_{i}(int b, int h, int {lo}, int {hi},"
        f" const AttnParams& p, const AttnBuffers& buf, int& lo, int& hi) {{\n{index_range(m, axis).to_cuda()}\n}}\n"
        for i, m in enumerate(CUDA_MASKS))


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_cuda_emission_matches_python(tmp_path: Path) -> None:
    rng = random.Random(0)
    n = len(CUDA_MASKS)
    calls = "\n".join(f"      case {i}: kv_range_{i}(b, h, e0, e1, p, buf, lo, hi); break;\n"
                      f"      case {n + i}: q_range_{i}(b, h, e0, e1, p, buf, lo, hi); break;" for i in range(n))
    source = PRELUDE + _functions("kv") + _functions("q") + (
        "int main() {\n  int fn, b, h, e0, e1, nq, nk;\n  const AttnBuffers buf = {nullptr, 0};\n"
        "  while (std::scanf(\"%d %d %d %d %d %d %d\", &fn, &b, &h, &e0, &e1, &nq, &nk) == 7) {\n"
        "    const AttnParams p = {nq, nk};\n    int lo = -7, hi = -7;\n    switch (fn) {\n" + calls +
        "\n      default: return 1;\n    }\n    std::printf(\"%d %d\\n\", lo, hi);\n  }\n  return 0;\n}\n")
    work = []
    for fn in range(2 * n):
        for _ in range(300):
            span = rng.choice([1, 64, 128, 1000, 20000, INDEX_LIMIT])
            e0 = rng.randrange(span)
            e1 = e0 + rng.choice([0, 15, 63, 127, rng.randrange(50)])
            nq, nk = rng.randrange(0, span + 300), rng.randrange(0, span + 300)  # 0: outside the guard
            work.append((fn, rng.randrange(3), rng.randrange(4), e0, e1, nq, nk))
    out = host_run(source, "".join(" ".join(map(str, w)) + "\n" for w in work), tmp_path,
                   ("-Wno-unused-but-set-parameter",)).splitlines()
    assert len(out) == len(work)
    bad = []
    for w, got in zip(work, out):
        fn, b, h, e0, e1, nq, nk = w
        axis, m = ("kv", CUDA_MASKS[fn]) if fn < n else ("q", CUDA_MASKS[fn - n])
        length = nk if axis == "kv" else nq
        want = index_range(m, axis).evaluate(e0, e1, b=b, h=h, q_len=nq, kv_len=nk)
        g = tuple(int(x) for x in got.split())
        if g != want and not (length == 0 and g == (0, -1)):  # Python needs len >= 1; CUDA: empty
            bad.append(f"{axis} {m} {w}: cuda {g} python {want}")
    assert not bad, "\n".join(bad[:20])


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_cuda_emission_compiles_with_nvcc(tmp_path: Path) -> None:
    """The bodies compile as device code against the real common.cuh (no GPU needed)."""
    calls = "".join(f"  kv_range_{i}(t & 1, t & 3, t, t + 63, p, buf, lo, hi); c += lo + hi;\n"
                    f"  q_range_{i}(t & 1, t & 3, 2 * t, 2 * t + 63, p, buf, lo, hi); c += lo - hi;\n"
                    for i in range(len(CUDA_MASKS)))
    nvcc_compile(_functions("kv") + _functions("q") +
                 'extern "C" __global__ void k(const AttnParams p, const AttnBuffers buf, int* out) {\n'
                 "  const int t = threadIdx.x;\n  int c = 0, lo, hi;\n" + calls + "  out[t] = c;\n}\n", tmp_path)


# ---------------------------------------------------------------------------------------------
# GPU: the v2 forward visits only the K/V blocks of kv_range; same answers (run with -m gpu)
# ---------------------------------------------------------------------------------------------
def _gpu_specs() -> dict[str, object]:
    import attncompiler as ac
    from attncompiler.spec import presets

    def chunk(b, h, q_idx, kv_idx):  # noqa: ANN001 - mask_mod signature
        return q_idx // 48 == kv_idx // 48

    def sym(b, h, q_idx, kv_idx):  # noqa: ANN001
        return abs(q_idx - kv_idx) <= 70

    def late(b, h, q_idx, kv_idx):  # noqa: ANN001 - rows < 200 see nothing (O = 0, LSE = -inf)
        return (q_idx >= 200) & (kv_idx <= q_idx)

    return {
        "window 100": presets.sliding_window(100, 64),
        "window 100 + bottom-right causal": ac.AttentionSpec(64, causal=True, mask_mod=presets.sliding_window_mask(100),
                                                             name="br_window"),
        "prefix 96": presets.prefix_lm(96, 64),
        "chunked 48": ac.AttentionSpec(64, mask_mod=chunk, name="chunked"),
        "symmetric window 70": ac.AttentionSpec(64, mask_mod=sym, name="sym_window"),
        "late rows": ac.AttentionSpec(64, mask_mod=late, name="late_rows"),
        "window 300 fp16 d128": presets.sliding_window(300, 128, dtype="fp16"),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(_gpu_specs()))
def test_gpu_forward_with_kv_range(name: str) -> None:
    import attncompiler as ac
    from attncompiler.testing import check_kernel

    spec = _gpu_specs()[name]
    for opts in ({}, {"block_m": 64, "block_n": 32, "num_warps": 4, "stages": 1}):
        kern = ac.compile(spec, "v2", **opts)
        for nq, nk in ((1, 1), (113, 113), (1023, 1023), (300, 1000), (1000, 300), (1, 4096), (2500, 2500)):
            res = check_kernel(kern, 1, 2, nq, nk)
            assert res.ok, f"{name} {opts} Nq={nq} Nk={nk}: {res}"


def test_kv_dense_masks() -> None:
    """Which masks the walk may visit without the EMPTY search (ir/ranges.py kv_dense): conjunctions of bounds on
    kv_idx that rise with q_idx at slope 0 or 1; everything else keeps the search."""
    dense = [causal(), bottom_right(), sliding(1024), sliding(3), sliding_br(77), batch_window(5),
             causal() & bottom_right(), M(KV <= Q + 7, None), M(sympy.Eq(KV, Q - 2), None),
             M((KV >= 10) & (KV <= Q), None), M(sympy.Eq(H, 0) & (KV <= Q), None), M(~(KV > Q), None)]
    searched = [prefix(96), sym_window(70), capped(40), document(), chunked(48), chunked_causal(48), striped(8, 3),
                float_mask(), half(2), rational(1), not_equal(0), late_rows(200), head_causal(), head_shift(3),
                M(KV >= 2 * Q, None), M(KV <= -Q + 900, None), M(~((KV <= Q) & (KV >= Q - 9)), None)]
    assert kv_dense(None) and kv_dense(True)
    for m in dense:
        assert kv_dense(m.expr), m.expr
    for m in searched:
        assert not kv_dense(m.expr), m.expr
    # why a condition on q_idx alone keeps the search: rows 128-199 see nothing, the derived range starts at
    # 128 - 16 while the first visible key is 200 - 16, so blocks of 16 keys in between are EMPTY
    m, blk = late_rows(200) & sliding(16), Block(128, 255, 0, 0, 400, 400)
    lo, hi = evaluate(m, "kv", blk)
    vis = set(visible(m, "kv", blk))
    assert (lo, min(vis)) == (112, 184) and not kv_dense(m.expr)
    assert not vis & set(range(128, 144))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=masks, blk=blocks(), bn=st.sampled_from([16, 64, 128]))
def test_kv_dense_range_has_no_empty_block(m: M, blk: Block, bn: int) -> None:
    """Brute force: where kv_dense holds, every key block that meets a query block's derived K/V range holds a
    key visible from one of its rows (so skipping the EMPTY search visits exactly the blocks the search would)."""
    if not kv_dense(m.expr):
        return
    lo, hi = evaluate(m, "kv", blk)
    if lo > hi:
        return
    vis = set(visible(m, "kv", blk))
    for j in range(lo // bn, hi // bn + 1):
        assert vis & set(range(j * bn, min(j * bn + bn, blk.kv_len))), (m.expr, blk, bn, (lo, hi), j)


def q_walk(m: M, bm: int, kv0: int, kv_hi: int, q_len: int, kv_len: int, heads: int, rot: int, b: int = 0,
           jump: bool = True) -> tuple[list[tuple[int, int]], int]:
    """ranges.cuh q_walk_skip replayed in Python: the (head, query block) pairs the backward's walk over one K/V
    block visits, in order, and its tile_class calls. ``jump``: positions outside q_range are jumped over
    (False: AC_Q_WALK_SCAN, one position at a time)."""
    from attncompiler.ir.bounds import TILE_EMPTY, tile_classifier

    tc, qr = tile_classifier(m.expr), q_range(m.expr)
    nqb = -(-q_len // bm)
    calls = 0

    def block_of(i: int) -> int:
        qb = nqb - 1 - i if rot < 0 else i + rot
        return qb - nqb if qb >= nqb else qb

    def skip(hg: int, i: int) -> tuple[int, int]:
        nonlocal calls
        while hg < heads:
            q0 = block_of(i) * bm
            calls += 1
            if tc.classify(q0, min(q0 + bm, q_len) - 1, kv0, kv_hi, b=b, h=hg, q_len=q_len, kv_len=kv_len) != TILE_EMPTY:
                return hg, i
            i += 1
            if i == nqb:
                hg, i = hg + 1, 0
                continue
            if jump:  # the range derived again at each EMPTY tile, as the kernel does
                lo, hi = qr.evaluate(kv0, kv_hi, b=b, h=hg, q_len=q_len, kv_len=kv_len)
                lo, hi = max(lo, 0), min(hi, q_len - 1)
                qb_lo, qb_hi = lo // bm, (-1 if lo > hi else hi // bm)
                qb = block_of(i)
                if qb < qb_lo or qb > qb_hi:
                    i_t = nqb - 1 - qb_hi if rot < 0 else qb_lo - rot
                    if i_t < 0:
                        i_t += nqb
                    if qb_lo <= qb_hi and i < i_t:
                        i = i_t
                    else:
                        hg, i = hg + 1, 0
        return hg, i

    visits: list[tuple[int, int]] = []
    hg, i = skip(0, 0)
    while hg < heads:
        visits.append((hg, block_of(i)))
        i += 1
        if i == nqb:
            hg, i = hg + 1, 0
        hg, i = skip(hg, i)
    return visits, calls


@pytest.mark.parametrize("m", [causal(), sliding(1024), sliding(100), sliding_br(77), prefix(96), chunked(48),
                               sym_window(70), late_rows(200), causal() | document(), bottom_right(), head_shift(40),
                               capped(30), not_equal(3)],
                         ids=lambda m: str(m.expr)[:40])
@pytest.mark.parametrize("shape", [(64, 128, 2500, 2500), (64, 64, 300, 1000), (64, 128, 1000, 300), (128, 128, 1, 700)])
def test_q_walk_jumps_visit_what_the_scan_visits(m: M, shape: tuple[int, int, int, int]) -> None:
    """The backward's walk over query blocks (ranges.cuh q_walk_skip): jumping over the positions outside q_range
    visits the same (head, query block) pairs in the same order as classifying every position, for rotated
    (atomic dQ), unrotated and descending (deterministic) orders, and every visible tile is among them."""
    bm, bn, q_len, kv_len = shape
    nqb, heads = -(-q_len // bm), 3
    for j in range(-(-kv_len // bn)):
        kv0, kv_hi = j * bn, min(j * bn + bn, kv_len) - 1
        for rot in (j % nqb, 0, -1):
            scan, scan_calls = q_walk(m, bm, kv0, kv_hi, q_len, kv_len, heads, rot, jump=False)
            jumped, calls = q_walk(m, bm, kv0, kv_hi, q_len, kv_len, heads, rot)
            assert jumped == scan, (m.expr, shape, j, rot)
            assert calls <= scan_calls
            for hg in range(heads):
                for qb in range(nqb):
                    rows = range(qb * bm, min(qb * bm + bm, q_len))
                    if any(m.fn(0, hg, q, kv, q_len, kv_len) for q in rows for kv in range(kv0, kv_hi + 1)):
                        assert (hg, qb) in jumped, (m.expr, shape, j, rot, hg, qb)


def test_q_walk_jumps_over_the_causal_upper_triangle() -> None:
    """N = 16k, 64-row query blocks, 128-key blocks: the scan classifies every query block above a causal K/V
    block's diagonal (2 kv0 / 64 of them, up to 254); the jump classifies at most two tiles more than it visits."""
    n, bm, bn = 16384, 64, 128
    nqb = n // bm
    for j in (1, 40, 127):
        kv0 = j * bn
        scan, scan_calls = q_walk(causal(), bm, kv0, kv0 + bn - 1, n, n, 1, j % nqb, jump=False)
        jumped, calls = q_walk(causal(), bm, kv0, kv0 + bn - 1, n, n, 1, j % nqb)
        assert jumped == scan and len(scan) == nqb - 2 * j
        assert scan_calls == nqb and calls <= len(scan) + 2, (j, calls, len(scan))
