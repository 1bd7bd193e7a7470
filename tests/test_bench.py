"""The benchmark suite's CPU-testable parts: grids and budget, FLOP counting, progress bar, report and
plots from synthetic data, the CLI, and the run loops driven on the CPU with fake timers and impls."""
from __future__ import annotations

import io
import json
import math
import random
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attncompiler.bench import grid as G
from attncompiler.bench import latency, measure, memory, report, runner
from attncompiler.bench.measure import Impl
from attncompiler.bench.progress import Progress, format_seconds


# ----------------------------------------------------------------------------------- synthetic data
_BASE = {"v1": 8.0, "v2": 340.0, "v3": 600.0, "sdpa_flash": 320.0, "sdpa_cudnn": 560.0, "sdpa_efficient": 210.0, "flex": 380.0}


def synthetic_data(seed: int = 0) -> dict:
    """A bench.json of the full suite with H100-like numbers, errors, n/a, OOM and latency rows."""
    rnd = random.Random(seed)
    suite = G.full_suite()
    params = suite.variants.params
    rows = []
    for section, ms in G.suite_measurements(suite).items():
        for m in ms:
            c = m.case
            flops = measure.case_flops(c, m.mode, params)
            row = dict(section=section, variant=c.variant, mask=c.mask, d=c.d, N=c.N, B=c.B, H=c.H, causal=c.causal,
                       mode=m.mode, impl=m.impl, flops=flops)
            if m.unsupported:
                rows.append(dict(row, status="unsupported", error=m.unsupported))
            elif m.impl == "sdpa_cudnn" and c.d == 256 and m.mode != "fwd":
                rows.append(dict(row, status="unsupported", error="RuntimeError: No available kernel. Aborting."))
            elif m.impl == "flex" and c.variant == "document" and c.N == 16384 and m.mode == "bwd":
                rows.append(dict(row, status="error", error="BackendCompilerFailed: inductor failed"))
            else:
                ramp = 1 - 0.45 * math.exp(-c.N / 2500) * (1.6 if c.causal else 1.0)
                tf = _BASE[m.impl] * ramp * (1 + 0.04 * rnd.uniform(-1, 1)) * (0.8 if m.mode != "fwd" else 1.0)
                rows.append(dict(row, status="ok", ms=flops / tf / 1e9, tflops=tf,
                                 first_call_s=8.0 if m.impl == "flex" else 0.01))
    for impl, vals in (("v1", dict(import_s=2.1, compile_s=0.9, first_call_s=1.0, warm_s=4e-4)),
                       ("v2", dict(import_s=2.1, compile_s=1.7, first_call_s=1.8, warm_s=3e-4, first_bwd_s=3.1,
                                   warm_bwd_s=2e-3)),
                       ("flex", dict(import_s=2.4, first_call_s=9.5, warm_s=9e-4, first_bwd_s=21.0, warm_bwd_s=4e-3))):
        rows.append(dict(section="latency", impl=impl, d=128, N=4096, B=4, H=16, causal=True, status="ok",
                         process_s=vals["first_call_s"] + 5, **vals))
    mg = suite.memory
    for mode in mg.modes:
        for impl in mg.impls:
            stopped = False
            for N in mg.seqlens:
                r = dict(section="memory", impl=impl, mode=mode, d=128, N=N, B=1, H=16, causal=True)
                need = 16 * N * N * 2 * (3 if mode == "fwd" else 6) if impl == "sdpa_math" else N * 2048 * 2 * 4
                if stopped:
                    r.update(status="skipped", error="OOM at a smaller N")
                elif need > 70 * 2**30:
                    r.update(status="oom", error="OutOfMemoryError: CUDA out of memory")
                    stopped = True
                else:
                    r.update(status="ok", peak_bytes=need, input_bytes=3 * N * 2048 * 2)
                rows.append(r)
    meta = dict(device="NVIDIA H100 80GB HBM3", capability="sm_90", sm_count=132, memory_gib=79.1, date="2026-12-01",
                torch="2.13.0", attncompiler="0.1.0", command="attncompiler bench --out /out", suite="full",
                elapsed_s=402.0, budget_s=450.0, timer="fake", l2_bytes=50 * 2**20, gemm_tflops=742.0,
                flex_dynamic=True, tokens=16384, hidden=2048, v1_max_n=2048,
                variant_params=dict(window=1024, num_docs=4, softcap=30.0, dropout_p=0.1, alibi_causal=True))
    return {"meta": meta, "rows": rows}


# ----------------------------------------------------------------------------------- grids and budget
def test_standard_grid_shapes_and_v1_limits() -> None:
    g = G.StandardGrid()
    cases = g.cases()
    assert len(cases) == 3 * 6 * 2
    assert all(c.B * c.N == 16384 and c.H * c.d == 2048 for c in cases)
    ms = G.grid_measurements(g)
    v1 = [m for m in ms if m.impl == "v1"]
    assert v1 and all(m.mode == "fwd" and m.case.N <= 2048 for m in v1)
    assert len(v1) == 3 * 3 * 2
    assert not [m for m in ms if m.mode == "fwdbwd" and m.impl == "sdpa_efficient"]
    fwd = G.grid_measurements(g, ("fwd",))
    # 36 cases x (v2, v3, 4 peers) + v1 at N <= 2k; v3 only in the forward
    assert {m.mode for m in fwd} == {"fwd"} and len(fwd) == 36 * 6 + 18
    assert {m.mode for m in ms if m.impl == "v3"} == {"fwd"}


def test_variant_grid_unsupported_reasons() -> None:
    ms = G.grid_measurements(G.VariantGrid())
    by = {(m.case.variant, m.impl): m.unsupported for m in ms}
    assert by[("softcap", "sdpa_cudnn")] and by[("dropout", "flex")] and by[("alibi", "sdpa_flash")]
    assert by[("dropout", "sdpa_flash")] is None and by[("alibi", "sdpa_efficient")] is None
    assert by[("document", "flex")] is None
    assert {m.case.d for m in ms} == {128} and {m.case.N for m in ms} == {1024, 4096, 16384}
    assert all(m.case.N <= 2048 for m in ms if m.impl == "v1")
    causal = {m.case.variant: m.case.causal for m in ms}
    assert causal == {"alibi": True, "softcap": True, "sliding_window": True, "document": False, "dropout": False}


def test_budget_full_under_8_minutes_quick_under_2() -> None:
    full, quick = G.estimate_seconds(G.full_suite()), G.estimate_seconds(G.quick_suite())
    assert full["total"] <= G.full_suite().budget_s <= 470, full
    assert quick["total"] <= 120, quick
    assert set(full) >= {"forward", "backward", "variants", "latency", "memory", "total"}
    # dynamic FlexAttention compiles once per (head dim, variant, grad mode), static once per shape too
    ms = [m for v in G.suite_measurements(G.full_suite()).values() for m in v]
    assert len(G.flex_compile_keys(ms, dynamic=True)) < len(G.flex_compile_keys(ms, dynamic=False))


def test_only_and_restrict() -> None:
    assert G.parse_only(None) == G.SECTIONS
    assert G.parse_only(["memory,forward", "latency"]) == ("latency", "forward", "memory")
    with pytest.raises(ValueError, match="expected one of"):
        G.parse_only(["forwards"])
    s = G.restrict(G.full_suite(), ("variants",))
    assert list(G.suite_measurements(s)) == ["variants"]
    est = G.estimate_seconds(s)
    assert "latency" not in est and "memory" not in est


# ----------------------------------------------------------------------------------- FLOPs
def _brute_pairs(mask_mod, n: int) -> int:
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    return int(mask_mod(0, 0, q, k).sum())


@pytest.mark.parametrize("n", [1, 2, 7, 64, 100, 257])
@pytest.mark.parametrize("w", [0, 1, 5, 64, 300])
def test_window_pairs_exact(n: int, w: int) -> None:
    from attncompiler.spec.presets import sliding_window_mask

    assert measure.window_pairs(n, w) == _brute_pairs(sliding_window_mask(w), n)


@pytest.mark.parametrize("n", [1, 3, 10, 64, 99, 1000])
@pytest.mark.parametrize("docs", [1, 2, 3, 4, 7])
def test_document_pairs_exact(n: int, docs: int) -> None:
    from attncompiler.spec.presets import document_ids, document_mask

    if docs > n:
        pytest.skip("more documents than tokens")
    assert measure.document_pairs(n, docs) == _brute_pairs(document_mask(document_ids(n, docs)), n)


def test_flop_conventions() -> None:
    c = G.Case("standard", "plain", 128, 4096, 4, 16, False)
    base = 4 * 4 * 16 * 4096 * 4096 * 128
    assert measure.case_flops(c, "fwd") == base
    assert measure.case_flops(c, "bwd") == 2.5 * base and measure.case_flops(c, "fwdbwd") == 3.5 * base
    assert measure.case_flops(G.Case("standard", "causal", 128, 4096, 4, 16, True), "fwd") == base / 2
    p = G.VariantParams(window=100, num_docs=4)
    w = G.Case("variants", "sliding_window", 128, 4096, 4, 16, True)
    assert measure.case_flops(w, "fwd", p) == 4 * 4 * 16 * 128 * measure.window_pairs(4096, 100)
    doc = G.Case("variants", "document", 128, 4096, 4, 16, False)
    assert measure.case_flops(doc, "bwd", p) == 2.5 * 4 * 4 * 16 * 128 * 4 * 1024 ** 2
    alibi = G.Case("variants", "alibi", 128, 4096, 4, 16, True)
    assert measure.case_flops(alibi, "fwd", p) == base / 2


def test_rotation_and_errors() -> None:
    assert measure.rotation_count(192 * 2**20, 50 * 2**20) == 2
    assert measure.rotation_count(10 * 2**20, 50 * 2**20) == 8  # capped
    assert measure.rotation_count(30 * 2**20, 50 * 2**20) == 4
    assert measure.classify_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert measure.classify_error(RuntimeError("No available kernel. Aborting execution."))[0] == "unsupported"
    assert measure.classify_error(NotImplementedError("x"))[0] == "unsupported"
    st, msg = measure.classify_error(ValueError("bad\n  thing"))
    assert st == "error" and msg == "ValueError: bad thing"
    assert measure.is_fatal_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not measure.is_fatal_cuda_error(RuntimeError("out of memory"))
    assert measure.is_compile_failure("CompileError: NVRTC failed to compile attn_fwd")
    assert not measure.is_compile_failure("RuntimeError: shape mismatch")


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwdbwd"])
def test_measure_mode_on_cpu(mode: str) -> None:
    inputs = measure.make_inputs(1, 2, 16, 8, device="cpu", l2=1 << 12, dtype=torch.float32)
    assert len(inputs.sets) >= 2
    calls = []

    def call(q, k, v):
        calls.append(torch.is_grad_enabled())
        return F.scaled_dot_product_attention(q, k, v)

    def timer(fn):
        for _ in range(3):
            fn()
        return 2.0
    ms, first = measure.measure_mode(Impl("x", call), inputs, mode, timer, lambda: None)
    assert ms == 2.0 and first >= 0
    assert all(g == (mode != "fwd") for g in calls)


# ----------------------------------------------------------------------------------- progress
def test_progress_bar_log_and_tty() -> None:
    t = [0.0]
    buf = io.StringIO()
    p = Progress(20, "bench", stream=buf, tty=False, log_every_pct=25, log_every_s=1e9, clock=lambda: t[0])
    for i in range(20):
        t[0] += 1.0
        p.step(f"item {i}")
    p.close()
    lines = buf.getvalue().splitlines()
    assert 3 <= len(lines) <= 6
    assert "20/20 100%" in lines[-1] and "eta 0.0s" in lines[-1]
    assert "|" in lines[0] and "item" in lines[0]
    tty = io.StringIO()
    p = Progress(4, "x", stream=tty, tty=True, clock=lambda: 0.0)
    p.step("a")
    p.step("b")
    p.close()
    assert tty.getvalue().count("\r") == 3 and tty.getvalue().endswith("\n")
    assert format_seconds(75) == "1m15s" and format_seconds(9.5) == "9.5s" and format_seconds(float("nan")) == "?"


# ----------------------------------------------------------------------------------- report
def test_markdown_has_ratios_and_gemm_percent() -> None:
    data = synthetic_data()
    md = report.to_markdown(data, plots=["tflops_fwd.png"])
    for col in ("ours/flash", "ours/cuDNN", "ours/efficient", "ours/Flex", "ours %GEMM"):
        assert col in md
    assert "## Forward (TFLOP/s)" in md and "## Backward (TFLOP/s)" in md and "## Forward + backward" in md
    assert "## Variants" in md and "## Compile latency" in md and "## Peak memory" in md
    assert "![tflops_fwd](tflops_fwd.png)" in md and "742 TFLOP/s" in md and "NVIDIA H100" in md
    # the first forward row: d=64 N=512 non-causal; its v2/flash ratio and %GEMM from the rows
    r = {x["impl"]: x for x in data["rows"] if x["section"] == "forward" and x["d"] == 64 and x["N"] == 512
         and not x["causal"]}
    line = next(ln for ln in md.splitlines() if ln.startswith("| 64 | 512 | no |"))
    best = max(r["v2"]["tflops"], r["v3"]["tflops"])  # ours = the faster of v2 and v3
    assert f"{best / r['sdpa_flash']['tflops']:.2f}" in line
    assert f"{100 * best / 742:.0f}%" in line
    # the backward has no v3 rows: its ratios are v2's
    bwd = {x["impl"]: x for x in data["rows"] if x["section"] == "backward" and x["d"] == 64 and x["N"] == 512
           and not x["causal"] and x["mode"] == "bwd"}
    assert "v3" not in bwd
    assert "| softcap | 1024 | fwd |" in md and "n/a" in md and "OOM" in md and "err" in md
    assert "FlexAttention has no dropout" in md  # in the errors / unsupported section


def test_report_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        report.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="parse error"):
        report.load(bad)
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="rows"):
        report.load(bad)


def test_plots_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    files = report.plot_all(synthetic_data(), tmp_path)
    names = {f.name for f in files}
    assert names == {"tflops_fwd.png", "tflops_bwd.png", "tflops_fwdbwd.png", "tflops_variants.png", "memory.png",
                     "latency.png"}
    for f in files:
        assert f.stat().st_size > 10_000 and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_outputs_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    files = runner.write_outputs(synthetic_data(), tmp_path)
    assert [f.name for f in files] == ["bench.json", "bench.md"]
    assert "pip install matplotlib" in capsys.readouterr().err
    assert "matplotlib is not installed" in (tmp_path / "bench.md").read_text()


# ----------------------------------------------------------------------------------- CLI
def test_cli_parser_bench_options() -> None:
    from attncompiler import cli

    args = cli._parser().parse_args(["bench", "--quick", "--out", "o", "--only", "forward", "--only", "memory"])
    assert args.fn is cli._cmd_bench and args.quick and args.out == "o" and args.only == ["forward", "memory"]
    args = cli._parser().parse_args(["bench", "--report-only", "x/bench.json", "--no-plots"])
    assert args.report_only == "x/bench.json" and args.no_plots and not args.quick
    assert cli.main(["bench", "--only", "everything"]) == 2


def test_cli_report_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attncompiler import cli

    src = tmp_path / "in" / "bench.json"
    src.parent.mkdir()
    src.write_text(json.dumps(synthetic_data()))
    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "out"
    assert cli.main(["bench", "--report-only", str(src), "--out", str(out), "--no-plots"]) == 0
    assert "ours/flash" in (out / "bench.md").read_text()
    assert json.loads((out / "bench.json").read_text())["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    assert runner.resolve_out_dir(None, str(src)) == src.parent.resolve()
    monkeypatch.setenv("OUT", str(tmp_path / "env"))
    assert runner.resolve_out_dir(None, None) == tmp_path / "env"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_cli_bench_without_gpu(capsys) -> None:
    from attncompiler import cli

    assert cli.main(["bench", "--quick"]) == 2
    assert "expected a CUDA GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- the loops, on the CPU
class OutOfMemoryError(RuntimeError):
    pass


def _tiny_suite(**kw) -> G.Suite:
    return G.Suite(
        "tiny",
        standard=G.StandardGrid(head_dims=(16,), seqlens=(32, 64), tokens=128, hidden=32, v1_max_n=32),
        variants=G.VariantGrid(variants=("alibi", "softcap", "sliding_window", "document", "dropout"), seqlens=(32, 64),
                               head_dim=16, tokens=128, hidden=32, v1_max_n=32,
                               params=G.VariantParams(window=8, num_docs=2)),
        latency=G.LatencyGrid(impls=("v2", "flex")),
        memory=G.MemoryGrid(seqlens=(32, 64, 128), impls=("v2", "sdpa_math")),
        **{"budget_s": 0.0, **kw})


class _FakeFlex:
    def impl(self, case, params):
        return Impl("flex", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal))

    def clear(self) -> None:
        pass


def _runtime(suite: G.Suite, compiles: list, **kw) -> runner.Runtime:
    def ours(name, case, params, device):
        if case.variant == "softcap" and name == "v2":
            compiles.append(case.N)
            raise RuntimeError("CompileError: NVRTC failed to compile attn_fwd (fake)")
        return Impl(name, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal))

    def probe(impl, mode, case):
        if impl == "sdpa_math" and case.N >= 64:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return 1000 * case.N, 6 * case.N

    def lat(cfg, timeout):
        return {"status": "ok", "first_call_s": 1.5, "warm_s": 1e-3}

    args = dict(device="cpu", timer=lambda fn: (fn(), 1.0)[1], timer_name="fake", sync=lambda: None, ours_factory=ours,
                flex_factory=_FakeFlex, l2=1 << 14, gemm=lambda: 100.0, latency_runner=lat, memory_probe=probe,
                dtype=torch.float32, precompile=False)
    args.update(kw)
    return runner.Runtime(suite, **args)


def test_run_suite_on_cpu(tmp_path: Path) -> None:
    suite = _tiny_suite()
    compiles: list = []
    rec = runner.Recorder(tmp_path / "bench.json", {"device": "cpu", "date": "2026-01-01"})
    buf = io.StringIO()
    data = runner.run_suite(suite, _runtime(suite, compiles), rec, progress_stream=buf)
    rows = data["rows"]
    planned = sum(len(v) for v in G.suite_measurements(suite).values())
    grid_rows = [r for r in rows if r["section"] in ("forward", "backward", "variants")]
    assert len(grid_rows) == planned
    ok = [r for r in grid_rows if r["status"] == "ok"]
    assert ok and all(r["tflops"] == r["flops"] / 1e9 for r in ok)  # the fake timer says 1 ms
    assert all(r["status"] == "unsupported" for r in grid_rows if r["impl"] == "flex" and r["variant"] == "dropout")
    # CPU SDPA has no cuDNN / efficient kernels: recorded, not fatal
    assert {r["status"] for r in grid_rows if r["impl"] == "sdpa_cudnn"} == {"unsupported"}
    # the fake NVRTC failure: built once for the case (both modes), not retried at N = 64
    soft = [r for r in grid_rows if r["impl"] == "v2" and r["variant"] == "softcap"]
    assert {r["status"] for r in soft} == {"error"} and len(compiles) == 1
    assert any("not retried" in r["error"] for r in soft)
    mem = {(r["impl"], r["mode"], r["N"]): r["status"] for r in rows if r["section"] == "memory"}
    assert mem[("sdpa_math", "fwd", 32)] == "ok" and mem[("sdpa_math", "fwd", 64)] == "oom"
    assert mem[("sdpa_math", "fwd", 128)] == "skipped" and mem[("v2", "fwdbwd", 128)] == "ok"
    assert [r["impl"] for r in rows if r["section"] == "latency"] == ["v2", "flex"]
    assert data["meta"]["gemm_tflops"] == 100.0 and "elapsed_s" in data["meta"]
    assert json.loads((tmp_path / "bench.json").read_text())["rows"] == json.loads(json.dumps(rows, default=str))
    assert "100%" in buf.getvalue()
    md = report.to_markdown(data)
    assert "## Forward (TFLOP/s)" in md and "not retried" in md


def test_run_suite_budget_and_fatal(tmp_path: Path) -> None:
    suite = _tiny_suite(budget_s=100.0)
    t = [0.0]

    def clock() -> float:
        t[0] += 1.0  # every clock read costs a second: the budget runs out midway
        return t[0]
    rec = runner.Recorder(None, {})
    data = runner.run_suite(suite, _runtime(suite, []), rec, progress_stream=io.StringIO(), clock=clock)
    statuses = [r["status"] for r in data["rows"]]
    assert "skipped" in statuses and "ok" in statuses
    assert any(r.get("error") == "time budget" for r in data["rows"])

    def fatal(name, case, params, device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    rec = runner.Recorder(None, {})
    data = runner.run_suite(G.restrict(suite, ("forward", "memory")), _runtime(suite, [], ours_factory=fatal), rec,
                            progress_stream=io.StringIO())
    assert "CUDA context lost" in data["meta"]["fatal"]
    after = [r for r in data["rows"] if r["section"] == "memory"]
    assert after and all(r["status"] == "skipped" for r in after)


# ----------------------------------------------------------------------------------- latency, memory, specs
def test_latency_child_protocol(tmp_path: Path) -> None:
    assert latency.parse_child_output("noise\n@@RESULT {\"status\": \"ok\", \"warm_s\": 1}\n") == \
        {"status": "ok", "warm_s": 1}
    assert latency.parse_child_output("no result") is None
    env = latency.child_env(tmp_path, {"PYTHONPATH": "/x", "ATTNCOMPILER_DISABLE_CACHE": "1"})
    assert env["ATTNCOMPILER_CACHE_DIR"].startswith(str(tmp_path)) and "ATTNCOMPILER_DISABLE_CACHE" not in env
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path)) and env["PYTHONPATH"].endswith("/x")
    res = latency.run_child({"impl": "v2"}, 30, command=[sys.executable, "-c", "print('hello')"])
    assert res["status"] == "error" and "no result" in res["error"]
    ok = [sys.executable, "-c", "print('@@RESULT {\"status\": \"ok\"}')"]
    res = latency.run_child({"impl": "v2"}, 30, command=ok)
    assert res["status"] == "ok" and res["process_s"] > 0
    rows = []
    latency.run_latency(G.LatencyGrid(impls=("v1", "v2")), lambda **r: rows.append(r), expired=lambda: True)
    assert [r["status"] for r in rows] == ["skipped", "skipped"]


def test_sdpa_masks_match_presets() -> None:
    from attncompiler.bench.peers import sdpa_attn_mask
    from attncompiler.spec.presets import alibi_slopes, document_ids, document_mask, sliding_window_mask

    p = G.VariantParams(window=5, num_docs=3)
    q, k = torch.arange(40)[:, None], torch.arange(40)[None, :]
    w = sdpa_attn_mask(G.Case("variants", "sliding_window", 16, 40, 1, 4, True), p, "cpu", torch.float32)
    assert torch.equal(w[0, 0] == 0, sliding_window_mask(5)(0, 0, q, k))
    d = sdpa_attn_mask(G.Case("variants", "document", 16, 40, 1, 4, False), p, "cpu", torch.float32)
    assert torch.equal(d[0, 0] == 0, document_mask(document_ids(40, 3))(0, 0, q, k))
    a = sdpa_attn_mask(G.Case("variants", "alibi", 16, 40, 1, 4, True), p, "cpu", torch.float32)
    want = alibi_slopes(4)[:, None, None] * (k - q).float()
    want = want.masked_fill(k > q, float("-inf"))
    assert torch.equal(a[0], want)
    assert sdpa_attn_mask(G.Case("variants", "dropout", 16, 40, 1, 4, False), p, "cpu") is None


def test_specs_of_cases() -> None:
    from attncompiler.bench.ours import spec_for

    p = G.VariantParams()
    kinds = {}
    for v in ("plain", "causal", *G.VARIANTS):
        c = G.Case("variants", v, 64, 1024, 16, 32, p.causal(v) or v == "causal")
        kinds[v] = spec_for(c, p)
    assert kinds["causal"].causal and not kinds["plain"].causal
    assert kinds["alibi"].causal and kinds["alibi"].score_mod is not None
    assert kinds["softcap"].causal and kinds["sliding_window"].mask_mod is not None
    assert kinds["dropout"].dropout_p == p.dropout_p and kinds["document"].mask_mod is not None
    with pytest.raises(ValueError, match="variant"):
        spec_for(G.Case("variants", "nope", 64, 1024, 16, 32, False), p)


def test_memory_section_oom_stops_that_impl() -> None:
    rows = []

    def probe(impl, mode, case):
        if impl == "sdpa_math" and case.N > 2048:
            raise RuntimeError("CUDA out of memory")
        return case.N, 0
    memory.run_memory(G.MemoryGrid(seqlens=(1024, 2048, 4096, 8192), modes=("fwd",), impls=("v2", "sdpa_math")),
                      probe, lambda **r: rows.append(r))
    st = {(r["impl"], r["N"]): r["status"] for r in rows}
    assert st[("sdpa_math", 4096)] == "oom" and st[("sdpa_math", 8192)] == "skipped" and st[("v2", 8192)] == "ok"


def test_v3_trace_grid_tail_is_each_ctas_wait_for_the_last() -> None:
    """The grid's tail: per CTA, the launch's last epilogue mark (either consumer's) minus the CTA's own last one;
    tiles without a recorded CTA drop out."""
    from attncompiler.bench.v3trace import SLOTS, grid_tail

    def tile(cta: int, epi0: int, epi1: int) -> dict[str, int]:
        row = dict.fromkeys(SLOTS, 0)
        row.update(cta=cta, epi0=epi0, epi1=epi1)
        return row

    tiles = [tile(1, 100, 120), tile(1, 300, 290), tile(2, 250, 260), tile(3, 400, 420), tile(0, 999, 999)]
    assert grid_tail(tiles) == [0, 420 - 300, 420 - 260]
    assert grid_tail([]) == []


def test_v3_trace_boundaries_follow_each_ctas_own_tiles() -> None:
    """The tracer's tile boundary pairs a tile with the next tile its own CTA ran (the trace's ``cta`` slot, in the
    order of their first softmax), whatever the tile numbers; tiles without a CTA or without K/V blocks drop out."""
    from attncompiler.bench.v3trace import SLOTS, tile_boundaries

    def tile(cta: int, softmax0: int, loop: int) -> dict[str, int]:
        row = dict.fromkeys(SLOTS, 0)
        row.update(cta=cta, softmax0=softmax0, loop=loop)
        return row

    tiles = [tile(2, 500, 900), tile(1, 100, 400), tile(2, 100, 450), tile(1, 430, 800), tile(1, 820, 1200),
             tile(0, 50, 60),   # no CTA recorded: left out
             tile(2, 0, 0)]     # no K/V block visited: left out
    # CTA 1 ran softmax0 100 -> 430 -> 820, CTA 2 ran 100 -> 500
    assert sorted(tile_boundaries(tiles)) == sorted([430 - 400, 820 - 800, 500 - 450])
    assert tile_boundaries([tile(1, 100, 400)]) == []
    # the names follow v3_trace.cuh's slot enum, one for one
    import re

    from attncompiler.bench.v3trace import SLOT_BLOCKS
    from attncompiler.codegen.render import templates_dir

    header = (templates_dir() / "include" / "attncompiler" / "v3_trace.cuh").read_text()
    enum = re.search(r"enum : int \{([^}]*)\}", header).group(1)
    names = [n.strip().split("=")[0].strip() for n in enum.split(",") if n.strip()]
    assert len(names) == len(SLOTS) and names.index("kTraceCta") == SLOTS.index("cta")
    assert names.index("kTraceBlocks") == SLOTS.index("blocks") == SLOT_BLOCKS
