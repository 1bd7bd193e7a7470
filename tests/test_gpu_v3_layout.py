"""GPU runs of the v3 main loop's layout options (plan/v3_softmax.py): the other number of softmax copies than the
model's, and half blocks, against the float64 reference (attncompiler.testing.check_kernel, the error-ratio rule):
masked presets at seqlens that are not multiples of a tile, both grids, fp16, GQA at cross lengths, and
Nq != Nk (windows and diagonals offset from the tile grid)."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import check_kernel

pytestmark = pytest.mark.gpu

B, H = 2, 3
needs_hopper = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                                  reason="v3 needs an sm_90 GPU")


def _masked(name: str, d: int, dtype: str, n: int) -> ac.AttentionSpec:
    if name == "sliding_window":
        return presets.sliding_window(200, d, dtype=dtype)  # narrow enough for both edges inside N = 113 .. 1023
    if name == "sliding_window1024":
        return presets.sliding_window(1024, d, dtype=dtype)
    if name == "alibi_causal":
        return presets.alibi(presets.alibi_slopes(H), d, dtype=dtype, causal=True)
    if name == "softcap_causal":
        return presets.softcap(30.0, d, dtype=dtype, mask_mod=presets.causal_mask)
    return presets.get_preset(name, head_dim=d, dtype=dtype, num_heads=H, seqlen=n)


NAMES = ("causal", "sliding_window", "sliding_window1024", "prefix_lm", "document", "alibi_causal", "softcap_causal")


@needs_hopper
@pytest.mark.parametrize("name", NAMES)
def test_half_blocks(name):
    """half_blocks=True: d = 64 / 128 (and 256 at BLOCK_N 64) at N 113 / 1023 / 4096, both grids, fp16, GQA."""
    for d, lengths, opts in ((64, (113, 1023, 4096), {}), (128, (113, 1023, 4096), {}),
                             (128, (1023,), {"persistent": True}), (128, (1023,), {"persistent": False}),
                             (256, (1023,), {"block_n": 64})):
        for n in lengths:
            kern = ac.compile(_masked(name, d, "bf16", n), "v3", half_blocks=True, **opts)
            assert kern.kernel_source.plan.half_blocks
            res = check_kernel(kern, B, H, n)
            assert res.ok, f"{name} half_blocks d={d} N={n} {opts}: {res}"
    kern = ac.compile(_masked(name, 128, "fp16", 1023), "v3", half_blocks=True)
    res = check_kernel(kern, B, H, 1023)
    assert res.ok, f"{name} half_blocks fp16: {res}"
    if name != "document":  # (its ids are per query and key position of one length)
        kern = ac.compile(_masked(name, 128, "bf16", 1500), "v3", half_blocks=True)
        for hkv, nq, nk in ((1, 517, 1500), (3, 1500, 517)):
            res = check_kernel(kern, 2, 3, nq, nk, H_kv=hkv)
            assert res.ok, f"{name} half_blocks GQA H_kv={hkv} Nq={nq} Nk={nk}: {res}"


@needs_hopper
@pytest.mark.parametrize("name", NAMES + ("plain", "alibi", "softcap"))
def test_other_softmax_copies(name):
    """The number of softmax copies the model does not choose, at d = 64 / 128 / 256, N 113 / 1023."""
    make = (lambda d, n: presets.get_preset(name, head_dim=d, num_heads=H, seqlen=n)) if name in (
        "plain", "alibi", "softcap") else (lambda d, n: _masked(name, d, "bf16", n))
    if name == "alibi":
        make = lambda d, n: presets.alibi(presets.alibi_slopes(H), d)  # noqa: E731
    for d in (64, 128, 256):
        for n in (113, 1023):
            spec = make(d, n)
            model = ac.compile(spec, "v3", build=False).kernel_source.plan.softmax_copies
            kern = ac.compile(spec, "v3", softmax_copies=3 - model)
            assert kern.kernel_source.plan.softmax_copies == 3 - model
            res = check_kernel(kern, B, H, n)
            assert res.ok, f"{name} softmax_copies={3 - model} d={d} N={n}: {res}"
