"""``attncompiler bench``: run the suite in one process and write bench.json, bench.md and the plots.

Order: compile latency (subprocesses), GEMM ceiling, forward grid, backward grid, variant grid,
memory, GEMM ceiling again.  Every measurement fails soft: an exception becomes a row with status
"error" / "unsupported" / "oom" and the run goes on; after a sticky CUDA error the remaining GPU
measurements are recorded as skipped.  The suite's ``budget_s`` is a soft deadline (rows past it
are "skipped", time budget) keeping the memory section's share; bench.json is rewritten as rows
arrive, and on SIGTERM / Ctrl-C the report is written from what was measured.

Everything GPU-specific comes from :class:`Runtime`'s callables, so tests drive the same loops on
the CPU with fake timers and impls.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import env
from . import grid as G
from .grid import Case, Measurement, Suite, VariantParams
from .measure import (Impl, InputSets, Timer, case_flops, classify_error, is_compile_failure, is_fatal_cuda_error,
                      make_inputs, measure_mode)
from .progress import Progress, format_seconds

__all__ = ["add_arguments", "build_parser", "main", "run_args", "Runtime", "Recorder", "run_suite",
           "write_outputs", "resolve_out_dir"]

MEMORY_RESERVE_S = 25.0  # of the budget, kept for the memory section (it runs last)
REPORT_RESERVE_S = 10.0


# ----------------------------------------------------------------------------------- arguments
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench`` options (shared by ``attncompiler bench`` and ``benchmarks/run_all.py``)."""
    p.add_argument("--quick", action="store_true", help="a ~2 minute smoke run (d=128, N in {1k, 4k, 16k})")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder for bench.json, bench.md and PNGs (default: $OUT, else ./bench_results)")
    p.add_argument("--only", action="append", default=None, metavar="SECTION",
                   help=f"run only these sections (repeatable or comma-separated): {', '.join(G.ONLY_CHOICES)}")
    p.add_argument("--report-only", default=None, metavar="BENCH_JSON",
                   help="no GPU: write bench.md and the plots from an earlier bench.json")
    p.add_argument("--budget-s", type=float, default=None,
                   help="soft time limit in seconds (default: 470 full, 120 quick; 0 = none)")
    p.add_argument("--no-flex", action="store_true", help="leave FlexAttention out (no torch.compile)")
    p.add_argument("--flex-static", action="store_true",
                   help="compile FlexAttention per shape (dynamic=False): slower to run, no dynamic-shape kernels")
    p.add_argument("--no-plots", action="store_true", help="JSON and markdown only")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attncompiler bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


def resolve_out_dir(out: str | None, report_only: str | None = None) -> Path:
    if out:
        return Path(out)
    from_env = env.bench_out_dir()
    if from_env is not None:
        return from_env
    if report_only:
        return Path(report_only).resolve().parent
    return Path("bench_results")


# ----------------------------------------------------------------------------------- recording
class Recorder:
    """Rows and meta of a run; bench.json rewritten at most every ``flush_every_s`` (and on demand)."""

    def __init__(self, path: Path | None, meta: dict[str, Any], flush_every_s: float = 15.0) -> None:
        self.path = path
        self.meta = meta
        self.rows: list[dict[str, Any]] = []
        self.flush_every_s = flush_every_s
        self._last = time.monotonic()

    def record(self, **row: Any) -> None:
        self.rows.append({k: v for k, v in row.items() if v is not None})
        if time.monotonic() - self._last > self.flush_every_s:
            self.flush()

    def data(self) -> dict[str, Any]:
        return {"meta": self.meta, "rows": self.rows}

    def flush(self) -> None:
        self._last = time.monotonic()
        if self.path is None:
            return
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data(), indent=1, default=str))
        os.replace(tmp, self.path)


class Budget:
    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s = total_s
        self.clock = clock
        self.t0 = clock()
        self.reserve_s = 0.0

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def expired(self) -> bool:
        return self.total_s > 0 and self.elapsed() > self.total_s - self.reserve_s


# ----------------------------------------------------------------------------------- runtime
class Runtime:
    """What a run needs from the machine; every part is a callable that tests replace."""

    def __init__(self, suite: Suite, *, device: str = "cuda", timer: Timer | None = None,
                 slow_timer: Timer | None = None, timer_name: str = "", sync: Callable[[], None] | None = None,
                 ours_factory: Callable[[str, Case, VariantParams, str], Impl] | None = None,
                 flex_factory: Callable[[], Any] | None = None, l2: int | None = None,
                 gemm: Callable[[], float] | None = None, latency_runner: Callable[..., dict] | None = None,
                 memory_probe: Callable[..., tuple[int, int]] | None = None, dtype: Any = None,
                 precompile: bool = True, no_flex: bool = False) -> None:
        from . import measure

        self.suite = suite
        self.device = device
        if timer is None:
            timer, timer_name = measure.make_timer(suite.warmup_ms, suite.rep_ms)
            slow_timer = slow_timer or measure.make_timer(5.0, 40.0)[0]
        self.timer = timer
        self.slow_timer = slow_timer or timer
        self.timer_name = timer_name
        if sync is None:
            import torch

            sync = torch.cuda.synchronize
        self.sync = sync
        if ours_factory is None:
            from .ours import ours_impl as ours_factory
        self.ours_factory = ours_factory
        self._flex_factory = flex_factory
        self._flex: Any = None
        self.no_flex = no_flex
        self.l2 = measure.l2_bytes() if l2 is None else l2
        self.gemm = gemm or (lambda: measure.gemm_tflops(self.timer, device=device))
        self.latency_runner = latency_runner
        self.memory_probe = memory_probe
        self.dtype = dtype
        self.do_precompile = precompile
        self._inputs_key: tuple | None = None
        self._inputs: InputSets | None = None
        self._mask_case: Case | None = None
        self._mask: Any = None

    def flex(self) -> Any:
        if self.no_flex:
            raise NotImplementedError("FlexAttention left out (--no-flex)")
        if self._flex is None:
            if self._flex_factory is None:
                from .peers import Flex

                seqs = self.suite.variants.seqlens + self.suite.standard.seqlens
                self._flex = Flex(dynamic=self.suite.flex_dynamic, device=self.device, max_seqlen=max(seqs))
            else:
                self._flex = self._flex_factory()
        return self._flex

    def inputs(self, case: Case) -> InputSets:
        key = (case.B, case.H, case.N, case.d)
        if key != self._inputs_key:
            self._inputs = None  # free the old sets first
            self.empty_cache()
            self._inputs = make_inputs(case.B, case.H, case.N, case.d, device=self.device, l2=self.l2,
                                       dtype=self.dtype)
            self._inputs_key = key
        assert self._inputs is not None
        return self._inputs

    def sdpa_mask(self, case: Case) -> Any:
        from .peers import sdpa_attn_mask

        if case != self._mask_case:
            self._mask, self._mask_case = None, None
            self._mask = sdpa_attn_mask(case, self.suite.variants.params, self.device, self.dtype)
            self._mask_case = case
        return self._mask

    def impl(self, name: str, case: Case) -> Impl:
        params = self.suite.variants.params
        if name in G.SCHEDULES:
            return self.ours_factory(name, case, params, self.device)
        if name.startswith("sdpa_"):
            from .peers import sdpa_impl

            mask = self.sdpa_mask(case)
            p = params.dropout_p if case.variant == "dropout" else 0.0
            return sdpa_impl(name, case.causal, mask, p)
        if name == "flex":
            return self.flex().impl(case, params)
        raise ValueError(f"impl: expected one of {G.IMPLS}, got {name!r}")

    def release(self) -> None:
        """Free inputs and masks (between sections)."""
        self._inputs, self._inputs_key, self._mask, self._mask_case = None, None, None, None
        if self._flex is not None and hasattr(self._flex, "clear"):
            self._flex.clear()
        self.empty_cache()

    def empty_cache(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def precompile(self, cases: list[Case]) -> int:
        if not self.do_precompile or not cases:
            return 0
        from .ours import precompile

        return precompile(cases, self.suite.variants.params, v1_max_n=self.suite.standard.v1_max_n)


# ----------------------------------------------------------------------------------- the loops
def run_grid(section: str, measurements: list[Measurement], rt: Runtime, rec: Recorder, progress: Progress,
             budget: Budget, state: dict[str, str]) -> None:
    """Time every measurement of a grid section, one row each.  A compile failure of an impl (NVRTC,
    inductor) is not retried at the other shapes of the same variant, head dim and grad mode."""
    params = rt.suite.variants.params
    built: dict[tuple[str, Case], Impl | BaseException] = {}
    compile_failed: dict[tuple, str] = {}
    case: Case | None = None
    for m in measurements:
        if m.case != case:
            built.clear()
            case = m.case
        c = m.case
        flops = case_flops(c, m.mode, params)
        row = dict(section=section, variant=c.variant, mask=c.mask, d=c.d, N=c.N, B=c.B, H=c.H, causal=c.causal,
                   mode=m.mode, impl=m.impl, flops=flops)
        text = f"{m.mode} d={c.d} N={c.N} {c.mask} {m.impl}"
        ckey = (m.impl, c.variant, c.d, c.causal, m.mode == "fwd")
        if m.unsupported:
            rec.record(**row, status="unsupported", error=m.unsupported)
        elif ckey in compile_failed:
            rec.record(**row, status="error", error=compile_failed[ckey])
        elif state.get("fatal"):
            rec.record(**row, status="skipped", error=state["fatal"])
        elif budget.expired():
            rec.record(**row, status="skipped", error="time budget")
        else:
            try:
                key = (m.impl, c)
                if key not in built:
                    try:
                        built[key] = rt.impl(m.impl, c)
                    except Exception as e:
                        built[key] = e
                impl = built[key]
                if isinstance(impl, BaseException):
                    raise impl
                timer = rt.slow_timer if m.impl == "v1" else rt.timer
                ms, first = measure_mode(impl, rt.inputs(c), m.mode, timer, rt.sync)
                rec.record(**row, status="ok", ms=ms, tflops=flops / ms / 1e9, first_call_s=first,
                           note=impl.note or None)
            except Exception as e:
                status, msg = classify_error(e)
                rec.record(**row, status=status, error=msg)
                if status == "error" and is_compile_failure(msg):
                    compile_failed[ckey] = f"not retried after the compile failure at N={c.N}: {msg[:200]}"
                if is_fatal_cuda_error(e):
                    state["fatal"] = f"CUDA context lost at {section} {text}: {msg[:100]}"
                elif status == "oom":
                    rt.empty_cache()
        progress.step(text)


def run_suite(suite: Suite, rt: Runtime, rec: Recorder, *, progress_stream: Any = None,
              clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Run every section of ``suite``; returns the data (also kept in ``rec``)."""
    from .latency import run_child, run_latency
    from .memory import cuda_probe, run_memory

    budget = Budget(suite.budget_s, clock)
    meta = rec.meta
    meta.setdefault("section_s", {})
    per_section = G.suite_measurements(suite)
    n_latency = len(suite.latency.impls) if "latency" in suite.sections else 0
    mg = suite.memory
    n_memory = len(mg.seqlens) * len(mg.modes) * len(mg.impls) if "memory" in suite.sections else 0
    total = sum(len(v) for v in per_section.values()) + n_latency + n_memory
    progress = Progress(total, "bench", stream=progress_stream)
    state: dict[str, str] = {}
    if "memory" in suite.sections:
        budget.reserve_s = MEMORY_RESERVE_S + REPORT_RESERVE_S
    try:
        if n_latency:
            t0 = clock()
            run_latency(suite.latency, lambda **r: rec.record(**r), step=progress.step, expired=budget.expired,
                        runner=rt.latency_runner or run_child)
            meta["section_s"]["latency"] = clock() - t0
            rec.flush()
        if per_section:
            t0 = clock()
            cases = [m.case for ms in per_section.values() for m in ms if not m.unsupported]
            meta["precompiled_kernels"] = rt.precompile(list(dict.fromkeys(cases)))
            meta["section_s"]["precompile"] = clock() - t0
        if per_section or "memory" in suite.sections:
            try:
                meta["gemm_tflops"] = rt.gemm()
            except Exception as e:
                meta["gemm_error"] = classify_error(e)[1]
        for section, ms in per_section.items():
            t0 = clock()
            run_grid(section, ms, rt, rec, progress, budget, state)
            rt.release()
            meta["section_s"][section] = clock() - t0
            rec.flush()
        if n_memory:
            t0 = clock()
            budget.reserve_s = REPORT_RESERVE_S
            probe = rt.memory_probe or cuda_probe(suite.variants.params, rt.device)
            expired = (lambda: state.get("fatal") or ("time budget" if budget.expired() else ""))
            run_memory(mg, probe, lambda **r: rec.record(**r), step=progress.step, expired=expired)
            meta["section_s"]["memory"] = clock() - t0
        if per_section and not state.get("fatal"):
            try:
                meta["gemm_end_tflops"] = rt.gemm()
            except Exception as e:
                meta["gemm_end_error"] = classify_error(e)[1]
    finally:
        progress.close()
        meta["elapsed_s"] = budget.elapsed()
        if state.get("fatal"):
            meta["fatal"] = state["fatal"]
        rec.flush()
    return rec.data()


# ----------------------------------------------------------------------------------- meta, outputs
def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    for mod in ("triton", "cupy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    from .. import __version__

    out["attncompiler"] = __version__
    try:
        root = Path(__file__).resolve().parent.parent.parent
        out["git"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=5).stdout.strip() or None
    except Exception:
        pass
    return out


def gpu_meta() -> dict[str, Any]:
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": torch.cuda.get_device_name(), "capability": f"sm_{p.major}{p.minor}",
            "sm_count": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1)}


def write_outputs(data: dict[str, Any], out_dir: Path, *, plots: bool = True) -> list[Path]:
    """bench.json, bench.md and (when matplotlib is importable) the PNGs; returns the files written."""
    from . import report

    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "bench.json", out_dir / "bench.md"]
    files[0].write_text(json.dumps(data, indent=1, default=str))
    pngs: list[Path] = []
    note = ""
    if plots:
        try:
            pngs = report.plot_all(data, out_dir)
        except ImportError as e:
            note = (f"matplotlib is not installed ({e}): no plots. `pip install matplotlib` (or "
                    f"`pip install -e .[bench]`) and rerun `attncompiler bench --report-only {files[0]}`.")
            print(f"attncompiler bench: {note}", file=sys.stderr)
    try:
        md = report.to_markdown(data, plots=[p.name for p in pngs], note=note)
    except Exception as e:  # the JSON is safe; say what broke instead of losing the run
        md = (f"# attncompiler benchmark report\n\nThe report could not be rendered ({type(e).__name__}: {e}); "
              f"bench.json holds every row.\n\n```\n{report.summary(data)}\n```\n")
        print(f"attncompiler bench: markdown report failed: {type(e).__name__}: {e}", file=sys.stderr)
    files[1].write_text(md)
    return files + pngs


def _print_plan(suite: Suite, stream: Any) -> None:
    est = G.estimate_seconds(suite)
    per = G.suite_measurements(suite)
    counts = ", ".join(f"{k} {sum(1 for m in v if not m.unsupported)}" for k, v in per.items())
    parts = ", ".join(f"{k} {format_seconds(v)}" for k, v in est.items() if k != "total")
    print(f"[bench] suite {suite.name}: sections {', '.join(suite.sections)}; timed measurements: {counts or 'none'}",
          file=stream)
    print(f"[bench] estimate {format_seconds(est['total'])} ({parts}); budget "
          f"{format_seconds(suite.budget_s) if suite.budget_s else 'none'}", file=stream, flush=True)


def run_args(args: argparse.Namespace) -> int:
    """The command: a run on this GPU, or ``--report-only``."""
    from dataclasses import asdict, replace

    out_dir = resolve_out_dir(args.out, args.report_only)
    if args.report_only:
        from .report import load

        data = load(args.report_only)
        files = write_outputs(data, out_dir, plots=not args.no_plots)
        print("\n".join(str(f) for f in files))
        return 0
    suite = G.quick_suite() if args.quick else G.full_suite()
    suite = G.restrict(suite, G.parse_only(args.only))
    import torch

    if not torch.cuda.is_available():
        print("attncompiler bench: expected a CUDA GPU, got none; `attncompiler bench --report-only bench.json` "
              "writes the report and plots of an earlier run without one", file=sys.stderr)
        return 2
    if args.budget_s is not None:
        suite = replace(suite, budget_s=max(0.0, args.budget_s))
    if args.flex_static:
        suite = replace(suite, flex_dynamic=False)
    if args.no_flex:
        impls = tuple(i for i in suite.latency.impls if i != "flex")
        suite = replace(suite, latency=replace(suite.latency, impls=impls))
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("attncompiler bench: matplotlib is not installed: bench.json and bench.md will be written, no "
                  "plots (`pip install matplotlib`, then `--report-only`)", file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    _print_plan(suite, sys.stderr)
    # an SDPA backend that refuses a case says why in a UserWarning per call site; the row has the error
    for msg in (".*kernel not used because.*", ".*fused kernels do not support.*", ".*not supported by.*backend.*"):
        warnings.filterwarnings("ignore", message=msg, category=UserWarning)
    rt = Runtime(suite, no_flex=args.no_flex)
    meta: dict[str, Any] = {
        **gpu_meta(), **_versions(), "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "attncompiler bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        "suite": suite.name, "sections": list(suite.sections), "budget_s": suite.budget_s, "timer": rt.timer_name,
        "l2_bytes": rt.l2, "flex_dynamic": suite.flex_dynamic, "no_flex": bool(args.no_flex),
        "estimate_s": G.estimate_seconds(suite), "tokens": suite.standard.tokens, "hidden": suite.standard.hidden,
        "variant_params": asdict(suite.variants.params),
        "v1_max_n": suite.standard.v1_max_n,
    }
    rec = Recorder(out_dir / "bench.json", meta)
    old = None
    if threading.current_thread() is threading.main_thread():
        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")
        old = signal.signal(signal.SIGTERM, _term)
    rc = 0
    try:
        run_suite(suite, rt, rec)
    except KeyboardInterrupt as e:
        meta["interrupted"] = str(e) or "KeyboardInterrupt"
        print(f"\nattncompiler bench: interrupted ({meta['interrupted']}); writing what was measured",
              file=sys.stderr)
        rc = 130
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    files = write_outputs(rec.data(), out_dir, plots=not args.no_plots)
    print(f"[bench] {format_seconds(meta.get('elapsed_s', 0.0))}; wrote " + ", ".join(str(f) for f in files),
          file=sys.stderr)
    from .report import summary

    print(summary(rec.data()))
    return rc or (1 if meta.get("fatal") else 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_args(args)
    except ValueError as e:  # bad --only value and the like
        print(f"attncompiler bench: error: {e}", file=sys.stderr)
        return 2
