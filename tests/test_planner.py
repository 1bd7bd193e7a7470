"""Tests for attncompiler.plan: targets, the v1 FA1 rule, the v2 tile search and IO reports."""
from __future__ import annotations

import math
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attncompiler.plan import (
    TARGETS, Candidate, PlanError, ProblemDims, TargetError, V1Plan, V2Plan, candidates_v2, detect_target,
    fa1_block_sizes, format_candidates, format_io_report, get_target, io_report, plan, plan_v1, plan_v2,
)
from attncompiler.plan.v1 import v1_smem_bytes
from attncompiler.plan.v2 import v2_register_estimate, v2_smem_bytes

ALL_TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
HEAD_DIMS = (32, 64, 96, 128, 192, 256)


# --- targets ---------------------------------------------------------------------------------------

def test_target_table_numbers() -> None:
    assert set(ALL_TARGETS) <= set(TARGETS)
    h100 = get_target("sm_90")
    assert (h100.sm_count, h100.smem_per_sm, h100.max_smem_per_block_optin) == (132, 233472, 232448)
    assert h100.nvrtc_arch == "sm_90a" and h100.supports_wgmma and h100.supports_tma
    a100 = get_target("sm_80")
    assert (a100.sm_count, a100.smem_per_sm, a100.max_smem_per_block_optin) == (108, 167936, 166912)
    assert not a100.supports_tma and a100.supports_cp_async
    for name in ("sm_86", "sm_89", "sm_120"):
        assert get_target(name).max_smem_per_block_optin == 101376
    for t in TARGETS.values():
        assert t.smem_per_sm - t.max_smem_per_block_optin == 1024  # the per-block reservation
        assert t.static_smem_per_block == 49152 and t.registers_per_sm == 65536
        assert t.max_registers_per_thread == 255 and t.warp_size == 32 and t.supports_cp_async
        assert t.describe().startswith(t.name)
    assert not get_target("sm_100").tested and not get_target("sm_120").tested


@pytest.mark.parametrize("alias", ["sm_90", "sm_90a", "SM_90A", "90", "9.0", "h100", "H100", "NVIDIA H100",
                                   "sm90", "compute_90"])
def test_get_target_aliases(alias: str) -> None:
    assert get_target(alias).name == "sm_90"


@pytest.mark.parametrize("alias,name", [("8.6", "sm_86"), ("a100", "sm_80"), ("RTX 4090", "sm_89"),
                                        ("100", "sm_100"), ("sm_100a", "sm_100"), ("12.0", "sm_120"),
                                        ("rtx-5090", "sm_120"), ("86", "sm_86")])
def test_get_target_more_aliases(alias: str, name: str) -> None:
    assert get_target(alias).name == name
    assert get_target(get_target(alias)) is get_target(alias)


@pytest.mark.parametrize("bad", ["sm_75", "7.5", "v100", "", "sm_9000"])
def test_get_target_error_lists_valid_names(bad: str) -> None:
    with pytest.raises(TargetError) as e:
        get_target(bad)
    msg = str(e.value)
    assert repr(bad) in msg
    for name in ALL_TARGETS:
        assert name in msg


def test_detect_target_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TargetError, match="no CUDA device"):
        detect_target()
    with pytest.raises(TargetError, match="no CUDA device"):
        plan(ProblemDims(128))  # target=None means "detect"


def _fake_device(monkeypatch: pytest.MonkeyPatch, **props: object) -> None:
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: types.SimpleNamespace(**props))


def test_detect_target_overrides_sm_count(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_device(monkeypatch, major=9, minor=0, name="NVIDIA H100 PCIe", multi_processor_count=114)
    t = detect_target()
    assert t.name == "sm_90" and t.sm_count == 114 and t.products[0] == "NVIDIA H100 PCIe"
    assert t.max_smem_per_block_optin == 232448 and t.nvrtc_arch == "sm_90a"


def test_detect_target_unknown_arch_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_device(monkeypatch, major=8, minor=7, name="Orin", multi_processor_count=16)
    with pytest.warns(UserWarning, match="sm_86"):
        t = detect_target()
    assert t.name == "sm_87" and t.nvrtc_arch == "sm_87" and t.sm_count == 16
    assert t.max_smem_per_block_optin == get_target("sm_86").max_smem_per_block_optin


def test_detect_target_too_old(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_device(monkeypatch, major=7, minor=5, name="Tesla T4", multi_processor_count=40)
    with pytest.raises(TargetError, match="sm_80"):
        detect_target()


# --- v1: the FA1 rule -----------------------------------------------------------------------------

@pytest.mark.parametrize("m,d,expected", [
    (116224, 128, (128, 227)),  # sm_90: 232448 B / 2
    (83456, 128, (128, 163)),   # sm_80: 166912 B / 2
    (50688, 64, (64, 198)),     # sm_86: 101376 B / 2
    (50688, 256, (50, 50)),
    (1000, 64, (4, 4)),
    (100, 3, (3, 9)),
])
def test_fa1_rule(m: int, d: int, expected: tuple[int, int]) -> None:
    b_r, b_c = fa1_block_sizes(m, d)
    assert (b_r, b_c) == expected
    assert b_c == math.ceil(m / (4 * d)) and b_r == min(b_c, d)


def test_v1_reasons_show_the_rule_with_numbers() -> None:
    p = plan_v1(ProblemDims(128), "sm_90")
    assert isinstance(p, V1Plan)
    assert (p.sram_budget_bytes, p.sram_budget_elems, p.fa1_block_r, p.fa1_block_c) == (232448, 116224, 128, 227)
    text = "\n".join(p.reasons)
    assert "M = 232448 B / 2 B = 116224 elements" in text
    assert "B_c = ceil(M / (4d)) = ceil(116224 / (4*128)) = 227" in text
    assert "B_r = min(ceil(M / (4d)), d) = min(227, 128) = 128" in text
    # FA1's sizes overflow (the fp32 S tile is extra): B_c shrinks 227 -> 224 -> 208 -> 192
    assert "265216 B > 232448 B" in text and "shrink B_c to 224" in text
    assert "shrink B_c to 208" in text and "shrink B_c to 192" in text
    assert (p.block_r, p.block_c) == (128, 192) and (p.block_m, p.block_n) == (128, 192)
    assert p.smem_bytes == v1_smem_bytes(128, 192, 128, 128) == 229376 <= 232448
    assert p.num_threads == 128 and p.num_warps == 4 and p.ctas_per_sm == 1
    assert "FA1 rule" in p.describe() and "232448" in p.describe()


def test_v1_given_budget_shrinks_step_by_step() -> None:
    p = plan_v1(ProblemDims(64), "sm_90", sram_budget=32768)
    assert (p.fa1_block_r, p.fa1_block_c) == (64, 64)
    assert (p.block_r, p.block_c) == (64, 48)
    text = "\n".join(p.reasons)
    assert "SRAM budget: 32768 B (given" in text
    assert "smem = 64*64*2 + 64*64*2 + 64*64*2 + 64*64*4 = 40960 B > 32768 B" in text
    assert "shrink B_c to 48" in text and "32768 B <= 32768 B: fits" in text


def test_v1_shrinks_block_r_after_block_c() -> None:
    # a budget beyond the hardware limit: FA1 asks for B_r = 256, B_c = 256 (capped), which even at
    # B_c = 16 overflows sm_86's 101376 B, so B_r shrinks next
    p = plan_v1(ProblemDims(256), "sm_86", sram_budget=1_000_000)
    assert (p.fa1_block_r, p.fa1_block_c) == (256, 489)
    text = "\n".join(p.reasons)
    assert "B_r=256, B_c=16: smem = 256*256*2 + 16*256*2 + 16*256*2 + 256*16*4 = 163840 B > 101376 B" in text
    assert "B_c is at its minimum, shrink B_r to 224" in text
    assert p.block_c == 16 and p.block_r == 128 and p.smem_bytes <= 101376


def test_v1_block_r_rounding_and_caps() -> None:
    p = plan_v1(ProblemDims(256), "sm_86")  # FA1: B_r = 50 -> 32 threads
    assert p.fa1_block_r == 50 and p.block_r == 32
    assert any("B_r = 50 -> 32" in r for r in p.reasons)
    p = plan_v1(ProblemDims(16), "sm_90")  # FA1: B_c = 1816 -> capped at 256
    assert p.fa1_block_c == 1816 and p.block_c == 256
    assert any("capped at 256" in r for r in p.reasons)


def test_v1_head_dim_must_be_multiple_of_8() -> None:
    with pytest.raises(PlanError, match="multiples of 8"):
        plan_v1(ProblemDims(100), "sm_90")


def test_v1_budget_above_limit_and_too_small() -> None:
    p = plan_v1(ProblemDims(128), "sm_86", sram_budget=232448)
    assert p.fa1_block_c == 227 and p.smem_bytes <= 101376
    assert any("exceeds the 101376 B per-block limit" in r for r in p.reasons)
    with pytest.raises(PlanError, match="no v1 tiling fits"):
        plan_v1(ProblemDims(128), "sm_90", sram_budget=16384)
    with pytest.raises(PlanError):
        plan_v1(ProblemDims(128), "sm_90", sram_budget=0)


@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 64).map(lambda x: 8 * x), dv=st.integers(1, 64).map(lambda x: 8 * x), budget=st.integers(20_000, 300_000),
       target=st.sampled_from(ALL_TARGETS))
def test_v1_plans_always_fit(d: int, dv: int, budget: int, target: str) -> None:
    t = get_target(target)
    try:
        p = plan_v1(ProblemDims(d, dv), t, sram_budget=budget)
    except PlanError as e:
        assert "no v1 tiling fits" in str(e)
        assert v1_smem_bytes(32, 16, d, dv) > min(budget, t.max_smem_per_block_optin)
        return
    assert p.smem_bytes == v1_smem_bytes(p.block_r, p.block_c, d, dv)
    assert p.smem_bytes <= min(budget, t.max_smem_per_block_optin)
    assert p.block_r % 32 == 0 and 32 <= p.block_r <= 1024 and 1 <= p.block_c <= 256


# --- v2: the tile search --------------------------------------------------------------------------

@pytest.mark.parametrize("target", ALL_TARGETS)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_v2_default_is_feasible(target: str, d: int) -> None:
    t = get_target(target)
    p = plan_v2(ProblemDims(d), target)
    assert isinstance(p, V2Plan)
    assert p.smem_bytes == v2_smem_bytes(p.block_m, p.block_n, d, d, stages=p.stages) <= t.max_smem_per_block_optin
    assert p.stages in (1, 2)
    assert p.est_registers_per_thread <= 255
    assert p.block_m == 16 * p.mt * p.num_warps and p.mt in (1, 2)
    assert p.num_threads == 32 * p.num_warps <= 1024 and p.ctas_per_sm >= 1
    r = v2_register_estimate(p.mt, p.block_n, d, d)
    assert p.est_registers_per_thread == r["o"] + r["s"] + r["overhead"] + (r["q"] if p.q_in_regs else 0)
    assert any(f"{p.smem_bytes} B" in x for x in p.reasons)


def test_v2_lead_defaults_on_sm_90() -> None:
    p = plan_v2(ProblemDims(128), "sm_90")
    assert (p.block_m, p.block_n, p.num_warps, p.mt, p.q_in_regs) == (128, 64, 4, 2, False)
    assert p.smem_bytes == (128 * 136 + p.stages * (64 * 136 + 64 * 136)) * 2  # 69632 B per K/V stage count 1
    assert p.est_registers_per_thread == 128 + 64 + 40
    text = "\n".join(p.reasons)
    assert "296 > 200" in text  # why Q stays in smem
    assert "registers ~296/thread > 255" in text  # why BLOCK_N=128 is out
    p = plan_v2(ProblemDims(64), "sm_90")
    assert (p.block_m, p.block_n, p.num_warps, p.mt) == (128, 128, 4, 2)
    p = plan_v2(ProblemDims(256), "sm_90")
    assert p.mt == 1 and p.block_n in (32, 64, 128) and p.num_warps in (4, 8)


def test_v2_sm_86_d256_rejects_big_tiles_with_numbers() -> None:
    cands = candidates_v2(ProblemDims(256), "sm_86")
    big = next(c for c in cands if (c.block_m, c.block_n, c.num_warps) == (128, 64, 8))
    assert not big.accepted
    assert "smem 135168 B > 101376 B per-block limit on sm_86" in big.reason
    p = plan_v2(ProblemDims(256), "sm_86")
    assert p.smem_bytes <= 101376
    assert any("135168 B > 101376 B" in r for r in p.reasons)


def test_v2_candidates_accepted_and_rejected() -> None:
    cands = candidates_v2(ProblemDims(128), "sm_90")
    # BLOCK_M {64, 128} x BLOCK_N {32, 64, 128} x warps {4, 8} x STAGES {1, 2}
    assert len(cands) == 24 and all(isinstance(c, Candidate) for c in cands)
    assert {c.stages for c in cands} == {1, 2}
    acc = [c for c in cands if c.accepted]
    rej = [c for c in cands if not c.accepted]
    assert acc and rej
    assert [c.rank for c in acc] == list(range(1, len(acc) + 1))
    assert acc[0].config == (128, 64, 4)
    assert all(c.reason for c in cands)
    assert all(c.reason.startswith("feasible") for c in acc)
    assert any("MT = 64 / (16*8) = 0.5" in c.reason for c in rej)
    assert any("registers ~" in c.reason and "> 255" in c.reason for c in rej)
    table = format_candidates(cands)
    assert len(table.splitlines()) == 25 and "BLOCK_M" in table and "stages" in table and "NO" in table


def test_v2_forced_config() -> None:
    p = plan_v2(ProblemDims(128), "sm_90", block_m=128, block_n=32, num_warps=4)
    assert (p.block_m, p.block_n, p.num_warps) == (128, 32, 4)
    assert any("forced by the caller" in r for r in p.reasons)
    with pytest.raises(PlanError, match=r"registers ~296/thread > 255"):
        plan_v2(ProblemDims(128), "sm_90", block_m=128, block_n=128, num_warps=4)
    with pytest.raises(PlanError, match=r"smem 135168 B > 101376 B per-block limit on sm_86"):
        plan_v2(ProblemDims(256), "sm_86", block_m=128, block_n=64, num_warps=8)
    with pytest.raises(PlanError, match=r"BLOCK_M=96 not in \{64, 128\}"):
        plan_v2(ProblemDims(128), "sm_90", block_m=96)
    with pytest.raises(PlanError, match=r"MT = 64 / \(16\*8\) = 0.5"):
        plan_v2(ProblemDims(64), "sm_90", block_m=64, num_warps=8)
    p = plan_v2(ProblemDims(64), "sm_90", block_n=64)  # partial forcing narrows the search
    assert p.block_n == 64


def test_v2_q_in_regs() -> None:
    p = plan_v2(ProblemDims(64), "sm_86")
    assert p.q_in_regs == (p.est_registers_per_thread <= 200)
    # forcing Q into registers rules out MT=2 at D=128 (128 + 32 + 40 + 64 = 264 > 255)
    p = plan_v2(ProblemDims(128), "sm_90", q_in_regs=True, block_n=32)
    assert p.q_in_regs and (p.block_m, p.num_warps, p.mt) == (128, 8, 1)
    assert p.est_registers_per_thread == 64 + 16 + 40 + 32
    assert any("registers ~264/thread > 255 with Q in registers" in r for r in p.reasons)
    with pytest.raises(PlanError, match="with Q in registers"):
        plan_v2(ProblemDims(128), "sm_90", q_in_regs=True, block_m=128, block_n=64, num_warps=4)


@pytest.mark.parametrize("d,dv", [(100, 100), (128, 272), (8, 8)])
def test_v2_bad_head_dims(d: int, dv: int) -> None:
    with pytest.raises(PlanError, match="multiple of 16"):
        plan_v2(ProblemDims(d, dv), "sm_90")
    assert not any(c.accepted for c in candidates_v2(ProblemDims(d, dv), "sm_90"))


def test_v2_different_value_dim() -> None:
    p = plan_v2(ProblemDims(64, 128), "sm_80")
    assert p.head_dim_v == 128
    assert p.smem_bytes == v2_smem_bytes(p.block_m, p.block_n, 64, 128)


# --- dispatch --------------------------------------------------------------------------------------

def test_plan_dispatch() -> None:
    p = plan(ProblemDims(128), "auto", target="sm_90")
    assert p.schedule == "v3" and p.reasons[0].startswith("schedule 'auto' on sm_90 -> v3")
    p = plan(ProblemDims(96), "auto", target="sm_90")
    assert p.schedule == "v3" and p.reasons[0].startswith("schedule 'auto' on sm_90 -> v3")
    p = plan(ProblemDims(128), "auto", target="sm_90", q_in_regs=True)  # a v2-only plan option
    assert p.schedule == "v2" and "expected v3 plan options" in p.reasons[0]
    assert plan(ProblemDims(128), "v1", target="h100").schedule == "v1"
    assert plan(ProblemDims(128), "v1", target="sm_90", sram_budget=65536).sram_budget_bytes == 65536
    assert plan(ProblemDims(128), "v2", target="sm_90", block_n=32).block_n == 32
    assert plan(ProblemDims(128), "v3", target="sm_90").schedule == "v3"
    with pytest.raises(PlanError, match=r"unknown schedule 'v9'; expected one of v1, v2, v3, auto"):
        plan(ProblemDims(128), "v9", target="sm_90")


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a", "h100", "gh200"])
@pytest.mark.parametrize("d,dv", [(64, 64), (128, 128), (256, 256), (192, 128), (128, 64), (96, 96), (32, 32),
                                  (128, 96), (80, 112)])
def test_auto_picks_v3_on_hopper(arch: str, d: int, dv: int) -> None:
    from attncompiler.plan import auto_schedule, choose_auto

    c = choose_auto(ProblemDims(d, dv), arch)
    assert c.schedule == "v3" and c.reason.startswith("schedule 'auto' on sm_90 -> v3: Hopper")
    assert f"D={d}, DV={dv}" in c.reason and auto_schedule(arch, ProblemDims(d, dv)) == "v3"
    assert plan(ProblemDims(d, dv), "auto", target=arch).reasons[0] == c.reason


@pytest.mark.parametrize("d,dv,why", [(40, 40, "got head_dim=40, head_dim_v=40"), (128, 72, "got head_dim_v=72"),
                                      (320, 320, "got head_dim=320")])
def test_auto_falls_back_to_v2_with_the_reason(d: int, dv: int, why: str) -> None:
    from attncompiler.plan import choose_auto

    c = choose_auto(ProblemDims(d, dv), "sm_90")
    assert c.schedule == "v2" and c.reason.startswith("schedule 'auto' on sm_90 -> v2: v3 needs head dims that are "
                                                      "multiples of 16 and <= 256") and why in c.reason
    with pytest.raises(PlanError, match="multiple of 16"):  # v2 cannot either: its own reason follows
        plan(ProblemDims(d, dv), "auto", target="sm_90")


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_100", "sm_120"])
def test_auto_is_v2_off_hopper(arch: str) -> None:
    from attncompiler.plan import auto_schedule, choose_auto

    c = choose_auto(ProblemDims(128), arch)
    assert c.schedule == "v2" and f"v3 needs sm_90a (TMA, wgmma, setmaxnreg), got {arch}" in c.reason
    assert auto_schedule(arch) == "v2" and auto_schedule(arch, ProblemDims(128)) == "v2"
    assert plan(ProblemDims(128), "auto", target=arch).schedule == "v2"


def test_auto_with_plan_options() -> None:
    from attncompiler.plan import choose_auto

    # options v3 takes (and accepts) keep v3; v2-only options or ones v3 refuses pick v2, saying why
    assert choose_auto(ProblemDims(128), "sm_90", block_n=64, stages=2, persistent=True).schedule == "v3"
    c = choose_auto(ProblemDims(128), "sm_90", q_in_regs=True, num_warps=4)
    assert c.schedule == "v2" and "expected v3 plan options (block_n, stages, persistent), got q_in_regs" in c.reason
    c = choose_auto(ProblemDims(128), "sm_90", block_m=32)
    assert c.schedule == "v2" and "expected block_m in (64, 128, 192)" in c.reason
    assert choose_auto(ProblemDims(128), "sm_90", block_m=64).schedule == "v3"  # one consumer, two CTAs per SM
    assert choose_auto(ProblemDims(64), "sm_90", block_m=192).schedule == "v3"
    c = choose_auto(ProblemDims(256), "sm_90", block_n=256)
    assert c.schedule == "v2" and "registers per consumer thread > 240" in c.reason
    assert plan(ProblemDims(128), "auto", target="sm_90", block_n=64).block_n == 64


def test_plan_accepts_ir_like_objects() -> None:
    ir = types.SimpleNamespace(head_dim=64, head_dim_v=64, dtype="fp16")
    p = plan(ir, target="sm_80")
    assert (p.head_dim, p.dtype) == (64, "fp16")
    with pytest.raises(PlanError):
        plan(object(), target="sm_80")
    with pytest.raises(PlanError):
        ProblemDims(64, dtype="fp32")
    assert ProblemDims(64).head_dim_v == 64


def test_plan_from_attention_ir() -> None:
    from attncompiler.ir.types import AttentionIR
    ir = AttentionIR(head_dim=128, head_dim_v=128, dtype="bf16", scale=128 ** -0.5, score_expr=None,
                     mask_expr=None, dropout_p=0.0)
    assert plan_v2(ir, "sm_90").block_n == 64


# --- IO report -------------------------------------------------------------------------------------

def test_io_report_v2_hand_computed() -> None:
    p = plan_v2(ProblemDims(64), "sm_90")  # BLOCK_M = BLOCK_N = 128
    r = io_report(p, 1, 2, 256, 512)
    # per head: Q 256*64*2, O 256*64*2, K+V Tr=2 passes of 512*(64+64)*2
    assert r.schedule_bytes == 2 * (256 * 64 * 2 + 256 * 64 * 2 + 2 * 512 * 128 * 2) == 655360
    assert r.standard_bytes == 2 * ((256 * 64 + 512 * 64 + 512 * 64) * 2 + 4 * 256 * 512 * 2 + 256 * 64 * 2)
    assert r.standard_bytes == 2490368
    assert r.flops == 4 * 1 * 2 * 256 * 512 * 64 == 67108864
    assert r.schedule_intensity == pytest.approx(67108864 / 655360)
    rc = io_report(p, 1, 2, 256, 512, causal=True)
    assert rc.flops == 67108864 // 2
    # bottom-right causal: block 0 sees keys 0..383 (384 rows), block 1 sees all 512
    kv = next(b for label, b in rc.schedule_terms if label.startswith("K, V"))
    assert kv == 2 * (384 + 512) * 128 * 2
    text = format_io_report(r)
    assert "655360 B" in text and "2490368 B" in text and "standard attention" in text
    assert "FLOP / byte" in text and "roofline" in text and "causal=False" in text
    assert "causal=True" in format_io_report(rc)
    # a mask expression (the CLI passes the IR's) counts its non-empty tiles, and the header says so
    from attncompiler.ir import build_ir
    from attncompiler.spec import presets
    rm = io_report(p, 1, 2, 256, 512, mask=build_ir(presets.sliding_window(128, 64)).mask_expr)
    assert rm.masked and not r.masked and not rc.masked and rm.flops < r.flops
    tm = format_io_report(rm)
    assert "mask: the tiles its classifier leaves non-empty" in tm and "causal=" not in tm


def test_io_report_v1_hand_computed() -> None:
    p = plan_v1(ProblemDims(64), "sm_90", sram_budget=32768)  # B_c = 48
    r = io_report(p, 1, 1, 256, 256)
    tc = 6  # ceil(256 / 48)
    expected = (256 * 66 * 4              # workspace init: O, l, m
                + 256 * 128 * 2           # K, V once
                + tc * 256 * 64 * 2       # Q_i per pass
                + tc * 256 * 64 * 4 * 2   # O_i fp32 read + write per pass
                + tc * 2 * 256 * 4 * 2    # l_i, m_i
                + 256 * 64 * (4 + 2))     # final pass: read fp32 O, write bf16 O
    assert r.schedule_bytes == expected == 1105920 + 256 * 66 * 4 + 256 * 64 * 4
    # causal, Nq = Nk = 256, B_r = 64, B_c = 48: query block i (rows 64i..64i+63) sees K/V blocks
    # j <= (64i + 63) // 48, i.e. 2, 3, 4, 6 of the 6 blocks
    rc = io_report(p, 1, 1, 256, 256, causal=True)
    q_term = next(b for label, b in rc.schedule_terms if label.startswith("Q_i"))
    assert q_term == 64 * (2 + 3 + 4 + 6) * 64 * 2
    assert "Theta(N^2 d^2 / M)" in r.schedule_order
    assert "v1 (FA1)" in format_io_report(r)


def test_io_report_validates_sizes() -> None:
    p = plan_v2(ProblemDims(64), "sm_90")
    with pytest.raises(PlanError):
        io_report(p, 0, 1, 16, 16)


# --- the sympy resource model ----------------------------------------------------------------------

def test_resource_model_is_sympy_and_exact() -> None:
    import sympy

    from attncompiler.plan import resources as R
    for expr in (R.V2_SMEM_BYTES, R.V2_REGISTERS, R.V1_SMEM_BYTES, R.FLOPS, *(e for _, e in R.V2_HBM_TERMS)):
        assert isinstance(expr, sympy.Expr) and expr.free_symbols
    assert {s.name for s in R.V2_SMEM_BYTES.free_symbols} == {"BLOCK_M", "BLOCK_N", "D", "DV", "STAGES", "ELEM_BYTES"}
    vals = dict(BLOCK_M=128, BLOCK_N=64, D=128, DV=128, WARPS=4, STAGES=1, ELEM_BYTES=2)
    assert R.evaluate(R.V2_SMEM_BYTES, vals) == 69632 and isinstance(R.evaluate(R.V2_SMEM_BYTES, vals), int)
    assert R.evaluate(R.MT, vals) == 2 and R.evaluate(R.MT, BLOCK_M=64, WARPS=8) == 0.5
    assert R.evaluate(R.V2_SMEM_BYTES, {**vals, "STAGES": 2}) == (128 * 136 + 2 * 64 * 272) * 2
    # Q rows are padded to max(D, DV) + 8: the Q buffer also stages O
    assert R.evaluate(R.V2_SMEM_BYTES, {**vals, "D": 64, "DV": 128}) == (128 * 136 + 64 * (72 + 136)) * 2
    assert R.evaluate(R.V2_KV_ROWS_DENSE, NQ=1000, BLOCK_M=128, NK=7) == 8 * 7
    with pytest.raises(R.ModelError, match="expected values for BLOCK_N"):
        R.evaluate(R.V2_SMEM_BYTES, BLOCK_M=1, D=1, DV=1, STAGES=1, ELEM_BYTES=2)
    smem = next(c for c in R.Constraint.__mro__ if c is R.Constraint)
    chk = smem("smem", R.V2_SMEM_BYTES, limit=R.SMEM_LIMIT).check({**vals, "SMEM_LIMIT": 65536})
    assert not chk.ok and chk.value == 69632 and chk.bound == 65536 and "69632 > 65536" in chk.describe()
    with pytest.raises(R.ModelError):
        R.Constraint("bad", R.D)


def test_v2_smem_uses_max_head_dim_for_q_rows() -> None:
    p = plan_v2(ProblemDims(64, 128), "sm_90")
    q_rows = max(64, 128) + 8
    assert p.smem_bytes == (p.block_m * q_rows + p.stages * p.block_n * (72 + 136)) * 2
    p = plan_v2(ProblemDims(128, 64), "sm_90")
    assert p.smem_bytes == (p.block_m * 136 + p.stages * p.block_n * (136 + 72)) * 2
    assert any("max(D, DV)+8" in r for r in p.reasons)


def test_v2_stages_knob() -> None:
    from attncompiler.plan.v2 import RANK_KEYS
    p1 = plan_v2(ProblemDims(128), "sm_90", stages=1)
    assert p1.stages == 1 and p1.smem_bytes == 69632
    assert any("stages" in k for k in RANK_KEYS)  # STAGES only breaks ties (same occupancy)
    d = plan_v2(ProblemDims(128), "sm_90")
    assert (d.block_m, d.block_n, d.num_warps) == (p1.block_m, p1.block_n, p1.num_warps)
    p2 = plan_v2(ProblemDims(128), "sm_90", stages=2)
    assert p2.stages == 2 and p2.smem_bytes == v2_smem_bytes(p2.block_m, p2.block_n, 128, 128, stages=2)
    assert p2.smem_bytes == (128 * 136 + 2 * 64 * 272) * 2 and "STAGES=2" in p2.describe()
    assert p2.options == {"block_m": 128, "block_n": 64, "num_warps": 4, "q_in_regs": False, "stages": 2,
                          "score_skip": False}
    with pytest.raises(PlanError, match=r"stages=3 not in \{1, 2\}"):
        plan_v2(ProblemDims(128), "sm_90", stages=3)
    # d = 256 on sm_86: two K/V stages do not fit where one does
    c = candidates_v2(ProblemDims(256), "sm_86", block_m=64, block_n=64, num_warps=4, stages=2)[0]
    assert not c.accepted and "per-block limit on sm_86" in c.reason
    assert candidates_v2(ProblemDims(256), "sm_86", block_m=64, block_n=64, num_warps=4, stages=1)[0].accepted


def _ir(spec):
    from attncompiler.ir.build import build_ir
    return build_ir(spec)


def test_v2_variant_registers_pick_a_narrower_block_n() -> None:
    import attncompiler as ac
    from attncompiler.plan.resources import variant_features
    from attncompiler.spec import presets

    plain = plan_v2(_ir(presets.plain(64)), "sm_90")
    assert (plain.block_m, plain.block_n, plain.num_warps) == (128, 128, 4)
    assert plain.est_registers_per_thread == 64 + 128 + 40
    for spec in (ac.AttentionSpec(head_dim=64, dropout_p=0.1), presets.alibi(presets.alibi_slopes(4), 64),
                 presets.softcap(30.0, 64), presets.document(presets.document_ids(256), 64)):
        ir = _ir(spec)
        assert variant_features(ir).costly
        p = plan_v2(ir, "sm_90")
        assert (p.block_m, p.block_n, p.num_warps) == (128, 64, 4), spec.name
        assert p.est_registers_per_thread == 64 + 64 + 40 + 16  # + MT*(BLOCK_N/8) for the variant
        text = "\n".join(p.reasons)
        assert "MT*(BLOCK_N/8) = 16" in text
        assert "a plain variant would use BLOCK_M=128, BLOCK_N=128, 4 warps" in text
        assert "registers ~264/thread > 255 (O 64 + S 128 + overhead 40 + variant 32)" in text
    # masks on indices only cost nothing: causal keeps the plain tiles
    assert not variant_features(_ir(presets.causal(64))).costly
    assert plan_v2(_ir(presets.causal(64)), "sm_90").block_n == 128
    # at d = 128 the variant term (16) still fits the default tiles
    p = plan_v2(_ir(ac.AttentionSpec(head_dim=128, dropout_p=0.1)), "sm_90")
    assert (p.block_m, p.block_n, p.num_warps, p.est_registers_per_thread) == (128, 64, 4, 248)
    r = v2_register_estimate(2, 128, 64, 64, variant_features(_ir(presets.softcap(30.0, 64))))
    assert r["variant"] == 32 and r["o"] == 64 and r["s"] == 128


def test_io_report_comes_from_the_model() -> None:
    from attncompiler.plan import resources as R
    p = plan_v2(ProblemDims(64), "sm_90")
    r = io_report(p, 2, 3, 300, 500)
    vals = dict(BATCH=2, HEADS=3, NQ=300, NK=500, D=64, DV=64, ELEM_BYTES=2, BLOCK_M=p.block_m)
    kv_rows = R.evaluate(R.V2_KV_ROWS_DENSE, vals)
    assert r.schedule_bytes == sum(R.evaluate(e, {**vals, "KV_ROWS": kv_rows}) for _, e in R.V2_HBM_TERMS)
    assert r.standard_bytes == sum(R.evaluate(e, vals) for _, e in R.STANDARD_HBM_TERMS)
    assert r.flops == R.evaluate(R.FLOPS, vals)


@pytest.mark.nvcc
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("d,dv,stages", [(64, 128, 1), (128, 64, 1), (128, 128, 2), (64, 128, 2)])
def test_nvcc_planner_smem_matches_kernel_layout(d: int, dv: int, stages: int) -> None:
    """The template static_asserts V2Layout::kSmemBytes == the planner's smem: nvcc checks it."""
    from attncompiler.codegen.hooks import render_prelude
    from attncompiler.codegen.render import render_source
    from attncompiler.runtime.compiler import compile_with_nvcc
    from attncompiler.spec import presets

    ir = _ir(presets.causal(d, head_dim_v=dv))
    p = plan_v2(ir, "sm_90", stages=stages)
    src = render_source("v2_fwd.cu.j2", name="t", prelude=render_prelude(ir), plan_text="", head_dim=d,
                        head_dim_v=dv, block_m=p.block_m, block_n=p.block_n, num_warps=p.num_warps,
                        q_in_regs=p.q_in_regs, min_ctas=1, smem_bytes=p.smem_bytes, stages=p.stages)
    assert compile_with_nvcc(src, "sm_90a").registers > 0


@pytest.mark.nvcc
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("d", [64, 128, 256])
def test_nvcc_default_plans_do_not_spill(d: int) -> None:
    """Calibration guard for the register model: the planner's choice for each variant compiles
    with at most 128 B of spill stores (ptxas -v; the model aims at 64 B, softcap at d = 128 is a
    known 84 B miss).  A kernel change that breaks this needs the model in
    attncompiler/plan/resources.py recalibrated."""
    import attncompiler as ac
    from attncompiler.codegen.schedule import get_schedule
    from attncompiler.runtime.compiler import compile_with_nvcc
    from attncompiler.spec import presets

    specs = [presets.plain(d), presets.causal(d), presets.alibi(presets.alibi_slopes(8), d), presets.softcap(30.0, d),
             presets.document(presets.document_ids(256), d), ac.AttentionSpec(head_dim=d, dropout_p=0.1, causal=True)]
    sched, t = get_schedule("v2"), get_target("sm_90")
    for spec in specs:
        ir = _ir(spec)
        p = plan_v2(ir, t)
        rep = compile_with_nvcc(sched.render(ir, p, t).source, "sm_90a")
        print(f"d={d} {spec.name}: {p.block_m}x{p.block_n} w{p.num_warps} est {p.est_registers_per_thread} -> "
              f"{rep.registers} regs, {rep.spill_stores} B spill")
        assert rep.spill_stores <= 128, f"{spec.name} d={d}: {rep.spill_stores} B spill stores"


# --- the CLI ----------------------------------------------------------------------------------------

def test_cli_plan_all_lists_candidates_model_and_io(capsys: pytest.CaptureFixture) -> None:
    from attncompiler.cli import main
    assert main(["plan", "causal", "--schedule", "v2", "--arch", "sm_90", "--all", "--shape", "1,16,4096"]) == 0
    out = capsys.readouterr().out
    assert "v2 plan for sm_90" in out and "HBM IO: v2 (FA2 forward) plan on sm_90; B=1 H=16 Nq=4096" in out
    assert "resource model (v2" in out and "smem: ELEM_BYTES*(BLOCK_M*(Max(D, DV) + 8)" in out
    assert "rank  BLOCK_M  BLOCK_N  warps  stages" in out and " NO  " in out and " yes  feasible" in out
    assert "non-empty" in out  # the causal tiles the kernel skips are skipped in the IO report too


def test_cli_plan_ptxas_reports_registers_and_spills(capsys: pytest.CaptureFixture) -> None:
    """``plan --ptxas``: the forward kernel through NVRTC (no GPU), ptxas's registers and spills in one line."""
    from attncompiler.cli import main
    from attncompiler.runtime.compiler import nvrtc_unavailable

    assert main(["plan", "causal", "--schedule", "v2", "--arch", "sm_80", "--head-dim", "64", "--ptxas"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    if nvrtc_unavailable() is not None:
        assert line.startswith("machine code: not compiled (NVRTC does not load")
        return
    assert line.startswith("machine code (ptxas through NVRTC, sm_80): ") and " registers per thread, " in line
    regs = int(line.split("sm_80): ")[1].split()[0])
    assert 32 <= regs <= 255 and ("no spills" in line or "B stores" in line)


def test_cli_plan_and_show_explain_the_auto_choice(capsys: pytest.CaptureFixture) -> None:
    from attncompiler.cli import main
    assert main(["plan", "causal", "--arch", "sm_90", "--all", "--shape", "1,16,4096"]) == 0
    out = capsys.readouterr().out
    assert "v3 plan for sm_90" in out and "1. schedule 'auto' on sm_90 -> v3: Hopper" in out
    assert "HBM IO: v3 plan on sm_90" in out and "v3 candidates on sm_90" in out
    # the candidates table names the options a row changes beside its tile, stages and grid
    assert "other options" in out and "softmax_copies=1" in out and "half_blocks=True" in out
    assert main(["plan", "causal", "--arch", "sm_90", "--head-dim", "96"]) == 0
    out = capsys.readouterr().out
    assert "v3 plan for sm_90" in out and "smem rows padded to 128 / 128 columns" in out
    assert main(["plan", "causal", "--arch", "sm_80"]) == 0
    assert "1. schedule 'auto' on sm_80 -> v2: v3 needs sm_90a" in capsys.readouterr().out
    assert main(["show", "causal", "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    assert "-- schedule v3" in out and "//    1. schedule 'auto' on sm_90 -> v3" in out
    assert main(["show", "causal", "--arch", "sm_90a", "--head-dim", "96"]) == 0
    out = capsys.readouterr().out
    assert "-- schedule v3" in out and "static constexpr int D = 96;" in out
    assert main(["show", "causal", "--arch", "sm_90a", "--option", "q_in_regs=true"]) == 0
    out = capsys.readouterr().out
    assert "-- schedule v2" in out and "//    1. schedule 'auto' on sm_90 -> v2: expected v3 plan options" in out


def test_cli_plan_sram_budget(capsys: pytest.CaptureFixture) -> None:
    from attncompiler.cli import main
    assert main(["plan", "causal", "--arch", "sm_90", "--head-dim", "64", "--sram-budget", "32768"]) == 0
    cap = capsys.readouterr()
    assert "v1 schedule is planned" in cap.err
    assert "SRAM budget: 32768 B (given" in cap.out and "shrink B_c to 48" in cap.out and "HBM IO: v1 (FA1)" in cap.out
    assert main(["plan", "causal", "--schedule", "v2", "--sram-budget", "32768"]) == 2
    assert "expected --schedule v1" in capsys.readouterr().err


def test_cli_tune_needs_a_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import torch

    from attncompiler.cli import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["tune", "causal", "--shape", "1,4,1024,64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert main(["tune", "causal", "--shape", "1,4,1024"]) == 2
    assert "expected B,H,N,D" in capsys.readouterr().err


def test_plan_option_names_match_the_planners():
    """check_plan_options reads each planner's signature; V3_OPTIONS (the "auto" choice's refusal of foreign v3
    options, in its own order) must name the same set."""
    from attncompiler.plan.planner import plan_option_names
    from attncompiler.plan.v3 import V3_OPTIONS

    assert set(plan_option_names("v3")) == set(V3_OPTIONS)
    assert plan_option_names("v1") == ("sram_budget",)
    assert "score_skip" in plan_option_names("v2") and plan_option_names("decode") == ()
