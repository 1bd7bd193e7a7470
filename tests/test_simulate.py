"""CPU tile simulator (attncompiler.simulate) against the float64 reference.

Every preset (plus dropout, a narrow sliding window and a causal ALiBi) x 54 random shapes (seqlens
that are not multiples of the tiles, Nq != Nk, GQA, rows with no visible key) x random feasible
plans of every schedule (v2 tiles drawn from the accepted candidates of random targets, v1 from
the FA1 rule at random SRAM budgets, odd tiny tilings, and v3 tilings of 1-3 warpgroups with either
K/V walk order) must match to ~1e-10, LSE included.
Then: a wrong tile classifier must be caught, and the counters must show skipped tiles.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

import attncompiler as ac
from attncompiler.ir.bounds import TILE_EMPTY, TILE_FULL, TILE_PARTIAL
from attncompiler.ir.build import build_ir
from attncompiler.plan import PlanError, candidates_v2, plan_v1
from attncompiler.reference import reference_attention
from attncompiler.simulate import SimulateError, TileSchedule, simulate, tile_classes
from attncompiler.spec import presets
from attncompiler.spec.presets import PRESETS, get_preset

TOL = 1e-10
N_SHAPES = 54
CASES = (*PRESETS, "dropout", "window17", "alibi_causal_dropout")
TARGETS = ("sm_80", "sm_86", "sm_90")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The simulator works on tiny tiles: torch's intra-op threads only add overhead."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _spec(case: str, D: int, DV: int, H: int, Nk: int) -> ac.AttentionSpec:
    if case == "dropout":
        return ac.AttentionSpec(head_dim=D, head_dim_v=DV, causal=True, dropout_p=0.25, name="dropout")
    if case == "window17":
        return presets.sliding_window(17, D, head_dim_v=DV)
    if case == "alibi_causal_dropout":
        return presets.alibi(presets.alibi_slopes(H), D, head_dim_v=DV, causal=True, dropout_p=0.1)
    return get_preset(case, head_dim=D, num_heads=H, seqlen=Nk, head_dim_v=DV)


def _shapes() -> list[tuple[int, int, int, int, int, int, int]]:
    """(B, H, H_kv, Nq, Nk, D, DV), reproducible."""
    rng = random.Random(20240607)
    out = []
    for i in range(N_SHAPES):
        H = rng.choice((1, 2, 4))
        Hkv = rng.choice([x for x in (1, 2, 4) if H % x == 0])
        Nq = rng.choice((1, 7, 16, 63, 64, 65, 100, 127, 129, 150, 191))
        Nk = Nq if i % 3 == 0 else rng.choice((1, 5, 17, 33, 64, 99, 128, 130, 177, 200))
        out.append((rng.choice((1, 2)), H, Hkv, Nq, Nk, rng.choice((16, 32, 48)), rng.choice((16, 32))))
    return out


def _plans(ir, rng: random.Random) -> list:
    """One v2 plan from the accepted candidates, one v1 plan from a random SRAM budget, and one odd
    tiling (tiny or prime block sizes) for a random schedule."""
    cands = [c for c in candidates_v2(ir, rng.choice(TARGETS)) if c.accepted]
    c = rng.choice(cands)
    out = [TileSchedule("v2", c.block_m, c.block_n)]
    try:
        p = plan_v1(ir, rng.choice(TARGETS), sram_budget=rng.randrange(12_000, 240_000))
    except PlanError:
        p = plan_v1(ir, "sm_90")
    out.append(p)
    bm, bn = rng.choice(((1, 47), (3, 16), (16, 5), (31, 1), (13, 29), (16, 16)))
    out.append(TileSchedule(rng.choice(("v1", "v2")), bm, bn))
    # v3: 64-row warpgroups (1..3 per CTA), any key width, either walk order
    out.append(TileSchedule("v3", rng.choice((64, 128, 192)), rng.choice((16, 32, 48, 80, 112, 128)),
                            rng.choice((False, True))))
    return out


def _close(res, ref: torch.Tensor, ref_lse: torch.Tensor) -> tuple[float, bool]:
    err = float((res.out - ref).abs().max()) if ref.numel() else 0.0
    same_inf = torch.isinf(ref_lse) & (res.lse == ref_lse)
    lse_err = (res.lse - ref_lse).abs().masked_fill(same_inf, 0.0)
    lse_ok = bool((lse_err <= TOL).all()) and not bool(torch.isnan(res.lse).any())
    return err, lse_ok


@pytest.mark.parametrize("case", CASES)
def test_simulator_matches_reference(case: str) -> None:
    rng = random.Random(hash(case) % 1000)
    torch.manual_seed(7)
    worst = 0.0
    for (B, H, Hkv, Nq, Nk, D, DV) in _shapes():
        spec = _spec(case, D, DV, H, Nk)
        ir = build_ir(spec)
        bufs = dict(spec.trace().buffer_values)
        q = torch.randn(B, H, Nq, D, dtype=torch.float64)
        k = torch.randn(B, Hkv, Nk, D, dtype=torch.float64)
        v = torch.randn(B, Hkv, Nk, DV, dtype=torch.float64)
        seed, offset = rng.randrange(2**40), rng.randrange(2**20)
        ref, ref_lse = reference_attention(q, k, v, ir, buffers=bufs, seed=seed, offset=offset, return_lse=True)
        for plan in _plans(ir, rng):
            res = simulate(ir, plan, q, k, v, buffers=bufs, seed=seed, offset=offset)
            err, lse_ok = _close(res, ref, ref_lse)
            where = (f"{case} {plan.schedule} {plan.block_m}x{plan.block_n} B={B} H={H} H_kv={Hkv} Nq={Nq} "
                     f"Nk={Nk} D={D} DV={DV}")
            assert err <= TOL, f"{where}: max err {err:.3e}"
            assert lse_ok, f"{where}: lse differs"
            worst = max(worst, err)
    print(f"{case}: worst max-abs error {worst:.2e} over {N_SHAPES} shapes x 4 plans")


def test_simulator_inputs_any_dtype_and_device_free() -> None:
    spec = presets.causal(32)
    ir = build_ir(spec)
    q, k, v = (torch.randn(1, 2, 40, 32).to(torch.bfloat16) for _ in range(3))
    res = simulate(ir, TileSchedule("v2", 16, 16), q, k, v)
    ref, lse = reference_attention(q, k, v, ir, return_lse=True)
    assert res.out.dtype == torch.float64 and res.out.device.type == "cpu"
    assert float((res.out - ref).abs().max()) <= TOL


def test_empty_tiles_are_skipped_and_full_tiles_skip_the_mask() -> None:
    spec = presets.sliding_window(17, 32)
    ir = build_ir(spec)
    q, k, v = (torch.randn(1, 1, 160, 32, dtype=torch.float64) for _ in range(3))
    for sched in ("v1", "v2"):  # (v3 runs 64-row warpgroups: below)
        st = simulate(ir, TileSchedule(sched, 16, 16), q, k, v).stats
        assert st.tiles == 100 and st.tiles_empty > 60  # a 17-wide band over a 10 x 10 tile grid
        assert st.scores_computed == (st.tiles_partial + st.tiles_full) * 16 * 16
        assert st.mask_evaluations == st.tiles_partial * 16 * 16
    plain = simulate(build_ir(presets.plain(32)), TileSchedule("v2", 16, 16), q, k, v).stats
    assert (plain.tiles_full, plain.tiles_partial, plain.mask_evaluations) == (100, 0, 0)


class _Liar:
    """A tile classifier that answers ``answer`` for every tile (wrong for a causal mask)."""

    def __init__(self, answer: int) -> None:
        self.answer = answer

    def inputs(self) -> frozenset:
        return frozenset()

    def buffer_values(self, buffers: object) -> dict:
        return {}

    def classify(self, *args: object) -> int:
        return self.answer


@pytest.mark.parametrize("answer", [TILE_FULL, TILE_EMPTY])
@pytest.mark.parametrize("sched", ["v1", "v2", "v3"])
def test_a_wrong_classifier_gives_a_wrong_answer(monkeypatch: pytest.MonkeyPatch, answer: int, sched: str) -> None:
    """The simulator trusts the classifier (FULL: no mask, EMPTY: skipped), so it proves it."""
    import attncompiler.simulate as sim

    ir = build_ir(presets.causal(16))
    n, bm = (200, 64) if sched == "v3" else (48, 16)
    q, k, v = (torch.randn(1, 1, n, 16, dtype=torch.float64) for _ in range(3))
    ref = reference_attention(q, k, v, ir)
    good = simulate(ir, TileSchedule(sched, bm, 16), q, k, v).out
    assert float((good - ref).abs().max()) <= TOL
    monkeypatch.setattr(sim, "tile_classifier", lambda mask, buffers=None: _Liar(answer))
    bad = simulate(ir, TileSchedule(sched, bm, 16), q, k, v).out
    assert float((bad - ref).abs().max()) > 1e-3


def test_v3_walk_and_warpgroups() -> None:
    """v3: the CTA walks the blocks not EMPTY for all its rows.  With blocks as wide as the tile every 64-row
    warpgroup runs every one of them -- a block EMPTY for one warpgroup's rows goes through its masked softmax and
    adds nothing; with narrower blocks (the kernel's per-warpgroup walk) a warpgroup multiplies only the blocks that
    meet its own rows' K/V range.  The counters are per warpgroup."""
    q, k, v = (torch.randn(1, 1, 128, 16, dtype=torch.float64) for _ in range(3))
    # causal, a 128-row tile, two 64-key blocks: warpgroup 0 (rows 0..63) runs block 0 only (PARTIAL), warpgroup 1
    # (rows 64..127) block 0 (FULL) and block 1 (PARTIAL)
    ir = build_ir(presets.causal(16))
    ref, ref_lse = reference_attention(q, k, v, ir, return_lse=True)
    for desc in (False, True):
        res = simulate(ir, TileSchedule("v3", 128, 64, desc), q, k, v)
        assert float((res.out - ref).abs().max()) <= TOL and float((res.lse - ref_lse).abs().max()) <= TOL
        st = res.stats
        assert (st.tiles_empty, st.tiles_partial, st.tiles_full) == (0, 2, 1)
        assert st.scores_computed == 3 * 64 * 64 and st.mask_evaluations == 2 * 64 * 64
    # rows below 100 see nothing, one 128-key block: warpgroup 0's rows make it EMPTY, and it still runs it
    late = ac.AttentionSpec(head_dim=16, mask_mod=lambda b, h, q_idx, kv_idx: (q_idx >= 100) & (q_idx >= kv_idx))
    ir = build_ir(late)
    ref, ref_lse = reference_attention(q, k, v, ir, return_lse=True)
    res = simulate(ir, TileSchedule("v3", 128, 128), q, k, v)
    assert float((res.out - ref).abs().max()) <= TOL
    assert bool((res.lse[..., :100] == -math.inf).all()) and float((res.lse - ref_lse)[..., 100:].abs().max()) <= TOL
    st = res.stats
    assert (st.tiles_empty, st.tiles_partial, st.tiles_full) == (1, 1, 0)
    assert st.scores_computed == 64 * 128 and st.mask_evaluations == 64 * 128


def test_v3_lazy_offset_and_fixed_offset() -> None:
    """Rows whose maximum grows block after block (ALiBi-like growth, ascending walk) move the lazy offset only past
    V3_RESCALE_SLACK; a bounded score_mod (softcap) fixes it at the first block -- the results are exact either
    way, and the slack is the kernel's constant."""
    import re
    from pathlib import Path

    from attncompiler.simulate import V3_RESCALE_SLACK

    cuh = (Path(__file__).parent.parent / "templates/include/attncompiler/v3_consumer.cuh").read_text()
    assert float(re.search(r"kRescaleSlack = ([0-9.]+)f;", cuh).group(1)) == V3_RESCALE_SLACK
    g = torch.Generator().manual_seed(3)
    bias = torch.linspace(0.0, 40.0, 300, dtype=torch.float64)  # the row maximum grows ~0.13 per key

    def growing(score, b, h, q_idx, kv_idx):
        return score + bias[kv_idx]

    for spec in (ac.AttentionSpec(head_dim=16, score_mod=growing), presets.softcap(20.0, 16)):
        ir = build_ir(spec)
        bufs = dict(spec.trace().buffer_values)
        q, k, v = (torch.randn(1, 2, 300, 16, generator=g, dtype=torch.float64) * 3 for _ in range(3))
        ref, ref_lse = reference_attention(q, k, v, ir, buffers=bufs, return_lse=True)
        for desc in (False, True):
            res = simulate(ir, TileSchedule("v3", 128, 32, desc), q, k, v, buffers=bufs)
            assert float((res.out - ref).abs().max()) <= TOL, (spec.name, desc)
            assert float((res.lse - ref_lse).abs().max()) <= 1e-9, (spec.name, desc)


def test_per_head_classification() -> None:
    """A mask reading h is classified per (b, h): heads whose tiles are EMPTY are skipped alone."""
    def per_head_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= 8 + 40 * h)

    spec = ac.AttentionSpec(head_dim=16, mask_mod=per_head_window)
    ir = build_ir(spec)
    q, k, v = (torch.randn(2, 3, 90, 16, dtype=torch.float64) for _ in range(3))
    ref, lse = reference_attention(q, k, v, ir, return_lse=True)
    for sched in ("v1", "v2"):
        res = simulate(ir, TileSchedule(sched, 16, 16), q, k, v)
        assert float((res.out - ref).abs().max()) <= TOL
        assert res.stats.tiles_empty > 0
    cls = tile_classes(ir, TileSchedule("v2", 16, 16), 90, 90, B=2, H=3)
    assert cls.shape == (2, 3, 6, 6)
    assert int((cls[:, 0] == TILE_EMPTY).sum()) > int((cls[:, 2] == TILE_EMPTY).sum())


def test_tile_classes_sliding_window_16k() -> None:
    """The share of non-empty tiles of a 1024-wide window at N = 16k (the benchmark's scaling case)."""
    ir = build_ir(presets.sliding_window(1024, 128))
    cls = tile_classes(ir, TileSchedule("v2", 128, 128), 16384, 16384)
    live = int((cls != TILE_EMPTY).sum())
    # query block i sees key blocks i - 8 .. i (9, or fewer at the start): 9 * 128 - (1 + ... + 8)
    assert live == 9 * 128 - 36
    # partial: the diagonal block, and block i - 8 (q - kv spans 897 .. 1151 there) for i >= 8
    assert int((cls == TILE_PARTIAL).sum()) == 128 + 120
    assert int((cls == TILE_FULL).sum()) == live - 248


def test_simulate_errors() -> None:
    ir = build_ir(presets.plain(16))
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(SimulateError, match="expected one of v1, v2, v3, got 'v4'"):
        simulate(ir, TileSchedule("v4", 16, 16), q, q, q)
    with pytest.raises(SimulateError, match="expected a multiple of 64 for v3.*got 96"):
        simulate(ir, TileSchedule("v3", 96, 16), q, q, q)
    with pytest.raises(SimulateError, match="positive int"):
        simulate(ir, TileSchedule("v2", 0, 16), q, q, q)
    with pytest.raises(SimulateError, match="head_dim"):
        simulate(ir, TileSchedule("v2", 16, 16), torch.randn(1, 1, 8, 32), q, q)
    with pytest.raises(SimulateError, match="dropout_p"):
        simulate(ir, TileSchedule("v2", 16, 16), q, q, q, dropout_p=1.0)
    empty = simulate(ir, TileSchedule("v1", 16, 16), q, torch.randn(1, 1, 0, 16), torch.randn(1, 1, 0, 16))
    assert empty.out.abs().sum() == 0 and bool(torch.isinf(empty.lse).all())
    assert math.isinf(float(empty.lse[0, 0, 0])) and empty.stats.tiles == 0
