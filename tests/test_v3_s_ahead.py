"""A tile's first two S GEMMs in its first turn (plan option ``s_ahead``): S_1 goes into O's registers, which are
unset until the tile's first P V overwrites them. The plan and its refusals, the rendered kernel, its machine code
(nvcc: no spills, no serialized wgmmas, S_0 and S_1 issued back to back) and (GPU) its results: the error-ratio
rule, and O and LSE bit-identical to the same plan without it (each block's arithmetic is the same)."""
from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

import attncompiler as ac
from attncompiler.ir.build import build_ir
from attncompiler.plan import v3_softmax
from attncompiler.plan.model import PlanError
from attncompiler.plan.v3 import plan_v3
from attncompiler.spec import presets

from _nvcc import ptx_and_reports
from _v3 import GPU_PRESETS, needs_hopper, render_v3, same_outputs, v3_gpu_spec


def test_plan_s_ahead(monkeypatch):
    """Off by default (S_AHEAD_DEFAULT); forced on, the same tile, stages and grid as the model's plan and a reason
    line; the options reproduce the plan; with the default patched on, taken only where it applies."""
    ir = build_ir(presets.sliding_window(1024, 128))
    base = plan_v3(ir, "sm_90")
    assert not base.s_ahead and not v3_softmax.S_AHEAD_DEFAULT
    p = plan_v3(ir, "sm_90", s_ahead=True)
    assert p.s_ahead and p.options == {**base.options, "s_ahead": True}
    assert (p.block_m, p.block_n, p.stages, p.smem_bytes) == (base.block_m, base.block_n, base.stages, base.smem_bytes)
    assert any(r.startswith("a tile's first turn issues S_0 and S_1") for r in p.reasons)
    assert plan_v3(ir, "sm_90", **p.options) == p
    monkeypatch.setattr(v3_softmax, "S_AHEAD_DEFAULT", True)
    assert plan_v3(ir, "sm_90").s_ahead and plan_v3(build_ir(presets.plain(128)), "sm_90").s_ahead
    assert not plan_v3(build_ir(presets.softcap(30.0, 64)), "sm_90").s_ahead  # BLOCK_N 144 != DV 64


@pytest.mark.parametrize("spec, opts, expected", [
    (presets.plain(64), {}, "BLOCK_N = DV (O's registers hold the second S tile), got BLOCK_N 112, DV 64"),
    (presets.alibi(presets.alibi_slopes(4), 128), {"block_n": 128},
     "no separable score_mod (its column term may start in the S accumulator), got one"),
    (presets.sliding_window(1024, 128), {"half_blocks": True}, "whole K/V blocks, got half_blocks"),
    (presets.plain(128), {"stages": 1}, "two K/V stages or more (K_0 and K_1 resident at once), got 1"),
    (presets.causal(64), {"block_m": 192, "block_n": 64},
     "one K/V walk for every consumer warpgroup, got a mask with BLOCK_N 64 < BLOCK_M 192"),
])
def test_s_ahead_refusals(spec, opts, expected):
    with pytest.raises(PlanError, match="s_ahead expected " + expected.replace("(", r"\(").replace(")", r"\)")):
        plan_v3(build_ir(spec), "sm_90", s_ahead=True, **opts)
    with pytest.raises(PlanError, match="expected s_ahead a bool, got 1"):
        plan_v3(build_ir(presets.plain(128)), "sm_90", s_ahead=1)


def test_render_s_ahead():
    src = render_v3(presets.plain(128), s_ahead=True).source
    assert "static constexpr bool S_AHEAD = true;" in src and "wgmma_pv_set" in src
    assert "static constexpr bool S_AHEAD = false;" in render_v3(presets.plain(128)).source


def test_autotuner_tries_s_ahead():
    """The model's plan with the option flipped is a candidate where it applies (BLOCK_N = DV), none elsewhere."""
    from attncompiler.plan.v3_candidates import candidates_v3

    ir = build_ir(presets.sliding_window(1024, 128))
    base = plan_v3(ir, "sm_90")
    ahead = [o for o in candidates_v3(ir, "sm_90") if o["s_ahead"]]
    assert {**base.options, "s_ahead": True} in ahead
    assert not any(o["s_ahead"] for o in candidates_v3(build_ir(presets.softcap(30.0, 64)), "sm_90"))


# ---------------------------------------------------------------------------------------------------------------
# machine code

_NVCC_SPECS = {"plain": presets.plain(128), "softcap": presets.softcap(30.0, 128), "causal": presets.causal(128),
               "sliding_window": presets.sliding_window(1024, 128),
               "document": presets.get_preset("document", head_dim=128),
               "dropout": ac.AttentionSpec(head_dim=128, dropout_p=0.1, causal=True, name="dropout")}


def _hgmma_groups(cubin: bytes) -> list[list[str]] | None:
    """The SASS's HGMMA instructions, in groups of consecutive ones (a group: no wait or barrier between); None
    without cuobjdump and nvdisasm."""
    tools = [shutil.which("cuobjdump"), shutil.which("nvdisasm")]
    if None in tools:
        return None
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([tools[0], "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    groups: list[list[str]] = [[]]
    for line in sass.splitlines():
        if "HGMMA" in line:
            groups[-1].append(line)
        elif "WARPGROUP.DEPBAR" in line or "BAR.SYNC" in line or "BAR.ARV" in line:
            if groups[-1]:
                groups.append([])
    return [g for g in groups if g]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_s_ahead():
    """Every preset at d = 128 (BLOCK_N 128 = DV; the window on its persistent grid with q_prefetch and the tile
    list) and plain at d = 64 with BLOCK_N 64 compile for sm_90a without spills and without serialized wgmmas, with
    two more waits than the kernel without the option (S_0 alone, then S_1; the first P V's), and with S_0 and S_1
    issued back to back: the first group of HGMMAs holds both (16 k16 steps at d = 128). A zeroed O at the tile's
    start (S_1's wgmma reads its registers) had made ptxas serialize every wgmma for want of registers (C7512)."""
    jobs = {}
    for name, spec in _NVCC_SPECS.items():
        for on in (False, True):
            jobs[f"{name}:{int(on)}"] = render_v3(spec, s_ahead=on).source
    for on in (False, True):
        jobs[f"plain64:{int(on)}"] = render_v3(presets.plain(64), block_n=64, s_ahead=on).source
    _, reps = ptx_and_reports(jobs)
    for key, rep in reps.items():
        assert "C7520" not in rep.log and "C7512" not in rep.log, f"{key}: ptxas serialized the wgmmas\n{rep.log}"
        assert rep.spill_stores == 0 and rep.spill_loads == 0, f"{key}: spills\n{rep.log}"
    for name in (*_NVCC_SPECS, "plain64"):
        off, on = _hgmma_groups(reps[f"{name}:0"].cubin), _hgmma_groups(reps[f"{name}:1"].cubin)
        if on is None or off is None:
            break  # (no SASS tools on this machine: the ptxas checks above stand alone)
        steps = 8 if name != "plain64" else 4
        assert len(on[0]) == 2 * steps, f"{name}: S_0 and S_1 not issued together: {len(on[0])} HGMMAs"
        assert len(off[0]) == steps, name
        assert sum(map(len, on)) == sum(map(len, off)) + 2 * steps, name  # S_1 and P_0 V_0 of the prologue


# ---------------------------------------------------------------------------------------------------------------
# GPU

_spec = functools.partial(v3_gpu_spec, seqlen=1023, heads=12)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("name", [n for n in GPU_PRESETS if n != "alibi_causal"])
def test_gpu_s_ahead(name):
    """Several tiles per CTA on the model's grid at d = 128: the error-ratio rule, and O and LSE bit-identical to
    the same plan without the option (dropout: check_kernel's own draw of the same mask covers it)."""
    from attncompiler.testing import check_kernel

    spec = _spec(name, 128)
    kern = ac.compile(spec, "v3", s_ahead=True)
    assert kern.plan.s_ahead
    res = check_kernel(kern, 4, 12, 1023)
    assert res.ok, f"{name}: {res}"
    if name != "dropout":
        off = ac.compile(spec, "v3", **{**kern.plan.options, "s_ahead": False})
        assert same_outputs(kern, off, 4, 12, 1023, 128, seed=11), name


@pytest.mark.gpu
@needs_hopper
def test_gpu_s_ahead_shapes():
    """Tiles of one block (N = 113: S_1 multiplies K_0 again and O is zeroed before the tile's one P V), tiles of two
    (N = 200), tiles without keys between tiles with keys, one CTA per tile and the persistent grid, fp16, GQA at
    cross lengths, (B, N, H, d) storage, d = 64 with BLOCK_N 64, and a window of 100 keys (tiles of 1-2 blocks)."""
    from attncompiler.testing import check_kernel

    for persistent in (False, True):
        plain = ac.compile(presets.plain(128), "v3", s_ahead=True, persistent=persistent)
        for B, H, N in ((1, 2, 113), (2, 7, 200), (3, 40, 1023)):
            res = check_kernel(plain, B, H, N)
            assert res.ok, f"plain persistent={persistent} B={B} H={H} N={N}: {res}"
    causal = ac.compile(presets.causal(128), "v3", s_ahead=True)
    for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
        res = check_kernel(causal, 4, 6, nq, nk, H_kv=hkv)
        assert res.ok, f"GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"
    res = check_kernel(causal, 4, 6, 1023, layout="bnhd")
    assert res.ok, f"bnhd: {res}"
    res = check_kernel(ac.compile(_spec("sliding_window", 128, "fp16"), "v3", s_ahead=True), 2, 12, 1023)
    assert res.ok, f"fp16: {res}"
    d64 = ac.compile(presets.plain(64), "v3", s_ahead=True, block_n=64, block_m=128)
    res = check_kernel(d64, 2, 8, 1023)
    assert res.ok, f"d64: {res}"
    narrow = ac.compile(presets.sliding_window(100, 128), "v3", s_ahead=True, block_m=128, block_n=128)
    res = check_kernel(narrow, 2, 8, 1023)
    assert res.ok, f"window 100: {res}"

    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 700) & (kv_idx <= q_idx)

    for persistent in (False, True):
        holes = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", s_ahead=True, persistent=persistent)
        res = check_kernel(holes, 4, 8, 1023)
        assert res.ok, f"tiles without keys persistent={persistent}: {res}"
        q, k, v = (torch.randn(4, 8, 1023, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o, lse = holes(q, k, v, return_lse=True)
        assert not torch.isnan(o).any() and (o[:, :, :700] == 0).all() and torch.isinf(lse[:, :, :700]).all()
        off = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", **{**holes.plan.options,
                                                                                "s_ahead": False})
        assert same_outputs(holes, off, 4, 8, 4096, 128, 7)
