"""CPU: the decode planner (stages, split choice and its reasons, the auto-pick rule, the fold_combine and
loader options), the launch sequence, rendering, and an nvcc compile of both decode kernels for sm_80 and
sm_90a (default plan and each option)."""
from __future__ import annotations

import ctypes
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
    assert p.smem_bytes == pd.decode_smem_bytes(d, d, p.block_n, p.stages, p.loader) <= t.max_smem_per_block_optin
    assert p.loader == ("tma" if t.major >= 9 else "cp_async")
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
    c, plan = _choice(1, 32, 8, 1, 32768)  # 8 work units
    assert c.row_blocks == 1 and c.num_splits == 16  # one CTA per SM: 128 of 132
    assert plan.sm_count * pd.DECODE_ONE_WAVE_FILL <= c.ctas <= plan.sm_count, c.reasons
    assert c.tiles_per_split * c.num_splits >= c.tiles > c.tiles_per_split * (c.num_splits - 1)
    assert "one CTA per SM" in c.reasons[1] and "combine" in c.reasons[-1]
    c, _ = _choice(4, 32, 8, 1, 65536)  # 32 units: 4 splits
    assert (c.num_splits, c.ctas) == (4, 128)


def test_split_choice_whole_waves_when_one_wave_cannot_fill():
    # 100 units: one split is 100 CTAs (< 0.9 of the SMs), so the slots (SMs x CTAs/SM) are filled in waves
    c, plan = _choice(1, 100, 100, 1, 65536)
    slots = plan.sm_count * plan.ctas_per_sm
    assert c.num_splits > 1 and "wave efficiency" in c.reasons[1]
    assert (c.ctas / slots) / -(-c.ctas // slots) >= 0.9, c.reasons


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


def _render(spec, arch="sm_90", **options):
    sched = get_schedule("decode")
    t = get_target(arch)
    ir = build_ir(spec)
    return sched.render(ir, sched.make_plan(ir, t, **options), t)


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


# ---- plan options: fold_combine (merge in the split kernel) and loader (cp_async / bulk) ----------------------

def test_options_defaults():
    """Measured defaults (plan/decode.py): the TMA loader on sm_90 (head dims multiples of 64), else cp.async;
    the combine folded into the split kernel."""
    t = pd.plan_decode(ProblemDims(128), "sm_90")
    assert (t.fold_combine, t.loader, t.l2_hint) == (True, "tma", 0)
    assert "K/V loader: tma: 3-stage TMA ring" in t.describe()
    assert any(r.startswith("loader tma: thread 0 issues 4 tensor-map copies") for r in t.reasons)
    assert pd.plan_decode(ProblemDims(96), "sm_90").loader == "cp_async"  # not 64-column boxes
    p = pd.plan_decode(ProblemDims(128), "sm_80")
    assert (p.fold_combine, p.loader, p.l2_hint) == (True, "cp_async", pd.DECODE_L2_HINT)
    text = p.describe()
    assert "K/V loader: cp_async: 2-stage cp.async ring" in text and "L2::256B hint" in text
    assert "combine: folded into the split kernel" in text
    assert any(r.startswith("loader cp_async: 16-byte cp.async") for r in p.reasons)
    assert any(r.startswith("fold_combine: ") for r in p.reasons)


def test_options_accepted_and_explained():
    p = pd.plan_decode(ProblemDims(128), "sm_90", fold_combine=True, loader="bulk")
    assert (p.fold_combine, p.loader, p.l2_hint) == (True, "bulk", 0)
    text = p.describe()
    assert "K/V loader: bulk: 3-stage cp.async.bulk ring" in text
    assert "combine: folded into the split kernel" in text
    assert any(r.startswith("loader bulk (requested): warp 0 issues 128 cp.async.bulk copies per tile")
               for r in p.reasons)
    assert any(r.startswith("fold_combine (requested):") for r in p.reasons)
    # the mbarriers: 3 stages x 8 B, rounded up to 16 B, after the stages
    assert p.smem_bytes == pd.decode_smem_bytes(128, 128, 64, 3) + 32 == pd.decode_smem_bytes(128, 128, 64, 3, "bulk")
    assert (p.stages, p.ctas_per_sm) == (3, 2)
    # each option alone, and fold_combine on sm_80 (it needs nothing beyond the split kernel)
    assert pd.plan_decode(ProblemDims(128), "sm_90", loader="bulk").fold_combine is pd.DECODE_FOLD_COMBINE
    f80 = pd.plan_decode(ProblemDims(128), "sm_80", fold_combine=True)
    assert f80.fold_combine and f80.loader == "cp_async" and f80.smem_bytes == pd.decode_smem_bytes(128, 128, 64, 2)
    assert pd.plan_decode(ProblemDims(64), "sm_100", loader="bulk").loader == "bulk"
    off = pd.plan_decode(ProblemDims(128), "sm_90", fold_combine=False, loader="cp_async")
    assert any(r.startswith("loader cp_async (requested)") for r in off.reasons)
    assert any(r.startswith("combine kernel (requested)") for r in off.reasons)


def test_options_rejected_with_reason():
    with pytest.raises(PlanError, match=r"decode: loader 'bulk' needs sm_90\+ \(cp\.async\.bulk\), got sm_80"):
        pd.plan_decode(ProblemDims(128), "sm_80", loader="bulk")
    with pytest.raises(PlanError, match=r"decode: loader 'bulk' needs sm_90\+ \(cp\.async\.bulk\), got sm_86"):
        pd.plan_decode(ProblemDims(128), "sm_86", loader="bulk")
    with pytest.raises(PlanError, match=r"expected loader in \('cp_async', 'bulk', 'tma'\), got 'tensor'"):
        pd.plan_decode(ProblemDims(128), "sm_90", loader="tensor")
    with pytest.raises(PlanError, match=r"decode: loader 'tma' needs sm_90\+"):
        pd.plan_decode(ProblemDims(128), "sm_80", loader="tma")
    with pytest.raises(PlanError, match=r"loader 'tma' copies 64-column boxes .* got D=96, DV=96"):
        pd.plan_decode(ProblemDims(96), "sm_90", loader="tma")
    with pytest.raises(PlanError, match="expected fold_combine True or False, got 1"):
        pd.plan_decode(ProblemDims(128), "sm_90", fold_combine=1)
    with pytest.raises(PlanError, match="l2_hint applies to the cp_async loader"):
        pd.plan_decode(ProblemDims(128), "sm_90", loader="bulk", l2_hint=256)
    assert pd.plan_decode(ProblemDims(128), "sm_90", loader="bulk", l2_hint=0).l2_hint == 0


def test_workspace_with_counters():
    dims = AttnInputs(1, 32, 8, 2, 32768, 128, 128)
    plain = pd.plan_decode(ProblemDims(128), "sm_90", fold_combine=False)
    fold = pd.plan_decode(ProblemDims(128), "sm_90", fold_combine=True)
    c = pd.choose_splits(fold, B=1, H=32, H_kv=8, Nq=2, Nk=32768)
    assert c.num_splits > 1 and c.row_blocks == 1  # 4 heads x 2 queries = 8 rows
    base = c.num_splits * 32 * 2 * 129
    assert rt.workspace_floats(c, dims) == rt.workspace_floats(c, dims, plain) == base
    assert rt.counter_slice(plain, c, dims) == (0, 0)
    # one int32 counter per (b, h_kv, row block), after the partial LSEs
    assert rt.counter_slice(fold, c, dims) == (base, 1 * 8 * 1)
    assert rt.workspace_floats(c, dims, fold) == base + 8
    assert "fold_combine: one launch" in c.reasons[-1] and "8 units" in c.reasons[-1]
    # MQA with 16 queries: 32 heads x 16 queries = 512 rows = 32 row blocks per (b, h_kv)
    dims2 = AttnInputs(2, 32, 1, 16, 4099, 128, 128)
    c2 = pd.choose_splits(fold, B=2, H=32, H_kv=1, Nq=16, Nk=4099, num_splits=3)
    assert rt.counter_slice(fold, c2, dims2) == (3 * 2 * 32 * 16 * 129, 2 * 1 * 32)
    # one split: the split kernel writes O directly, no workspace and no counters
    c1 = pd.choose_splits(fold, B=8, H=32, H_kv=32, Nq=1, Nk=131072)
    d1 = AttnInputs(8, 32, 32, 1, 131072, 128, 128)
    assert c1.num_splits == 1 and rt.workspace_floats(c1, d1, fold) == 0 and rt.counter_slice(fold, c1, d1) == (0, 0)
    assert get_schedule("decode").workspace_floats(_render(presets.plain(128), fold_combine=True), dims) == base + 8


class _KS:
    def __init__(self, plan):
        self.plan, self.threads, self.smem_bytes = plan, plan.num_threads, plan.smem_bytes


def _fake_params(workspace=0x7f0000000000, k=0x10000, k_sn=128):
    from attncompiler.runtime.launch import _params_type

    P = _params_type()()
    P.workspace, P.k, P.v = workspace, k, 0x20000
    P.k_sb, P.k_sh, P.k_sn = 8 * 32768 * 128, 32768 * 128, k_sn
    P.v_sb, P.v_sh, P.v_sn = 8 * 32768 * 128, 32768 * 128, 128
    return P


@pytest.mark.parametrize("fold", [False, True])
def test_launch_sequence(monkeypatch, fold):
    """Without a GPU: which launches (and counter memsets) launch_decode issues, in order."""
    import attncompiler.runtime.launch as launch_mod

    calls = []
    monkeypatch.setattr(launch_mod, "launch_structs", lambda fn, grid, block, smem, structs, dev: calls.append(
        ("launch", fn, grid, block, smem)))
    monkeypatch.setattr(launch_mod, "launch_structs", lambda fn, grid, block, smem, structs, dev: calls.append(
        ("launch", fn, grid, block, smem, structs[2].counters)))
    monkeypatch.setattr(rt, "_zero_counters", lambda params, off, cnt, dev: calls.append(("zero", off, cnt)))
    arena = []  # what runtime/counters.py hands out: an address, or None (a capture without arena room)
    monkeypatch.setattr(rt, "_counters", lambda dev, cnt: calls.append(("counters", cnt)) or arena[0])
    plan = pd.plan_decode(ProblemDims(128), "sm_90", fold_combine=fold, loader="cp_async")
    dims = AttnInputs(1, 32, 8, 1, 32768, 128, 128)
    c = rt.split_choice(plan, dims)
    assert c.num_splits > 1
    P = _fake_params()
    off, cnt = rt.counter_slice(plan, c, dims)
    for addr in (0x7000, None):
        arena[:] = [addr]
        calls.clear()
        rt.launch_decode(_KS(plan), 11, 22, c, dims, P, None, None)
        if fold:
            ctr = addr if addr is not None else P.workspace + 4 * off
            split = ("launch", 11, (c.num_splits, 8, 1), 128, plan.smem_bytes, ctr)  # (splits x row blocks, H_kv, B)
            zero = [] if addr is not None else [("zero", off, cnt)]
            assert calls == [("counters", cnt)] + zero + [split]
        else:
            split = ("launch", 11, (c.num_splits, 8, 1), 128, plan.smem_bytes, None)
            assert calls == [split, ("launch", 22, (8, 1, 1), 128, 0, None)]
    calls.clear()
    c1 = rt.split_choice(plan, AttnInputs(8, 32, 32, 1, 131072, 128, 128))
    rt.launch_decode(_KS(plan), 11, 22, c1, AttnInputs(8, 32, 32, 1, 131072, 128, 128), _fake_params(), None, None)
    assert calls == [("launch", 11, (1, 32, 8), 128, plan.smem_bytes, None)]  # one split: no combine, no counters


def test_bulk_launch_checks_alignment(monkeypatch):
    import attncompiler.runtime.launch as launch_mod
    from attncompiler.runtime.launch import InputError

    monkeypatch.setattr(launch_mod, "launch_structs", lambda *a: None)
    plan = pd.plan_decode(ProblemDims(128), "sm_90", loader="bulk")
    dims = AttnInputs(8, 32, 32, 1, 32768, 128, 128)
    c = rt.split_choice(plan, dims)
    rt.launch_decode(_KS(plan), 1, 2, c, dims, _fake_params(), None, None)
    with pytest.raises(InputError, match="loader 'bulk' needs a 16-byte aligned base"):
        rt.launch_decode(_KS(plan), 1, 2, c, dims, _fake_params(k=0x10008), None, None)
    with pytest.raises(InputError, match="multiples of 8 elements"):
        rt.launch_decode(_KS(plan), 1, 2, c, dims, _fake_params(k_sn=132), None, None)


def test_tma_loader_plan_and_source():
    p = pd.plan_decode(ProblemDims(128), "sm_90", loader="tma")
    assert (p.loader, p.l2_hint, p.stages) == ("tma", 0, 3)
    # 1024 slack + Q's 16 x 136 x 2 = 4352 B rounded to 5120 + 3 x 64 x 512 unpadded + 32 B of mbarriers
    assert p.smem_bytes == pd.decode_smem_bytes(128, 128, 64, 3, "tma") == 1024 + 5120 + 3 * 64 * 512 + 32
    assert any(r.startswith("loader tma (requested): thread 0 issues 4 tensor-map copies per tile") for r in p.reasons)
    ks = _render(presets.causal(128), loader="tma")
    assert "TMA_LOADER = true" in ks.source and "BULK_LOADER = false" in ks.source
    assert "const __grid_constant__ ac::DecodeMaps maps" in ks.source
    assert "cp.async.bulk.tensor.4d" in ks.source and f"kSmemBytes == {ks.plan.smem_bytes}" in ks.source
    assert "const __grid_constant__" not in _render(presets.causal(128), loader="cp_async").source


def test_tma_launch_passes_the_maps(monkeypatch):
    """loader 'tma' launches the split kernel with a fourth by-value struct (the K, V tensor maps built
    from the packed strides; boxes of BLOCK_N rows)."""
    from attncompiler.runtime import launch, tma

    calls = []
    monkeypatch.setattr(launch, "launch_structs", lambda fn, grid, thr, smem, structs, dev: calls.append(structs))
    monkeypatch.setattr(rt, "_zero_counters", lambda *a: None)
    monkeypatch.setattr(rt, "_counters", lambda *a: 0x7000)
    seen = []
    monkeypatch.setattr(tma, "encode_attn_map",
                        lambda name, ptr, shape, strides, dtype, box: seen.append((name, shape, strides, box)) or
                        bytes(128))
    plan = pd.plan_decode(ProblemDims(128), "sm_90", loader="tma")
    dims = AttnInputs(2, 8, 2, 1, 4096, 128, 128)
    c = pd.choose_splits(plan, B=2, H=8, H_kv=2, Nq=1, Nk=4096)
    rt.launch_decode(_KS(plan), 1, 2, c, dims, _fake_params(), None, None)
    assert len(calls[0]) == 4 and ctypes.sizeof(calls[0][3]) == 256
    assert [(n, shape, box) for n, shape, _, box in seen] == [("k", (2, 2, 4096, 128), 64), ("v", (2, 2, 4096, 128), 64)]


def test_render_options_and_cache_key():
    default = _render(presets.causal(128), fold_combine=False)
    assert "BULK_LOADER = false" in default.source and "FOLD_COMBINE = false" in default.source
    both = _render(presets.causal(128), fold_combine=True, loader="bulk")
    assert "BULK_LOADER = true" in both.source and "FOLD_COMBINE = true" in both.source
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in both.source
    assert "K/V loader: bulk" in both.source and "combine: folded into the split kernel" in both.source
    assert f"kSmemBytes == {both.plan.smem_bytes}" in both.source
    # a compiled kernel is identified by its source (NVRTC / disk caches) and compile()'s plan options
    spec = presets.causal(128)
    k0 = ac.compile(spec, "decode", target="sm_90", build=False, fold_combine=False)
    kf = ac.compile(spec, "decode", target="sm_90", build=False, fold_combine=True)
    kb = ac.compile(spec, "decode", target="sm_90", build=False, loader="bulk")
    assert len({k0.source, kf.source, kb.source}) == 3
    assert (kf.plan.fold_combine, kb.plan.loader) == (True, "bulk") and not k0.plan.fold_combine
    assert ac.compile(spec, "decode", target="sm_90", build=False, fold_combine=True).kernel_source is kf.kernel_source


_OPTION_CASES = [dict(fold_combine=True), dict(loader="bulk"), dict(fold_combine=True, loader="bulk"),
                 dict(loader="tma"), dict(loader="tma", fold_combine=False)]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("opts", _OPTION_CASES, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()))
def test_nvcc_decode_options(arch, opts):
    if arch == "sm_80" and opts.get("loader") in ("bulk", "tma"):
        pytest.skip("loaders 'bulk' / 'tma' are sm_90+ (test_options_rejected_with_reason, test_nvcc_bulk_refuses_sm80)")
    for spec in (presets.causal(128), ac.AttentionSpec(head_dim=64, dropout_p=0.1, name="dropout"),
                 presets.softcap(30.0, 256)):
        rep = compile_with_nvcc(_render(spec, arch.rstrip("a"), **opts).source, arch)
        assert "attn_decode_combine" in rep.log and "attn_fwd" in rep.log
        assert rep.spill_stores == 0 and rep.spill_loads == 0, rep.log
        assert rep.registers <= 255


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_bulk_refuses_sm80():
    """A bulk-loader source built for sm_80 stops at the kernel's static_assert (the planner refuses it first)."""
    from attncompiler.runtime.compiler import CompileError

    with pytest.raises(CompileError, match="loaders 'bulk' and 'tma' need sm_90"):
        compile_with_nvcc(_render(presets.plain(64), "sm_90", loader="bulk").source, "sm_80")


def test_decode_launch_reuses_maps_per_pointers(monkeypatch):
    """DecodeLaunch (what a recorded decode call launches) issues launch_decode's launches, and encodes the "tma"
    loader's K/V maps once per (k, v) pointer pair."""
    from attncompiler.runtime import launch, tma

    calls = []
    monkeypatch.setattr(launch, "launch_structs", lambda fn, grid, thr, smem, structs, dev: calls.append(
        (fn, grid, len(structs))))
    monkeypatch.setattr(rt, "_counters", lambda *a: 0x7000)
    encoded = []
    monkeypatch.setattr(tma, "encode_attn_map",
                        lambda name, ptr, shape, strides, dtype, box: encoded.append((name, ptr)) or bytes(128))
    plan = pd.plan_decode(ProblemDims(128), "sm_90", loader="tma", fold_combine=False)
    dims = AttnInputs(2, 8, 2, 1, 32768, 128, 128)
    c = pd.choose_splits(plan, B=2, H=8, H_kv=2, Nq=1, Nk=32768)
    assert c.num_splits > 1
    dl = rt.DecodeLaunch(_KS(plan), 11, 22, c, dims, None)
    for k in (0x10000, 0x10000, 0x30000, 0x10000):
        dl.launch(_fake_params(k=k), 0)
    assert encoded == [("k", 0x10000), ("v", 0x20000), ("k", 0x30000), ("v", 0x20000)]
    split, combine = (11, (c.num_splits, 2, 2), 4), (22, (-(-2 * 8 // plan.combine_warps), 1, 1), 3)
    assert calls == [split, combine] * 4


def test_split_grid_holds_row_blocks_on_x_and_the_batch_on_z():
    """(num_splits * row_blocks, H_kv, B): B * H_kv may pass the grid's y limit (tests/test_gpu_large_batch.py)."""
    plan = pd.plan_decode(ProblemDims(64), "sm_90")
    dims = AttnInputs(40000, 16, 2, 3, 65, 64, 64)  # 8 heads x 3 queries: 2 row blocks of 16
    c = rt.split_choice(plan, dims, 2)
    assert (c.num_splits, c.row_blocks) == (2, 2)
    assert rt.split_grid(c, dims) == (4, 2, 40000)


def test_counters_past_an_arena_come_from_the_workspace():
    """fold_combine's counters, more than an arena holds: _counters says None (before touching CUDA), and the launch
    takes the workspace's own, zeroed in the call."""
    from attncompiler.runtime.counters import ARENA_INTS

    assert rt._counters("cuda:0", ARENA_INTS + 1) is None
