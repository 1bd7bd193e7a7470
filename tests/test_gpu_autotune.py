"""GPU: the autotuner benchmarks feasible plans, keeps a correct one, persists it, and a second process
and compile(schedule="auto") reuse it without benchmarking again."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).parent.parent
SHAPE = (1, 4, 1024, 64)


@pytest.fixture()
def tuned_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "tuned"
    monkeypatch.setenv("ATTNCOMPILER_TUNED_DIR", str(d))
    monkeypatch.delenv("ATTNCOMPILER_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("ATTNCOMPILER_USE_TUNED", raising=False)
    return d


def _tune(spec, **kw):
    from attncompiler.runtime.autotune import autotune
    return autotune(spec, SHAPE, max_candidates=4, reps=3, progress=False, **kw)


def test_autotune_returns_a_feasible_checked_plan(tuned_dir: Path) -> None:
    import attncompiler as ac
    from attncompiler.ir.build import build_ir
    from attncompiler.plan import detect_target, plan_v2
    from attncompiler.runtime.autotune import format_tune_result, tune_stats
    from attncompiler.spec import presets
    from attncompiler.testing import check_kernel

    spec = presets.causal(64)
    before = tune_stats()["benchmarks"]
    res = _tune(spec)
    print(format_tune_result(res))
    timed = tune_stats()["benchmarks"] - before  # candidates that compiled and passed the check
    failed = [c for c in res.candidates if not math.isfinite(c.ms)]
    assert not res.from_cache and 1 <= timed == len(res.candidates) - len(failed) and len(res.candidates) <= 4
    assert not failed, f"candidates failed: {[(c.options, c.error) for c in failed]}"
    assert math.isfinite(res.ms) and res.ms <= res.default_ms
    assert res.candidates[0].options == res.default_options  # the model's choice is always measured
    p = plan_v2(build_ir(spec), detect_target(), **res.options)  # feasible for the planner
    assert p.options == dict(res.options)
    kern = ac.compile(spec, "v2", **res.options)
    for n in (1, 333, 1024):
        r = check_kernel(kern, 2, 4, n)
        assert r.ok, str(r)
    doc = json.loads((tuned_dir / "plans.json").read_text())
    assert list(doc["entries"]) == [res.key.digest()]
    assert res.key.seqlen_bucket == 1024 and res.key.head_dim == 64


def test_second_process_reuses_the_cache(tuned_dir: Path) -> None:
    from attncompiler.spec import presets

    first = _tune(presets.causal(64))
    code = textwrap.dedent(f"""
        import json
        from attncompiler.runtime.autotune import autotune, tune_stats
        from attncompiler.spec import presets
        res = autotune(presets.causal(64), (1, 4, 1000, 64), max_candidates=4, reps=3, progress=False)
        print(json.dumps({{"stats": tune_stats(), "from_cache": res.from_cache, "options": dict(res.options)}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNCOMPILER_TUNED_DIR": str(tuned_dir)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["stats"]["benchmarks"] == 0 and got["stats"]["tunes"] == 0 and got["stats"]["cache_hits"] == 1
    assert got["from_cache"] and got["options"] == dict(first.options)  # N = 1000 is in the 1024 bucket


def test_compile_auto_picks_the_tuned_plan(tuned_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attncompiler as ac
    from attncompiler.api import clear_caches
    from attncompiler.ir.build import build_ir
    from attncompiler.runtime import autotune as at
    from attncompiler.spec import presets
    from attncompiler.testing import check_kernel

    spec = presets.causal(64)
    res = _tune(spec)
    clear_caches()
    kern = ac.compile(spec, seqlen_hint=1024)
    assert kern.plan.options == dict(res.options)
    assert kern.plan.reasons[0].startswith("autotuned on")
    # a tuned entry that differs from the model's choice is what compile() uses
    forced = {"block_m": 64, "block_n": 32, "num_warps": 4, "q_in_regs": True, "stages": 1}
    key = at.tune_key(build_ir(spec), 4096)
    at.store().put(at.TuneResult(key=key, shape=(1, 4, 4096, 64), options=forced, ms=0.5,
                                 default_options=dict(res.default_options), default_ms=1.0))
    clear_caches()
    kern = ac.compile(spec, seqlen_hint=4000)
    assert kern.plan.options == forced
    assert check_kernel(kern, 1, 4, 777).ok
    assert ac.compile(spec, seqlen_hint=4000, block_n=64).plan.block_n == 64  # explicit options win
    monkeypatch.setenv("ATTNCOMPILER_USE_TUNED", "0")
    clear_caches()
    assert ac.compile(spec, seqlen_hint=4000).plan.options == dict(res.default_options)


def test_failing_candidates_score_inf(tuned_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attncompiler.runtime import autotune as at
    from attncompiler.spec import presets

    real = at.tune_candidates

    def with_bad(ir, target, schedule="v2", max_candidates=None):
        return real(ir, target, schedule, 2) + [{"block_m": 96, "block_n": 64, "num_warps": 4}]

    monkeypatch.setattr(at, "tune_candidates", with_bad)
    res = _tune(presets.plain(64), force=True)
    bad = [c for c in res.candidates if c.options.get("block_m") == 96]
    assert len(bad) == 1 and math.isinf(bad[0].ms) and "BLOCK_M=96" in (bad[0].error or "")
    assert math.isfinite(res.ms) and res.options.get("block_m") != 96
    assert "inf" in at.format_tune_result(res)
