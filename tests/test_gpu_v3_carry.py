"""GPU runs of carried tiles (plan option ``carry_tiles``, plan/v3_carry.py): on the persistent grid a tile's first S
GEMM and softmax run in the previous tile's tail. Shapes with several tiles per CTA (B * H * query blocks > the SM
count), against the float64 reference by the error-ratio rule, and bit-identical O and LSE to the same plan without
carrying (the arithmetic is the same: only when it runs moves)."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel, random_qkv

pytestmark = pytest.mark.gpu

needs_hopper = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                                  reason="v3 needs an sm_90 GPU")

CARRY = {"persistent": True, "tma_store_o": True, "carry_tiles": True}


def _spec(name: str, d: int, dtype: str = "bf16", H: int = 8) -> ac.AttentionSpec:
    if name == "plain":
        return presets.plain(d, dtype=dtype)
    if name == "sliding_window":
        return presets.sliding_window(200, d, dtype=dtype)
    if name == "sliding_window1024":
        return presets.sliding_window(1024, d, dtype=dtype)
    if name == "causal":
        return presets.causal(d, dtype=dtype)
    if name == "alibi":
        return presets.alibi(presets.alibi_slopes(H), d, dtype=dtype)
    if name == "softcap":
        return presets.softcap(30.0, d, dtype=dtype)
    if name == "late_rows":  # rows below 300 see no key: some tiles' walks are empty (nothing carried into them)
        return presets.plain(d, dtype=dtype, mask_mod=lambda b, h, q, kv: (q >= 300) & (kv <= q), name="late_rows")
    if name == "dropout":
        return presets.plain(d, dtype=dtype, dropout_p=0.1)
    raise KeyError(name)


NAMES = ("plain", "sliding_window", "sliding_window1024", "causal", "alibi", "softcap", "late_rows", "dropout")
#: (B, H, N): several tiles per CTA on 132 SMs (N 1023 at BLOCK_M 128: 8 query blocks x 48 = 384 tiles)
SHAPES = ((4, 12, 1023), (8, 48, 113), (2, 8, 2500))


def _run(kern, B, H, N, seed=7):
    ir = kern.ir
    dt = torch.bfloat16 if ir.dtype == "bf16" else torch.float16
    q, k, v = random_qkv(B, H, N, N, ir.head_dim, ir.head_dim_v, dt,
                         generator=torch.Generator().manual_seed(seed))
    out = torch.full((B, H, N, ir.head_dim_v), float("nan"), device=q.device, dtype=dt)
    _, lse = kern(q, k, v, out=out, return_lse=True, seed=seed)
    return out, lse


@needs_hopper
@pytest.mark.parametrize("name", NAMES)
def test_carry_tiles(name):
    """carry_tiles at d = 64 / 128: error-ratio rule, and bit-identical to the persistent plan without it."""
    for d in (64, 128):
        spec = _spec(name, d)
        try:
            kern = ac.compile(spec, "v3", **CARRY)
        except ValueError as e:  # the planner refuses (a mask with BLOCK_N < BLOCK_M): says why
            assert "carry_tiles expected" in str(e), str(e)
            continue
        plan = kern.kernel_source.plan
        assert plan.carry_tiles and plan.persistent
        base = ac.compile(spec, "v3", **{**plan.options, "carry_tiles": False, "stages": plan.stages})
        for B, H, N in SHAPES:
            res = check_kernel(kern, B, H, N)
            assert res.ok, f"{name} carry d={d} B={B} H={H} N={N}: {res}"
            o1, l1 = _run(kern, B, H, N)
            o0, l0 = _run(base, B, H, N)
            assert torch.equal(o1, o0) and torch.equal(l1, l0), f"{name} d={d} N={N}: carried != not carried"


@needs_hopper
def test_carry_tiles_fp16_gqa_cross():
    """fp16, GQA at cross lengths, the (B, N, H, d) layout."""
    for name in ("plain", "sliding_window", "causal"):
        kern = ac.compile(_spec(name, 128, "fp16"), "v3", **CARRY)
        res = check_kernel(kern, 4, 12, 1023)
        assert res.ok, f"{name} fp16: {res}"
        kern = ac.compile(_spec(name, 128), "v3", **CARRY)
        for hkv, nq, nk in ((1, 517, 1500), (4, 1500, 517)):
            res = check_kernel(kern, 4, 12, nq, nk, H_kv=hkv)
            assert res.ok, f"{name} GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"
        res = check_kernel(kern, 4, 12, 1023, layout="bnhd")
        assert res.ok, f"{name} bnhd: {res}"
