"""CPU fuzzing (hypothesis): random specs x random shapes (attncompiler.fuzz).

* the CPU tile simulator, with v1 and v2 tilings, matches the float64 reference (out and lse) and
  every output is finite (rows with no visible key: 0, lse -inf);
* every fuzzed spec traces, builds and verifies its IR, and renders the v1 and v2 forward and the
  v2 backward for sm_80 and sm_90 (no compiler needed); a handful compile with nvcc (``-m nvcc``).

Seeds are drawn by hypothesis (derandomized: the same seeds every run); a failure names its seed,
and ``attncompiler.fuzz.random_case(seed)`` rebuilds the case.
"""
from __future__ import annotations

import math
import random
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attncompiler import fuzz
from attncompiler.codegen.schedule import get_schedule
from attncompiler.codegen.v2_bwd import make_bwd_plan, render_bwd
from attncompiler.plan.v3_bwd import v3_bwd_auto_refusal
from attncompiler.runtime.backward import bwd_source
from attncompiler.ir.build import build_ir, verify
from attncompiler.plan.targets import get_target
from attncompiler.reference import reference_attention
from attncompiler.spec import presets
from attncompiler.simulate import TileSchedule, simulate

TOL = 1e-10
SEEDS = st.integers(min_value=0, max_value=2**31 - 1)
_FAST = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tiles: torch's intra-op threads only add overhead."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _inputs(shape: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, H, Hkv, Nq, Nk, D, DV = (shape[k] for k in ("B", "H", "H_kv", "Nq", "Nk", "D", "DV"))
    mk = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g)  # noqa: E731
    return mk(B, H, Nq, D), mk(B, Hkv, Nk, D), mk(B, Hkv, Nk, DV)


def _tilings(rng: random.Random) -> list[TileSchedule]:
    """v1 and v2 with small tiles (several tiles per row at these lengths), an odd one, and v3 (64-row warpgroups,
    either walk order)."""
    sq = (8, 16, 32)
    return [TileSchedule("v2", rng.choice(sq), rng.choice(sq)), TileSchedule("v1", rng.choice(sq), rng.choice(sq)),
            TileSchedule(rng.choice(("v1", "v2")), rng.choice((3, 13, 31)), rng.choice((5, 16, 29))),
            TileSchedule("v3", rng.choice((64, 128)), rng.choice((16, 32, 48)), rng.choice((False, True)))]


@settings(max_examples=120, **_FAST)
@given(seed=SEEDS)
def test_simulator_matches_reference_on_fuzzed_cases(seed: int) -> None:
    spec, shape = fuzz.random_case(seed, small=True)
    ir = build_ir(spec)
    bufs = dict(spec.trace().buffer_values)
    q, k, v = _inputs(shape, seed)
    ref, ref_lse = reference_attention(q, k, v, ir, buffers=bufs, seed=seed, offset=3, return_lse=True)
    where = f"fuzz seed {seed} {shape}\n{fuzz.random_spec(seed, head_dims=fuzz.CPU_HEAD_DIMS)}"
    assert bool(torch.isfinite(ref).all()), f"non-finite reference output: {where}"
    assert not bool(torch.isnan(ref_lse).any()) and not bool((ref_lse == math.inf).any()), f"bad lse: {where}"
    empty = torch.isinf(ref_lse)
    assert bool((ref[empty] == 0).all()), f"an empty row is not 0: {where}"
    for plan in _tilings(random.Random(seed)):
        res = simulate(ir, plan, q, k, v, buffers=bufs, seed=seed, offset=3)
        err = float((res.out - ref).abs().max()) if ref.numel() else 0.0
        same_inf = torch.isinf(ref_lse) & (res.lse == ref_lse)
        lse_err = (res.lse - ref_lse).abs().masked_fill(same_inf, 0.0)
        tiles = f"{plan.schedule} {plan.block_m}x{plan.block_n}"
        assert err <= TOL, f"{tiles}: max err {err:.3e}; {where}"
        assert bool((lse_err <= TOL).all()), f"{tiles}: lse differs; {where}"


@settings(max_examples=30, **_FAST)
@given(seed=SEEDS)
def test_fuzzed_specs_trace_verify_and_render(seed: int) -> None:
    fs = fuzz.random_spec(seed)
    ir = build_ir(fs.spec)
    verify(ir)
    for arch in ("sm_80", "sm_90"):
        tgt = get_target(arch)
        for name in ("v1", "v2"):
            sched = get_schedule(name)
            ks = sched.render(ir, sched.make_plan(ir, tgt), tgt)
            assert 'extern "C" __global__' in ks.source and "struct Variant" in ks.source, f"{name} {arch}: {fs}"
        bwd = render_bwd(ir, make_bwd_plan(ir, tgt), tgt)
        assert "attn_bwd_pre" in bwd.source, f"backward {arch}: {fs}"
        # what .backward() runs there: the v3 backward on sm_90 at head dims 48-128, else v2's
        auto = bwd_source(ir, tgt)
        v3_bwd = arch == "sm_90" and v3_bwd_auto_refusal(ir, tgt) is None
        assert ("wgmma.mma_async" in auto.source) == v3_bwd, f"backward {arch} (v3: {v3_bwd}): {fs}"
    # v3 (sm_90 only) with the seed's fuzzed plan options, as tests/test_gpu_fuzz.py runs it
    tgt = get_target("sm_90")
    opts = fuzz.accepted_options(fs.spec, "v3", tgt, fuzz.v3_options(seed))
    plan = get_schedule("v3").make_plan(ir, tgt, **opts)
    ks = get_schedule("v3").render(ir, plan, tgt)
    assert "wgmma.mma_async" in ks.source or "wgmma_" in ks.source, f"v3 {opts}: {fs}"
    for name, want in opts.items():
        assert getattr(plan, name) == want, f"v3 plan ignores {name}={want!r}: {plan}"


def _visible(ir, bufs: dict, B: int, H: int, Nq: int, Nk: int) -> torch.Tensor:
    """(B, H, Nq, Nk) bool: the mask as the reference evaluates it."""
    from attncompiler.reference import evaluate
    from attncompiler.spec.symbols import B as SB, H as SH, KV_IDX, KV_LEN, Q_IDX, Q_LEN

    if ir.mask_expr is None:
        return torch.ones(B, H, Nq, Nk, dtype=torch.bool)
    env = {SB.name: torch.arange(B).view(B, 1, 1, 1), SH.name: torch.arange(H).view(1, H, 1, 1),
           Q_IDX.name: torch.arange(Nq).view(1, 1, Nq, 1), KV_IDX.name: torch.arange(Nk).view(1, 1, 1, Nk),
           Q_LEN.name: Nq, KV_LEN.name: Nk}
    ints = {n: (t if t.is_floating_point() else t.to(torch.int64)) for n, t in bufs.items()}
    m = torch.as_tensor(evaluate(ir.mask_expr, env, ints))
    return torch.broadcast_to(m if m.dtype == torch.bool else m != 0, (B, H, Nq, Nk))


@settings(max_examples=60, **_FAST)
@given(seed=SEEDS)
def test_mask_index_ranges_are_sound_on_fuzzed_masks(seed: int) -> None:
    """The kernels visit only the K/V blocks in ``kv_range`` of a query block (and the backward the
    query blocks in ``q_range`` of a key block): on fuzzed masks no visible element lies outside."""
    ranges = pytest.importorskip("attncompiler.ir.ranges")
    spec, shape = fuzz.random_case(seed, small=True)
    ir = build_ir(spec)
    B, H, Nq, Nk = shape["B"], shape["H"], shape["Nq"], shape["Nk"]
    vis = _visible(ir, dict(spec.trace().buffer_values), B, H, Nq, Nk)
    rng = random.Random(seed)
    for axis, n_self, n_other in (("kv", Nq, Nk), ("q", Nk, Nq)):
        rg = ranges.index_range(ir.mask_expr, axis)
        v = vis if axis == "kv" else vis.transpose(-1, -2)  # (B, H, block axis, solved axis)
        for _ in range(6):
            lo = rng.randrange(n_self)
            hi = min(n_self - 1, lo + rng.choice((0, 3, 15, 63)))
            for b in range(B):
                for h in range(H):
                    r_lo, r_hi = rg.evaluate(lo, hi, b=b, h=h, q_len=Nq, kv_len=Nk)
                    seen = v[b, h, lo:hi + 1].any(0).nonzero().flatten()
                    if seen.numel():
                        assert r_lo <= int(seen.min()) and int(seen.max()) <= r_hi, (
                            f"{axis} range [{r_lo}, {r_hi}] of block [{lo}, {hi}] (b={b}, h={h}) misses visible "
                            f"{seen.tolist()[:8]}...; fuzz seed {seed} {shape}\nmask {ir.mask_expr}")


def test_cases_are_deterministic_per_seed() -> None:
    for seed in (0, 7, 123456):
        (s1, sh1), (s2, sh2) = fuzz.random_case(seed), fuzz.random_case(seed)
        assert sh1 == sh2
        ir1, ir2 = build_ir(s1), build_ir(s2)
        assert ir1.key() == ir2.key() and ir1.scale == ir2.scale and ir1.dropout_p == ir2.dropout_p
        b1, b2 = s1.trace().buffer_values, s2.trace().buffer_values
        assert b1.keys() == b2.keys() and all(torch.equal(b1[n], b2[n]) for n in b1)
        assert fuzz.random_spec(seed).description == fuzz.random_spec(seed).description


def test_grammar_covers_its_features() -> None:
    """Over 300 seeds the generator reaches every preset, both mods, every buffer and dropout."""
    texts = [fuzz.random_spec(s).description for s in range(300)]
    joined = "\n".join(texts)
    for needle in ("preset none", "preset causal", "sliding_window(", "prefix_lm(", "document(", "alibi(",
                   "softcap(", "relative_bias(", "fz_hbias[h]", "fz_kvbias[kv_idx]", "fz_qbias[q_idx]",
                   "fz_table[h, ops.clamp(", "fz_temp", "fz_doc[q_idx] == fz_doc[kv_idx]", "fz_keep[kv_idx]",
                   "torch.tanh", "ops.where(", "ops.max(", "ops.min(", " & ", " | ", "~(", "abs(", " % ", " // ",
                   "base(score", "base_mask(", "dropout_p=0.1", "dropout_p=0.25", "causal=True"):
        assert needle in joined, f"no fuzzed spec uses {needle!r}"
    shapes = [fuzz.random_shape(s) for s in range(300)]
    assert any(s["H"] != s["H_kv"] for s in shapes) and any(s["H_kv"] == 1 < s["H"] for s in shapes)
    assert any(s["Nq"] != s["Nk"] for s in shapes) and any(s["layout"] == "bnhd" for s in shapes)
    assert max(max(s["Nq"], s["Nk"]) for s in shapes) <= fuzz.MAX_SEQLEN


def test_bad_seeds() -> None:
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="seed: expected an int >= 0"):
            fuzz.random_case(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="seed: expected an int >= 0"):
            fuzz.v3_options(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="seed: expected an int >= 0"):
            fuzz.random_decode_shape(bad)  # type: ignore[arg-type]


def test_v3_options_cover_the_sets_and_fall_back() -> None:
    """Over 200 seeds every option set is drawn; a set the planner refuses (the Q prescale without a
    ``G(c * score)`` score_mod) falls back to the model's plan, an accepted one is kept as given."""
    drawn = [fuzz.v3_options(s) for s in range(200)]
    assert all(o in drawn for o in fuzz.V3_OPTION_SETS)
    assert fuzz.v3_options(17) == fuzz.v3_options(17)
    tgt = get_target("sm_90")
    plain = presets.plain(128)
    assert fuzz.accepted_options(plain, "v3", tgt, {"q_prescale": True}) == {}
    assert fuzz.accepted_options(presets.softcap(30.0, 128), "v3", tgt, {"q_prescale": True}) == {"q_prescale": True}
    assert fuzz.accepted_options(plain, "v3", tgt, {"persistent": True}) == {"persistent": True}
    jobs = fuzz.compile_jobs([plain, plain], tgt, schedules=("v3",), options=[{}, {"persistent": True}])
    assert len(jobs) == 2 and jobs[0][0] != jobs[1][0]
    with pytest.raises(ValueError, match=r"options: expected one dict per spec \(2\), got 1"):
        fuzz.compile_jobs([plain, plain], tgt, schedules=("v3",), options=[{}])


def test_decode_cases() -> None:
    """Decode cases: few query rows against long K/V, buffers long enough for them, every option set drawn,
    and each spec renders through the decode schedule with its (accepted) options on sm_90."""
    shapes = [fuzz.random_decode_shape(s) for s in range(300)]
    assert all(1 <= s["Nq"] <= 16 and 512 <= s["Nk"] <= fuzz.DECODE_MAX_SEQLEN for s in shapes)
    assert any(s["H_kv"] < s["H"] for s in shapes) and any(s["Nk"] % 16 for s in shapes)
    drawn = [fuzz.decode_options(s) for s in range(200)]
    assert all(o in drawn for o in fuzz.DECODE_OPTION_SETS)
    tgt = get_target("sm_90")
    for seed in range(12):
        fs = fuzz.random_decode_spec(seed)
        assert fs.spec.dropout_p == 0.0
        bufs = fs.spec.trace().buffer_values
        for name in ("fz_qbias", "fz_kvbias", "fz_doc", "fz_keep"):
            if name in bufs:
                assert bufs[name].shape[0] == fuzz.DECODE_MAX_SEQLEN, name
        opts = fuzz.accepted_options(fs.spec, "decode", tgt, fuzz.decode_options(seed))
        ir = build_ir(fs.spec)
        ks = get_schedule("decode").render(ir, get_schedule("decode").make_plan(ir, tgt, **opts), tgt)
        assert 'extern "C" __global__' in ks.source, f"decode {opts}: {fs}"
    # the v2 / v3 fuzz's specs keep their buffers (and so their values) at MAX_SEQLEN
    for seed in range(40):
        b = fuzz.random_spec(seed).spec.trace().buffer_values
        assert all(t.shape[0] == fuzz.MAX_SEQLEN for n, t in b.items() if n in ("fz_qbias", "fz_kvbias", "fz_doc"))


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("seed", [0, 1, 2, 5, 7, 11])
def test_nvcc_compiles_fuzzed_specs(seed: int) -> None:
    from attncompiler.runtime.compiler import compile_with_nvcc

    fs = fuzz.random_spec(seed)
    ir = build_ir(fs.spec)
    tgt = get_target("sm_90")
    sources = {name: get_schedule(name).render(ir, get_schedule(name).make_plan(ir, tgt), tgt).source
               for name in ("v1", "v2")}
    opts = fuzz.accepted_options(fs.spec, "v3", tgt, fuzz.v3_options(seed))
    sources["v3"] = get_schedule("v3").render(ir, get_schedule("v3").make_plan(ir, tgt, **opts), tgt).source
    sources["bwd"] = render_bwd(ir, make_bwd_plan(ir, tgt), tgt).source
    if v3_bwd_auto_refusal(ir, tgt) is None:  # the v3 backward .backward() runs for this spec on sm_90
        sources["bwd_v3"] = bwd_source(ir, tgt).source
    for name, src in sources.items():
        rep = compile_with_nvcc(src, "sm_90a")
        print(f"fuzz seed {seed} {name}: {rep.registers} regs, spill {rep.spill_stores} B")
        assert rep.registers > 0, f"{name}: {fs}"


def test_gpu_fuzz_seeds_reach_every_option_set() -> None:
    """tests/test_gpu_fuzz.py's fixed seeds (specs 0..59, decode specs 0, 2, .., 58) run every v3 and decode
    option set on sm_90 after the planner's refusals, so no plan the fuzz names goes untested on the GPU."""
    tgt = get_target("sm_90")
    v3 = {str(fuzz.accepted_options(fuzz.random_spec(i).spec, "v3", tgt, fuzz.v3_options(i))) for i in range(60)}
    assert v3 == {str(o) for o in fuzz.V3_OPTION_SETS}
    dec = {str(fuzz.accepted_options(fuzz.random_decode_spec(i).spec, "decode", tgt, fuzz.decode_options(i)))
           for i in range(0, 60, 2)}
    assert dec == {str(o) for o in fuzz.DECODE_OPTION_SETS}
