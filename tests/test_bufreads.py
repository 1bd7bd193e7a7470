"""Tile classification by buffer values (attncompiler/ir/bufreads.py, attncompiler/runtime/blockstats.py).

CPU only: the granule tables against brute force and their cache; every launch path's
``pack_params`` filling the table pointers; the generated ``tile_class`` bodies compiled with g++
(CUDA == Python on real tables, document ids sorted / unsorted / beyond the value guard, a null
table) and with nvcc; the tile simulator on document masks (random unsorted ids, document lengths
that are multiples of no tile, causal & document, per-batch ids) against the float64 reference.
The tile soundness property over random buffers lives in tests/test_bounds.py.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import sympy
import torch

import attncompiler as ac
from attncompiler.ir.bounds import INDEX_LIMIT, TILE_EMPTY, TILE_FULL, TILE_PARTIAL, tile_classifier
from attncompiler.ir.bufreads import GRANULE, BufferValues
from attncompiler.ir.build import build_ir
from attncompiler.ir.types import BufferInfo
from attncompiler.reference import reference_attention
from attncompiler.runtime import blockstats
from attncompiler.runtime.launch import AttnInputs, pack_params, prepare_buffers
from attncompiler.runtime.params import buffer_fields, c_struct
from attncompiler.simulate import TileSchedule, simulate, tile_classes
from attncompiler.spec import presets
from attncompiler.spec.symbols import B, H, KV_IDX, KV_LEN, Q_IDX, Q_LEN
from _bruteforce import (  # shared with test_bounds.py
    GXX, HOST_PRELUDE, NVCC, cuda_classes_match_python, nvcc_compile_classifiers,
)

Q, KV = Q_IDX, KV_IDX
DOC, D2, COL = sympy.IndexedBase("doc"), sympy.IndexedBase("d2"), sympy.IndexedBase("col")
INFOS = (BufferInfo("doc", 1, "int"), BufferInfo("d2", 2, "int"), BufferInfo("col", 2, "int"))


def _brute_table(t: torch.Tensor, axis: int) -> torch.Tensor:
    x = t.to(torch.int64).movedim(axis, -1)
    n = x.shape[-1]
    chunks = [x[..., g:g + GRANULE] for g in range(0, n, GRANULE)]
    return torch.stack([torch.stack([c.amin(-1), c.amax(-1)], -1) for c in chunks], -2).to(torch.int32)


@pytest.mark.parametrize("shape,axis", [((1,), 0), ((16,), 0), ((17,), 0), ((1000,), 0), ((3, 77), 1),
                                        ((77, 2), 0), ((2, 40, 3), 1)])
def test_granule_minmax_matches_brute_force(shape: tuple[int, ...], axis: int) -> None:
    t = torch.randint(-50, 50, shape, dtype=torch.int64)
    got = blockstats.granule_minmax(t, axis)
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert torch.equal(got, _brute_table(t, axis))
    b = torch.rand(shape) > 0.5
    assert torch.equal(blockstats.granule_minmax(b, axis), _brute_table(b.to(torch.int32), axis))
    with pytest.raises(ValueError, match="int or bool"):
        blockstats.granule_minmax(t.float(), axis)
    table = blockstats.range_table(t, axis)  # level k, granule g: granules [g, g + 2^k) clipped
    base = _brute_table(t, axis)
    ng = base.shape[-2]
    assert table.shape == (*base.shape[:-2], ng.bit_length(), ng, 2)
    for k in range(ng.bit_length()):
        for g in range(ng):
            part = base[..., g:g + (1 << k), :]
            assert torch.equal(table[..., k, g, 0], part[..., 0].amin(-1))
            assert torch.equal(table[..., k, g, 1], part[..., 1].amax(-1))


def test_tables_are_cached_per_buffer_version() -> None:
    blockstats.clear_cache()
    t = torch.arange(100, dtype=torch.int32)
    a, b = blockstats.granule_table(t, 0), blockstats.granule_table(t, 0)
    assert a is b  # same buffer, same version: nothing recomputed
    t[5] = 1000  # in-place update: a new version, a new table
    c = blockstats.granule_table(t, 0)
    assert c is not a and int(c[0, 0, 1]) == 1000  # level 0, granule 0: max
    src = torch.arange(40, dtype=torch.int64)
    d1 = blockstats.device_int32(src, torch.device("cpu"))
    assert d1.dtype == torch.int32 and blockstats.device_int32(src, torch.device("cpu")) is d1
    assert blockstats.device_int32(d1, torch.device("cpu")) is d1  # already int32, contiguous, there
    with torch.inference_mode():
        inf = torch.arange(40, dtype=torch.int32)
    x, y = blockstats.granule_table(inf, 0), blockstats.granule_table(inf, 0)
    assert x is not y and torch.equal(x, y)  # no version counter: never cached
    for i in range(blockstats.CACHE_SIZE + 5):
        blockstats.granule_table(torch.full((8,), i, dtype=torch.int32), 0)
    assert len(blockstats._cache) <= blockstats.CACHE_SIZE
    blockstats.clear_cache()
    assert not blockstats._cache


def _doc_mask2(ids2: torch.Tensor):
    def mask(b, h, q_idx, kv_idx):
        return (ids2[b, q_idx] == ids2[b, kv_idx]) & (q_idx >= kv_idx)
    return mask


def test_table_axes_and_pack_params_fill_the_pointers() -> None:
    ids = torch.randint(0, 4, (300,), dtype=torch.int64)
    ir = build_ir(presets.document(ids, 64))
    assert blockstats.table_axes(ir) == {"doc_ids": 0}
    ids2 = torch.randint(0, 4, (2, 300), dtype=torch.int32)
    ir2 = build_ir(ac.AttentionSpec(head_dim=64, mask_mod=_doc_mask2(ids2)))
    (name,) = [b.name for b in ir2.buffers]
    assert blockstats.table_axes(ir2) == {name: 1}
    assert blockstats.table_axes(build_ir(presets.causal(64))) == {}
    fields = [f.name for f in buffer_fields(ir.buffers)]
    assert fields == ["doc_ids", "doc_ids_d0", "doc_ids_gminmax"]
    q = torch.zeros(1, 2, 300, 64, dtype=torch.bfloat16)
    dims = AttnInputs(1, 2, 2, 300, 300, 64, 64)
    for the_ir, bufs in ((ir, {"doc_ids": ids}), (ir2, {name: ids2})):
        prepared = prepare_buffers(the_ir, bufs, torch.device("cpu"))
        assert prepare_buffers(the_ir, bufs, torch.device("cpu"))[0] is prepared[0]  # cached copy
        _, Bf = pack_params(q, q, q, q, None, None, dims, scale=1.0, dropout_p=0.0, seed=0, offset=0, ir=the_ir,
                            buffers=prepared)
        (nm,) = bufs
        table = blockstats.granule_table(prepared[0], blockstats.table_axes(the_ir)[nm])
        assert getattr(Bf, f"{nm}_gminmax") == table.data_ptr()
        assert torch.equal(table, blockstats.range_table(prepared[0], blockstats.table_axes(the_ir)[nm]))
    # an int buffer the classifier does not read: no table, null pointer
    def score(s, b, h, q_idx, kv_idx):
        return s + ids[kv_idx]
    ir3 = build_ir(ac.AttentionSpec(head_dim=64, score_mod=score))
    _, Bf = pack_params(q, q, q, q, None, None, dims, scale=1.0, dropout_p=0.0, seed=0, offset=0, ir=ir3,
                        buffers=prepare_buffers(ir3, {ir3.buffers[0].name: ids}, torch.device("cpu")))
    assert not getattr(Bf, f"{ir3.buffers[0].name}_gminmax")


def test_buffer_values_of() -> None:
    assert BufferValues.of([[1, 2], [3, 4]]) == BufferValues((2, 2), (1, 2, 3, 4))
    assert BufferValues.of(torch.tensor([True, False])) == BufferValues((2,), (1, 0))
    with pytest.raises(ValueError, match="rectangular"):
        BufferValues.of([[1, 2], [3]])
    with pytest.raises(ValueError, match="int or bool buffer"):
        BufferValues.of(torch.zeros(3))


# ---------------------------------------------------------------------------------------------
# CUDA == Python: the emitted bodies on real tables (g++), and as device code (nvcc)
# ---------------------------------------------------------------------------------------------
CUDA_MASKS = [
    sympy.Eq(DOC[Q], DOC[KV]),
    (Q >= KV) & sympy.Eq(DOC[Q], DOC[KV]),
    sympy.Ne(DOC[KV], 0) | (Q >= KV),
    sympy.Eq(DOC[sympy.floor(Q / 2)], DOC[KV - 3]),
    DOC[Q] - DOC[KV] <= 2,
    sympy.Eq(D2[B, Q], D2[B, KV]) & (Q + KV_LEN - Q_LEN >= KV),
    sympy.Eq(COL[Q, 1], COL[KV, 1]) | sympy.Eq(COL[Q, 0], COL[KV, 0] + 1),
    sympy.Eq(DOC[H], 1) | (Q >= KV),
]


def _sorted_ids(rng: random.Random, n: int) -> list[int]:
    out, cur = [], rng.randrange(-2, 3)
    while len(out) < n:
        out += [cur] * rng.choice((1, 5, 13, 16, 17, 31, 100, 129))
        cur += rng.choice((1, 1, 2))
    return out[:n]


def _datasets(rng: random.Random) -> list[dict[str, torch.Tensor]]:
    """Buffer values: sorted ids (document lengths that are multiples of no tile), unsorted ids,
    values at the guard (+-INDEX_LIMIT), and None (null tables: every read unknown)."""
    sets = []
    for kind in ("sorted", "unsorted", "huge"):
        def ids(n: int) -> list[int]:
            if kind == "sorted":
                return _sorted_ids(rng, n)
            if kind == "unsorted":
                return [rng.randrange(0, 4) for _ in range(n)]
            return [rng.choice((0, 1, INDEX_LIMIT - 1, INDEX_LIMIT, -INDEX_LIMIT)) for _ in range(n)]
        sets.append({"doc": torch.tensor(ids(1000)),
                     "d2": torch.tensor([ids(600) for _ in range(3)]),
                     "col": torch.tensor(list(zip(ids(500), ids(500))))})
    return sets


def _c_array(name: str, t: torch.Tensor) -> str:
    return f"static const int {name}[] = {{{', '.join(str(int(x)) for x in t.reshape(-1).tolist())}}};\n"


def _buffers_source(datasets: list[dict[str, torch.Tensor]]) -> str:
    """The AttnBuffers struct (runtime/params.py) and one initialized instance per dataset (+ null)."""
    src = c_struct("AttnBuffers", buffer_fields(INFOS)) + "\n"
    inits = []
    for i, ds in enumerate(datasets):
        vals = []
        for info in INFOS:
            t = ds[info.name]
            src += _c_array(f"{info.name}_{i}", t)
            axis = {"doc": 0, "d2": 1, "col": 0}[info.name]
            src += _c_array(f"{info.name}_{i}_t", blockstats.range_table(t, axis))
            vals += [f"{info.name}_{i}", *map(str, t.shape), f"{info.name}_{i}_t"]
        inits.append("{" + ", ".join(vals) + "}")
    null = ", ".join(f"nullptr, {', '.join(['1'] * info.ndim)}, nullptr" for info in INFOS)
    inits.append("{" + null + "}")
    return src + f"static const AttnBuffers kBufs[] = {{{', '.join(inits)}}};\n"


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_cuda_reads_match_python(tmp_path: Path) -> None:
    rng = random.Random(3)
    datasets = _datasets(rng)
    classifiers = [tile_classifier(m, INFOS) for m in CUDA_MASKS]
    assert all(c.reads for c in classifiers)
    assert [r.axis for r in classifiers[6].reads] == [0] * 4
    fns = "".join(f"static int tc{i}(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi, const AttnParams& p,"
                  f" const AttnBuffers& buf) {{\n{c.to_cuda()}\n}}\n" for i, c in enumerate(classifiers))
    calls = "\n".join(f"      case {i}: r = tc{i}(b, h, ql, qh, kl, kh, p, kBufs[ds]); break;"
                      for i in range(len(classifiers)))
    source = HOST_PRELUDE + _buffers_source(datasets) + fns + (
        "int main() {\n  int fn, ds, b, h, ql, qh, kl, kh, nq, nk;\n"
        "  while (std::scanf(\"%d %d %d %d %d %d %d %d %d %d\", &fn, &ds, &b, &h, &ql, &qh, &kl, &kh, &nq, &nk)"
        " == 10) {\n    const AttnParams p = {nq, nk};\n    int r = -1;\n    switch (fn) {\n" + calls +
        "\n      default: return 1;\n    }\n    std::printf(\"%d\\n\", r);\n  }\n  return 0;\n}\n")
    work = []
    for i in range(len(classifiers)):
        for _ in range(700):
            span = rng.choice([16, 200, 1200, 1200, INDEX_LIMIT])
            ql, kl = rng.randrange(span), rng.randrange(span)
            if rng.random() < 0.5:
                ql, kl = ql // 16 * 16, kl // 16 * 16  # granule-aligned, as the kernels' tiles are
            tq, tk = rng.choice([(0, 0), (15, 15), (63, 63), (127, 63), (rng.randrange(200), rng.randrange(200))])
            work.append((i, rng.randrange(len(datasets) + 1), rng.randrange(3), rng.randrange(4), ql, ql + tq,
                         kl, kl + tk, rng.randrange(1, 1300), rng.randrange(1, 1300)))
    values = [classifiers[0].buffer_values(ds) | classifiers[5].buffer_values(ds) | classifiers[6].buffer_values(ds)
              for ds in datasets] + [None]

    def python(w: tuple[int, ...]) -> int:
        i, ds, b, h, ql, qh, kl, kh, nq, nk = w
        return classifiers[i].classify(ql, qh, kl, kh, b=b, h=h, q_len=nq, kv_len=nk, buffers=values[ds])

    out = cuda_classes_match_python(source, work, tmp_path, CUDA_MASKS, python)
    seen = {(w[1], c) for w, c in zip(work, out)}
    assert {c for ds, c in seen if ds == 0} == {TILE_EMPTY, TILE_PARTIAL, TILE_FULL}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_cuda_reads_compile_with_nvcc(tmp_path: Path) -> None:
    prelude = ('#include "attncompiler/common.cuh"\nstruct AttnParams { int Nq, Nk; };\n' +
               c_struct("AttnBuffers", buffer_fields(INFOS)) + "\n")
    nvcc_compile_classifiers([tile_classifier(m, INFOS).to_cuda() for m in CUDA_MASKS], tmp_path, prelude)


# ---------------------------------------------------------------------------------------------
# the tile simulator on document masks
# ---------------------------------------------------------------------------------------------
def _check_sim(ir, bufs: dict, B: int, H: int, Nq: int, Nk: int, tiles: tuple[tuple[str, int, int], ...],
               seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Nq, 32, dtype=torch.float64, generator=g)
    k = torch.randn(B, H, Nk, 32, dtype=torch.float64, generator=g)
    v = torch.randn(B, H, Nk, 16, dtype=torch.float64, generator=g)
    ref, ref_lse = reference_attention(q, k, v, ir, buffers=bufs, return_lse=True)
    stats = []
    for sched, bm, bn in tiles:
        res = simulate(ir, TileSchedule(sched, bm, bn), q, k, v, buffers=bufs)
        assert float((res.out - ref).abs().max()) <= 1e-10, (sched, bm, bn)
        same_inf = torch.isinf(ref_lse) & (res.lse == ref_lse)
        assert float((res.lse - ref_lse).abs().masked_fill(same_inf, 0.0).max()) <= 1e-10
        stats.append(res.stats)
    return stats


TILES = (("v2", 64, 64), ("v1", 32, 48), ("v2", 16, 16), ("v2", 13, 29))


@pytest.fixture(autouse=True)
def _one_thread():
    """The simulator works on tiny tiles: torch's intra-op threads only add overhead."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("causal", [False, True])
def test_simulator_document_sorted_odd_lengths(causal: bool) -> None:
    lengths = torch.tensor([150, 37, 101, 13, 1, 98])  # 400 rows: documents of no tile's multiple
    ids = torch.repeat_interleave(torch.arange(6) + 3, lengths)
    ir = build_ir(presets.document(ids, 32, head_dim_v=16, causal=causal))
    stats = _check_sim(ir, {"doc_ids": ids}, 1, 2, 400, 400, TILES, 1)
    for st in stats:
        assert st.tiles_empty > 0 and st.tiles_full > 0  # skipped tiles, mask-free tiles
        assert st.mask_evaluations < st.scores_computed
    cls = tile_classes(ir, TileSchedule("v2", 16, 16), 400, 400, buffers={"doc_ids": ids})
    without = tile_classes(ir, TileSchedule("v2", 16, 16), 400, 400)  # no values: the old answer
    assert int((cls == TILE_PARTIAL).sum()) < int((without == TILE_PARTIAL).sum())


def test_simulator_document_unsorted_and_constant_ids() -> None:
    ids = torch.randint(0, 3, (200,), generator=torch.Generator().manual_seed(2))
    ir = build_ir(presets.document(ids, 32, head_dim_v=16))
    _check_sim(ir, {"doc_ids": ids}, 1, 1, 200, 200, TILES, 2)
    runs = torch.repeat_interleave(torch.tensor([3, 0, 2, 1]), torch.tensor([40, 57, 3, 100]))  # long unsorted runs
    st = _check_sim(ir, {"doc_ids": runs}, 1, 1, 200, 200, TILES, 3)
    assert st[2].tiles_empty > 0 and st[2].tiles_full > 0  # 16 x 16 tiles: ranges of one or two ids
    const = torch.full((200,), 7)
    st = _check_sim(ir, {"doc_ids": const}, 1, 1, 150, 200, TILES, 4)  # Nq != Nk: clamped reads
    assert all(s.tiles_partial == 0 and s.mask_evaluations == 0 for s in st)


def test_simulator_per_batch_document_ids() -> None:
    ids2 = torch.stack([torch.tensor(_sorted_ids(random.Random(s), 150)) for s in (7, 8)])
    ir = build_ir(ac.AttentionSpec(head_dim=32, head_dim_v=16, mask_mod=_doc_mask2(ids2)))
    (name,) = [b.name for b in ir.buffers]
    st = _check_sim(ir, {name: ids2}, 2, 2, 150, 150, TILES, 5)
    assert st[2].tiles_empty > 0 and st[2].tiles_full > 0


def test_device_copies_are_cached_and_follow_edits() -> None:
    """prepare_buffers' copies (blockstats.device_copy): one per buffer version, and for a CPU buffer one per
    content, so an edit through ``.data`` (which leaves the version counter alone) still reaches the kernel."""
    blockstats.clear_cache()
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)  # float64 on the CPU: float32 copy needed
    ir = build_ir(presets.alibi(slopes, 64))
    dev = torch.device("cpu")
    (a,) = prepare_buffers(ir, {"slopes": slopes}, dev)
    (b,) = prepare_buffers(ir, {"slopes": slopes}, dev)
    assert a is b and a.dtype == torch.float32 and a.tolist() == [0.5, 0.25, 0.125]
    slopes.data[1] = 4.0  # no version bump
    (c,) = prepare_buffers(ir, {"slopes": slopes}, dev)
    assert c is not b and c.tolist() == [0.5, 4.0, 0.125]
    slopes.mul_(2.0)  # in place: version bump
    (d,) = prepare_buffers(ir, {"slopes": slopes}, dev)
    assert d.tolist() == [1.0, 8.0, 0.25]
    f32 = torch.tensor([1.0, 2.0, 3.0])  # already float32, contiguous, on the device: passed as it is
    assert prepare_buffers(ir, {"slopes": f32}, dev)[0] is f32
