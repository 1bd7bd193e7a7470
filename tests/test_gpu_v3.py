"""GPU (sm_90 only): the v3 schedule (TMA + wgmma + warp specialization) against the float64
reference by the error-ratio rule: every preset and example, fp16 / bf16, head dims 64 / 96 / 128 /
192 / 256 (and other multiples of 16, with D != DV), sequence lengths that are not multiples of any tile, GQA, (B, N, H, d) layouts,
fully masked rows.

Run on an H100 / H200 with ``python3 -m pytest -m gpu tests/test_gpu_v3.py``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel

pytestmark = pytest.mark.gpu

H = 3
B = 2
SEQLENS = (113, 1023, 4096)
EXAMPLES = sorted(p.stem for p in (Path(__file__).parent.parent / "examples").glob("*.py") if not p.stem.startswith("_"))
PRESET_NAMES = ("plain", "causal", "sliding_window", "alibi", "alibi_causal", "softcap", "prefix_lm", "document",
                "relative_bias", "dropout")


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")


def spec_for(name: str, head_dim: int, dtype: str, seqlen: int) -> ac.AttentionSpec:
    if name == "dropout":
        return ac.AttentionSpec(head_dim=head_dim, dtype=dtype, dropout_p=0.2, name="dropout")
    if name == "alibi_causal":
        return presets.alibi(presets.alibi_slopes(H), head_dim, dtype=dtype, causal=True)
    return presets.get_preset(name, head_dim=head_dim, dtype=dtype, num_heads=H, seqlen=seqlen)


@needs_hopper
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_presets(name, head_dim, dtype):
    for n in SEQLENS:
        kern = ac.compile(spec_for(name, head_dim, dtype, n), "v3")
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"{name} v3 {dtype} d={head_dim} N={n}: {res}"


@needs_hopper
@pytest.mark.parametrize("name", ["plain", "causal"])
def test_long_16k(name):
    kern = ac.compile(spec_for(name, 128, "bf16", 16384), "v3")
    res = check_kernel(kern, 1, 2, 16384)
    assert res.ok, str(res)


@needs_hopper
@pytest.mark.parametrize("name", ["plain", "causal", "softcap"])
def test_head_dim_192(name):
    for n in (113, 1023):
        kern = ac.compile(spec_for(name, 192, "bf16", n), "v3")
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"{name} d=192 N={n}: {res}"


# Head dims that are not multiples of 64: the last 64-column TMA box is zero-filled beyond D (Q, K) or DV (V),
# the Q K^T k16 steps stop at D and the P V wgmma's N is DV (v3_consumer.cuh, V3Layout).
@needs_hopper
@pytest.mark.parametrize("d,dv", [(32, 32), (48, 48), (80, 80), (96, 64), (64, 96), (128, 96), (192, 96), (160, 160),
                                  (224, 224), (16, 16)])
@pytest.mark.parametrize("name", ["plain", "causal", "alibi_causal", "dropout"])
def test_head_dims_not_multiples_of_64(d, dv, name):
    import dataclasses

    for n, dtype in ((113, "bf16"), (1023, "fp16")):
        spec = dataclasses.replace(spec_for(name, d, dtype, n), head_dim_v=dv)
        kern = ac.compile(spec, "v3")
        assert kern.schedule == "v3"
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"{name} v3 D={d} DV={dv} {dtype} N={n}: {res}"


@needs_hopper
@pytest.mark.parametrize("example", EXAMPLES)
def test_examples(example):
    from attncompiler.testing import run_example

    path = Path(__file__).parent.parent / "examples" / f"{example}.py"
    spec_mod = importlib.util.spec_from_file_location(f"example_v3_{example}", path)
    mod = importlib.util.module_from_spec(spec_mod)
    spec_mod.loader.exec_module(mod)  # type: ignore[union-attr]
    assert run_example(mod.make_spec(), schedules=("v3",), verbose=False) == 0


@needs_hopper
def test_layouts_cross_lengths_and_gqa():
    kern = ac.compile(presets.causal(128), "v3")
    assert check_kernel(kern, 2, 3, 300, layout="bnhd").ok
    for nq, nk in ((113, 1023), (1023, 113), (1, 4096), (200, 5)):
        res = check_kernel(kern, 2, 3, nq, nk)
        assert res.ok, str(res)
    plain = ac.compile(presets.plain(64), "v3")
    for hkv in (1, 2):
        res = check_kernel(plain, 2, 4, 517, H_kv=hkv)
        assert res.ok, f"H_kv={hkv}: {res}"


@needs_hopper
@pytest.mark.parametrize("block_n,stages", [(64, 2), (96, 3), (176, 2), (128, 1)])
def test_forced_tiles(block_n, stages):
    kern = ac.compile(presets.causal(128), "v3", block_n=block_n, stages=stages)
    for n in (113, 1023):
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"BLOCK_N={block_n} stages={stages} N={n}: {res}"


@needs_hopper
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_three_consumers(name):
    """block_m = 192: three consumer warpgroups taking GEMM turns round robin (d = 64 and d = 128 at
    BLOCK_N 64), every preset at seqlens that are not multiples of 192 or of BLOCK_N, cross lengths
    with GQA, and the persistent grid."""
    for head_dim, block_n in ((64, 96), (128, 64)):
        for n in (113, 1023, 4096):
            kern = ac.compile(spec_for(name, head_dim, "bf16", n), "v3", block_m=192, block_n=block_n)
            assert kern.kernel_source.plan.consumers == 3
            res = check_kernel(kern, B, H, n)
            assert res.ok, f"{name} block_m=192 d={head_dim} BN={block_n} N={n}: {res}"
    kern = ac.compile(spec_for(name, 64, "fp16", 1023), "v3", block_m=192, block_n=96, persistent=True)
    res = check_kernel(kern, B, H, 1023)
    assert res.ok, f"{name} block_m=192 persistent fp16: {res}"
    if name in ("plain", "causal"):
        kern = ac.compile(spec_for(name, 64, "bf16", 1500), "v3", block_m=192, block_n=96)
        for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
            res = check_kernel(kern, 2, 3, nq, nk, H_kv=hkv)
            assert res.ok, f"{name} block_m=192 GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"


# Masks under which one consumer warpgroup's rows miss blocks the CTA visits (the per-warpgroup walk, kWgWalk in
# v3_fwd.cuh: a mask and BLOCK_N < BLOCK_M). "late rows": rows < 700 see no key at all, so a warpgroup may skip every
# block while the other multiplies (its extra empty turn); their outputs must be 0, their LSE -inf.
WG_WALK_MASKS = {
    "window 100": lambda b, h, q, kv: (q >= kv) & (q - kv <= 100),
    "window 700": lambda b, h, q, kv: (q >= kv) & (q - kv <= 700),
    "causal": lambda b, h, q, kv: q >= kv,
    "symmetric 90": lambda b, h, q, kv: (q - kv <= 90) & (kv - q <= 90),
    "late rows": lambda b, h, q, kv: (q >= 700) & (q >= kv),
}


@needs_hopper
@pytest.mark.parametrize("mask", sorted(WG_WALK_MASKS))
@pytest.mark.parametrize("opts", [dict(block_m=192, block_n=64), dict(block_m=128, block_n=64),
                                  dict(block_m=192, block_n=64, persistent=True),
                                  dict(block_m=192, block_n=64, kv_descending=True)], ids=str)
def test_warpgroup_walk(mask, opts):
    """Each consumer warpgroup multiplies only the blocks that meet its own rows' K/V range and takes empty turns
    for the rest: seqlens that are not multiples of any tile, cross lengths, fp16 and GQA, the persistent grid (the
    ring's slots and phases run on across tiles) and the descending walk."""
    spec = presets.plain(128, mask_mod=WG_WALK_MASKS[mask], name=mask.replace(" ", "_"))
    kern = ac.compile(spec, "v3", **opts)
    assert (kern.kernel_source.plan.block_m, kern.kernel_source.plan.block_n) == (opts["block_m"], opts["block_n"])
    for nq, nk in ((113, 113), (1023, 1023), (1500, 517), (517, 1500), (2500, 2500)):
        res = check_kernel(kern, B, H, nq, nk)
        assert res.ok, f"{mask} {opts} Nq={nq} Nk={nk}: {res}"
    res = check_kernel(ac.compile(dataclasses.replace(spec, dtype="fp16"), "v3", **opts), 2, 4, 1023, H_kv=2)
    assert res.ok, f"{mask} {opts} fp16 GQA: {res}"


def _resident_ctas(kern) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor of the kernel's loaded v3 function (after one call)."""
    import ctypes

    from attncompiler.codegen import v3 as v3_codegen

    ks = kern.kernel_source
    fn = v3_codegen._loaded[(ks, torch.cuda.current_device())]
    n = ctypes.c_int(0)
    rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(n), ctypes.c_void_p(fn.ptr), ctypes.c_int(ks.threads), ctypes.c_size_t(ks.smem_bytes))
    assert rc == 0, f"cuOccupancyMaxActiveBlocksPerMultiprocessor returned {rc}"
    return n.value


@needs_hopper
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_one_consumer_two_ctas(name):
    """block_m = 64: one consumer warpgroup per CTA and two CTAs per SM (no ping-pong inside a CTA), every preset
    at d = 64, 96 and 128 (the planner's BLOCK_N and BLOCK_N 64) and seqlens that are not multiples of any tile,
    fp16, the persistent grid (two CTAs per SM in it), GQA with cross lengths; the driver confirms that two CTAs
    fit an SM."""
    for head_dim, block_n in ((64, None), (96, None), (128, None), (128, 64)):
        opts = {"block_m": 64} if block_n is None else {"block_m": 64, "block_n": block_n}
        for n in (113, 1023, 4096):
            kern = ac.compile(spec_for(name, head_dim, "bf16", n), "v3", **opts)
            plan = kern.kernel_source.plan
            assert (plan.consumers, plan.ctas_per_sm) == (1, 2)
            res = check_kernel(kern, B, H, n)
            assert res.ok, f"{name} block_m=64 d={head_dim} BN={plan.block_n} N={n}: {res}"
        assert _resident_ctas(kern) == 2
    kern = ac.compile(spec_for(name, 128, "fp16", 1023), "v3", block_m=64, persistent=True)
    res = check_kernel(kern, 4, H, 1023)
    assert res.ok, f"{name} block_m=64 persistent fp16: {res}"
    if name in ("plain", "causal", "sliding_window"):
        kern = ac.compile(spec_for(name, 128, "bf16", 1500), "v3", block_m=64)
        for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
            res = check_kernel(kern, 2, 3, nq, nk, H_kv=hkv)
            assert res.ok, f"{name} block_m=64 GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"


@needs_hopper
@pytest.mark.parametrize("name", ["plain", "causal", "sliding_window", "document", "dropout", "alibi_causal", "softcap"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_persistent(name, head_dim):
    # B*H*query blocks > SMs at 4096, so CTAs loop over several tiles (Q reload, ring across tiles)
    for n in (113, 1023, 4096):
        kern = ac.compile(spec_for(name, head_dim, "bf16", n), "v3", persistent=True)
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"{name} persistent d={head_dim} N={n}: {res}"
    kern = ac.compile(presets.causal(head_dim), "v3", persistent=True)
    for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
        res = check_kernel(kern, 2, 3, nq, nk, H_kv=hkv)
        assert res.ok, f"persistent causal GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"
    # without a mask the persistent tiles run head by head (v3_tile's kByHead order): GQA, cross lengths, and more
    # tiles than SMs (B * H * 9 query blocks at 1100 rows)
    kern = ac.compile(presets.plain(head_dim), "v3", persistent=True)
    for b, h, hkv, nq, nk in ((2, 3, 1, 517, 1500), (2, 3, 3, 1500, 517), (8, 6, 2, 1100, 1100)):
        res = check_kernel(kern, b, h, nq, nk, H_kv=hkv)
        assert res.ok, f"persistent plain B={b} H={h} H_kv={hkv} Nq={nq} Nk={nk}: {res}"


@needs_hopper
def test_persistent_tiles_without_keys():
    """Persistent CTAs meet tiles with no visible key between tiles with keys (rows < 700 see nothing):
    the Q reload and the ring run on across them; fully masked rows give 0, never NaN."""
    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 700) & (kv_idx <= q_idx)

    kern = ac.compile(ac.AttentionSpec(head_dim=128, mask_mod=mask), "v3", persistent=True)
    for n in (1023, 4096):
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"N={n}: {res}"


@needs_hopper
def test_fully_masked_rows_are_zero_not_nan():
    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 64) & (kv_idx <= q_idx)

    kern = ac.compile(ac.AttentionSpec(head_dim=64, mask_mod=mask), "v3")
    q, k, v = (torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = kern(q, k, v, return_lse=True)
    assert not torch.isnan(out).any()
    assert (out[:, :, :64] == 0).all()
    assert torch.isinf(lse[:, :, :64]).all() and (lse[:, :, :64] < 0).all()
    res = check_kernel(kern, 1, 2, 200)
    assert res.ok, str(res)


@needs_hopper
@pytest.mark.parametrize("name", ["causal", "alibi_causal", "softcap", "dropout"])
def test_v3_forward_v2_backward_grads(name):
    """Under autograd a v3 forward saves out and lse and the v2 backward kernels run from them."""
    from attncompiler.testing import check_kernel_grads

    kern = ac.compile(spec_for(name, 128, "bf16", 1023), "v3")
    assert kern.schedule == "v3"
    assert (r := check_kernel_grads(kern, B, H, 1023)).ok, str(r)


@needs_hopper
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_auto_is_v3_on_hopper_with_per_call_paths(head_dim):
    """schedule="auto" compiles v3 on an sm_90 GPU; per call it still runs decode (Nq <= 16, long K/V),
    the v2 varlen kernels (cu_seqlens), v2 for K/V broadcast by .expand() (stride 0: no TMA map),
    and the v2 backward under autograd."""
    from attncompiler.testing import check_kernel_grads
    from attncompiler.testing_varlen import check_varlen_kernel

    kern = ac.compile(presets.causal(head_dim))
    assert kern.schedule == "v3" and kern.plan.reasons[0].startswith("schedule 'auto' on sm_90 -> v3")
    assert (r := check_kernel(kern, 2, 3, 1023)).ok, str(r)
    assert kern._decode is None and kern._v2 is None
    assert (r := check_kernel(kern, 1, 4, 2, 2048, H_kv=2)).ok, str(r)  # decode
    assert kern._decode is not None and kern._decode.schedule == "decode"
    assert (r := check_varlen_kernel(kern, [300, 17, 1023], H=2)).ok, str(r)  # packed: v2 varlen kernels
    k1 = torch.randn(1, 1, 500, head_dim, device="cuda", dtype=torch.bfloat16)
    v1 = torch.randn(1, 1, 500, head_dim, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 4, 500, head_dim, device="cuda", dtype=torch.bfloat16)
    out = kern(q, k1.expand(1, 4, 500, head_dim), v1.expand(1, 4, 500, head_dim))  # heads stride 0
    assert kern._v2 is not None and kern._v2.schedule == "v2"
    torch.testing.assert_close(out, kern(q, k1, v1), atol=2e-2, rtol=2e-2)  # == MQA through v3
    assert (r := check_kernel_grads(kern, 2, 3, 300)).ok, str(r)


@needs_hopper
@pytest.mark.parametrize("head_dim", [32, 96])
def test_auto_is_v3_for_head_dims_not_multiples_of_64(head_dim):
    kern = ac.compile(presets.causal(head_dim))
    assert kern.schedule == "v3" and kern.plan.reasons[0].startswith("schedule 'auto' on sm_90 -> v3")
    assert (r := check_kernel(kern, 2, 3, 333)).ok, str(r)
    assert (r := check_kernel(kern, 2, 3, 200, 1023, layout="bnhd")).ok, str(r)


# ---------------------------------------------------------------- score_mod forms, polynomial exp2
def _key_bias() -> torch.Tensor:
    return torch.linspace(-2.0, 3.0, 4096)


SCORE_FORMS = {
    # separable, linear column term with a numeric slope (ALiBi-like without a buffer)
    "linear_numeric": lambda s, b, h, q, kv: s - 0.03 * (q - kv),
    # separable, linear column term per head, coefficient of the score != 1
    "linear_head": lambda s, b, h, q, kv: 0.5 * s + (h + 1) * 0.01 * kv - 0.02 * q,
    # separable, non-linear column term (a key bias read from a buffer)
    "key_buffer": (lambda kb: lambda s, b, h, q, kv: s + kb[kv])(_key_bias()),
    # separable with a negative coefficient: the column term stays out of the S accumulator (kSepInAcc off)
    "negative_coef": lambda s, b, h, q, kv: 0.02 * kv - 0.5 * s,
    # separable, row term only (drops out of the softmax, stays in the LSE)
    "row_only": lambda s, b, h, q, kv: s + 0.001 * q * q,
    # a positive constant factor folded into exp2's multiply-add
    "factor": lambda s, b, h, q, kv: 3.0 * torch.tanh(s / 3.0),
    # not separable (q and kv in one term), negative factor: the generic hook
    "generic": lambda s, b, h, q, kv: 2.0 * torch.tanh(s / 2.0) + 0.001 * q * kv / 4096,
}


@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", sorted(SCORE_FORMS))
def test_score_forms(form, causal):
    """Every shape ir/scoreform.py finds (separable linear / non-linear / row-only, positive factor,
    generic) matches the float64 reference, output and LSE (the separable kernels add the dropped row
    term to the LSE)."""
    spec = ac.AttentionSpec(head_dim=64, score_mod=SCORE_FORMS[form], causal=causal, name=form)
    for n in (113, 1023):
        kern = ac.compile(spec, "v3")
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"{form} causal={causal} N={n}: {res}"


@needs_hopper
@pytest.mark.parametrize("poly", [1, 4, 8])
@pytest.mark.parametrize("name", ["plain", "causal", "softcap", "alibi_causal", "dropout"])
def test_exp2_poly(name, poly):
    """The FMA-pipe exponential (ac_exp2_poly) for 1/8, 1/2 and all of the softmax's exponentials."""
    for head_dim, n in ((64, 1023), (128, 113), (256, 517)):
        kern = ac.compile(spec_for(name, head_dim, "bf16", n), "v3", exp2_poly=poly)
        assert kern.kernel_source.plan.exp2_poly == poly
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"{name} d={head_dim} N={n} exp2_poly={poly}: {res}"


@needs_hopper
def test_exp2_poly_fully_masked_rows_and_nan():
    """With every exponential on the polynomial (which gives 2^-126, not 0, for -inf) rows with no
    visible key still give 0 and LSE -inf; a NaN key reaches exactly the rows that see it."""
    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 64) & (kv_idx <= q_idx)

    kern = ac.compile(ac.AttentionSpec(head_dim=64, mask_mod=mask), "v3", exp2_poly=8)
    q, k, v = (torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = kern(q, k, v, return_lse=True)
    assert not torch.isnan(out).any()
    assert (out[:, :, :64] == 0).all()
    assert torch.isinf(lse[:, :, :64]).all() and (lse[:, :, :64] < 0).all()
    causal = ac.compile(presets.causal(64), "v3", exp2_poly=8)
    clean = causal(q, k, v)
    k[0, 1, 150, 3] = float("nan")
    out = causal(q, k, v)
    assert torch.equal(out[:, 0], clean[:, 0])
    assert torch.equal(out[0, 1, :150], clean[0, 1, :150])
    assert bool(torch.isnan(out[0, 1, 150:]).all()), "a row that sees the NaN key is not NaN"


@needs_hopper
@pytest.mark.parametrize("schedule", ["v3", "v2"])
@pytest.mark.parametrize("cap", [30.0, 50.0, 60.0])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_softcap_fixed_offset_extreme_rows(cap, head_dim, schedule):
    """Soft-capping with a fixed softmax offset per row (ir/scorerange.py: the first block's row maximum
    clamped into the safe window; cap 60: too wide, the running maximum) on its worst cases: rows whose
    every score saturates near -cap and rows near +cap, next to ordinary rows, at a ragged length (the
    later blocks' scores exceed or undercut the first block's offset). Output by the error-ratio rule,
    LSE to 2e-3."""
    from attncompiler.reference import eager_attention, error_ratio_check, reference_attention

    kern = ac.compile(presets.softcap(cap, head_dim), schedule)
    assert ("kStaticMax = true" in kern.source) == (cap <= 51.3)
    B_, H_, N = 1, 2, 1023
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(B_, H_, N, head_dim, device="cuda", generator=g) for _ in range(3))
    u = torch.randn(head_dim, device="cuda", generator=g)
    k = u + 0.1 * k                                   # every key close to u
    beta = 5.0 * cap * head_dim ** 0.5 / float(u @ u)  # q = -beta u: every score ~ -5 cap before the cap
    q[:, :, :200] = -beta * u
    q[:, :, 200:400] = beta * u
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    out = torch.full_like(q, float("nan"))
    _, lse = kern(q, k, v, out=out, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, kern.ir, return_lse=True)
    ok, msg = error_ratio_check(out, ref, eager_attention(q, k, v, kern.ir))
    assert ok, f"{schedule} cap {cap} d={head_dim}: {msg}"
    assert float((lse.double() - ref_lse).abs().max()) <= 2e-3


@needs_hopper
def test_softcap_fixed_offset_fully_masked_rows():
    """The fixed offset with the d=64 plan's polynomial exponentials (exp2(-inf) must be exactly 0 there:
    the row maximum no longer marks rows without a visible key): those rows give 0 and LSE -inf, the
    rest match the reference."""
    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= 64) & (kv_idx <= q_idx)

    spec = ac.AttentionSpec(head_dim=64, score_mod=presets.softcap_score_mod(30.0), mask_mod=mask, name="capmask")
    kern = ac.compile(spec, "v3")
    assert kern.kernel_source.plan.exp2_poly > 0 and "kStaticMax = true" in kern.source
    q, k, v = (torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = kern(q, k, v, return_lse=True)
    assert not torch.isnan(out).any()
    assert (out[:, :, :64] == 0).all()
    assert torch.isinf(lse[:, :, :64]).all() and (lse[:, :, :64] < 0).all()
    for n in (113, 1023):
        res = check_kernel(kern, B, H, n)
        assert res.ok, f"N={n}: {res}"


@needs_hopper
@pytest.mark.parametrize("schedule", ["v3", "v2"])
@pytest.mark.parametrize("n", [1, 2, 64])
def test_softcap_fixed_offset_short_rows_exact(n, schedule):
    """Rows whose keys all lie in the first K/V block take that block's maximum, clamped into the offset
    window, as their fixed offset. Where the maximum lies below the window (kStaticMaxLo = 43.3 - 48 log2
    units at cap 30, i.e. every score below about -3.3) no P is 1, so that block's P are summed into l as
    rounded to bf16, the weights P V multiplies: one key gives exactly v (eager's answer) wherever its score
    lies. Before that rounding, such rows came out 1 ulp off (the flaky Nk = 1 failure of 2026-11-22).
    Two and 64 keys: the error-ratio rule (check_kernel, seeded)."""
    kern = ac.compile(presets.softcap(30.0, 128), schedule)
    assert "kStaticMax = true" in kern.source
    if n > 1:
        res = check_kernel(kern, B, H, 113, n, seed=1234 + n)
        assert res.ok, f"Nk={n}: {res}"
        return
    g = torch.Generator(device="cuda").manual_seed(0)
    k, v = (torch.randn(1, 2, 1, 128, device="cuda", generator=g) for _ in range(2))
    q = torch.randn(1, 2, 120, 128, device="cuda", generator=g)
    draws = {
        "inside the window": 0.25 * q,  # scores ~ N(0, 0.25^2)
        "unit normal": q,  # scores ~ N(0, 1): some rows below the window
        "below the window": q[..., :1] * 0.1 - 2.0 * k,  # every score near -2 |k|^2 / sqrt(128) ~ -23 < -3.3
    }
    kb, vb = k.to(torch.bfloat16), v.to(torch.bfloat16)
    for what, qd in draws.items():
        out = kern(qd.to(torch.bfloat16), kb, vb)
        assert torch.equal(out, vb.expand_as(out)), f"{what}: max |out - v| {(out.float() - vb.float()).abs().max()}"


@needs_hopper
@pytest.mark.parametrize("rate", [0.002, 0.02, 0.5])
def test_lazy_rescale_growing_row_maxima(rate):
    """Row maxima that grow along the keys, per K/V block by less than the lazy-rescale slack (8 log2 units:
    the offset stays and P exceeds 1), by about it, and by far more (the offset moves at every block):
    a separable drift (its own softmax path) and a key-dependent stretch of the score (score_mod's)."""
    def drift(score, b, h, q_idx, kv_idx):
        return score + rate * kv_idx

    def stretch(score, b, h, q_idx, kv_idx):
        return score * (1.0 + rate * kv_idx / 64)

    for mod in (drift, stretch):
        for dtype in ("bf16", "fp16"):
            kern = ac.compile(ac.AttentionSpec(head_dim=128, dtype=dtype, score_mod=mod, name=mod.__name__), "v3")
            for n in (1023, 4096):
                res = check_kernel(kern, 1, 2, n)
                assert res.ok, f"{mod.__name__} rate={rate} {dtype} N={n}: {res}"


@needs_hopper
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_kv_descending(name):
    """The K/V walk from the last block down (plan option kv_descending): every preset at seqlens that are not
    multiples of a tile (the ragged block comes first), d = 64 and 128, and the persistent grid."""
    for head_dim in (64, 128):
        for n in (113, 1023, 4096):
            kern = ac.compile(spec_for(name, head_dim, "bf16", n), "v3", kv_descending=True)
            assert kern.kernel_source.plan.kv_descending
            res = check_kernel(kern, B, H, n)
            assert res.ok, f"{name} descending d={head_dim} N={n}: {res}"
    kern = ac.compile(spec_for(name, 128, "fp16", 1023), "v3", kv_descending=True, persistent=True)
    res = check_kernel(kern, B, H, 1023)
    assert res.ok, f"{name} descending persistent fp16: {res}"
    if name in ("plain", "causal", "sliding_window"):
        kern = ac.compile(spec_for(name, 128, "bf16", 1500), "v3", kv_descending=True)
        for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
            res = check_kernel(kern, 2, 3, nq, nk, H_kv=hkv)
            assert res.ok, f"{name} descending GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"


@needs_hopper
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_late_pv_wait(name):
    """Plan option late_pv_wait (the wait for the previous block's P V kept below a masked kernel's softmax): every
    preset at seqlens that are not multiples of a tile, d = 64 / 128 / 256 (and 96 / 192 at one length), fp16, and GQA
    at cross lengths."""
    for head_dim, lengths in ((64, (113, 1023, 4096)), (128, (113, 1023, 4096)), (256, (113, 1023, 4096)),
                              (96, (1023,)), (192, (1023,))):
        for n in lengths:
            kern = ac.compile(spec_for(name, head_dim, "bf16", n), "v3", late_pv_wait=True)
            assert kern.kernel_source.plan.late_pv_wait
            res = check_kernel(kern, B, H, n)
            assert res.ok, f"{name} late_pv_wait d={head_dim} N={n}: {res}"
    kern = ac.compile(spec_for(name, 128, "fp16", 1023), "v3", late_pv_wait=True)
    res = check_kernel(kern, B, H, 1023)
    assert res.ok, f"{name} late_pv_wait fp16: {res}"
    if name in ("plain", "causal", "sliding_window", "document"):
        kern = ac.compile(spec_for(name, 128, "bf16", 1500), "v3", late_pv_wait=True)
        for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
            res = check_kernel(kern, 2, 3, nq, nk, H_kv=hkv)
            assert res.ok, f"{name} late_pv_wait GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"
