"""The v3 main loop's layout options (plan/v3_softmax.py): ``softmax_copies`` (one or two copies of the softmax)
and ``half_blocks`` (a block's GEMMs over the half of its keys a consumer warpgroup's rows can see). CPU only:
plans, reasons, refusals, rendering, and nvcc / NVRTC builds for sm_90a; the GPU runs are tests/test_gpu_v3_layout.py.
"""
from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError
from attncompiler.plan.v3 import plan_v3
from attncompiler.runtime.compiler import compile_with_nvcc
from attncompiler.spec import presets

from test_v3_codegen import _render, _specs

#: masked presets (and a bounded score_mod under a mask) whose tiles have EMPTY halves to skip
MASKED = {"causal": lambda d: presets.causal(d), "sliding_window": lambda d: presets.sliding_window(1024, d),
          "prefix_lm": lambda d: presets.prefix_lm(256, d), "alibi_causal": lambda d: presets.alibi(
              presets.alibi_slopes(4), d, causal=True),
          "softcap_causal": lambda d: presets.softcap(30.0, d, mask_mod=presets.causal_mask)}


def test_plan_softmax_copies():
    """softmax_copies: two copies for masks at BLOCK_N <= 128 and DV <= 128 without a separable score_mod or a fixed
    offset, one elsewhere with a mask; unmasked kernels as the template had it (one for ALiBi below d = 256); forced
    values reach the kernel; the reasons say which and why; anything but 1 or 2 is refused."""
    from attncompiler.plan.v3_softmax import MASK_TWO_COPIES_MAX_BN, MASK_TWO_COPIES_MAX_DV

    assert (MASK_TWO_COPIES_MAX_BN, MASK_TWO_COPIES_MAX_DV) == (128, 128)
    cases = [(presets.causal(128), 2, "BLOCK_N 128 <= MASK_TWO_COPIES_MAX_BN"),
             (presets.sliding_window(1024, 128), 2, "a mask, BLOCK_N 128"),
             (presets.sliding_window(1024, 64), 2, "a mask, BLOCK_N"),
             (presets.causal(64), 1, "BLOCK_N 192 > MASK_TWO_COPIES_MAX_BN = 128"),
             (presets.causal(256), 1, "DV 256 > MASK_TWO_COPIES_MAX_DV = 128"),
             (presets.alibi(presets.alibi_slopes(8), 128, causal=True), 1, "(a separable score_mod)"),
             (presets.softcap(30.0, 128, mask_mod=presets.causal_mask), 1, "(a fixed row offset)"),
             (presets.plain(128), 2, "the ragged last block"),
             (presets.softcap(30.0, 128), 2, "the ragged last block"),
             (presets.alibi(presets.alibi_slopes(8), 128), 1, "DV 128 < SEPARABLE_TWO_COPIES_MIN_DV = 256"),
             (presets.alibi(presets.alibi_slopes(8), 256), 2, "the ragged last block")]
    for spec, copies, why in cases:
        p = plan_v3(build_ir(spec), "sm_90")
        assert p.softmax_copies == copies, (spec.name, spec.head_dim, p.block_n)
        assert any(why in r for r in p.reasons), (spec.name, spec.head_dim, p.reasons)
        assert p.options["softmax_copies"] == copies
        other = plan_v3(build_ir(spec), "sm_90", softmax_copies=3 - copies)
        assert other.softmax_copies == 3 - copies and any("(forced)" in r for r in other.reasons)
        assert f"static constexpr int SOFTMAX_COPIES = {3 - copies};" in _render(spec, softmax_copies=3 - copies).source
        assert f"static constexpr int SOFTMAX_COPIES = {copies};" in _render(spec).source
    for bad in (0, 3, True, "2", 2.0):
        with pytest.raises(PlanError, match=f"expected softmax_copies 1 or 2, got {bad!r}"):
            plan_v3(build_ir(presets.causal(128)), "sm_90", softmax_copies=bad)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_nvcc_softmax_copies(head_dim):
    """Every preset and example also compiles for sm_90a with the other number of softmax copies (nvcc and NVRTC)
    without serialized wgmmas, and the main presets without spills."""
    specs = _specs(head_dim)
    jobs = {}
    for name, spec in specs.items():
        copies = plan_v3(build_ir(spec), "sm_90").softmax_copies
        jobs[name] = _render(spec, softmax_copies=3 - copies).source
    with ThreadPoolExecutor(max_workers=2) as pool:
        reps = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reps.items():
        assert "C7520" not in rep.log, f"{name}: ptxas serialized the wgmma instructions"
        if name in ("plain", "causal", "sliding_window", "document"):
            assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"


def test_plan_half_blocks():
    """half_blocks: off by default; forced on with a mask and BLOCK_N a multiple of 32 it reaches the kernel (the
    half-width wgmma of BLOCK_N / 2 columns) and the reasons; refused without a mask, at BLOCK_N not a multiple of 32
    and for anything but a bool, each with what was expected and what was got."""
    for name, make in MASKED.items():
        for d in (64, 128):
            ir = build_ir(make(d))
            assert not plan_v3(ir, "sm_90").half_blocks
            p = plan_v3(ir, "sm_90", half_blocks=True)
            assert p.half_blocks and p.options["half_blocks"] is True and p.block_n % 32 == 0, (name, d, p.block_n)
            assert any(f"low or high {p.block_n // 2} keys are EMPTY" in r for r in p.reasons)
    src = _render(presets.sliding_window(1024, 128), half_blocks=True).source
    assert "static constexpr bool HALF_BLOCKS = true;" in src
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in src  # S of one half: n = 128 / 2
    assert "static constexpr bool HALF_BLOCKS = false;" in _render(presets.sliding_window(1024, 128)).source
    with pytest.raises(PlanError, match="half_blocks expected a mask .*, got a spec without one"):
        plan_v3(build_ir(presets.plain(128)), "sm_90", half_blocks=True)
    with pytest.raises(PlanError, match="half_blocks expected BLOCK_N a multiple of 32 .*, got 112"):
        plan_v3(build_ir(presets.causal(128)), "sm_90", half_blocks=True, block_n=112)
    p = plan_v3(build_ir(presets.causal(256)), "sm_90", half_blocks=True)  # the model's 80 passed over: 64
    assert p.half_blocks and p.block_n == 64
    assert any("BLOCK_N=80: half_blocks takes a multiple of 32" in r for r in p.reasons)
    # the half S GEMMs' registers (BLOCK_N / 4) count: causal d = 64 drops from the model's 192 to 160
    p = plan_v3(build_ir(presets.causal(64)), "sm_90", half_blocks=True)
    assert p.block_n == 160 and any("~264 registers per consumer thread > 240" in r for r in p.reasons)
    assert any("half S BLOCK_N/4 = 40" in r for r in p.reasons)
    with pytest.raises(PlanError, match="expected half_blocks a bool, got 1"):
        plan_v3(build_ir(presets.causal(128)), "sm_90", half_blocks=1)
    assert not plan_v3(build_ir(presets.plain(128)), "sm_90", half_blocks=False).half_blocks


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_nvcc_half_blocks(head_dim):
    """With half_blocks every masked preset builds for sm_90a (nvcc and NVRTC) without spills and without
    serialized wgmmas (C7510-C7520: the half GEMMs' own registers and arms, v3_fwd.cuh)."""
    jobs = {name: _render(make(head_dim), half_blocks=True).source for name, make in MASKED.items()}
    jobs["document"] = _render(_specs(head_dim)["document"], half_blocks=True).source
    with ThreadPoolExecutor(max_workers=2) as pool:
        reps = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reps.items():
        serialized = sorted(set(re.findall(r"C75(?:1[0-8]|20)", rep.log)))
        assert not serialized, f"{name}: ptxas serialized the wgmma instructions ({serialized})\n{rep.log[-3000:]}"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{name}: spills\n{rep.log}"
