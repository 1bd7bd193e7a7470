"""CPU: the decode planner (stages, split choice and its reasons, the auto-pick rule), rendering, and an
nvcc compile of both decode kernels for sm_80 and sm_90a."""
from __future__ import annotations

import shutil

import pytest

import attncompiler as ac
from attncompiler.codegen.schedule import get_schedule, schedule_names
from attncompiler.ir.build import build_ir
from attncompiler.plan import decode as pd
from attncompiler.plan.model import PlanError, ProblemDims
from attncompiler.plan.targets import get_target
from attncompiler.runtime import decode as rt
from attncompiler.runtime.compiler import compile_with_nvcc
from attncompiler.runtime.launch import AttnInputs
from attncompiler.spec import presets


def test_registered():
    assert "decode" in schedule_names()
    assert get_schedule("decode").name == "decode"


@pytest.mark.parametrize("arch,d,stages,ctas", [("sm_90", 128, 3, 2), ("sm_80", 128, 2, 2), ("sm_90", 64, 4, 3),
                                                ("sm_90", 256, 2, 1), ("sm_86", 256, 2, 1)])
def test_stages_fill_two_ctas(arch, d, stages, ctas):
    t = get_target(arch)
    p = pd.plan_decode(ProblemDims(d), t)
    assert (p.stages, p.ctas_per_sm) == (stages, ctas), p.describe()
    assert p.smem_bytes == pd.decode_smem_bytes(d, d, p.block_n, p.stages) <= t.max_smem_per_block_optin
    assert p.block_n == 16 * p.num_warps and p.block_m == pd.DECODE_ROWS
    assert any("stages" in r for r in p.reasons)


def test_plan_errors():
    with pytest.raises(PlanError, match="multiple of 16"):
        pd.plan_decode(ProblemDims(72), "sm_90")
    with pytest.raises(PlanError, match="stages"):
        pd.plan_decode(ProblemDims(128), "sm_90", stages=9)
    with pytest.raises(PlanError, match="num_warps"):
        pd.plan_decode(ProblemDims(128), "sm_90", num_warps=3)
    with pytest.raises(PlanError, match="needs"):
        pd.plan_decode(ProblemDims(256), "sm_86", stages=4)


def _choice(B, H, H_kv, Nq, Nk, arch="sm_90", **kw):
    plan = pd.plan_decode(ProblemDims(128), arch)
    return pd.choose_splits(plan, B=B, H=H, H_kv=H_kv, Nq=Nq, Nk=Nk, **kw), plan


def test_split_choice_fills_the_gpu():
    c, plan = _choice(1, 32, 8, 1, 32768)
    slots = plan.sm_count * plan.ctas_per_sm
    assert c.row_blocks == 1 and c.num_splits > 16
    assert c.ctas <= slots and c.ctas >= 0.85 * slots, c.reasons
    assert c.tiles_per_split * c.num_splits >= c.tiles > c.tiles_per_split * (c.num_splits - 1)
    assert "combine" in c.reasons[-1]


def test_split_choice_no_split_when_heads_fill_the_gpu():
    c, _ = _choice(8, 32, 32, 1, 131072)
    assert c.num_splits == 1 and "directly" in c.reasons[-1]


def test_split_choice_short_kv_and_rows():
    c, _ = _choice(2, 4, 4, 3, 113)  # 2 tiles: fewer than DECODE_MIN_TILES_PER_SPLIT per split -> 1
    assert c.num_splits == 1
    c, _ = _choice(1, 32, 1, 16, 4099)  # MQA: 32 heads x 16 queries = 512 rows = 32 row blocks
    assert c.row_blocks == 32
    c, _ = _choice(1, 32, 8, 1, 10**6)
    assert c.num_splits <= pd.DECODE_MAX_SPLITS
    c, _ = _choice(1, 8, 8, 1, 4096, num_splits=7)
    assert c.num_splits == 7 and "requested" in c.reasons[1]
    with pytest.raises(PlanError):
        _choice(1, 8, 8, 1, 4096, num_splits=0)


def test_workspace_floats():
    c, plan = _choice(1, 32, 8, 2, 32768)
    dims = AttnInputs(1, 32, 8, 2, 32768, 128, 128)
    assert rt.workspace_floats(c, dims) == c.num_splits * 32 * 2 * 129
    c1, _ = _choice(8, 32, 32, 1, 131072)
    assert rt.workspace_floats(c1, AttnInputs(8, 32, 32, 1, 131072, 128, 128)) == 0


def test_decode_applies_rule():
    ir = build_ir(presets.causal(128))
    assert pd.decode_applies(ir, 1, 32768)[0]
    assert pd.decode_applies(ir, 16, pd.DECODE_MIN_KV)[0]
    ok, why = pd.decode_applies(ir, 17, 32768)
    assert not ok and "Nq=17" in why
    ok, why = pd.decode_applies(ir, 1, pd.DECODE_MIN_KV - 1)
    assert not ok and "Nk" in why


def test_auto_compile_flags_decode():
    spec = presets.causal(128)
    auto = ac.compile(spec, target="sm_90")
    v2 = ac.compile(spec, "v2", target="sm_90")
    assert auto.auto_decode and not v2.auto_decode
    dec = auto._decode_kernel(AttnInputs(1, 32, 8, 1, 32768, 128, 128))
    assert dec is not None and dec.schedule == "decode" and dec.target == auto.target
    assert auto._decode_kernel(AttnInputs(1, 32, 8, 64, 32768, 128, 128)) is None
    assert auto._decode_kernel(AttnInputs(1, 32, 8, 1, 100, 128, 128)) is None


def _render(spec, arch="sm_90"):
    sched = get_schedule("decode")
    t = get_target(arch)
    ir = build_ir(spec)
    return sched.render(ir, sched.make_plan(ir, t), t)


def test_render_has_both_entries():
    ks = _render(presets.alibi(presets.alibi_slopes(8), 128))
    assert "struct DecodeParams" in ks.source and "attn_decode_combine" in ks.source
    assert ks.entry == "attn_fwd" and ks.schedule == "decode"
    assert "static_assert(ac::DecodeLayout<DecodeConfig>::kSmemBytes" in ks.source


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvcc_decode_kernels(arch):
    for spec in (presets.causal(128), ac.AttentionSpec(head_dim=64, dropout_p=0.1, name="dropout"),
                 presets.softcap(30.0, 256)):
        rep = compile_with_nvcc(_render(spec, arch.rstrip("a")).source, arch)
        assert "attn_decode_combine" in rep.log and "attn_fwd" in rep.log
        assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.log
        # the split kernel's launch bounds: 2 CTAs of 128 threads fit the register file at d <= 128
        assert rep.registers <= 255


def test_cli_plan_decode(capsys):
    from attncompiler.cli import main

    assert main(["plan", "causal", "--schedule", "decode", "--arch", "sm_90", "--shape", "1,32,32768"]) == 0
    out = capsys.readouterr().out
    assert "decode plan for sm_90" in out and "split choice for B=1" in out
