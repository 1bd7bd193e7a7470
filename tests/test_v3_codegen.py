"""CPU: the v3 (Hopper) schedule -- plans, rendering, errors, TMA map geometry, and (nvcc) every
variant compiled for sm_90a with wgmma / TMA in its PTX and no local-memory spills in the common
variants."""
from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import attncompiler as ac
from attncompiler.codegen.schedule import ScheduleError, get_schedule
from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError, ProblemDims
from attncompiler.plan.targets import get_target
from attncompiler.plan.v3 import CONSUMER_REGS, PREFERRED_BLOCK_N_DROPOUT, PRODUCER_REGS, plan_v3, v3_smem_bytes
from attncompiler.runtime.compiler import compile_with_nvcc
from attncompiler.spec import presets

from _nvcc import ptx_sm90a  # shared with the other v3 nvcc tests
from _v3 import render_v3

ROOT = Path(__file__).parent.parent
PRESET_NAMES = ("plain", "causal", "sliding_window", "alibi", "softcap", "prefix_lm", "document", "relative_bias")


def _specs(head_dim: int, dtype: str = "bf16") -> dict[str, ac.AttentionSpec]:
    out = {n: presets.get_preset(n, head_dim=head_dim, num_heads=4, seqlen=1024, dtype=dtype) for n in PRESET_NAMES}
    out["dropout"] = ac.AttentionSpec(head_dim=head_dim, dropout_p=0.1, causal=True, name="dropout", dtype=dtype)
    for path in sorted((ROOT / "examples").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"v3ex_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        out[f"example:{path.stem}"] = dataclasses.replace(mod.make_spec(head_dim=head_dim), dtype=dtype)
    return out


_render = render_v3


@pytest.mark.parametrize("d,block_n,stages", [(64, 192, 4), (128, 128, 3), (192, 112, 2), (256, 80, 2)])
def test_plan_choices(d, block_n, stages):
    # with a mask: two consumer warpgroups at every head dim
    p = plan_v3(build_ir(presets.causal(d)), "sm_90")
    assert (p.block_m, p.block_n, p.stages, p.num_threads) == (128, block_n, stages, 384)
    assert p.smem_bytes == v3_smem_bytes(128, block_n, d, d, stages) <= get_target("sm_90").max_smem_per_block_optin
    assert p.producer_regs == PRODUCER_REGS and p.consumer_regs == CONSUMER_REGS
    text = p.describe()
    assert "setmaxnreg" in text and "rejected" in text or stages == 4
    plain = plan_v3(ProblemDims(d), "sm_90")  # no mask: three consumers at d = 64 (PREFERRED_BLOCK_M)
    if d == 64:
        assert (plain.block_m, plain.block_n, plain.consumer_regs, plain.num_threads) == (192, 112, 160, 512)
        assert "PREFERRED_BLOCK_M" in plain.describe()
        assert "BLOCK_N=128: ~168 registers per consumer thread > 160" in plain.describe()
        assert plan_v3(ProblemDims(d), "sm_90", block_n=192).block_m == 128  # too wide for three: two
        assert plan_v3(ProblemDims(d), "sm_90", num_warps=12).block_m == 128  # the warps name two
    else:
        # d = 128: the persistent grid with TMA stores of O, whose O tile takes the third stage (plan/v3_grid.py);
        # d >= 192: the O tile would cost BLOCK_N, so one CTA per tile
        assert (plain.block_m, plain.block_n, plain.stages) == (128, block_n, 2 if d == 128 else stages)
        assert plain.persistent == plain.tma_store_o == (d == 128)
    drop = plan_v3(build_ir(ac.AttentionSpec(head_dim=d, dropout_p=0.1)), "sm_90")  # at most ..._DROPOUT
    assert drop.block_n == min(block_n, PREFERRED_BLOCK_N_DROPOUT) and "with dropout" in drop.describe()
    # a mask that reads a buffer (document ids) takes the same cap; a mask of positions only does not
    doc = plan_v3(build_ir(presets.document(presets.document_ids(1000, 3), d)), "sm_90")
    assert doc.block_n == min(block_n, PREFERRED_BLOCK_N_DROPOUT)
    assert "a mask that reads buffers" in doc.describe()
    assert "reads buffers" not in plan_v3(build_ir(presets.causal(d)), "sm_90").describe()


def test_plan_head_dims_not_multiples_of_64():
    """96 (and any multiple of 16 up to 256) tiles in zero-padded 64-column boxes: shared memory counts whole
    boxes, registers the real DV; without a mask, head dims up to 96 take three consumers (PREFERRED_BLOCK_M)."""
    causal = plan_v3(build_ir(presets.causal(96)), "sm_90")
    assert (causal.block_m, causal.block_n, causal.stages) == (128, 128, 3)
    assert causal.smem_bytes == v3_smem_bytes(128, 128, 96, 96, 3) == v3_smem_bytes(128, 128, 128, 128, 3)
    text = causal.describe()
    assert "smem rows padded to 128 / 128 columns (TMA zero-fills the rest)" in text
    assert "O DV/2 = 48" in text and "128*128 + 3*128*(128+128)" in text
    plain = plan_v3(ProblemDims(96), "sm_90")
    assert (plain.block_m, plain.consumer_regs) == (192, 160) and "PREFERRED_BLOCK_M" in plain.describe()
    assert plan_v3(ProblemDims(128), "sm_90").block_m == 128
    mixed = plan_v3(ProblemDims(192, 96), "sm_90")  # D 3 boxes, DV 2 boxes
    assert mixed.smem_bytes == v3_smem_bytes(128, mixed.block_n, 192, 128, mixed.stages, o_tile=mixed.tma_store_o)
    assert "smem rows padded" not in plan_v3(ProblemDims(192, 128), "sm_90").describe()


@pytest.mark.parametrize("spec, block_n, poly", [
    (presets.softcap(30.0, 64), 144, 4),    # bounded: fixed softmax offset, MUFU-bound at d=64
    (presets.softcap(60.0, 64), 192, 0),    # too wide for a fixed offset: the running maximum, plain's plan
    (presets.softcap(30.0, 128), 128, 0),
    (presets.softcap(30.0, 64, dtype="fp16"), 192, 0),  # fp16 P keeps the running maximum
])
def test_plan_bounded_score_mod(spec, block_n, poly):
    p = plan_v3(build_ir(spec), "sm_90")
    assert (p.block_n, p.exp2_poly) == (block_n, poly)
    if poly:
        assert "EXP2_POLY_STATIC" in p.describe() and "PREFERRED_BLOCK_N_STATIC" in p.describe()
    assert plan_v3(build_ir(spec), "sm_90", exp2_poly=0).exp2_poly == 0  # the caller's choice wins


def test_plan_errors_name_the_numbers():
    with pytest.raises(PlanError, match="v3 needs sm_90a, got sm_80"):
        plan_v3(ProblemDims(128), "sm_80")
    with pytest.raises(PlanError, match="multiples of 16 and <= 256.*got head_dim=40, head_dim_v=40"):
        plan_v3(ProblemDims(40), "sm_90")
    with pytest.raises(PlanError, match="got head_dim_v=264"):
        plan_v3(ProblemDims(128, 264), "sm_90")
    with pytest.raises(PlanError, match="BLOCK_N=100: expected a multiple of 16"):
        plan_v3(ProblemDims(128), "sm_90", block_n=100)
    with pytest.raises(PlanError, match=r"smem \d+ B with 4 stage\(s\) > 232448 B"):
        plan_v3(ProblemDims(256), "sm_90", block_n=64, stages=4)
    with pytest.raises(PlanError, match="registers per consumer thread > 240"):
        plan_v3(ProblemDims(256), "sm_90", block_n=256)
    with pytest.raises(PlanError, match=r"expected block_m in \(64, 128, 192\).*got 96"):
        plan_v3(ProblemDims(128), "sm_90", block_m=96)
    with pytest.raises(PlanError, match="BLOCK_N=128: ~168 registers per consumer thread > 160"):
        plan_v3(ProblemDims(64), "sm_90", block_m=192, block_n=128)
    with pytest.raises(PlanError, match="expected num_warps=16"):
        plan_v3(ProblemDims(64), "sm_90", block_m=192, num_warps=12)


def test_plan_kv_order():
    """Separable score_mods (ALiBi, with or without a mask) walk the K/V blocks from the last down; the rest
    ascend; the option forces either, and the kernel gets it as a constexpr."""
    sep = build_ir(presets.alibi(presets.alibi_slopes(4), 128))
    sep_causal = build_ir(presets.alibi(presets.alibi_slopes(4), 128, causal=True))
    for ir in (sep, sep_causal):
        p = plan_v3(ir, "sm_90")
        assert p.kv_descending and p.options["kv_descending"] is True
        assert any("from the last down (KV_DESCENDING_SEPARABLE" in r for r in p.reasons)
    for spec in (presets.causal(128), presets.plain(64), presets.softcap(30.0, 128)):
        assert not plan_v3(build_ir(spec), "sm_90").kv_descending
    assert plan_v3(build_ir(presets.causal(128)), "sm_90", kv_descending=True).kv_descending
    assert not plan_v3(sep, "sm_90", kv_descending=False).kv_descending
    with pytest.raises(PlanError, match="expected kv_descending a bool, got 1"):
        plan_v3(sep, "sm_90", kv_descending=1)
    src = ac.compile(presets.alibi(presets.alibi_slopes(4), 128), "v3", target="sm_90", build=False).kernel_source.source
    assert "static constexpr bool KV_DESCENDING = true;" in src


def test_plan_three_consumers():
    """block_m = 192: three consumer warpgroups with 160 registers each, BLOCK_N narrowed to fit them."""
    p = plan_v3(ProblemDims(64), "sm_90", block_m=192)
    assert (p.block_m, p.consumers, p.consumer_regs, p.num_threads) == (192, 3, 160, 512)
    assert p.block_n == 112 and p.options["block_m"] == 192
    assert any("x 3 consumer warpgroups = 192 (forced)" in r for r in p.reasons)
    assert any("24*128 + 160*384 <= 65536" in r for r in p.reasons)
    assert plan_v3(ProblemDims(64), "sm_90", **p.options) == p
    src = ac.compile(presets.causal(64), "v3", target="sm_90", build=False, block_m=192).kernel_source.source
    assert "static constexpr int NC = 3;" in src and "__launch_bounds__(512, 1)" in src


def test_plan_one_consumer_two_ctas():
    """block_m = 64: one consumer warpgroup and two CTAs per SM. Shared memory is half the SM's less the per-block
    reserve (115712 B on sm_90); registers are ptxas's 128 per thread under __launch_bounds__(256, 2), so d = 256
    (O alone takes 128) is refused with the numbers."""
    p = plan_v3(ProblemDims(128), "sm_90", block_m=64)
    assert (p.block_m, p.consumers, p.ctas_per_sm, p.num_threads) == (64, 1, 2, 256)
    assert (p.block_n, p.stages) == (80, 2) and p.smem_bytes <= 115712
    assert any("> 115712 B per block (2 CTAs per SM)" in r and "BLOCK_N=96" in r for r in p.reasons)
    assert any("O DV/2 = 64 + S BLOCK_N/2 = 40 + slack 8 <= 128" in r for r in p.reasons)
    assert plan_v3(ProblemDims(128), "sm_90", **p.options) == p
    assert plan_v3(ProblemDims(128), "sm_90", num_warps=8).block_m == 64  # the warps name one consumer
    assert plan_v3(ProblemDims(64), "sm_90", block_m=64).block_n == 176  # BN 192: O 32 + S 96 + 8 > 128
    with pytest.raises(PlanError, match=r"BLOCK_N=64: O 128 \+ S 32 \+ 8 registers per thread > 128"):
        plan_v3(ProblemDims(256), "sm_90", block_m=64)
    src = ac.compile(presets.sliding_window(1024, 128), "v3", target="sm_90", build=False,
                     block_m=64).kernel_source.source
    assert "static constexpr int NC = 1;" in src and "__launch_bounds__(256, 2)" in src
    assert plan_v3(ProblemDims(128), "sm_90").ctas_per_sm == 1  # the default keeps the ping-pong


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_100"])
def test_v3_on_other_targets_is_a_clear_error(arch):
    with pytest.raises(ScheduleError, match=f"v3 needs sm_90a, got {arch}"):
        ac.compile(presets.plain(128), "v3", target=arch)


def test_render_has_the_hopper_pieces():
    ks = _render(presets.causal(128))
    assert ks.arch == "sm_90a" and ks.threads == 384 and ks.entry == "attn_fwd"
    src = ks.source
    for needle in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "cp.async.bulk.tensor.4d",
                   "setmaxnreg.inc.sync.aligned", "setmaxnreg.dec.sync.aligned", "__grid_constant__ ac::V3Maps",
                   "mbarrier.try_wait.parity", "bar.sync", "struct Variant"):
        assert needle in src, needle
    assert '#include "attncompiler/' not in src
    fp16 = _render(presets.plain(64, dtype="fp16")).source
    assert "m64n112k16.f32.f16.f16" in fp16 and "m64n64k16.f32.f16.f16" in fp16  # d64: three consumers, BN 112


def test_cli_show_prints_the_v3_source(capsys):
    from attncompiler.cli import main

    assert main(["show", "causal", "--schedule", "v3", "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    assert "schedule v3" in out and "wgmma.mma_async" in out and "cp.async.bulk.tensor" in out


def test_tma_geometry_checks_strides():
    from attncompiler.runtime.tma import TmaError, _geometry

    dims, strides = _geometry("q", (2, 3, 100, 128), (3 * 100 * 128, 100 * 128, 128), 2)
    assert dims == (128, 100, 3, 2) and strides == (256, 100 * 256, 300 * 256)
    # (B, N, H, d) storage viewed as (B, H, N, d): heads inner
    dims, strides = _geometry("k", (2, 3, 100, 64), (100 * 3 * 64, 64, 3 * 64), 2)
    assert strides == (3 * 64 * 2, 64 * 2, 100 * 3 * 64 * 2)
    # size-1 dims get a harmless stride whatever torch reports
    assert _geometry("v", (1, 1, 1, 64), (0, 0, 0), 2)[1] == (128, 128, 128)
    with pytest.raises(TmaError, match="expected a heads stride the copy engine can address"):
        _geometry("q", (1, 2, 10, 64), (0, 0, 64), 2)  # heads broadcast with stride 0


def test_tma_layout_error_answers_per_layout():
    """The launch path asks on every call; the answer depends on the layout only (and is cached by it)."""
    import torch

    from attncompiler.runtime.tma import tma_layout_error

    ok = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16)
    assert tma_layout_error("q", ok) is None and tma_layout_error("q", ok) is None
    bad = torch.empty(2, 1, 100, 64, dtype=torch.bfloat16).expand(2, 4, 100, 64)  # heads broadcast: stride 0
    msg = tma_layout_error("k", bad)
    assert msg is not None and "k: expected a heads stride" in msg and "got 0 bytes" in msg
    assert tma_layout_error("k", bad) == msg
    assert tma_layout_error("k", bad.contiguous()) is None


def test_maps_struct_cached_whole(monkeypatch):
    """A repeated launch reuses the whole struct (no per-map encode); a new pointer or box builds a new one; a
    refused map is never cached (the same call fails again)."""
    from attncompiler.runtime import tma

    calls = []

    def fake_encode(name, ptr, shape, strides, dtype, box):
        calls.append((name, ptr, box))
        if ptr == 0xbad0:
            raise tma.TmaError(f"{name}: refused")
        return bytes([len(calls)]) * 128

    monkeypatch.setattr(tma, "encode_attn_map", fake_encode)
    monkeypatch.setattr(tma, "_struct_cache", {})
    entries = tuple((n, 0x1000 * (i + 1), (1, 2, 64, 64), (8192, 4096, 64), "bf16", 128 if n == "q" else 64)
                    for i, n in enumerate("qkv"))
    s1 = tma.maps_struct(entries)
    raw = bytes(s1)
    assert len(raw) == 3 * 128 and raw[:128] == bytes([1]) * 128 and raw[256:] == bytes([3]) * 128
    assert tma.maps_struct(entries) is s1 and len(calls) == 3
    other = (entries[0][:5] + (64,),) + entries[1:]  # another box for q
    assert tma.maps_struct(other) is not s1 and len(calls) == 6
    bad = (("q", 0xbad0, *entries[0][2:]),) + entries[1:]
    for _ in range(2):
        with pytest.raises(tma.TmaError, match="q: refused"):
            tma.maps_struct(bad)
    assert len(calls) == 8


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim,dtype", [(64, "bf16"), (96, "bf16"), (128, "bf16"), (128, "fp16"), (192, "bf16"),
                                            (256, "bf16")])
def test_nvcc_every_v3_variant_has_wgmma_and_tma(head_dim, dtype):
    jobs = {name: _render(spec).source for name, spec in _specs(head_dim, dtype).items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        ptx = dict(zip(jobs, pool.map(ptx_sm90a, jobs.values())))
        reps = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name in jobs:
        rep = reps[name]
        print(f"v3 d={head_dim} {dtype} {name:24s}: {rep.registers} regs at entry, spill "
              f"{rep.spill_stores}/{rep.spill_loads} B, stack {rep.stack_bytes} B")
        assert "wgmma.mma_async.sync.aligned" in ptx[name], name
        assert "cp.async.bulk.tensor.4d" in ptx[name], name
        assert "setmaxnreg" in ptx[name], name
        assert "C7508" not in rep.log, f"{name}: setmaxnreg ignored by ptxas"
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        if name in ("plain", "causal", "alibi", "softcap", "sliding_window"):
            assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_trace_marks_compile_in_only_when_asked():
    """benchmarks/v3_trace.py prepends -DAC_V3_TRACE: then the kernel reads %globaltimer into the
    ac_v3_trace array; without it the marks are gone (no timer reads, no array)."""
    src = _render(_specs(128, "bf16")["sliding_window"]).source
    plain_ptx, traced_ptx = ptx_sm90a(src), ptx_sm90a("#define AC_V3_TRACE 1\n" + src)
    assert "%globaltimer" in traced_ptx and "ac_v3_trace" in traced_ptx
    assert "%globaltimer" not in plain_ptx and "ac_v3_trace" not in plain_ptx
    rep = compile_with_nvcc("#define AC_V3_TRACE 1\n" + src, "sm_90a")
    assert rep.spill_stores == 0 and "C7520" not in rep.log, rep.log


def test_plan_q_prescale():
    """q_prescale is opt-in (c q rounded to bf16: plan/qscale.py); the reasons say why it is off, and forcing it
    where the score_mod has no inner scale, or in fp16, is an error naming what was got."""
    for spec, why in ((presets.softcap(30.0, 128), "opt-in, q_prescale=True"),
                      (presets.softcap(30.0, 64), "opt-in, q_prescale=True"),
                      (presets.softcap(30.0, 128, dtype="fp16"), "bf16 only"),
                      (presets.plain(128), "no score_mod"),
                      (presets.alibi(presets.alibi_slopes(4), 128), "not G(c * score)")):
        q = plan_v3(build_ir(spec), "sm_90")
        assert not q.q_prescale and q.options["q_prescale"] is False
        assert any(r.startswith("Q prescale: off") and why in r for r in q.reasons), (spec.name, q.reasons)
    p = plan_v3(build_ir(presets.softcap(30.0, 64)), "sm_90", q_prescale=True)
    assert p.q_prescale and p.options["q_prescale"] is True
    assert any(r.startswith("Q prescale: on (forced)") for r in p.reasons)
    with pytest.raises(PlanError, match=r"q_prescale=True needs .*got dtype fp16"):
        plan_v3(build_ir(presets.softcap(30.0, 128, dtype="fp16")), "sm_90", q_prescale=True)
    with pytest.raises(PlanError, match=r"q_prescale=True needs .*got no score_mod"):
        plan_v3(build_ir(presets.plain(128)), "sm_90", q_prescale=True)
    with pytest.raises(PlanError, match="expected q_prescale a bool, got 'yes'"):
        plan_v3(build_ir(presets.softcap(30.0, 128)), "sm_90", q_prescale="yes")
    assert "static constexpr bool Q_PRESCALE = true;" in _render(presets.softcap(30.0, 128), q_prescale=True).source
    assert "static constexpr bool Q_PRESCALE = false;" in _render(presets.softcap(30.0, 128)).source


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim, opts", [(64, {}), (64, {"block_m": 192}), (128, {}), (128, {"persistent": True}),
                                            (256, {})])
def test_nvcc_q_prescale(head_dim, opts):
    """The Q scaling (v3_scale_q) compiles into every consumer shape: satfinite bf16x2 conversions, the proxy
    fence before the wgmmas read the scaled rows, no spills, no serialized wgmma."""
    spec = presets.softcap(30.0, head_dim)
    src = _render(spec, q_prescale=True, **opts).source
    assert "static constexpr bool Q_PRESCALE = true;" in src
    ptx = ptx_sm90a(src)
    assert "cvt.rn.satfinite.bf16x2.f32" in ptx and "fence.proxy.async.shared::cta" in ptx
    rep = compile_with_nvcc(src, "sm_90a")
    assert rep.spill_stores == 0 and rep.spill_loads == 0 and "C7520" not in rep.log, rep.log


def test_cli_plan_options(capsys):
    """--option KEY=VALUE passes plan options to show / plan (and run); a schedule that does not take one, or a
    malformed one, is a clear error naming what was got."""
    from attncompiler.cli import main

    assert main(["show", "softcap", "--schedule", "v3", "--arch", "sm_90", "--option", "q_prescale=true",
                 "--option", "block_n=96"]) == 0
    src = capsys.readouterr().out
    assert "static constexpr bool Q_PRESCALE = true;" in src and "static constexpr int BLOCK_N = 96;" in src
    assert main(["plan", "softcap", "--arch", "sm_90", "--option", "q_prescale=false"]) == 0
    assert "Q prescale: off (forced)" in capsys.readouterr().out
    for argv, expected in (
            (["plan", "softcap", "--arch", "sm_80", "--option", "q_prescale=true"],
             "v2 (schedule 'auto' on sm_80 -> v2: v3 needs sm_90a"),
            (["plan", "softcap", "--arch", "sm_90", "--option", "q_prescale=maybe"],
             "--option q_prescale: expected true, false or an integer, got 'maybe'"),
            (["show", "plain", "--arch", "sm_90", "--option", "block_n"], "--option: expected KEY=VALUE"),
    ):
        assert main(argv) == 2
        assert expected in capsys.readouterr().err


def test_varlen_source_drops_persistent_and_score_skip():
    """Packed sequences render the v3 kernel's own plan with varlen=True, minus the persistent grid and the score
    skip (one tile per CTA: the entry takes the sequence's view); asking the schedule for those is an error."""
    from attncompiler.runtime.varlen import varlen_fwd_source

    t = get_target("sm_90")
    kern = ac.compile(presets.alibi(presets.alibi_slopes(4), 128), "v3", target="sm_90", build=False,
                      persistent=True, score_skip=True)
    assert kern.plan.persistent and kern.plan.score_skip
    ks = varlen_fwd_source(kern.ir, t, kern.kernel_source, "v3")
    assert ks.schedule == "v3" and not ks.plan.persistent and not ks.plan.score_skip
    assert ks.plan.block_n == kern.plan.block_n and ks.plan.stages == kern.plan.stages
    assert "static constexpr bool VARLEN = true;" in ks.source and "varlen_fwd_enter" in ks.source
    assert varlen_fwd_source(kern.ir, t, kern.kernel_source, "v3") is ks  # cached
    with pytest.raises(ScheduleError, match="v3 varlen: expected a plan without persistent"):
        get_schedule("v3").render(kern.ir, kern.plan, t, varlen=True)
    with pytest.raises(ValueError, match="takes a v3 kernel's plan"):
        varlen_fwd_source(kern.ir, t, None, "v3")


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_varlen_v3_sources():
    """The packed-sequence v3 kernels (runtime/varlen.py renders them on first use) compile for sm_90a with TMA and
    wgmma, no spills and no serialized wgmma."""
    from attncompiler.runtime.varlen import varlen_fwd_source

    t = get_target("sm_90")
    specs = [presets.causal(128), presets.plain(96), presets.document(presets.document_ids(1000, 3), 64),
             ac.AttentionSpec(head_dim=128, dropout_p=0.1, causal=True)]
    srcs = [varlen_fwd_source(build_ir(s), t, ac.compile(s, "v3", target="sm_90", build=False).kernel_source,
                              "v3").source for s in specs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        reps = list(pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), srcs))
        ptx = list(pool.map(ptx_sm90a, srcs))
    for spec, rep, p in zip(specs, reps, ptx):
        assert "cp.async.bulk.tensor.4d" in p and "wgmma.mma_async.sync.aligned" in p, spec
        assert "C7520" not in rep.log, f"{spec}: ptxas serialized the wgmma instructions"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{spec}: spills\n{rep.log}"


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_nvcc_one_consumer_two_ctas(head_dim):
    """block_m = 64 (one consumer warpgroup, two CTAs per SM): every preset and example compiles for sm_90a within
    ptxas's 128 registers per thread, without spills and without serialized wgmma."""
    jobs = {name: _render(spec, block_m=64).source for name, spec in _specs(head_dim).items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        reps = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reps.items():
        print(f"v3 block_m=64 d={head_dim} {name:24s}: {rep.registers} regs, spill {rep.spill_stores}/"
              f"{rep.spill_loads} B")
        assert rep.registers <= 128, f"{name}: {rep.registers} registers > 128 (two CTAs of 256 threads)"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
        assert "C7520" not in rep.log and "C7508" not in rep.log, f"{name}\n{rep.log}"


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_warpgroup_walk():
    """With a mask and BLOCK_N < BLOCK_M each consumer warpgroup walks its own rows' run of the CTA's blocks (kWgWalk,
    v3_fwd.cuh): the range test behind a warp vote keeps the wgmma asynchronous (on the test alone ptxas serialized
    every wgmma, C7520), without spills; the default window tile (BLOCK_N = BLOCK_M) beside them."""
    cases = {"window 192x64": (presets.sliding_window(1024, 128), dict(block_m=192, block_n=64)),
             "window 128x64": (presets.sliding_window(1024, 128), dict(block_n=64)),
             "causal 192x64 persistent": (presets.causal(128), dict(block_m=192, block_n=64, persistent=True)),
             "document 192x96 d64": (_specs(64)["document"], dict(block_m=192, block_n=96)),
             "window 128x128": (presets.sliding_window(1024, 128), {})}
    jobs = {name: _render(spec, **opts).source for name, (spec, opts) in cases.items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        reps = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
        ptx = dict(zip(jobs, pool.map(ptx_sm90a, jobs.values())))
    for name, rep in reps.items():
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        assert "wgmma.mma_async.sync.aligned" in ptx[name] and "cp.async.bulk.tensor.4d" in ptx[name], name


def test_plan_says_when_warpgroups_walk_their_own_blocks():
    """The plan's reasons name the per-warpgroup walk exactly where the kernel takes it (v3_fwd.cuh kWgWalk: a mask,
    two or three consumer warpgroups, BLOCK_N < BLOCK_M)."""
    cuh = (ROOT / "templates/include/attncompiler/v3_fwd.cuh").read_text()
    assert "constexpr bool kWgWalk = Variant::kHasMask && NC >= 2 && BN < BM;" in cuh
    t = get_target("sm_90")
    for spec, opts, walks in ((presets.sliding_window(1024, 128), dict(block_m=192, block_n=64), True),
                              (presets.sliding_window(1024, 128), dict(block_n=64), True),
                              (presets.sliding_window(256, 160), {}, True),  # the band rule's BN 64
                              (presets.sliding_window(1024, 128), {}, False),  # BN = BM
                              (presets.sliding_window(256, 128), {}, False),  # BM 64: one warpgroup
                              (presets.plain(128), dict(block_m=192, block_n=64), False)):  # no mask
        plan = get_schedule("v3").make_plan(build_ir(spec), t, **opts)
        said = any("its own 64 rows" in r for r in plan.reasons)
        assert said == walks, (spec.name, opts, plan.block_m, plan.block_n, plan.consumers)
        assert said == (spec.mask_mod is not None and plan.consumers >= 2 and plan.block_n < plan.block_m)


def test_plan_late_pv_wait():
    """late_pv_wait is on by default in kernels with one softmax copy (a mask; ALiBi below d = 256) and no fixed
    offset from DV = 192 (ALiBi: 128), off below; forcing it reaches the kernel as a constexpr, every plan says why, and a
    non-bool is refused with what was expected."""
    from attncompiler.plan.v3 import LATE_PV_WAIT_MIN_DV

    assert LATE_PV_WAIT_MIN_DV == 192
    causal = build_ir(presets.causal(128))
    p = plan_v3(causal, "sm_90", softmax_copies=1)
    assert not p.late_pv_wait
    assert any("late_pv_wait off: DV = 128 < LATE_PV_WAIT_MIN_DV = 192" in r for r in p.reasons)
    p = plan_v3(build_ir(presets.causal(160)), "sm_90")
    assert p.softmax_copies == 1 and not p.late_pv_wait
    assert any("late_pv_wait off: DV = 160 < LATE_PV_WAIT_MIN_DV = 192" in r for r in p.reasons)
    assert plan_v3(build_ir(presets.causal(192)), "sm_90").late_pv_wait
    p = plan_v3(causal, "sm_90", late_pv_wait=True, softmax_copies=1)
    assert p.late_pv_wait and p.options["late_pv_wait"] is True
    assert any("below the softmax (late_pv_wait forced" in r for r in p.reasons)
    # two copies (the default for causal d = 128): forcing it changes nothing, and the plan says so
    p = plan_v3(causal, "sm_90", late_pv_wait=True)
    assert p.softmax_copies == 2 and any("without effect here" in r for r in p.reasons)
    for spec in (presets.causal(256), presets.sliding_window(1024, 256),
                 presets.plain(256, mask_mod=lambda b, h, q, kv: kv <= q + 2**30)):
        p = plan_v3(build_ir(spec), "sm_90")
        assert p.late_pv_wait, spec
        assert any("late_pv_wait: DV = 256 >= LATE_PV_WAIT_MIN_DV = 192" in r for r in p.reasons)
        assert not plan_v3(build_ir(spec), "sm_90", late_pv_wait=False).late_pv_wait
    # two softmax copies (no mask; ALiBi at d = 256) or a fixed offset (softcap): nothing to move, off by default
    for spec in (presets.plain(256), presets.alibi(presets.alibi_slopes(8), 256), presets.softcap(30.0, 256),
                 presets.softcap(30.0, 256, mask_mod=presets.causal_mask)):
        p = plan_v3(build_ir(spec), "sm_90")
        assert not p.late_pv_wait, spec
    # ALiBi (a separable score_mod, one softmax copy below d = 256): on from d = 128, measured flat at d = 64
    p = plan_v3(build_ir(presets.alibi(presets.alibi_slopes(16), 128)), "sm_90")
    assert p.late_pv_wait
    assert any("late_pv_wait: DV = 128 >= LATE_PV_WAIT_MIN_DV_SEPARABLE = 128" in r for r in p.reasons)
    assert not plan_v3(build_ir(presets.alibi(presets.alibi_slopes(32), 64)), "sm_90").late_pv_wait
    p = plan_v3(build_ir(presets.plain(256)), "sm_90", late_pv_wait=True)
    assert any("without effect here" in r for r in p.reasons)
    with pytest.raises(PlanError, match="expected late_pv_wait a bool, got 'yes'"):
        plan_v3(causal, "sm_90", late_pv_wait="yes")
    assert "static constexpr bool LATE_PV_WAIT = true;" in _render(presets.causal(128), late_pv_wait=True).source
    assert "static constexpr bool LATE_PV_WAIT = false;" in _render(presets.causal(128)).source
    assert "static constexpr bool LATE_PV_WAIT = true;" in _render(presets.causal(256)).source


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_nvcc_late_pv_wait(head_dim):
    """With late_pv_wait every preset and example compiles for sm_90a (nvcc and NVRTC) without spills or serialized
    wgmmas, as by default."""
    jobs = {name: _render(spec, late_pv_wait=True).source for name, spec in _specs(head_dim).items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        reps = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reps.items():
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        if name in ("plain", "causal", "alibi", "softcap", "sliding_window", "document"):
            assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
