"""GPU: B * H past 65535, the launch grid's y limit, which the grids once held B * H on (``InputError`` above it).

The grids now put the heads (query or K/V heads) on y and the batch, or the packed sequences, on z (common.cuh's
``ac_grid_bh``), so many short sequences run as one launch: windowed vision attention (thousands of windows times the
heads), a large decode batch. Each schedule runs at B * H just past 65535 against the float64 reference (error-ratio
rule): the v2 and v3 forwards (the v3 one-tile-per-CTA grid and its persistent grid), the v3 and v2 backwards, packed
sequences forward and backward, and decode with its split and combine kernels (and with fold_combine's counters, more
than one arena holds)."""
from __future__ import annotations

import random

import pytest
import torch

import attncompiler as ac
from attncompiler.runtime import decode as rt
from attncompiler.runtime.counters import ARENA_INTS
from attncompiler.runtime.launch import AttnInputs, InputError
from attncompiler.spec import presets
from attncompiler.testing import check_kernel, check_kernel_grads
from attncompiler.testing_varlen import check_varlen_grads, check_varlen_kernel

pytestmark = pytest.mark.gpu

B, H = 4099, 16  # B * H = 65584: past the old y limit, and batch indices reach 4098 on z
assert B * H > 65535


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")


def _free() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("schedule, spec, options", [
    ("v2", presets.causal(64), {}),
    ("v2", presets.plain(64), {}),
    pytest.param("v3", presets.causal(64), {"persistent": False}, marks=needs_hopper),
    pytest.param("v3", presets.plain(64), {}, marks=needs_hopper),
], ids=["v2-causal", "v2-plain", "v3-causal-grid", "v3-plain-default"])
def test_gpu_forward_past_grid_y(schedule: str, spec: ac.AttentionSpec, options: dict) -> None:
    kern = ac.compile(spec, schedule, **options)
    res = check_kernel(kern, B, H, 77, seed=31)
    _free()
    assert res.ok, str(res)


@pytest.mark.parametrize("backward", [
    pytest.param({}, marks=needs_hopper, id="v3"),
    pytest.param({"deterministic": True}, marks=needs_hopper, id="v3-deterministic"),
    pytest.param({"schedule": "v2"}, id="v2"),
])
def test_gpu_backward_past_grid_y(backward: dict) -> None:
    kern = ac.compile(presets.causal(64), "v3" if _hopper() else "v2")
    options = dict(backward)
    deterministic = options.pop("deterministic", False)
    kern.backward_options = options
    res = check_kernel_grads(kern, B, H, 37, seed=32, deterministic=deterministic)
    _free()
    assert res.ok, str(res)


def _packed_lens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 40) for _ in range(n)]


def test_gpu_packed_sequences_past_grid_y() -> None:
    """1100 packed sequences x 64 heads (70400 (sequence, head) pairs): forward and backward."""
    kern = ac.compile(presets.causal(64))
    lens = _packed_lens(1100, 33)
    res = check_varlen_kernel(kern, lens, H=64, seed=33)
    assert res.ok, str(res)
    grads = check_varlen_grads(kern, lens, H=64, seed=34)
    _free()
    assert grads.ok, str(grads)


def test_gpu_decode_past_grid_y(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode at B * H_kv = 80000 (B on z): its own split choice, then two splits forced at two row blocks (the split
    kernel's x holds split and row block), with the combine kernel and with fold_combine, whose 160000 counters are
    more than an arena holds (the workspace's own, zeroed in the call)."""
    Bd, Hd, Hkv = 40000, 16, 2
    for opts in ({}, {"fold_combine": True}):
        kern = ac.compile(presets.causal(64), "decode", **opts)
        res = check_kernel(kern, Bd, Hd, 1, 65, H_kv=Hkv, seed=35)
        assert res.ok, f"{opts}: {res}"
    real = rt.split_choice
    monkeypatch.setattr(rt, "split_choice", lambda plan, dims, num_splits=None: real(plan, dims, 2))
    for opts in ({}, {"fold_combine": True}):
        kern = ac.compile(presets.causal(64), "decode", **opts)
        dims = AttnInputs(Bd, Hd, Hkv, 3, 65, 64, 64)  # 8 heads x 3 queries: 2 row blocks of 16
        assert (rt.split_choice(kern.plan, dims).num_splits, rt.split_choice(kern.plan, dims).row_blocks) == (2, 2)
        if opts:
            assert rt.counter_slice(kern.plan, rt.split_choice(kern.plan, dims), dims)[1] > ARENA_INTS
        res = check_kernel(kern, Bd, Hd, 3, 65, H_kv=Hkv, seed=36)
        assert res.ok, f"two splits, {opts}: {res}"
    _free()


def test_gpu_batch_or_heads_past_grid_z_refused() -> None:
    """The limits that stay: B and H each at most 65535 (z and y), said before anything launches."""
    kern = ac.compile(presets.causal(64), "v2")
    one = torch.randn(1, 1, 1, 64, device="cuda").to(torch.bfloat16)
    with pytest.raises(InputError, match=r"batch and heads: expected each at most 65535.*got B=65536, H=1"):
        kern(*(one.expand(65536, 1, 1, 64) for _ in range(3)))
    with pytest.raises(InputError, match=r"got B=1, H=65536"):
        kern(*(one.expand(1, 65536, 1, 64) for _ in range(3)))
