"""Compile latency: each implementation's first call in a fresh process with empty caches, and warm.

For every impl of the :class:`~.grid.LatencyGrid` the parent starts ``python -m
attncompiler.bench.latency --child '<json>'`` with empty temporary ``ATTNCOMPILER_CACHE_DIR``,
``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``.  The child times, on one causal bf16 shape:

* ``import_s``: importing torch and the package (attncompiler, or torch's flex_attention);
* ``compile_s`` (attncompiler): ``attncompiler.compile(spec, schedule)`` -- trace, plan, render,
  NVRTC, load; ``first_call_s``: that plus the first kernel call, synchronized -- the cold number;
  for FlexAttention ``first_call_s`` is its first (torch.compile'd) call, ``block_mask_s`` the
  ``create_block_mask`` before it;
* ``warm_s``: the same again in the same process (attncompiler: compiling an equal spec, a new
  object, hits the in-memory cache; FlexAttention: the compiled function's second call);
* ``first_bwd_s`` / ``warm_bwd_s``: the first and second forward+backward with inputs that require
  grad (attncompiler: NVRTC of the v2 backward kernels; FlexAttention: the training graph).

The child prints one ``@@RESULT {json}`` line; a child that fails, hangs past the timeout or prints
no result becomes an error row.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .grid import LatencyGrid

__all__ = ["child_main", "child_command", "child_env", "parse_child_output", "run_child", "run_latency"]

RESULT_TAG = "@@RESULT "


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _child_ours(cfg: dict[str, Any], t_start: float) -> dict[str, Any]:
    import torch

    import attncompiler as ac
    from attncompiler.runtime.compiler import compile_stats
    from attncompiler.spec import presets

    res: dict[str, Any] = {"import_s": time.perf_counter() - t_start}
    B, H, N, d, sched = cfg["B"], cfg["H"], cfg["N"], cfg["d"], cfg["impl"]
    make_spec = (lambda: presets.causal(d)) if cfg["causal"] else (lambda: presets.plain(d))
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    _sync()
    t0 = time.perf_counter()
    # One-time runtime start-up, paid by the first compile of a process: importing CuPy and
    # loading NVRTC.  Timed apart so that compile_s is the per-variant cost; first_call_s
    # still counts everything from here.
    import cupy  # noqa: F401
    from cupy_backends.cuda.libs import nvrtc

    nvrtc.getVersion()
    t1 = time.perf_counter()
    res["runtime_init_s"] = t1 - t0
    kern = ac.compile(make_spec(), sched)
    res["compile_s"] = time.perf_counter() - t1
    kern(q, k, v)
    _sync()
    res["first_call_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ac.compile(make_spec(), sched)(q, k, v)
    _sync()
    res["warm_s"] = time.perf_counter() - t0
    # A second, different variant in the same process: what each new variant costs once the
    # runtime is up (trace + plan + render + NVRTC + load + first call).
    t0 = time.perf_counter()
    ac.compile(presets.softcap(30.0, d, causal=cfg["causal"]), sched)(q, k, v)
    _sync()
    res["next_variant_s"] = time.perf_counter() - t0
    if cfg.get("backward", True):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        dout = torch.randn_like(q)
        for name in ("first_bwd_s", "warm_bwd_s"):
            t0 = time.perf_counter()
            torch.autograd.grad(kern(qg, kg, vg), (qg, kg, vg), dout)
            _sync()
            res[name] = time.perf_counter() - t0
    res["compile_stats"] = compile_stats()
    return res


def _child_flex(cfg: dict[str, Any], t_start: float) -> dict[str, Any]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    res: dict[str, Any] = {"import_s": time.perf_counter() - t_start}
    B, H, N, d = cfg["B"], cfg["H"], cfg["N"], cfg["d"]
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    _sync()
    flex = torch.compile(flex_attention)  # what a user writes

    def causal(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return qi >= ki
    t0 = time.perf_counter()
    bm = create_block_mask(causal, None, None, N, N, device="cuda") if cfg["causal"] else None
    _sync()
    res["block_mask_s"] = time.perf_counter() - t0
    for name in ("first_call_s", "warm_s"):
        t0 = time.perf_counter()
        with torch.no_grad():
            flex(q, k, v, block_mask=bm)
        _sync()
        res[name] = time.perf_counter() - t0
    if cfg.get("backward", True):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        dout = torch.randn_like(q)
        for name in ("first_bwd_s", "warm_bwd_s"):
            t0 = time.perf_counter()
            torch.autograd.grad(flex(qg, kg, vg, block_mask=bm), (qg, kg, vg), dout)
            _sync()
            res[name] = time.perf_counter() - t0
    return res


def child_main(argv: list[str] | None = None) -> int:
    """Entry of the child process: ``--child '<json config>'``; prints ``@@RESULT {json}``."""
    t_start = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--child":
        print("usage: python -m attncompiler.bench.latency --child '<json>'", file=sys.stderr)
        return 2
    cfg = json.loads(argv[1])
    try:
        res = _child_flex(cfg, t_start) if cfg["impl"] == "flex" else _child_ours(cfg, t_start)
        res["status"] = "ok"
    except BaseException as e:  # reported to the parent as a row
        res = {"status": "error", "error": f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]}
    print(RESULT_TAG + json.dumps(res), flush=True)
    return 0 if res["status"] == "ok" else 1


def child_command(cfg: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "attncompiler.bench.latency", "--child", json.dumps(cfg)]


def child_env(tmp: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment with empty cache dirs under ``tmp`` and this package importable."""
    env = dict(os.environ if base is None else base)
    env["ATTNCOMPILER_CACHE_DIR"] = str(tmp / "attncompiler")
    env.pop("ATTNCOMPILER_TUNED_DIR", None)
    env.pop("ATTNCOMPILER_DISABLE_CACHE", None)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")
    env["TRITON_CACHE_DIR"] = str(tmp / "triton")
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding attncompiler/
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def parse_child_output(stdout: str) -> dict[str, Any] | None:
    """The last ``@@RESULT`` line's JSON, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            try:
                out = json.loads(line[len(RESULT_TAG):])
            except json.JSONDecodeError:
                return None
            return out if isinstance(out, dict) else None
    return None


def run_child(cfg: dict[str, Any], timeout_s: float, command: list[str] | None = None) -> dict[str, Any]:
    """Run one child in fresh empty cache dirs; its result, or a status "error" dict."""
    tmp = Path(tempfile.mkdtemp(prefix="attncompiler-latency-"))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command or child_command(cfg), env=child_env(tmp), capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"timed out after {timeout_s:.0f} s", "process_s": timeout_s}
    except OSError as e:
        return {"status": "error", "error": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = parse_child_output(proc.stdout)
    if res is None:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        res = {"status": "error", "error": f"exit {proc.returncode}, no result: {tail}"[:400]}
    res["process_s"] = time.perf_counter() - t0
    return res


def run_latency(grid: LatencyGrid, record: Callable[..., None], *, step: Callable[[str], None] | None = None,
                expired: Callable[[], bool] | None = None, runner: Callable[..., dict[str, Any]] = run_child) -> None:
    """One child per impl (sequentially: compile time is CPU time), each recorded as a row."""
    B, H, N, d = grid.batch, grid.heads, grid.seqlen, grid.head_dim
    for impl in grid.impls:
        base = dict(section="latency", impl=impl, d=d, N=N, B=B, H=H, causal=grid.causal)
        if expired is not None and expired():
            record(**base, status="skipped", error="time budget")
        else:
            cfg = dict(impl=impl, B=B, H=H, N=N, d=d, causal=grid.causal, backward=impl != "v1")
            res = runner(cfg, grid.timeout_s)
            record(**base, **res)
        if step is not None:
            step(f"latency {impl}")


if __name__ == "__main__":
    sys.exit(child_main())
