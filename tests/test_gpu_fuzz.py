"""GPU fuzzing: fixed seeds of random spec x random shape through the real kernels.

Run on a GPU machine with ``python3 -m pytest -m gpu tests/test_gpu_fuzz.py`` (about 1-2 minutes
on an H100, most of it parallel NVRTC in the module fixture).  The longer run for the device is
``PYTHONPATH=. python3 benchmarks/fuzz_long.py 2000``.

* 60 specs (``attncompiler.fuzz.random_spec(i)``, i < 60) x 4 shapes each = 240 v2 forward cases
  (``check_kernel``: error-ratio rule against the float64 reference, lse to 2e-3);
* every 4th spec x 2 shapes through v1 (30 cases);
* every 3rd spec x 2 shapes through the backward (``check_kernel_grads``: dq, dk, dv; 40 cases);
* on sm_90, every spec x 4 shapes through v3 with the seed's plan options (``fuzz.v3_options``: the
  persistent grid, one or three consumers, the descending walk, ...; 240 cases), and every 3rd spec x 2
  shapes through v3 and the backward that takes v3's LSE (40 cases);
* every other spec (``fuzz.random_decode_spec``: buffers over 4096 positions, no dropout) x 2 decode shapes
  (Nq <= 16 against 512..4096 keys) through the decode schedule with the seed's plan options
  (``fuzz.decode_options``: loaders, unfolded combine, stages, warps; 60 cases).

A failure prints the case's description (preset, flags, the generated mods' source) and shape;
``fuzz.random_spec(i)`` / ``fuzz.random_shape(1000 * i + j)`` rebuild it.
"""
from __future__ import annotations

import functools
import os

import pytest
import torch

from attncompiler import fuzz

pytestmark = pytest.mark.gpu

N_SPECS = 60
SHAPES_PER_SPEC = 4
V1_SPECS = tuple(range(0, N_SPECS, 4))
BWD_SPECS = tuple(range(1, N_SPECS, 3))


@functools.lru_cache(maxsize=None)
def _spec(i: int) -> fuzz.FuzzSpec:
    return fuzz.random_spec(i)


@functools.lru_cache(maxsize=None)
def _decode_spec(i: int) -> fuzz.FuzzSpec:
    return fuzz.random_decode_spec(i)


DECODE_SPECS = tuple(range(0, N_SPECS, 2))


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")


def _shape(i: int, j: int) -> dict:
    return fuzz.random_shape(1000 * i + j)


@pytest.fixture(scope="module", autouse=True)
def _precompile():
    """Every kernel of this module, compiled by NVRTC in parallel processes into the disk cache."""
    from attncompiler.plan.targets import detect_target
    from attncompiler.runtime.compiler import precompile_to_disk

    tgt = detect_target()
    jobs = fuzz.compile_jobs([_spec(i).spec for i in range(N_SPECS)], tgt)
    jobs += fuzz.compile_jobs([_spec(i).spec for i in V1_SPECS], tgt, schedules=("v1",))
    jobs += fuzz.compile_jobs([_spec(i).spec for i in BWD_SPECS], tgt, schedules=(), backward=True)
    if _hopper():
        jobs += fuzz.compile_jobs([_spec(i).spec for i in range(N_SPECS)], tgt, schedules=("v3",),
                                  options=[fuzz.v3_options(i) for i in range(N_SPECS)])
    jobs += fuzz.compile_jobs([_decode_spec(i).spec for i in DECODE_SPECS], tgt, schedules=("decode",),
                              options=[fuzz.decode_options(i) for i in DECODE_SPECS])
    precompile_to_disk(jobs, workers=min(16, os.cpu_count() or 1))
    yield


def _run(i: int, shapes: range, **kw) -> None:
    failures = []
    for j in shapes:
        ok, msg = fuzz.run_case(_spec(i), _shape(i, j), seed=1000 * i + j, **kw)
        if not ok:
            failures.append(f"[spec {i}, shape {j}] {msg}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("i", range(N_SPECS))
def test_fuzz_v2_forward(i: int) -> None:
    _run(i, range(SHAPES_PER_SPEC), schedule="v2")


@pytest.mark.parametrize("i", V1_SPECS)
def test_fuzz_v1_forward(i: int) -> None:
    _run(i, range(2), schedule="v1")


@pytest.mark.parametrize("i", BWD_SPECS)
def test_fuzz_backward(i: int) -> None:
    _run(i, range(2), schedule="v2", backward=True)


@needs_hopper
@pytest.mark.parametrize("i", range(N_SPECS))
def test_fuzz_v3_forward(i: int) -> None:
    _run(i, range(SHAPES_PER_SPEC), schedule="v3", options=fuzz.v3_options(i))


@needs_hopper
@pytest.mark.parametrize("i", BWD_SPECS)
def test_fuzz_v3_backward(i: int) -> None:
    """The backward kernels fed by the v3 forward's output and LSE (shapes 2, 3: not the v2 backward's)."""
    _run(i, range(2, 4), schedule="v3", backward=True, options=fuzz.v3_options(i))


@pytest.mark.parametrize("i", DECODE_SPECS)
def test_fuzz_decode(i: int) -> None:
    failures = []
    for j in range(2):
        shape = fuzz.random_decode_shape(1000 * i + j)
        ok, msg = fuzz.run_case(_decode_spec(i), shape, schedule="decode", seed=1000 * i + j,
                                options=fuzz.decode_options(i))
        if not ok:
            failures.append(f"[decode spec {i}, shape {j}] {msg}")
    assert not failures, "\n\n".join(failures)


def test_fuzz_seed_set_is_large_and_varied() -> None:
    """The fixed set covers >= 200 spec x shape cases and the features the issue names."""
    cases = N_SPECS * SHAPES_PER_SPEC + 2 * len(V1_SPECS) + 2 * len(BWD_SPECS)
    assert cases >= 200
    shapes = [_shape(i, j) for i in range(N_SPECS) for j in range(SHAPES_PER_SPEC)]
    assert any(s["H_kv"] < s["H"] for s in shapes) and any(s["Nq"] != s["Nk"] for s in shapes)
    specs = [_spec(i).spec for i in range(N_SPECS)]
    assert any(s.head_dim != s.head_dim_v for s in specs) and any(s.dropout_p > 0 for s in specs)
