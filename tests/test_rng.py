"""CPU: dropout's [seed, offset] pair: host values for eager calls, a device pair read by the kernels for calls a CUDA
graph replays (attncompiler/runtime/rng.py; the GPU side is tests/test_gpu_cuda_graphs.py)."""
from __future__ import annotations

import ctypes

import pytest
import torch

from attncompiler import autograd
from attncompiler.ir.build import build_ir
from attncompiler.runtime.launch import AttnInputs, pack_params
from attncompiler.runtime import rng as rng_mod
from attncompiler.runtime.rng import captured_rng, device_rng, host_values, rng_parts, signed64, wants_device_rng
from attncompiler.spec import presets

CPU = torch.device("cpu")


def test_signed64_wraps_to_twos_complement() -> None:
    assert signed64(5) == 5
    assert signed64(2**63) == -(2**63)
    assert signed64(2**64 - 1) == -1
    assert signed64(-3) == -3
    assert signed64(2**64 + 7) == 7


def test_pair_on_the_host_only_off_cuda_or_outside_tracing() -> None:
    assert not wants_device_rng(None)
    assert not wants_device_rng(CPU)
    rng = autograd.make_rng(5, 7, CPU)
    assert rng.device == CPU and rng.tolist() == [5, 7]
    rnd = autograd.make_rng(None, 3)
    assert rnd.dtype == torch.int64 and rnd.tolist()[1] == 3 and 0 <= rnd.tolist()[0] < 2**62
    assert autograd.make_rng(2**64 - 1, 2**63).tolist() == [-1, -(2**63)]


def test_device_pair_made_by_ops() -> None:
    """device_rng on the CPU device (the same ops a CUDA device runs): [seed, offset], a fresh seed when None."""
    assert device_rng(11, 4, CPU).tolist() == [11, 4]
    assert device_rng(2**63 + 1, 0, CPU).tolist() == [-(2**63) + 1, 0]
    seeds = {device_rng(None, 9, CPU).tolist()[0] for _ in range(8)}
    assert len(seeds) > 1 and all(0 <= s < 2**62 for s in seeds)


def test_rng_parts() -> None:
    assert host_values(None) == (0, 0)
    assert host_values(torch.tensor([-1, 3])) == (2**64 - 1, 3)
    assert rng_parts(None) == (0, 0, None)
    assert rng_parts(torch.tensor([5, 7])) == (5, 7, None)
    assert rng_parts(torch.tensor([-1, -2])) == (2**64 - 1, 2**64 - 2, None)
    assert autograd.uses_graph_safe_rng(None)
    assert not autograd.uses_graph_safe_rng(torch.tensor([5, 7]))


def test_captured_rng_only_for_a_random_seed_call_under_capture(monkeypatch) -> None:
    """The one rule both forwards (padded and packed) follow: a device pair for a dropout call without a seed while
    the stream captures; None (host values) otherwise: no capture, a CPU device, no dropout, or a fixed seed."""
    cuda = torch.device("cuda", 0)
    drawn: list[tuple] = []
    monkeypatch.setattr(rng_mod, "device_rng", lambda s, o, d: drawn.append((s, o, d)) or torch.tensor([1, o]))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert captured_rng(0.1, None, 3, cuda) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert captured_rng(0.0, None, 3, cuda) is None
    assert captured_rng(0.1, 42, 3, cuda) is None
    assert captured_rng(0.1, None, 3, CPU) is None
    assert drawn == []
    assert captured_rng(0.1, None, 3, cuda).tolist() == [1, 3]
    assert drawn == [(None, 3, cuda)]


@pytest.mark.parametrize("state", [None, torch.tensor([123, 4], dtype=torch.int64)])
def test_pack_params_passes_the_device_pair(state) -> None:
    """``AttnParams.rng_state`` holds the pair's address (null without one), beside the host seed and offset."""
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    dims = AttnInputs(1, 2, 2, 64, 64, 64, 64)
    P, _ = pack_params(q, q, q, q, None, None, dims, scale=1.0, dropout_p=0.1, seed=99, offset=3,
                       ir=build_ir(presets.causal(64)), buffers=[], rng_state=state)
    assert P.seed == 99 and P.offset == 3
    want = state.data_ptr() if state is not None else None
    assert P.rng_state == want
    fields = [f[0] for f in type(P)._fields_]
    assert "rng_state" in fields and dict(type(P)._fields_)["rng_state"] is ctypes.c_void_p


def _dropout_sources(head_dim: int = 64) -> dict[str, tuple[object, str]]:
    """name -> (rendered source, nvcc arch) of every schedule's dropout kernels, forward and backward."""
    import attncompiler as ac
    from attncompiler.codegen.schedule import get_schedule
    from attncompiler.plan.targets import get_target
    from attncompiler.runtime.backward import bwd_source

    ir = build_ir(ac.AttentionSpec(head_dim=head_dim, causal=True, dropout_p=0.1, name="dropout"))
    out: dict[str, tuple[object, str]] = {}
    for arch in ("sm_80", "sm_90"):
        t = get_target(arch)
        nv = "sm_90a" if arch == "sm_90" else arch
        for name in ("v1", "v2", "decode") + (("v3",) if arch == "sm_90" else ()):
            sched = get_schedule(name)
            out[f"{name} {arch}"] = (sched.render(ir, sched.make_plan(ir, t), t), nv)
        out[f"bwd {arch}"] = (bwd_source(ir, t), nv)
    return out


def test_device_rng_variant_prepends_the_switch() -> None:
    from attncompiler.runtime.rng import DEVICE_RNG_DEFINE, device_rng_variant

    for name, (src, _) in _dropout_sources().items():
        var = device_rng_variant(src)
        assert var is device_rng_variant(src), name  # cached: the compile caches key on the text
        assert var.source == DEVICE_RNG_DEFINE + src.source, name
        assert "ac_rng_load(p.rng_state)" in var.source and "#ifdef AC_DROPOUT_RNG_ON_DEVICE" in var.source, name
        assert dataclasses_equal_but_source(var, src), name


def dataclasses_equal_but_source(a, b) -> bool:
    import dataclasses

    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(a) if f.name != "source")


@pytest.mark.nvcc
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_the_device_rng_variants() -> None:
    """Every schedule's dropout kernels, forward and backward, built to read the device pair: they compile for
    sm_80 / sm_90a, and the PTX loads the pair and makes its words uniform (redux.sync)."""
    from concurrent.futures import ThreadPoolExecutor

    from attncompiler.runtime.compiler import compile_with_nvcc
    from attncompiler.runtime.rng import device_rng_variant

    jobs = {name: (device_rng_variant(src).source, arch) for name, (src, arch) in _dropout_sources().items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        reps = dict(zip(jobs, pool.map(lambda j: compile_with_nvcc(j[0], j[1]), jobs.values())))
    for name, rep in reps.items():
        print(f"device rng {name}: {rep.registers} regs, spill {rep.spill_stores}/{rep.spill_loads} B")
        assert rep.registers > 0, name
    from _nvcc import ptx_sm90a

    ptx = ptx_sm90a(jobs["v3 sm_90"][0])
    assert "redux.sync.or.b32" in ptx and "ld.global.nc" in ptx
