"""GPU: the autotuner benchmarks feasible plans, keeps a correct one, persists it, and a second process
and compile(schedule="auto") reuse it without benchmarking again.  The schedule policy: on an H100 /
H200 (sm_90) auto compiles v3 unless a tuned entry says otherwise (a tuned v2 entry overrides it);
``autotune(schedule="auto")`` measures v3 and v2 plans together and records which one won."""
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


def _hopper() -> bool:
    import torch
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="v3 needs an sm_90 GPU")


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
    res = _tune(spec, schedule="v2")
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
    assert res.key.schedule == res.schedule == "v2" and doc["entries"][res.key.digest()]["schedule"] == "v2"


@needs_hopper
def test_autotune_v3_returns_a_feasible_checked_plan(tuned_dir: Path) -> None:
    import attncompiler as ac
    from attncompiler.ir.build import build_ir
    from attncompiler.plan import detect_target
    from attncompiler.plan.v3 import plan_v3
    from attncompiler.runtime.autotune import format_tune_result
    from attncompiler.spec import presets
    from attncompiler.testing import check_kernel

    spec = presets.causal(64)
    res = _tune(spec, schedule="v3")
    print(format_tune_result(res))
    failed = [(c.options, c.error) for c in res.candidates if not math.isfinite(c.ms)]
    assert not failed, f"candidates failed: {failed}"
    assert res.schedule == "v3" and all(c.schedule == "v3" for c in res.candidates) and len(res.candidates) == 4
    assert res.candidates[0].options == res.default_options == plan_v3(build_ir(spec), detect_target()).options
    kern = ac.compile(spec, "v3", **res.options)
    assert kern.plan.options == dict(res.options)
    for n in (1, 333, 1024):
        assert (r := check_kernel(kern, 2, 4, n)).ok, str(r)


def test_autotune_auto_measures_both_and_records_the_winner(tuned_dir: Path) -> None:
    import attncompiler as ac
    from attncompiler.api import clear_caches
    from attncompiler.ir.build import build_ir
    from attncompiler.plan import choose_auto, detect_target
    from attncompiler.runtime.autotune import autotune, format_tune_result
    from attncompiler.spec import presets
    from attncompiler.testing import check_kernel

    spec = presets.causal(64)
    res = autotune(spec, SHAPE, max_candidates=6, reps=3, progress=False)  # schedule="auto" is the default
    print(format_tune_result(res))
    model = choose_auto(build_ir(spec), detect_target()).schedule
    scheds = [c.schedule for c in res.candidates]
    assert res.key.schedule == "auto" and res.default_schedule == model == scheds[0]
    assert set(scheds) == ({"v3", "v2"} if _hopper() else {"v2"})
    assert all(math.isfinite(c.ms) for c in res.candidates), [(c.schedule, c.options, c.error) for c in res.candidates]
    assert res.schedule in scheds and res.ms <= res.default_ms
    doc = json.loads((tuned_dir / "plans.json").read_text())
    assert doc["entries"][res.key.digest()]["schedule"] == res.schedule
    clear_caches()
    kern = ac.compile(spec, seqlen_hint=1024)
    assert kern.schedule == res.schedule and kern.plan.options == dict(res.options)
    assert kern.plan.reasons[0].startswith("autotuned on") and f": {res.schedule} " in kern.plan.reasons[0]
    assert (r := check_kernel(kern, 1, 4, 777)).ok, str(r)


def test_second_process_reuses_the_cache(tuned_dir: Path) -> None:
    from attncompiler.spec import presets

    first = _tune(presets.causal(64))  # schedule="auto"
    code = textwrap.dedent(f"""
        import json
        import attncompiler as ac
        from attncompiler.runtime.autotune import autotune, tune_stats
        from attncompiler.spec import presets
        res = autotune(presets.causal(64), (1, 4, 1000, 64), max_candidates=4, reps=3, progress=False)
        kern = ac.compile(presets.causal(64), seqlen_hint=1000)
        print(json.dumps({{"stats": tune_stats(), "from_cache": res.from_cache, "options": dict(res.options),
                          "schedule": res.schedule, "kernel": [kern.schedule, kern.plan.options]}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNCOMPILER_TUNED_DIR": str(tuned_dir)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["stats"]["benchmarks"] == 0 and got["stats"]["tunes"] == 0 and got["stats"]["cache_hits"] == 1
    assert got["from_cache"] and got["options"] == dict(first.options)  # N = 1000 is in the 1024 bucket
    assert got["schedule"] == first.schedule and got["kernel"] == [first.schedule, dict(first.options)]


def test_compile_auto_picks_the_tuned_plan(tuned_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attncompiler as ac
    from attncompiler.api import clear_caches
    from attncompiler.ir.build import build_ir
    from attncompiler.plan import detect_target, plan_v2
    from attncompiler.plan.v3 import plan_v3
    from attncompiler.runtime import autotune as at
    from attncompiler.spec import presets
    from attncompiler.testing import check_kernel

    spec = presets.causal(64)
    ir = build_ir(spec)
    model = "v3" if _hopper() else "v2"
    model_options = (plan_v3 if _hopper() else plan_v2)(ir, detect_target()).options
    clear_caches()
    kern = ac.compile(spec, seqlen_hint=1024)  # nothing tuned: v3 on an H100 / H200, else v2
    assert kern.schedule == model and kern.plan.options == model_options
    assert kern.plan.reasons[0].startswith(f"schedule 'auto' on {detect_target().name} -> {model}")
    res = _tune(spec)
    clear_caches()
    kern = ac.compile(spec, seqlen_hint=1024)
    assert kern.schedule == res.schedule and kern.plan.options == dict(res.options)
    assert kern.plan.reasons[0].startswith("autotuned on")
    # a tuned v2 entry (key schedule v2) that differs from the model's choice is what compile() uses
    forced = {"block_m": 64, "block_n": 32, "num_warps": 4, "q_in_regs": True, "stages": 1}
    key = at.tune_key(ir, 4096, "v2")
    at.store().put(at.TuneResult(key=key, shape=(1, 4, 4096, 64), options=forced, ms=0.5,
                                 default_options=plan_v2(ir, detect_target()).options, default_ms=1.0))
    clear_caches()
    kern = ac.compile(spec, seqlen_hint=4000)
    assert kern.schedule == "v2" and kern.plan.options == {**forced, "score_skip": False}  # (the model's)
    assert check_kernel(kern, 1, 4, 777).ok
    forced_bn = ac.compile(spec, seqlen_hint=4000, block_n=64)  # explicit options win (the model's schedule)
    assert forced_bn.schedule == model and forced_bn.plan.block_n == 64
    monkeypatch.setenv("ATTNCOMPILER_USE_TUNED", "0")
    clear_caches()
    kern = ac.compile(spec, seqlen_hint=4000)
    assert kern.schedule == model and kern.plan.options == model_options


def test_failing_candidates_score_inf(tuned_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attncompiler.runtime import autotune as at
    from attncompiler.spec import presets

    real = at.tune_candidates
    bad_opts = {"v2": {"block_m": 96, "block_n": 64, "num_warps": 4}, "v3": {"block_n": 100, "stages": 2}}

    def with_bad(ir, target, schedule="v2", max_candidates=None):
        return real(ir, target, schedule, 2) + [bad_opts[schedule]]

    monkeypatch.setattr(at, "tune_candidates", with_bad)
    for schedule, err in (("v2", "BLOCK_M=96"), ("v3", "BLOCK_N=100")):
        if schedule == "v3" and not _hopper():
            continue
        res = _tune(presets.plain(64), force=True, schedule=schedule)
        bad = [c for c in res.candidates if dict(c.options) == bad_opts[schedule]]
        assert len(bad) == 1 and math.isinf(bad[0].ms) and err in (bad[0].error or ""), res.candidates
        assert math.isfinite(res.ms) and dict(res.options) != bad_opts[schedule]
        assert "inf" in at.format_tune_result(res)
