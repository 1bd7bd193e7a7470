"""bench.json -> bench.md (tables with ratios to every peer and % of the GEMM ceiling) and PNG plots.

Plots use matplotlib's object API (``matplotlib.figure.Figure``, the Agg canvas; no pyplot state),
imported inside :func:`plot_all` -- matplotlib is optional: without it :func:`plot_all` raises
ImportError and the command writes JSON and markdown only.

Data layout (what :mod:`.runner` writes): ``{"meta": {...}, "rows": [...]}``; a row has ``section``
("forward" / "backward" / "variants" / "latency" / "memory"), ``impl``, shape fields, ``mode``,
``status`` ("ok", "error", "unsupported", "oom", "skipped") and the section's numbers (``tflops``,
``ms``; ``peak_bytes``; ``first_call_s``, ...).
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from .grid import IMPL_LABELS, MODE_LABELS, VARIANTS

__all__ = ["load", "to_markdown", "summary", "plot_all", "fmt_seqlen", "STYLE"]

GRID_IMPLS = ("v1", "v2", "v3", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex")
OURS_IMPLS = ("v2", "v3")  # the schedules whose best is compared with the peers
RATIO_PEERS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex")
SHORT = {"v1": "v1", "v2": "v2", "v3": "v3", "sdpa_flash": "flash", "sdpa_cudnn": "cuDNN", "sdpa_efficient": "efficient",
         "flex": "Flex", "sdpa_math": "math"}
STATUS_CELL = {"unsupported": "n/a", "error": "err", "oom": "OOM", "skipped": "skip"}
STYLE: dict[str, dict[str, Any]] = {
    "v2": dict(color="#d62728", marker="o", linewidth=2.4, zorder=5),
    "v3": dict(color="#e377c2", marker="*", linewidth=2.4, zorder=6),
    "v1": dict(color="#7f7f7f", marker="v", linestyle="--"),
    "sdpa_flash": dict(color="#1f77b4", marker="s"),
    "sdpa_cudnn": dict(color="#2ca02c", marker="^"),
    "sdpa_efficient": dict(color="#9467bd", marker="D"),
    "flex": dict(color="#ff7f0e", marker="P"),
    "sdpa_math": dict(color="#8c564b", marker="X"),
}


def load(path: str | Path) -> dict[str, Any]:
    """A bench.json, checked for the expected layout."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"--report-only: expected a bench.json at {p}, got no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--report-only: expected JSON in {p}, got a parse error: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"--report-only: expected {{'meta': ..., 'rows': [...]}} in {p}, got "
                         f"{type(data).__name__} without a 'rows' list")
    data.setdefault("meta", {})
    return data


def fmt_seqlen(n: float) -> str:
    """512 -> '512', 4096 -> '4k', 131072 -> '128k'."""
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _num(x: float) -> str:
    return f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}"


def _rows(data: dict[str, Any], section: str, **where: Any) -> list[dict[str, Any]]:
    return [r for r in data["rows"] if r.get("section") == section and all(r.get(k) == v for k, v in where.items())]


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    if r.get("status") == "ok" and r.get("tflops") is not None:
        return _num(r["tflops"])
    return STATUS_CELL.get(r.get("status", ""), "?")


def _perf_table(rows: list[dict[str, Any]], key_cols: Sequence[tuple[str, str]], gemm: float | None) -> list[str]:
    """A markdown table: key columns, TFLOP/s per impl, ours / peer ratios, ours % of the GEMM ceiling
    (ours = the faster of attncompiler's v2 and v3 in the row; v2 alone where v3 did not run)."""
    impls = [i for i in GRID_IMPLS if any(r["impl"] == i for r in rows)]
    ours_impls = [i for i in OURS_IMPLS if i in impls]
    lab = "ours" if len(ours_impls) > 1 else (ours_impls[0] if ours_impls else "v2")
    peers = [p for p in RATIO_PEERS if p in impls] if ours_impls else []
    groups: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k, _ in key_cols), {})[r["impl"]] = r
    head = [h for _, h in key_cols] + [SHORT[i] for i in impls] + [f"{lab}/{SHORT[p]}" for p in peers]
    if gemm and ours_impls:
        head.append(f"{lab} %GEMM")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, by in groups.items():
        cells = [_key_cell(k, v) for (k, _), v in zip(key_cols, key)] + [_cell(by.get(i)) for i in impls]
        oks = [by[i]["tflops"] for i in ours_impls
               if by.get(i) and by[i].get("status") == "ok" and by[i].get("tflops")]
        v2t = max(oks) if oks else None
        for p in peers:
            pr = by.get(p)
            pt = pr.get("tflops") if pr and pr.get("status") == "ok" else None
            cells.append(f"{v2t / pt:.2f}" if v2t and pt else "–")
        if gemm and ours_impls:
            cells.append(f"{100 * v2t / gemm:.0f}%" if v2t else "–")
        out.append("| " + " | ".join(cells) + " |")
    return out


def _key_cell(k: str, v: Any) -> str:
    if k == "causal":
        return "yes" if v else "no"
    if k == "mode":
        return {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}.get(v, str(v))
    if k == "variant":
        return str(v).replace("_", " ")
    return str(v)


def _sorted(rows: Iterable[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    def k(r: dict[str, Any]) -> tuple:
        out = []
        for key in keys:
            v = r.get(key)
            if key == "variant":
                v = VARIANTS.index(v) if v in VARIANTS else 99
            elif key == "mode":
                v = ("fwd", "bwd", "fwdbwd").index(v) if v in ("fwd", "bwd", "fwdbwd") else 9
            out.append(v if v is not None else -1)
        return tuple(out)
    return sorted(rows, key=k)


def _gib(b: float) -> str:
    g = b / 2**30
    return f"{g:.3f}" if g < 0.1 else f"{g:.2f}" if g < 10 else f"{g:.1f}"


def _memory_table(rows: list[dict[str, Any]]) -> list[str]:
    cols = [(m, i) for m in ("fwd", "fwdbwd") for i in ("v2", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flex")
            if any(r["mode"] == m and r["impl"] == i for r in rows)]
    by = {(r["N"], r["mode"], r["impl"]): r for r in rows}
    head = ["N"] + [f"{SHORT[i]} {_key_cell('mode', m)}" for m, i in cols]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for N in sorted({r["N"] for r in rows}):
        cells = [fmt_seqlen(N)]
        for m, i in cols:
            r = by.get((N, m, i))
            if r is None:
                cells.append("–")
            elif r.get("status") == "ok":
                cells.append(_gib(r["peak_bytes"]))
            else:
                cells.append(STATUS_CELL.get(r.get("status", ""), "?"))
        out.append("| " + " | ".join(cells) + " |")
    return out


def _secs(r: dict[str, Any], k: str) -> str:
    v = r.get(k)
    return "–" if v is None else (f"{v * 1e3:.1f} ms" if v < 0.1 else f"{v:.2f} s")


def _latency_table(rows: list[dict[str, Any]]) -> list[str]:
    head = ["impl", "import", "runtime init", "compile (cold)", "first call (cold)", "next variant",
            "first fwd+bwd (cold)", "warm call", "warm fwd+bwd", "whole process"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("status") != "ok":
            out.append(f"| {IMPL_LABELS.get(r['impl'], r['impl'])} | {STATUS_CELL.get(r.get('status', ''), '?')}: "
                       f"{r.get('error', '')[:120]} |" + " |" * (len(head) - 2))
            continue
        out.append("| " + " | ".join([IMPL_LABELS.get(r["impl"], r["impl"]), _secs(r, "import_s"),
                                      _secs(r, "runtime_init_s"), _secs(r, "compile_s"), _secs(r, "first_call_s"),
                                      _secs(r, "next_variant_s"), _secs(r, "first_bwd_s"),
                                      _secs(r, "warm_s"), _secs(r, "warm_bwd_s"), _secs(r, "process_s")]) + " |")
    return out


def _flex_first_calls(data: dict[str, Any]) -> str:
    """FlexAttention's first calls inside the grid runs (one per new compilation), summarized."""
    firsts: dict[tuple, float] = {}
    for r in data["rows"]:
        if r.get("impl") == "flex" and r.get("status") == "ok" and r.get("first_call_s") is not None:
            key = (r.get("section") == "forward" or r.get("mode") == "fwd", r.get("d"), r.get("variant"))
            firsts.setdefault(key, r["first_call_s"])  # the first row of a key holds its compilation
    if not firsts:
        return ""
    fwd = [v for (is_fwd, *_), v in firsts.items() if is_fwd]
    trn = [v for (is_fwd, *_), v in firsts.items() if not is_fwd]
    parts = []
    for what, xs in (("forward (no grad)", fwd), ("training (forward+backward)", trn)):
        if xs:
            parts.append(f"{what}: median {statistics.median(xs):.1f} s, max {max(xs):.1f} s over {len(xs)}")
    return ("FlexAttention's first call per new compilation inside the benchmark process (mask/score_mod x "
            "head dim; inductor already warm): " + "; ".join(parts) + ".")


def _errors(data: dict[str, Any], limit: int = 40) -> list[str]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in data["rows"]:
        if r.get("status") in ("error", "oom", "skipped", "unsupported"):
            groups[(r.get("section"), r.get("impl"), r.get("status"), str(r.get("error", ""))[:160])].append(r)
    if not groups:
        return []
    out = ["| section | impl | status | rows | first case | message |", "|---|---|---|---|---|---|"]
    for (sec, impl, st, msg), rs in list(groups.items())[:limit]:
        r = rs[0]
        case = " ".join(str(x) for x in (r.get("mode"), r.get("variant"), f"d={r.get('d')}", f"N={r.get('N')}")
                        if x is not None)
        out.append(f"| {sec} | {impl} | {st} | {len(rs)} | {case} | {msg.replace('|', '/')} |")
    if len(groups) > limit:
        out.append(f"| … | {len(groups) - limit} more groups in bench.json | | | | |")
    return out


def _header(data: dict[str, Any]) -> list[str]:
    m = data["meta"]
    dev = m.get("device", "unknown GPU")
    bits = [f"{dev} ({m.get('capability', '?')}, {m.get('sm_count', '?')} SMs, {m.get('memory_gib', '?')} GiB)",
            m.get("date", "undated")]
    ver = ", ".join(f"{k} {m[k]}" for k in ("torch", "cuda", "cudnn", "triton", "cupy") if m.get(k))
    src = f"attncompiler {m.get('attncompiler', '?')}" + (f" (git {m['git']})" if m.get("git") else "")
    out = [f"**{' · '.join(bits)}** · {ver} · {src}", ""]
    out.append(f"Command: `{m.get('command', 'attncompiler bench')}` (suite {m.get('suite', '?')}, "
               f"{m.get('elapsed_s', 0):.0f} s of a {m.get('budget_s', 0):.0f} s budget). "
               f"Timing: {m.get('timer', '?')}; "
               f"inputs rotate over sets larger than 2x L2 ({m.get('l2_bytes', 0) / 2**20:.0f} MiB).")
    if m.get("gemm_tflops"):
        end = f"; {m['gemm_end_tflops']:.0f} at the end of the run" if m.get("gemm_end_tflops") else ""
        out.append(f"GEMM ceiling (bf16 8192³ `torch.matmul`, same run): **{m['gemm_tflops']:.0f} TFLOP/s**{end}.")
    for k in ("interrupted", "fatal"):
        if m.get(k):
            out.append(f"**Run {k}:** {m[k]}")
    return out


def to_markdown(data: dict[str, Any], *, plots: Sequence[str] = (), note: str = "") -> str:
    """The report: header, every section's table, errors; ``plots`` (file names) are linked."""
    m = data["meta"]
    gemm = m.get("gemm_tflops")
    tokens, hidden = m.get("tokens", 16384), m.get("hidden", 2048)
    out = ["# attncompiler benchmark report", ""] + _header(data) + [""]
    out.append(f"TFLOP/s count forward FLOPs as 4·B·H·N²·d (halved when causal; the sliding window and document "
               f"masks count their visible (q, k) pairs exactly), backward 2.5x, forward+backward 3.5x; "
               f"B·N = {tokens} tokens, H·d = {hidden}, bf16. Ratios are ours / peer, ours = the "
               f"faster of attncompiler v2 and v3 in the row (v3: the Hopper schedule, forward only; above 1: "
               f"attncompiler is faster); %GEMM is ours against the GEMM ceiling. flash, cuDNN, efficient = torch SDPA backends; "
               f"Flex = FlexAttention ({'dynamic' if m.get('flex_dynamic', True) else 'static'} shapes, "
               f"torch.compile). "
               f"Cells: n/a = the peer cannot express the case, err / OOM / skip = see the last section, – = not run "
               f"(v1, FlashAttention-1's loop order with scalar FMA, runs the forward at "
               f"N ≤ {m.get('v1_max_n', 2048)} "
               f"only; a v1 or v3 forward's backward is v2's).")
    if note:
        out += ["", f"*{note}*"]
    if plots:
        out += [""] + [f"![{Path(p).stem}]({p})" for p in plots]
    for mode, title in (("fwd", "Forward"), ("bwd", "Backward"), ("fwdbwd", "Forward + backward")):
        rows = [r for r in data["rows"] if r.get("section") in ("forward", "backward") and r.get("mode") == mode]
        if rows:
            out += ["", f"## {title} (TFLOP/s)", ""]
            out += _perf_table(_sorted(rows, ("d", "N", "causal")), (("d", "d"), ("N", "N"), ("causal", "causal")),
                               gemm)
    rows = _rows(data, "variants")
    if rows:
        vp = m.get("variant_params") or {}
        desc = ", ".join(_variant_title(v, vp) for v in VARIANTS if any(r["variant"] == v for r in rows))
        out += ["", "## Variants (TFLOP/s)", "",
                f"d = {rows[0].get('d')}: {desc}. The sliding window is causal (q - window ≤ k ≤ q), the documents "
                f"equal-length. SDPA gets the ALiBi bias, window and document masks as an additive bf16 attn_mask "
                f"built outside the timing.", ""]
        out += _perf_table(_sorted(rows, ("variant", "N", "mode")),
                           (("variant", "variant"), ("N", "N"), ("mode", "mode")), gemm)
    rows = _rows(data, "latency")
    flex_note = _flex_first_calls(data)
    if rows or flex_note:
        out += ["", "## Compile latency", ""]
        if rows:
            r0 = rows[0]
            out += [f"A fresh process per implementation with empty attncompiler / inductor / triton caches; "
                    f"d = {r0.get('d')}, N = {r0.get('N')}, B = {r0.get('B')}, H = {r0.get('H')}, "
                    f"{'causal' if r0.get('causal') else 'non-causal'}. attncompiler: compile = trace + plan + "
                    f"render + NVRTC + load; warm = compiling an equal spec again in the same process (memory "
                    f"cache) and calling it. FlexAttention: its first torch.compile'd call; warm = its second call.",
                    ""]
            out += _latency_table(rows)
        if flex_note:
            out += ["", flex_note]
    rows = _rows(data, "memory")
    if rows:
        r0 = rows[0]
        out += ["", "## Peak memory (GiB above the inputs)", "",
                f"B = {r0.get('B')}, H = {r0.get('H')}, d = {r0.get('d')}, "
                f"{'causal' if r0.get('causal') else 'non-causal'}, bf16; `torch.cuda.max_memory_allocated` minus "
                f"what was allocated before the call (q, k, v, dout).", ""]
        out += _memory_table(rows)
    errs = _errors(data)
    if errs:
        out += ["", "## Errors, unsupported and skipped measurements", ""] + errs
    return "\n".join(out) + "\n"


def summary(data: dict[str, Any]) -> str:
    """A few lines for the terminal: counts per section and status, and the GEMM ceiling."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in data["rows"]:
        counts[r.get("section", "?")][r.get("status", "?")] += 1
    lines = [f"{sec}: " + ", ".join(f"{n} {st}" for st, n in sorted(c.items())) for sec, c in counts.items()]
    if data["meta"].get("gemm_tflops"):
        lines.append(f"GEMM ceiling {data['meta']['gemm_tflops']:.0f} TFLOP/s")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- plots
def _setup_x(ax: Any, seqlens: Sequence[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(seqlens)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([fmt_seqlen(n) for n in seqlens])
    lo, hi = min(seqlens), max(seqlens)
    ax.set_xlim(lo / 1.3, hi * 1.3)
    ax.grid(True, which="major", alpha=0.3)


def _title(data: dict[str, Any], what: str) -> str:
    m = data["meta"]
    return f"{what}\n{m.get('device', 'unknown GPU')} · {m.get('date', 'undated')}"


_LEGEND_ORDER = [IMPL_LABELS[i] for i in (*GRID_IMPLS, "sdpa_math")]


def _new_figure(width: float, height: float) -> Any:
    """A Figure with constrained layout (room for the suptitle and an outside legend)."""
    from matplotlib.figure import Figure

    try:
        return Figure(figsize=(width, height), layout="constrained")
    except TypeError:  # matplotlib < 3.5
        return Figure(figsize=(width, height), constrained_layout=True)


def _legend(fig: Any, axes: Iterable[Any], ncol: int | None = None) -> None:
    """One legend for the figure, below the panels, impls in a fixed order (the GEMM line last)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if not seen:
        return
    labels = sorted(seen, key=lambda lab: _LEGEND_ORDER.index(lab) if lab in _LEGEND_ORDER else len(_LEGEND_ORDER))
    width_in = fig.get_size_inches()[0]
    ncol = ncol or max(1, min(len(labels), int(width_in / 2.2)))
    handles = [seen[lab] for lab in labels]
    try:
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False, fontsize=9)
    except ValueError:  # matplotlib < 3.7: no "outside" locations
        fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False, fontsize=9)


def _panel_note(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Name, inside a panel, the impls with no points there and why (n/a: cannot express; err; OOM)."""
    missing: dict[str, set[str]] = defaultdict(set)
    for impl in GRID_IMPLS:
        rs = [r for r in rows if r["impl"] == impl]
        if rs and not any(r.get("status") == "ok" for r in rs):
            for r in rs:
                missing[STATUS_CELL.get(r.get("status", ""), "?")].add(SHORT[impl])
    if missing:
        text = "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in sorted(missing.items()))
        ax.text(0.98, 0.03, text, transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="#555555")


def _tflops_panel(ax: Any, rows: list[dict[str, Any]], gemm: float | None) -> float:
    top = 0.0
    for impl in [i for i in GRID_IMPLS if any(r["impl"] == i for r in rows)]:
        pts = sorted((r["N"], r["tflops"]) for r in rows if r["impl"] == impl and r.get("status") == "ok"
                     and r.get("tflops") is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=IMPL_LABELS[impl], markersize=5,
                    **STYLE.get(impl, {}))
            top = max(top, max(p[1] for p in pts))
    if gemm:
        ax.axhline(gemm, color="black", linestyle=":", linewidth=1.2, label=f"bf16 GEMM ceiling ({gemm:.0f})")
    return top


def _tflops_figure(data: dict[str, Any], rows: list[dict[str, Any]], panel_rows: Sequence[Any],
                   panel_cols: Sequence[Any], pick: Any, panel_title: Any, title: str, path: Path,
                   panel_w: float = 4.6, panel_h: float = 3.3) -> Path:
    tokens = data["meta"].get("tokens")
    xlabel = f"sequence length N (B = {fmt_seqlen(tokens)} / N)" if tokens else "sequence length N"
    gemm = data["meta"].get("gemm_tflops")
    nr, nc = len(panel_rows), len(panel_cols)
    fig = _new_figure(max(panel_w * nc + 0.6, 7.5), panel_h * nr + 1.5)
    axes = fig.subplots(nr, nc, squeeze=False, sharey=True)
    seqlens = sorted({r["N"] for r in rows})
    top = 0.0
    for i, pr in enumerate(panel_rows):
        for j, pc in enumerate(panel_cols):
            ax = axes[i][j]
            sub = pick(rows, pr, pc)
            top = max(top, _tflops_panel(ax, sub, gemm))
            _panel_note(ax, sub)
            ax.set_title(panel_title(pr, pc), fontsize=10)
            _setup_x(ax, seqlens)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == nr - 1:
                ax.set_xlabel(xlabel)
    axes[0][0].set_ylim(0, max(top, gemm or 0) * 1.1 or 1)
    fig.suptitle(title, fontsize=11)
    _legend(fig, [a for row in axes for a in row])
    fig.savefig(path, dpi=110)
    return path


def _variant_title(v: str, params: dict[str, Any]) -> str:
    return {"alibi": "ALiBi (causal)", "softcap": f"softcap {params.get('softcap', 30):g} (causal)",
            "sliding_window": f"sliding window {params.get('window', 1024)}",
            "document": f"document mask ({params.get('num_docs', 4)} docs)",
            "dropout": f"dropout {params.get('dropout_p', 0.1):g}"}.get(v, v)


def plot_all(data: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write every plot the data has rows for; returns the paths.  ImportError without matplotlib;
    a plot that fails otherwise is reported on stderr and left out (the others are still written)."""
    import matplotlib  # noqa: F401  (a clear ImportError when absent)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    m = data["meta"]
    jobs: list[tuple[str, Any]] = []
    shape = f"bf16, B·N = {fmt_seqlen(m.get('tokens', 16384))} tokens, H·d = {m.get('hidden', 2048)}"
    for mode in ("fwd", "bwd", "fwdbwd"):
        rows = [r for r in data["rows"] if r.get("section") in ("forward", "backward") and r.get("mode") == mode]
        if not any(r.get("status") == "ok" for r in rows):
            continue
        dims = sorted({r["d"] for r in rows})
        masks = [x for x in ("non-causal", "causal") if any(r.get("mask") == x for r in rows)]
        jobs.append((f"tflops_{mode}.png", lambda p, rows=rows, dims=dims, masks=masks, mode=mode: _tflops_figure(
            data, rows, dims, masks, lambda rs, d, mk: [r for r in rs if r["d"] == d and r.get("mask") == mk],
            lambda d, mk: f"d = {d}, {mk}", _title(data, f"{MODE_LABELS[mode].capitalize()} TFLOP/s ({shape})"), p)))
    rows = _rows(data, "variants")
    if any(r.get("status") == "ok" for r in rows):
        variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
        modes = [x for x in ("fwd", "bwd", "fwdbwd") if any(r["mode"] == x for r in rows)]
        vp = m.get("variant_params") or {}
        jobs.append(("tflops_variants.png", lambda p, rows=rows: _tflops_figure(
            data, rows, modes, variants, lambda rs, md, v: [r for r in rs if r["mode"] == md and r["variant"] == v],
            lambda md, v: f"{_variant_title(v, vp)}, {MODE_LABELS[md]}",
            _title(data, f"Variants, TFLOP/s (d = {rows[0]['d']})\n{shape}; window and document: visible pairs"),
            p, panel_w=3.5, panel_h=3.0)))
    rows = _rows(data, "memory")
    if any(r.get("status") == "ok" for r in rows):
        jobs.append(("memory.png", lambda p, rows=rows: _memory_figure(data, rows, p)))
    rows = [r for r in _rows(data, "latency") if r.get("status") == "ok"]
    if rows:
        jobs.append(("latency.png", lambda p, rows=rows: _latency_figure(data, rows, p)))
    files: list[Path] = []
    for name, draw in jobs:
        try:
            files.append(draw(out / name))
        except Exception as e:
            print(f"attncompiler bench: plot {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
    return files


def _memory_figure(data: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> Path:
    modes = [x for x in ("fwd", "fwdbwd") if any(r["mode"] == x for r in rows)]
    fig = _new_figure(5.2 * len(modes) + 0.6, 4.8)
    axes = fig.subplots(1, len(modes), squeeze=False, sharey=True)[0]
    seqlens = sorted({r["N"] for r in rows})
    ok = [r["peak_bytes"] / 2**30 for r in rows if r.get("status") == "ok" and r.get("peak_bytes")]
    lo, hi = (min(ok), max(ok)) if ok else (1e-3, 1.0)
    oom_y = hi * 4
    impls = [i for i in ("v2", "sdpa_flash", "sdpa_efficient", "flex", "sdpa_math")
             if any(r["impl"] == i for r in rows)]
    for ax, mode in zip(axes, modes):
        for impl in impls:
            rs = [r for r in rows if r["mode"] == mode and r["impl"] == impl]
            pts = sorted((r["N"], r["peak_bytes"] / 2**30) for r in rs
                         if r.get("status") == "ok" and r.get("peak_bytes"))
            st = STYLE.get(impl, {})
            if pts:  # peers' markers larger: a peer with v2's numbers (same allocations) stays visible under it
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=IMPL_LABELS.get(impl, impl),
                        markersize=5 if impl == "v2" else 8, **st)
            for r in rs:
                if r.get("status") == "oom":
                    ax.scatter([r["N"]], [oom_y], marker="x", s=60, color=st.get("color", "black"), zorder=6)
                    ax.annotate("OOM", (r["N"], oom_y), textcoords="offset points", xytext=(0, 7), ha="center",
                                fontsize=8, color=st.get("color", "black"))
        ax.set_yscale("log")
        ax.set_ylim(lo / 2, oom_y * 3)
        _setup_x(ax, seqlens)
        ax.set_title(MODE_LABELS[mode], fontsize=10)
        ax.set_xlabel("sequence length N")
    axes[0].set_ylabel("peak memory above inputs (GiB)")
    r0 = rows[0]
    fig.suptitle(_title(data, f"Peak memory (B = {r0.get('B')}, H = {r0.get('H')}, d = {r0.get('d')}, "
                              f"{'causal' if r0.get('causal') else 'non-causal'}, bf16; x = out of memory)"),
                 fontsize=11)
    _legend(fig, axes)
    fig.savefig(path, dpi=110)
    return path


def _latency_figure(data: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> Path:
    bars = (("first_call_s", "first forward call, cold (runtime init + compile + run)", "#d62728"),
            ("next_variant_s", "next new variant in that process (compile + run)", "#ff7f0e"),
            ("first_bwd_s", "first forward+backward after it (backward compile)", "#ff9896"),
            ("warm_s", "warm forward call (same process)", "#1f77b4"))
    fig = _new_figure(8.5, 1.1 * len(rows) + 2.2)
    ax = fig.subplots()
    h = 0.8 / len(bars)
    vals = []
    for j, (key, label, color) in enumerate(bars):
        ys, xs = [], []
        for i, r in enumerate(rows):
            if r.get(key) is not None:
                ys.append(i + (j - (len(bars) - 1) / 2) * h)
                xs.append(max(r[key], 1e-4))
        if xs:
            ax.barh(ys, xs, height=h * 0.95, color=color, label=label)
            for y, x in zip(ys, xs):
                ax.annotate(f"{x * 1e3:.1f} ms" if x < 0.1 else f"{x:.2f} s" if x < 10 else f"{x:.1f} s", (x, y),
                            textcoords="offset points",
                            xytext=(3, -3), fontsize=8)
            vals += xs
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([IMPL_LABELS.get(r["impl"], r["impl"]) for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    if vals:
        ax.set_xlim(min(vals) / 2, max(vals) * 6)
    ax.set_xlabel("seconds (log scale)")
    ax.grid(True, axis="x", alpha=0.3)
    r0 = rows[0]
    ax.set_title(_title(data, f"Compile latency: fresh process, empty caches (d = {r0.get('d')}, N = {r0.get('N')}, "
                              f"{'causal' if r0.get('causal') else 'non-causal'})"), fontsize=11)
    _legend(fig, [ax], ncol=1)
    fig.savefig(path, dpi=110)
    return path
