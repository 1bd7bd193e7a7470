"""GPU: masks classified per tile from buffer values (document ids, per-batch ids, key padding).

The kernels' ``tile_class`` reads the value range of ``doc[q_idx]`` / ``doc[kv_idx]`` over each tile
from the run-time granule tables (attncompiler/ir/bufreads.py, attncompiler/runtime/blockstats.py):
EMPTY tiles are skipped, FULL tiles run without the mask.  A wrong table or a wrong range skips
visible keys or keeps masked ones, which the error-ratio checks against the float64 reference
catch: random unsorted ids, shuffled runs (unsorted documents), sorted documents whose lengths are
multiples of no tile, constant ids, causal & document, forward (v2, v3, v1, decode) and backward,
in-place updates of the ids between calls (the table cache must miss), CUDA-graph replay.

Run on a GPU machine with ``python3 -m pytest -m gpu tests/test_gpu_bufreads.py``.
"""
from __future__ import annotations

import random

import pytest
import torch

import attncompiler as ac
from attncompiler.reference import eager_attention, error_ratio_check, reference_attention
from attncompiler.runtime import blockstats
from attncompiler.spec import presets
from attncompiler.testing import check_kernel, check_kernel_grads, random_qkv

pytestmark = pytest.mark.gpu

LENGTHS = (1000, 2049)  # multiples of no tile


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


SCHEDULES = ["v2", pytest.param("v3", marks=pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU"))]


def make_ids(kind: str, n: int, seed: int = 0) -> torch.Tensor:
    """int32 (n,) document ids: "unsorted" random in [0, 4); "runs": documents of odd lengths whose
    ids are shuffled (not sorted); "sorted": increasing ids, odd lengths; "constant": one document."""
    rng = random.Random(seed)
    if kind == "unsorted":
        return torch.tensor([rng.randrange(4) for _ in range(n)], dtype=torch.int32)
    if kind == "constant":
        return torch.full((n,), 5, dtype=torch.int32)
    lens = []
    while sum(lens) < n:
        lens.append(rng.choice((1, 7, 33, 100, 129, 250, 383, 700)))
    ids = list(range(len(lens)))
    if kind == "runs":
        rng.shuffle(ids)
    elif kind != "sorted":
        raise KeyError(kind)
    out = [i for i, ln in zip(ids, lens) for _ in range(ln)]
    return torch.tensor(out[:n], dtype=torch.int32)


def _doc(ids: torch.Tensor, head_dim: int, causal: bool, dtype: str = "bf16") -> ac.AttentionSpec:
    return presets.document(ids, head_dim, causal=causal, dtype=dtype)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kind", ["unsorted", "runs", "sorted", "constant"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_document_forward(schedule: str, kind: str, causal: bool, head_dim: int) -> None:
    for n in LENGTHS:
        kern = ac.compile(_doc(make_ids(kind, n, seed=n), head_dim, causal), schedule)
        res = check_kernel(kern, 2, 3, n)
        assert res.ok, f"{schedule} {kind} causal={causal} d={head_dim} N={n}: {res}"


@pytest.mark.parametrize("schedule", ["v1", "decode"])
@pytest.mark.parametrize("kind", ["unsorted", "runs", "sorted"])
def test_document_forward_v1_and_decode(schedule: str, kind: str) -> None:
    for causal in (False, True):
        ids = make_ids(kind, 3001, seed=3)
        kern = ac.compile(_doc(ids, 128, causal), schedule)
        shapes = ((1, 3001), (7, 3001), (16, 3001)) if schedule == "decode" else ((1000, 1000), (700, 3001))
        for nq, nk in shapes:
            res = check_kernel(kern, 2, 4, nq, nk, H_kv=2 if schedule == "decode" else None)
            assert res.ok, f"{schedule} {kind} causal={causal} Nq={nq} Nk={nk}: {res}"


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kind", ["unsorted", "runs", "sorted"])
@pytest.mark.parametrize("causal", [False, True])
def test_document_grads(schedule: str, kind: str, causal: bool) -> None:
    for n, head_dim in ((1000, 128), (2049, 64)):
        kern = ac.compile(_doc(make_ids(kind, n, seed=n + 1), head_dim, causal), schedule)
        res = check_kernel_grads(kern, 2, 2, n)
        assert res.ok, f"{schedule} {kind} causal={causal} d={head_dim} N={n}: {res}"
    res = check_kernel_grads(kern, 1, 2, n, deterministic=True)
    assert res.ok, f"{schedule} {kind} causal={causal} deterministic: {res}"


def _per_batch(ids2: torch.Tensor, causal: bool):
    def mask(b, h, q_idx, kv_idx):
        same = ids2[b, q_idx] == ids2[b, kv_idx]
        return same & (q_idx >= kv_idx) if causal else same
    return mask


def _key_padding(kpm: torch.Tensor):
    def mask(b, h, q_idx, kv_idx):
        return kpm[b, kv_idx]
    return mask


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("which", ["per_batch", "per_batch_causal", "key_padding"])
def test_two_dim_buffers_forward_backward(schedule: str, which: str) -> None:
    """ids (B, N) read along N at the batch index; a key-padding mask (B, N) bool, one row all padded."""
    n = 1537
    g = torch.Generator().manual_seed(11)
    if which == "key_padding":
        kpm = torch.rand(3, n, generator=g) < 0.9
        kpm[:, 300:700] = False  # a padded run longer than any tile: EMPTY tiles
        kpm[2] = False  # every key padded: rows with no visible key
        mask = _key_padding(kpm)
    else:
        ids2 = torch.stack([make_ids(k, n, seed=s) for k, s in (("runs", 1), ("sorted", 2), ("unsorted", 3))])
        mask = _per_batch(ids2, which.endswith("causal"))
    kern = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask, name=which), schedule)
    res = check_kernel(kern, 3, 2, n)
    assert res.ok, f"{schedule} {which} forward: {res}"
    res = check_kernel_grads(kern, 3, 2, n)
    assert res.ok, f"{schedule} {which} backward: {res}"


def _check_with(kern, bufs: dict, B: int, H: int, N: int, seed: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = random_qkv(B, H, N, N, kern.ir.head_dim, kern.ir.head_dim_v, torch.bfloat16, generator=g)
    out = kern(q, k, v, buffers=bufs)
    ref = reference_attention(q, k, v, kern.ir, buffers=bufs)
    eag = eager_attention(q, k, v, kern.ir, buffers=bufs)
    ok, msg = error_ratio_check(out, ref, eag)
    assert ok, msg


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_in_place_update_of_ids_is_seen(device: str, dtype: torch.dtype) -> None:
    """The granule tables are cached per buffer version: an in-place update must give new tables."""
    n = 1000
    ids = make_ids("sorted", n, seed=1).to(device=device, dtype=dtype)
    kern = ac.compile(_doc(ids.cpu(), 128, causal=True), "v2")
    blockstats.clear_cache()
    _check_with(kern, {"doc_ids": ids}, 2, 2, n, 1)
    before = len(blockstats._cache)
    _check_with(kern, {"doc_ids": ids}, 2, 2, n, 2)
    assert len(blockstats._cache) == before  # same buffer, same version: cache hits only
    ids.copy_(make_ids("runs", n, seed=9).to(dtype))  # in place: new version
    _check_with(kern, {"doc_ids": ids}, 2, 2, n, 3)
    ids.fill_(3)  # one document: every tile FULL
    _check_with(kern, {"doc_ids": ids}, 2, 2, n, 4)


def test_cuda_graph_replay_recomputes_tables() -> None:
    n = 1000
    ids = make_ids("sorted", n, seed=1).cuda()
    kern = ac.compile(_doc(ids.cpu(), 128, causal=False), "v2")
    q, k, v = random_qkv(1, 2, n, n, 128, 128, torch.bfloat16)
    kern(q, k, v, buffers={"doc_ids": ids})  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kern(q, k, v, buffers={"doc_ids": ids})
    for kind in ("runs", "unsorted", "sorted"):
        ids.copy_(make_ids(kind, n, seed=5).cuda())
        graph.replay()
        ref = reference_attention(q, k, v, kern.ir, buffers={"doc_ids": ids})
        eag = eager_attention(q, k, v, kern.ir, buffers={"doc_ids": ids})
        ok, msg = error_ratio_check(out, ref, eag)
        assert ok, f"after {kind}: {msg}"
