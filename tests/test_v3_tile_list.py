"""The persistent grid's tiles dealt by a host list (plan option ``tile_list``, runtime/tile_list.py): the dealing
(every tile once, the round robin for equal costs, a shorter busiest CTA for a band), the tiles' costs against the
mask itself, the plan and its errors, the rendered kernel and its machine code (nvcc), and (GPU) its results: the
error-ratio rule, O and LSE bit-identical to the round robin, and the round robin under CUDA graph capture."""
from __future__ import annotations

import functools
import shutil

import pytest
import torch

import attncompiler as ac
from attncompiler.ir.build import build_ir
from attncompiler.ir.ranges import kv_range
from attncompiler.plan.model import PlanError
from attncompiler.plan.v3 import plan_v3
from attncompiler.runtime.tile_list import (DEAL, DEALS, TILE_BOUNDARY_BLOCKS, build_list, deal_in_order, deal_tiles,
                                            makespan, round_robin, tile_costs)
from attncompiler.spec import presets

from _nvcc import ptx_and_reports
from _v3 import GPU_PRESETS, needs_hopper, render_v3, same_outputs, v3_gpu_spec

LISTED = {"persistent": True, "tile_list": True}


@pytest.mark.parametrize("deal", sorted(DEALS))
@pytest.mark.parametrize("n_tiles, ctas", [(2048, 132), (7, 132), (133, 132), (1000, 17)])
def test_deal_equal_costs_is_the_round_robin(deal, n_tiles, ctas):
    costs = [5] * n_tiles
    assert DEALS[deal](costs, ctas) == round_robin(n_tiles, ctas)


@pytest.mark.parametrize("deal", sorted(DEALS))
@pytest.mark.parametrize("seed", range(5))
def test_deal_every_tile_once_within_one_tile_of_the_mean(deal, seed):
    import random

    rng = random.Random(seed)
    costs = [rng.randint(1, 130) for _ in range(rng.randint(1, 3000))]
    ctas = rng.randint(1, 140)
    runs = DEALS[deal](costs, ctas)
    assert sorted(t for run in runs for t in run) == list(range(len(costs)))
    # greedy list scheduling, sorted or not: the busiest CTA carries at most its share plus one tile
    assert makespan(costs, runs) <= sum(costs) / ctas + max(costs)
    if deal == "lpt":
        assert makespan(costs, runs) <= makespan(costs, round_robin(len(costs), ctas))


def test_deal_in_order_keeps_the_order_per_cta():
    """In order: each CTA runs its tiles in the kernel's order (neighbouring tiles run at about the same time)."""
    costs = [11] * 120 + list(range(10, 2, -1)) + [11] * 120 + list(range(10, 2, -1))
    runs = deal_in_order(costs, 17)
    assert all(run == sorted(run) for run in runs) and DEAL == "in_order"


def test_sliding_window_makespan():
    """Sliding window 1024 at N = 16k, BLOCK_M = BLOCK_N = 128, 16 heads on 132 CTAs (the case issue 4 times): 2048
    tiles of 1-9 key blocks; the round robin's busiest CTA draws 16 full tiles, the list's about the mean."""
    costs = tile_costs(kv_range(build_ir(presets.sliding_window(1024, 128)).mask_expr), 16384, 16384, 1, 16, 128, 128,
                       by_head=True)
    assert len(costs) == 2048 and max(costs) == 9 + TILE_BOUNDARY_BLOCKS
    mean = sum(costs) / 132
    assert makespan(costs, round_robin(2048, 132)) == 16 * (9 + TILE_BOUNDARY_BLOCKS)  # 176: 94.5 % busy
    assert makespan(costs, deal_tiles(costs, 132)) <= mean + 2  # 168 against 166.3
    assert makespan(costs, deal_in_order(costs, 132)) <= mean + 5  # 171


@pytest.mark.parametrize("spec", [presets.sliding_window(1024, 128), presets.sliding_window(300, 64),
                                  presets.causal(128), presets.get_preset("prefix_lm", head_dim=128, seqlen=1000),
                                  presets.plain(128)], ids=lambda s: s.name)
@pytest.mark.parametrize("by_head", [True, False])
def test_tile_costs_match_the_mask(spec, by_head):
    """Each tile's cost is TILE_BOUNDARY_BLOCKS plus the K/V blocks holding a visible key of its query rows (brute
    force over the mask's dense matrix; for these masks every block between the first and the last such one holds
    one too), in the kernel's tile order."""
    from attncompiler.reference import evaluate

    ir = build_ir(spec)
    Nq, Nk, B, H, bm, bn = 1000, 1100, 2, 3, 128, 64
    rng = kv_range(ir.mask_expr) if ir.mask_expr is not None else None
    costs = tile_costs(rng, Nq, Nk, B, H, bm, bn, by_head)
    num_qb = -(-Nq // bm)
    assert len(costs) == num_qb * B * H
    visible = torch.ones(B, H, Nq, Nk, dtype=torch.bool)
    if ir.mask_expr is not None:
        idx = {"b": torch.arange(B).view(B, 1, 1, 1), "h": torch.arange(H).view(1, H, 1, 1),
               "q_idx": torch.arange(Nq).view(1, 1, Nq, 1), "kv_idx": torch.arange(Nk).view(1, 1, 1, Nk),
               "q_len": Nq, "kv_len": Nk}
        visible = visible & evaluate(ir.mask_expr, idx)
    for t, cost in enumerate(costs):
        q_block, bh = ((num_qb - 1 - t % num_qb, t // num_qb) if by_head else
                       (num_qb - 1 - t // (B * H), t % (B * H)))
        rows = visible[bh // H, bh % H, q_block * bm:(q_block + 1) * bm]
        blocks = rows.any(dim=0).reshape(-1).nonzero().flatten().div(bn, rounding_mode="floor").unique()
        assert cost == len(blocks) + TILE_BOUNDARY_BLOCKS, (t, q_block)


def test_build_list_layout():
    costs = [3, 1, 4, 1, 5, 9, 2]
    ints = build_list(costs, 3)
    offsets, tiles = ints[:4], ints[4:]
    assert offsets[0] == 4 and offsets[-1] == len(ints)
    runs = [ints[offsets[c]:offsets[c + 1]] for c in range(3)]
    assert runs == deal_tiles(costs, 3) and sorted(tiles) == list(range(7))


def test_plan_tile_list():
    ir = build_ir(presets.sliding_window(1024, 128))
    base = plan_v3(ir, "sm_90", tile_list=False)
    p = plan_v3(ir, "sm_90", tile_list=True)
    assert p.tile_list and not base.tile_list
    assert (p.block_n, p.stages, p.smem_bytes, p.persistent) == (base.block_n, base.stages, base.smem_bytes, True)
    assert any(r.startswith("tiles dealt by a host list (tile_list, forced)") for r in p.reasons)
    assert plan_v3(ir, "sm_90", **p.options) == p and "tiles dealt to the CTAs by a host list" in p.describe()
    assert "tiles dealt by a host list: off (forced)" in plan_v3(ir, "sm_90", tile_list=False).reasons


@pytest.mark.parametrize("opts, expected", [({"persistent": False}, "expected tile_list with persistent=True"),
                                            ({"tile_list": "yes"}, "expected tile_list a bool, got 'yes'")])
def test_tile_list_errors(opts, expected):
    with pytest.raises(PlanError, match=expected):
        plan_v3(build_ir(presets.causal(128)), "sm_90", **{"tile_list": True, **opts})


def test_render_tile_list():
    src = render_v3(presets.sliding_window(1024, 128), **LISTED)
    assert "static constexpr bool TILE_LIST = true;" in src.source
    assert "const int* __restrict__ tile_list) {" in src.source
    assert "v3_fwd<V3Config>(p, buf, maps, tile_list)" in src.source
    assert src.launch_info is not None  # the mask's K/V range, for the costs
    plain = render_v3(presets.sliding_window(1024, 128), tile_list=False)
    assert "static constexpr bool TILE_LIST = false;" in plain.source
    assert "const int* __restrict__ tile_list) {" not in plain.source


def test_autotuner_tries_tile_list(monkeypatch):
    """The other dealing is a candidate wherever a mask runs on the persistent grid (none without a mask); with
    TILE_LIST_MASKS the list is the default there, also for a forced persistent causal grid."""
    from attncompiler.plan import v3_grid
    from attncompiler.plan.v3_candidates import candidates_v3

    ir = build_ir(presets.sliding_window(1024, 128))
    for on in (False, True):
        monkeypatch.setattr(v3_grid, "TILE_LIST_MASKS", on)
        base = plan_v3(ir, "sm_90")
        assert base.tile_list == on and base.persistent
        assert {**base.options, "tile_list": not on} in candidates_v3(ir, "sm_90")
        assert not any(o["tile_list"] for o in candidates_v3(build_ir(presets.plain(128)), "sm_90"))
        assert plan_v3(build_ir(presets.causal(128)), "sm_90", persistent=True).tile_list == on
        assert not plan_v3(build_ir(presets.causal(128)), "sm_90").tile_list  # one CTA per tile


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_tile_list():
    """The list's kernels compile for sm_90a without serialized wgmmas or spills (window, causal, document, and the
    window with q_prefetch, whose store warp walks the list too)."""
    jobs = {"window": render_v3(presets.sliding_window(1024, 128), **LISTED).source,
            "causal": render_v3(presets.causal(128), **LISTED).source,
            "document": render_v3(presets.get_preset("document", head_dim=128, num_heads=4, seqlen=4096),
                                  **LISTED).source,
            "window_qp": render_v3(presets.sliding_window(1024, 128), **LISTED, tma_store_o=True, q_prefetch=True,
                                   score_skip=False).source}
    ptx, reps = ptx_and_reports(jobs)
    for name, rep in reps.items():
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"


# ---------------------------------------------------------------------------------------------------------------
# GPU

_spec = functools.partial(v3_gpu_spec, seqlen=1023, heads=12)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("name", GPU_PRESETS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_tile_list(name, head_dim):
    """Several tiles per CTA (4 x 12 x 8 query blocks > the SMs): the error-ratio rule, and (but dropout, whose
    offset moves every call) O and LSE bit-identical to the same plan's round robin (a tile's arithmetic does not
    depend on the CTA that runs it)."""
    from attncompiler.testing import check_kernel

    spec = _spec(name, head_dim)
    kern = ac.compile(spec, "v3", **LISTED)
    assert kern.plan.tile_list and kern.plan.persistent
    res = check_kernel(kern, 4, 12, 1023)
    assert res.ok, f"{name} d={head_dim}: {res}"
    if name != "dropout":
        assert same_outputs(kern, ac.compile(spec, "v3", **{**kern.plan.options, "tile_list": False}), 4, 12, 1023,
                     head_dim, seed=head_dim), name


@pytest.mark.gpu
@needs_hopper
def test_gpu_tile_list_shapes():
    """Fewer tiles than CTAs, GQA at cross lengths, (B, N, H, d) storage, the window with q_prefetch (the store warp
    walks the list), tiles without keys between tiles with keys, and a call first made inside CUDA graph capture (no
    list: the round robin, the same results)."""
    from attncompiler.testing import check_kernel

    window = ac.compile(presets.sliding_window(256, 128), "v3", **LISTED)
    for B, H, N, Nk, hkv in ((1, 2, 113, None, None), (3, 40, 1500, 517, 8), (2, 8, 517, 1500, 1)):
        res = check_kernel(window, B, H, N, Nk, H_kv=hkv)
        assert res.ok, f"window B={B} H={H} N={N} Nk={Nk} H_kv={hkv}: {res}"
    res = check_kernel(window, 4, 6, 1023, layout="bnhd")
    assert res.ok, f"bnhd: {res}"
    qp = ac.compile(presets.sliding_window(1024, 128), "v3", **LISTED, tma_store_o=True, q_prefetch=True,
                    score_skip=False)
    res = check_kernel(qp, 2, 16, 4096)
    assert res.ok, f"q_prefetch: {res}"
    robin = ac.compile(presets.sliding_window(1024, 128), "v3", **{**qp.plan.options, "tile_list": False})
    assert same_outputs(qp, robin, 2, 16, 4096, 128, seed=3)

    def mask(b, h, q_idx, kv_idx):
        return ((q_idx < 300) | (q_idx >= 700)) & (kv_idx <= q_idx)

    holes = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", **LISTED)
    res = check_kernel(holes, 4, 8, 1023)
    assert res.ok, f"tiles without keys: {res}"

    # inside capture an uncached list is not built: the kernel runs the round robin
    q, k, v = (torch.randn(3, 5, 777, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    eager = ac.compile(presets.sliding_window(256, 128), "v3", **{**window.plan.options, "tile_list": False})(q, k, v)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = window(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
