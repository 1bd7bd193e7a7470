"""The wheel ships the templates: build it, install it into a fresh venv, render and compile a kernel from it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_wheel_contains_templates_and_compiles_a_kernel(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True)
    (whl,) = wheels.glob("attncompiler-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    for must in ("attncompiler/templates/v2_fwd.cu.j2", "attncompiler/templates/v1_fwd.cu.j2",
                 "attncompiler/templates/include/attncompiler/v2_fwd.cuh",
                 "attncompiler/templates/include/attncompiler/common.cuh",
                 "attncompiler/templates/include/attncompiler/ranges.cuh"):  # included by other headers
        assert must in names, f"{must} missing from {whl.name}"
    # No PYTHONPATH: a source checkout on it (with the egg-info `pip wheel` leaves) would look installed.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", str(whl)], check=True,
                   env=env, cwd=tmp_path)
    code = (
        "import attncompiler, attncompiler.codegen.render as r, shutil\n"
        "from attncompiler.spec import presets\n"
        "from attncompiler.codegen.schedule import get_schedule\n"
        "from attncompiler.ir.build import build_ir\n"
        "from attncompiler.plan.targets import get_target\n"
        "assert 'site-packages' in attncompiler.__file__, attncompiler.__file__\n"
        "assert 'site-packages' in str(r.templates_dir()), r.templates_dir()\n"
        "ir = build_ir(presets.causal(64)); t = get_target('sm_80'); s = get_schedule('v2')\n"
        "ks = s.render(ir, s.make_plan(ir, t), t)\n"
        "if shutil.which('nvcc'):\n"
        "    from attncompiler.runtime.compiler import compile_with_nvcc\n"
        "    print('registers', compile_with_nvcc(ks.source, 'sm_80').registers)\n"
        "print('ok', len(ks.source))\n"
    )
    res = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok" in res.stdout
