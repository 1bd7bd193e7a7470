"""The environment variables attncompiler reads are declared in attncompiler/env.py and read only there."""
from __future__ import annotations

import re
from pathlib import Path

from attncompiler import env
from attncompiler.runtime import compiler

PKG = Path(env.__file__).resolve().parent


def test_environment_is_read_only_in_env_module() -> None:
    readers = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "env.py" and path.parent == PKG:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.environ(\.get|\[)|os\.getenv", line):
                readers.append(f"{path.relative_to(PKG)}:{n}: {line.strip()}")
    assert readers == [], "environment read outside env.py:\n" + "\n".join(readers)


def test_every_declared_variable_is_documented() -> None:
    doc = env.__doc__ or ""
    for var in env.ENV_VARS:
        assert var in doc, f"{var} is declared in ENV_VARS but not in env.py's table"


def test_cuda_toolkit_includes_order(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "a"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "b"))
    assert env.cuda_toolkit_includes() == [str(tmp_path / "a" / "include"), str(tmp_path / "b" / "include")]
    monkeypatch.delenv("CUDA_PATH")
    assert env.cuda_toolkit_includes() == [str(tmp_path / "b" / "include")]


def test_nvrtc_include_search_uses_the_toolkit_variables(monkeypatch, tmp_path) -> None:
    inc = tmp_path / "toolkit" / "include"
    inc.mkdir(parents=True)
    (inc / "cuda_fp16.h").write_text("")
    monkeypatch.delenv("ATTNCOMPILER_CUDA_INCLUDE", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "toolkit"))
    assert str(inc) in compiler._cuda_include_dirs()


def test_bench_out_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("OUT", raising=False)
    assert env.bench_out_dir() is None
    monkeypatch.setenv("OUT", str(tmp_path))
    assert env.bench_out_dir() == tmp_path
