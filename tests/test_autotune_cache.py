"""CPU tests of the autotuner's cache: keys, the JSON store, atomic writes, locking, lookups, and
compile(schedule="auto") picking a tuned plan (the GPU side is tests/test_gpu_autotune.py)."""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attncompiler.ir.build import build_ir
from attncompiler.runtime import autotune as at
from attncompiler.runtime.filelock import FileLock, LockTimeout, atomic_write
from attncompiler.spec import presets

INFO = at.DeviceInfo(gpu_name="NVIDIA H100 80GB HBM3", sm_arch="sm_90", cuda_runtime="13000", driver="13000/580.65")


@pytest.fixture()
def tuned_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "tuned"
    monkeypatch.setenv("ATTNCOMPILER_TUNED_DIR", str(d))
    monkeypatch.delenv("ATTNCOMPILER_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("ATTNCOMPILER_USE_TUNED", raising=False)
    return d


@pytest.fixture()
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from attncompiler.runtime import tuned
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(at, "device_info", lambda device=None: INFO)
    monkeypatch.setattr(tuned, "device_info", lambda device=None: INFO)


def _result(ir, seqlen: int, options: dict, ms: float = 1.0, default_ms: float = 1.5, schedule: str = "v2",
            winner: str = "") -> at.TuneResult:
    """A stored result for a key tuned with ``schedule``; ``winner``: the schedule that won (auto keys)."""
    key = at.tune_key(ir, seqlen, schedule, INFO)
    cands = (at.TunedCandidate({"block_n": 64}, default_ms, None, 1, winner or schedule),
             at.TunedCandidate(options, ms, None, 2, winner or schedule),
             at.TunedCandidate({"block_n": 999}, math.inf, "CompileError: boom", 3, winner or schedule))
    return at.TuneResult(key=key, shape=(1, 4, seqlen, ir.head_dim), options=options, ms=ms,
                         default_options={"block_n": 64}, default_ms=default_ms, candidates=cands,
                         schedule=winner, default_schedule=winner)


# --- keys ------------------------------------------------------------------------------------------

def test_key_is_stable_and_made_of_fields() -> None:
    ir = build_ir(presets.alibi(presets.alibi_slopes(8), 128, causal=True))
    k1, k2 = at.tune_key(ir, 4000, "v2", INFO), at.tune_key(build_ir(presets.alibi(presets.alibi_slopes(8), 128,
                                                                                    causal=True)), 4096, "v2", INFO)
    assert k1 == k2 and k1.digest() == k2.digest() and k1.seqlen_bucket == 4096
    assert at.TuneKey.from_fields(k1.fields()) == k1
    assert set(k1.fields()) == {"gpu_name", "sm_arch", "cuda_runtime", "driver", "package", "spec_hash", "schedule",
                                "dtype", "head_dim", "head_dim_v", "seqlen_bucket"}
    digests = {k1.digest()}
    for field, value in (("gpu_name", "NVIDIA H200"), ("sm_arch", "sm_80"), ("cuda_runtime", "12080"),
                         ("driver", "x"), ("package", "0" * 16), ("spec_hash", "1" * 16), ("schedule", "v1"),
                         ("dtype", "fp16"), ("head_dim", 64), ("head_dim_v", 64), ("seqlen_bucket", 8192)):
        other = at.TuneKey(**{**k1.fields(), field: value})
        assert other != k1 and other.digest() not in digests
        digests.add(other.digest())
    assert k1.family() == at.tune_key(ir, 100, "v2", INFO).family()
    assert at.tune_key(build_ir(presets.causal(128)), 4096, "v2", INFO).spec_hash != k1.spec_hash
    with pytest.raises(at.TuneError, match="expected fields"):
        at.TuneKey.from_fields({"gpu_name": "x"})


def test_spec_hash_is_the_same_in_another_process() -> None:
    code = textwrap.dedent("""
        from attncompiler.ir.build import build_ir
        from attncompiler.runtime.autotune import spec_hash, package_fingerprint
        from attncompiler.spec import presets
        print(spec_hash(build_ir(presets.document(presets.document_ids(512), 64))), package_fingerprint())
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    here = f"{at.spec_hash(build_ir(presets.document(presets.document_ids(512), 64)))} {at.package_fingerprint()}"
    assert out.strip() == here


def test_package_fingerprint_follows_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from attncompiler.codegen import render
    copy = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), copy)
    monkeypatch.setattr(render, "templates_dir", lambda: copy)
    at.package_fingerprint.cache_clear()
    try:
        a = at.package_fingerprint()
        (copy / "include" / "attncompiler" / "v2_fwd.cuh").write_text("// changed\n")
        at.package_fingerprint.cache_clear()
        assert at.package_fingerprint() != a and len(a) == 16
    finally:
        at.package_fingerprint.cache_clear()


@pytest.mark.parametrize("n,b", [(1, 1), (2, 2), (3, 4), (1000, 1024), (1024, 1024), (1025, 2048), (16384, 16384)])
def test_seqlen_bucket(n: int, b: int) -> None:
    assert at.seqlen_bucket(n) == b


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "8"])
def test_seqlen_bucket_rejects(bad) -> None:
    with pytest.raises(at.TuneError, match="expected a positive int"):
        at.seqlen_bucket(bad)


# --- the store -------------------------------------------------------------------------------------

def test_store_roundtrip_and_json(tuned_dir: Path) -> None:
    ir = build_ir(presets.causal(128))
    res = _result(ir, 4096, {"block_m": 128, "block_n": 32, "num_warps": 4, "q_in_regs": False, "stages": 1})
    st = at.store()
    assert st.get(res.key) is None
    st.put(res)
    doc = json.loads((tuned_dir / "plans.json").read_text())
    assert doc["format"] == 1 and list(doc["entries"]) == [res.key.digest()]
    entry = doc["entries"][res.key.digest()]
    assert entry["key"] == res.key.fields() and entry["candidates"][2]["ms"] is None  # inf stored as null
    back = st.get(res.key)
    assert back is not None and back.from_cache and back.options == res.options and back.key == res.key
    assert math.isinf(back.candidates[2].ms) and back.candidates[2].error == "CompileError: boom"
    assert back.speedup == pytest.approx(1.5)
    assert entry["schedule"] == back.schedule == "v2" and entry["candidates"][1]["schedule"] == "v2"
    assert not list(tuned_dir.glob(".plans.json.*.tmp"))  # no temporary file left behind


def test_store_records_the_winning_schedule_and_reads_old_entries(tuned_dir: Path) -> None:
    ir = build_ir(presets.causal(128))
    st = at.store()
    won = _result(ir, 4096, {"block_n": 128, "stages": 3, "persistent": True}, schedule="auto", winner="v3")
    st.put(won)
    back = st.get(won.key)
    assert back is not None and back.key.schedule == "auto" and back.schedule == "v3"
    assert back.default_schedule == "v3" and {c.schedule for c in back.candidates} == {"v3"}
    with pytest.raises(at.TuneError, match="expected the winning schedule"):
        _result(ir, 4096, {}, schedule="auto")
    # an entry written before the schedule was recorded reads back as its key's schedule
    old = _result(ir, 8192, {"block_n": 32})
    raw = old.to_json()
    for k in ("schedule", "default_schedule"):
        del raw[k]
    for c in raw["candidates"]:
        del c["schedule"]
    doc = json.loads((tuned_dir / "plans.json").read_text())
    doc["entries"][old.key.digest()] = raw
    (tuned_dir / "plans.json").write_text(json.dumps(doc))
    back = st.get(old.key)
    assert back is not None and back.schedule == back.default_schedule == "v2" and back.options == {"block_n": 32}
    assert all(c.schedule == "v2" for c in back.candidates)
    # an "auto" entry without its winner is unusable: skipped, not an error
    raw = won.to_json()
    del raw["schedule"]
    doc["entries"][won.key.digest()] = raw
    (tuned_dir / "plans.json").write_text(json.dumps(doc))
    assert st.get(won.key) is None


def test_corrupt_store_is_ignored_then_rewritten(tuned_dir: Path, capsys: pytest.CaptureFixture) -> None:
    tuned_dir.mkdir(parents=True)
    (tuned_dir / "plans.json").write_text("{not json")
    ir = build_ir(presets.plain(64))
    res = _result(ir, 1024, {"block_n": 32})
    st = at.TunedStore(tuned_dir / "plans.json")
    assert st.get(res.key) is None and "ignoring unreadable" in capsys.readouterr().err
    st.put(res)
    assert st.get(res.key) is not None and json.loads((tuned_dir / "plans.json").read_text())["format"] == 1


def test_memory_store_when_disk_cache_disabled(tuned_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNCOMPILER_DISABLE_CACHE", "1")
    st = at.store()
    assert st.path is None and st.key_lock(_result(build_ir(presets.plain(64)), 64, {}).key) is None
    res = _result(build_ir(presets.plain(64)), 64, {"block_n": 128})
    st.put(res)
    assert st.get(res.key) is not None and not tuned_dir.exists()


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "f.json"
    atomic_write(p, '{"a": 1}')
    assert p.read_text() == '{"a": 1}'

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(p, '{"a": 2}')
    assert p.read_text() == '{"a": 1}' and [x.name for x in tmp_path.iterdir()] == ["f.json"]


def test_file_lock_excludes_and_times_out(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with FileLock(path) as a:
        assert a.locked
        with pytest.raises(LockTimeout, match="within 0.1 s"):
            FileLock(path, timeout=0.1).acquire()
    with FileLock(path, timeout=0.1) as b:  # released: free again
        assert b.locked
    assert not b.locked


def _writer(args: tuple[str, dict, int, int]) -> None:
    """Worker: put ``n`` results with distinct keys (seqlen buckets) into the store at ``path``."""
    path, fields, wid, n = args
    store = at.TunedStore(Path(path))
    for i in range(n):
        key = at.TuneKey(**{**fields, "seqlen_bucket": 1 << (wid * n + i)})
        store.put(at.TuneResult(key=key, shape=(1, 1, 64, 64), options={"block_n": 32, "w": wid, "i": i}, ms=1.0,
                                default_options={}, default_ms=1.0))


def test_concurrent_writers_never_lose_or_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "tuned" / "plans.json"
    fields = at.tune_key(build_ir(presets.plain(64)), 64, "v2", INFO).fields()
    workers, per = 6, 5
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ctx.Pool(workers) as pool:
        pool.map(_writer, [(str(path), fields, w, per) for w in range(workers)])
    doc = json.loads(path.read_text())
    assert len(doc["entries"]) == workers * per  # read-modify-write under the lock: no lost update
    got = sorted((e["options"]["w"], e["options"]["i"]) for e in doc["entries"].values())
    assert got == [(w, i) for w in range(workers) for i in range(per)]


# --- lookups and compile(schedule="auto") ----------------------------------------------------------

def test_lookup_miss_hit_and_nearest(tuned_dir: Path, fake_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    ir = build_ir(presets.causal(128))
    assert at.lookup_tuned(ir, "sm_90", 4096) is None  # nothing stored
    opts_4k = {"block_m": 128, "block_n": 32, "num_warps": 4, "q_in_regs": False, "stages": 1}
    opts_16k = {"block_m": 128, "block_n": 64, "num_warps": 8, "q_in_regs": True, "stages": 1}
    at.store().put(_result(ir, 4096, opts_4k))
    at.store().put(_result(ir, 16384, opts_16k))
    assert at.lookup_tuned(ir, None, 3000) == opts_4k  # bucket 4096
    assert at.lookup_tuned(ir, None, 16384) == opts_16k
    assert at.lookup_tuned(ir, None, 100) == opts_4k  # nearest bucket
    assert at.lookup_tuned(ir, None, 100, nearest=False) is None
    assert at.lookup_tuned(ir, None, None) == opts_16k  # no hint: the largest tuned bucket
    assert at.lookup_tuned(ir, "sm_80", 4096) is None  # not this GPU
    assert at.lookup_tuned(build_ir(presets.causal(64)), None, 4096) is None  # another spec
    assert at.lookup_tuned(ir, None, 4096, schedule="v1") is None
    monkeypatch.setenv("ATTNCOMPILER_USE_TUNED", "0")
    assert at.lookup_tuned(ir, None, 4096) is None


def test_lookup_without_gpu_is_none(tuned_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    ir = build_ir(presets.causal(128))
    at.store().put(_result(ir, 4096, {"block_n": 32}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert at.find_tuned(ir, None, 4096) is None


def test_compile_auto_uses_the_tuned_plan(tuned_dir: Path, fake_gpu: None) -> None:
    import attncompiler as ac
    from attncompiler.api import clear_caches
    clear_caches()
    spec = presets.causal(128)
    ir = build_ir(spec)
    untuned = ac.compile(spec, target="sm_90", build=False, seqlen_hint=8000)  # nothing tuned: the model's v3
    assert untuned.schedule == "v3" and untuned.plan.reasons[0].startswith("schedule 'auto' on sm_90 -> v3")
    tuned = {"block_m": 128, "block_n": 32, "num_warps": 8, "q_in_regs": True, "stages": 1}
    at.store().put(_result(ir, 8192, tuned, ms=0.8, default_ms=1.0))
    kern = ac.compile(spec, target="sm_90", build=False, seqlen_hint=8000)  # a tuned v2 entry overrides v3
    p = kern.plan
    assert kern.schedule == "v2" and (p.block_m, p.block_n, p.num_warps, p.q_in_regs) == (128, 32, 8, True)
    assert p.reasons[0].startswith("autotuned on NVIDIA H100 80GB HBM3 for seqlen bucket 8192 (hint 8000): v2 0.8 ms")
    assert p.reasons[1].startswith("without a tuned plan: schedule 'auto' on sm_90 -> v3")
    assert "1. autotuned on NVIDIA H100" in kern.source  # the plan's explanation heads the CUDA source
    # explicit options or an explicit schedule bypass the tuned plan
    forced = ac.compile(spec, target="sm_90", build=False, block_n=64)
    assert forced.schedule == "v3" and forced.plan.block_n == 64  # options v3 accepts: the model's v3
    assert ac.compile(spec, target="sm_90", build=False, block_n=64, num_warps=4).schedule == "v2"
    assert ac.compile(spec, "v2", target="sm_90", build=False).plan.block_n == 64
    # a stale entry the planner refuses falls back to the model's choice
    at.store().put(_result(ir, 8192, {"block_m": 96}, ms=0.8))
    stale = ac.compile(spec, target="sm_90", build=False, seqlen_hint=8192)
    assert stale.schedule == "v3" and stale.plan.block_m == 128
    assert stale.plan.reasons[0].startswith("schedule 'auto' on sm_90 -> v3")
    with pytest.raises(TypeError, match="seqlen_hint"):
        ac.compile(spec, target="sm_90", build=False, seqlen_hint=0)


def test_compile_auto_uses_tuned_v3_and_auto_entries(tuned_dir: Path, fake_gpu: None) -> None:
    import attncompiler as ac
    from attncompiler.api import clear_caches
    clear_caches()
    spec = presets.plain(128)
    ir = build_ir(spec)
    v3_opts = {"block_n": 112, "stages": 2, "persistent": True}
    at.store().put(_result(ir, 4096, v3_opts, schedule="auto", winner="v3"))
    kern = ac.compile(spec, target="sm_90", build=False, seqlen_hint=4096)
    assert kern.schedule == "v3" and kern.plan.options == {**v3_opts, "exp2_poly": 0, "block_m": 128,
                                                                       "kv_descending": False,
                                                                       "score_skip": False, "q_prescale": False,
                                                                       "late_pv_wait": False,
                                                                       "tma_store_o": False,
                                                                       "softmax_copies": 2,
                                                                       "half_blocks": False,
                                                                       "tiles_by_head": True,
                                                                       "q_prefetch": False,
                                                                       "tile_list": False}  # a stored entry's
    # missing options take the planner's defaults
    assert kern.plan.reasons[0].startswith("autotuned on NVIDIA H100 80GB HBM3 for seqlen bucket 4096 (hint 4096): v3")
    # an "auto" entry won by v2 gives a v2 kernel
    v2_opts = {"block_m": 128, "block_n": 64, "num_warps": 4, "q_in_regs": False, "stages": 1}
    at.store().put(_result(ir, 16384, v2_opts, schedule="auto", winner="v2"))
    kern = ac.compile(spec, target="sm_90", build=False, seqlen_hint=16000)
    assert kern.schedule == "v2" and kern.plan.options == {**v2_opts, "score_skip": False}
    # a v3-tuned entry (key schedule v3) is used too; v1 entries never are
    at.store().put(_result(build_ir(presets.causal(64)), 1024, {"block_n": 128, "stages": 4, "persistent": False},
                           schedule="v3"))
    at.store().put(_result(build_ir(presets.causal(64)), 1024, {"sram_budget": 65536}, schedule="v1"))
    k64 = ac.compile(presets.causal(64), target="sm_90", build=False, seqlen_hint=1024)
    assert k64.schedule == "v3" and k64.plan.block_n == 128 and k64.plan.stages == 4
    # at equal bucket distance the "auto" entry (it compared both) wins over a single schedule's
    at.store().put(_result(ir, 4096, {"block_m": 64, "block_n": 64, "num_warps": 4, "q_in_regs": True, "stages": 1}))
    assert at.find_tuned(ir, None, 4096, schedule="auto").schedule == "v3"
    assert at.find_tuned(ir, None, 4096, schedule="v2").options["block_m"] == 64
    assert at.find_tuned(ir, None, None, schedule="auto").key.seqlen_bucket == 16384  # no hint: the largest


def test_find_tuned_auto_order_by_arch(tuned_dir: Path, monkeypatch: pytest.MonkeyPatch, fake_gpu: None) -> None:
    from attncompiler.runtime import tuned
    assert at.auto_lookup_order("sm_90") == ("auto", "v3", "v2") and at.auto_lookup_order("sm_80") == ("auto", "v2")
    a100 = at.DeviceInfo(gpu_name="NVIDIA A100", sm_arch="sm_80", cuda_runtime="13000", driver="x")
    monkeypatch.setattr(tuned, "device_info", lambda device=None: a100)
    ir = build_ir(presets.plain(128))
    v3 = _result(ir, 4096, {"block_n": 128}, schedule="v3")
    at.store().put(at.TuneResult(**{**v3.__dict__, "key": at.tune_key(ir, 4096, "v3", a100)}))
    assert at.find_tuned(ir, None, 4096, schedule="v3") is not None  # stored and found when asked for
    assert at.find_tuned(ir, None, 4096, schedule="auto") is None  # but "auto" on an sm_80 never uses v3


def test_tune_candidates_cpu() -> None:
    from attncompiler.plan import get_target, plan_v2
    ir = build_ir(presets.causal(128))
    t = get_target("sm_90")
    cands = at.tune_candidates(ir, t)
    assert cands[0] == plan_v2(ir, t).options  # the model's choice first
    assert len(cands) == len({tuple(sorted(c.items())) for c in cands})
    assert any(c["q_in_regs"] for c in cands) and any(not c["q_in_regs"] for c in cands)
    assert all(plan_v2(ir, t, **c).options == c for c in cands)  # every one is feasible
    assert at.tune_candidates(ir, t, max_candidates=3) == cands[:3]
    v1 = at.tune_candidates(ir, t, "v1")
    assert v1[0] == {} and all(set(o) <= {"sram_budget"} for o in v1) and len(v1) >= 2
    for bad in ("auto", "decode"):
        with pytest.raises(at.TuneError, match="schedule: expected 'v1', 'v2' or 'v3'"):
            at.tune_candidates(ir, t, bad)
    with pytest.raises(at.TuneError, match="max_candidates"):
        at.tune_candidates(ir, t, max_candidates=0)


def test_tune_candidates_v3_cpu() -> None:
    from attncompiler.plan import get_target
    from attncompiler.plan.model import ProblemDims
    from attncompiler.plan.v3 import plan_v3
    t = get_target("sm_90")
    for spec in (presets.plain(64), presets.causal(128), presets.plain(256)):
        ir = build_ir(spec)
        v3 = at.tune_candidates(ir, t, "v3")
        assert v3[0] == plan_v3(ir, t).options  # the model's choice first
        assert len(v3) == len({tuple(sorted(c.items())) for c in v3}) >= 4
        assert all(set(c) == {"block_n", "stages", "persistent", "exp2_poly", "block_m",
                                 "kv_descending", "score_skip", "q_prescale", "late_pv_wait", "tma_store_o",
                                 "softmax_copies", "half_blocks", "tiles_by_head", "q_prefetch", "tile_list"}
                   for c in v3)
        assert all(plan_v3(ir, t, **c).options == c for c in v3)  # every one is feasible
        assert any(c["persistent"] for c in v3) and len({c["block_n"] for c in v3}) >= 2
        if ir.head_dim <= 128:  # both grids (d = 256: the O tile costs BLOCK_N, more steps than max_steps)
            assert any(c["tma_store_o"] for c in v3) and any(not c["persistent"] for c in v3)
        assert {c["softmax_copies"] for c in v3} == {1, 2}  # the model's tile with the other softmax layout too
        assert any(c["half_blocks"] for c in v3) == (ir.mask_expr is not None)  # and with a mask its half blocks
        assert at.tune_candidates(ir, t, "v3", max_candidates=2) == v3[:2]
    assert at.tune_candidates(ProblemDims(40), t, "v3") == []  # v3 cannot tile it: nothing to tune
    assert at.tune_candidates(ProblemDims(96), t, "v3")[0] == plan_v3(ProblemDims(96), t).options  # padded boxes
    assert at.tune_candidates(build_ir(presets.plain(128)), get_target("sm_80"), "v3") == []


def test_tune_plans_auto_interleaves_v3_and_v2() -> None:
    from attncompiler.plan import get_target, plan_v2
    from attncompiler.plan.v3 import plan_v3
    t = get_target("sm_90")
    ir = build_ir(presets.causal(128))
    mixed = at.tune_plans(ir, t, "auto", 6)
    assert [s for s, _ in mixed] == ["v3", "v2"] * 3
    assert mixed[0] == ("v3", plan_v3(ir, t).options) and mixed[1] == ("v2", plan_v2(ir, t).options)
    assert [o for s, o in mixed if s == "v3"] == at.tune_candidates(ir, t, "v3")[:3]
    assert [o for s, o in mixed if s == "v2"] == at.tune_candidates(ir, t, "v2")[:3]
    full = at.tune_plans(ir, t, "auto")
    assert len(full) == len(at.tune_candidates(ir, t, "v3")) + len(at.tune_candidates(ir, t, "v2"))
    d96 = build_ir(presets.causal(96))  # v3 tiles 96 in two 64-column boxes: both schedules, v3's model first
    assert [s for s, _ in at.tune_plans(d96, t, "auto", 4)] == ["v3", "v2"] * 2
    assert at.tune_plans(d96, t, "auto")[1] == ("v2", plan_v2(d96, t).options)
    assert {s for s, _ in at.tune_plans(ir, get_target("sm_80"), "auto")} == {"v2"}
    assert at.tune_plans(ir, t, "v2", 2) == [("v2", o) for o in at.tune_candidates(ir, t, "v2", 2)]
    with pytest.raises(at.TuneError, match="schedule: expected one of auto, v1, v2, v3, got 'decode'"):
        at.tune_plans(ir, t, "decode")
    with pytest.raises(at.TuneError, match="max_candidates"):
        at.tune_plans(ir, t, "auto", 0)


def test_tune_candidates_stages_follow_the_codegen(monkeypatch: pytest.MonkeyPatch) -> None:
    from attncompiler.plan import get_target
    ir = build_ir(presets.plain(128))
    monkeypatch.setattr(at, "_renders_stages", lambda: True)
    assert {c["stages"] for c in at.tune_candidates(ir, get_target("sm_90"))} == {1, 2}
    monkeypatch.setattr(at, "_renders_stages", lambda: False)
    assert {c["stages"] for c in at.tune_candidates(ir, get_target("sm_90"))} == {1}


def test_format_and_errors_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    ir = build_ir(presets.causal(128))
    text = at.format_tune_result(_result(ir, 4096, {"block_m": 128, "block_n": 32}))
    assert "model rank" in text and "chosen: BM=128 BN=32" in text and "CompileError: boom" in text
    assert "1.500x" in text and "bucket 4096" in text
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(at.TuneError, match="needs a CUDA GPU"):
        at.autotune(presets.causal(128), (1, 4, 1024, 128))
    with pytest.raises(at.TuneError, match="expected D = the spec's head_dim 128, got 64"):
        at.autotune(presets.causal(128), (1, 4, 1024, 64))
    with pytest.raises(at.TuneError, match=r"expected \(B, H, N, D\)"):
        at.autotune(presets.causal(128), [(1, 4, 1024)])


def test_tuning_flow_with_fake_timings(tuned_dir: Path, fake_gpu: None, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture) -> None:
    """The tuner's logic end to end with the GPU parts faked: candidates in model order, failures
    score inf, min_gain keeps the default against noise, the result persists, and a second call
    (or another length in the bucket) is served from the cache without measuring."""
    from attncompiler.plan import get_target
    monkeypatch.setattr("attncompiler.plan.targets.detect_target", lambda device=None: get_target("sm_90"))
    monkeypatch.setattr(at, "_input_sets", lambda shape, ir, n: [None] * n)
    times = {32: 0.9, 128: None}  # BLOCK_N -> ms (None: fails); others 1.0 ms

    def fake_measure(spec, schedule, target, options, shape, sets, *, reps, warmup, check):
        at._stats["benchmarks"] += 1
        ms = times.get(options["block_n"], 1.0)
        if ms is None:
            return at.TunedCandidate(dict(options), math.inf, "CompileError: fake")
        return at.TunedCandidate(dict(options), ms if options != default else 1.0)

    spec = presets.causal(128)
    from attncompiler.plan import plan_v2
    default = plan_v2(build_ir(spec), "sm_90").options
    monkeypatch.setattr(at, "_measure", fake_measure)
    before = at.tune_stats()
    res = at.autotune(spec, (1, 4, 3000, 128), schedule="v2", max_candidates=6)
    assert "[tune v2 B=1 H=4 N=3000 D=128] |" in capsys.readouterr().err  # the progress bar
    assert at.tune_stats()["benchmarks"] - before["benchmarks"] == 6 and at.tune_stats()["tunes"] == before["tunes"] + 1
    assert res.default_options == default and res.candidates[0].options == default
    assert res.options["block_n"] == 32 and res.ms == 0.9 and res.speedup == pytest.approx(1 / 0.9)
    assert all(math.isinf(c.ms) == (c.options["block_n"] == 128) for c in res.candidates)
    again = at.autotune(spec, [1, 4, 4096, 128], schedule="v2", progress=False)  # same bucket: from the cache
    assert again.from_cache and again.options == res.options
    assert at.tune_stats()["benchmarks"] - before["benchmarks"] == 6 and at.tune_stats()["cache_hits"] > before["cache_hits"]
    # within min_gain (2 %) of the default: the default is kept
    times[32] = 0.99
    res2 = at.autotune(spec, (1, 4, 3000, 128), schedule="v2", max_candidates=6, force=True, progress=False)
    assert res2.options == default and res2.ms == 1.0
    # every candidate failing is an error with the reasons
    times.update({32: None, 64: None, 128: None})
    with pytest.raises(at.TuneError, match="no candidate produced a correct kernel: .*CompileError: fake"):
        at.autotune(spec, (1, 4, 3000, 128), schedule="v2", max_candidates=6, force=True, progress=False)


def test_auto_tuning_flow_records_the_winning_schedule(tuned_dir: Path, fake_gpu: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """schedule="auto" (the default) measures v3 and v2 candidates in one table; the stored entry
    says which schedule won, and compile(schedule="auto") builds that schedule's plan."""
    import attncompiler as ac
    from attncompiler.api import clear_caches
    from attncompiler.plan import get_target
    monkeypatch.setattr("attncompiler.plan.targets.detect_target", lambda device=None: get_target("sm_90"))
    monkeypatch.setattr(at, "_input_sets", lambda shape, ir, n: [None] * n)
    seen: list[tuple[str, dict]] = []
    fast = {"v2": 2.0, "v3": 1.0}

    def fake_measure(spec, schedule, target, options, shape, sets, *, reps, warmup, check):
        seen.append((schedule, dict(options)))
        ms = fast[schedule] * (0.9 if options.get("persistent") else 1.0)
        return at.TunedCandidate(dict(options), ms)

    monkeypatch.setattr(at, "_measure", fake_measure)
    spec = presets.plain(128)
    res = at.autotune(spec, (1, 4, 2048, 128), max_candidates=4, progress=False)
    assert [s for s, _ in seen] == ["v3", "v2", "v3", "v2"] and res.key.schedule == "auto"
    assert res.schedule == "v3" and res.options["persistent"] and res.default_schedule == "v3"
    assert [c.schedule for c in res.candidates] == ["v3", "v2", "v3", "v2"]
    text = at.format_tune_result(res)
    assert "autotune auto on" in text and "chosen: v3 BN=" in text and " P=1" in text and "v2 BM=" in text
    back = at.store().get(res.key)
    assert back is not None and back.schedule == "v3" and back.options == res.options
    clear_caches()
    kern = ac.compile(spec, target="sm_90", build=False, seqlen_hint=2048)
    assert kern.schedule == "v3" and kern.plan.options == dict(res.options)
    # v2 faster by more than min_gain: v2 is kept, and compile follows
    fast.update(v2=0.5)
    seen.clear()
    res = at.autotune(spec, (1, 4, 2048, 128), max_candidates=4, progress=False, force=True)
    # (the model's v3 plan of plain d = 128 is the persistent grid, which fake_measure times at 0.9)
    assert res.schedule == "v2" and res.default_schedule == "v3" and res.speedup == pytest.approx(1.8)
    clear_caches()
    assert ac.compile(spec, target="sm_90", build=False, seqlen_hint=2048).schedule == "v2"
    with pytest.raises(at.TuneError, match="schedule: expected one of auto, v1, v2, v3, got 'decode'"):
        at.autotune(spec, (1, 4, 2048, 128), schedule="decode")
