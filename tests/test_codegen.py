"""CPU: render every (schedule x preset/example x head dim) and compile it with nvcc for sm_80 and sm_90a.

Catches codegen breakage without a GPU; prints registers and spills per kernel.
"""
from __future__ import annotations

import importlib.util
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import attncompiler as ac
from _specs import all_specs  # shared with the other render / nvcc tests
from attncompiler.codegen.schedule import get_schedule, schedule_names
from attncompiler.ir.build import build_ir
from attncompiler.plan.targets import get_target
from attncompiler.runtime.compiler import compile_with_nvcc
from attncompiler.spec import presets

ROOT = Path(__file__).parent.parent


def _all_specs(head_dim: int) -> dict[str, ac.AttentionSpec]:
    return all_specs(head_dim)


def _render(spec, schedule: str, arch: str):
    sched = get_schedule(schedule)
    tgt = get_target(arch)
    ir = build_ir(spec)
    return sched.render(ir, sched.make_plan(ir, tgt), tgt)


@pytest.mark.parametrize("schedule", schedule_names())
@pytest.mark.parametrize("head_dim", [64, 128])
def test_render_all_variants(schedule, head_dim):
    for name, spec in _all_specs(head_dim).items():
        ks = _render(spec, schedule, "sm_90")
        assert 'extern "C" __global__' in ks.source and "#include \"attncompiler/" not in ks.source, name
        assert "struct Variant" in ks.source


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("schedule", schedule_names())
@pytest.mark.parametrize("head_dim", [64, 128])
def test_nvcc_compiles_every_variant(schedule, head_dim, arch):
    if schedule == "v3" and arch != "sm_90a":
        pytest.skip("v3 is sm_90a-only (tests/test_v3_codegen.py checks the error on other targets)")
    jobs = {name: _render(spec, schedule, arch.rstrip("a")).source for name, spec in _all_specs(head_dim).items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, arch), jobs.values())))
    for name, rep in reports.items():
        print(f"{schedule} d={head_dim} {arch} {name:28s}: {rep.registers:3d} regs, "
              f"spill {rep.spill_stores}/{rep.spill_loads} B, stack {rep.stack_bytes} B")
        assert rep.registers > 0


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [32, 96, 256])
def test_nvcc_other_head_dims(head_dim):
    for schedule in schedule_names():
        if schedule == "v3" and head_dim % 64:
            continue  # v3 tiles head dims in 64-column TMA boxes (tests/test_v3_codegen.py checks the error)
        for spec in (presets.plain(head_dim), presets.causal(head_dim), presets.softcap(30.0, head_dim)):
            rep = compile_with_nvcc(_render(spec, schedule, "sm_90").source, "sm_90a")
            print(f"{schedule} d={head_dim} {spec.name}: {rep.registers} regs, spill {rep.spill_stores} B")


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.stem)
def test_example_main_runs(path, capsys):
    """Every example's main() runs (on a CPU machine: plans and renders for sm_90)."""
    spec = importlib.util.spec_from_file_location(f"exmain_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main() == 0
    assert "lines of CUDA rendered" in capsys.readouterr().out or __import__("torch").cuda.is_available()
