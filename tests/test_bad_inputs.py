"""Bad inputs, table-driven: each is a clear error (its type, and a message naming what was expected
and what was got) or a documented behaviour (docs/shapes.md) -- never a crash in the driver.

``CPU_ROWS`` run everywhere: spec validation, tracing, presets, planning and compile options, and
every argument check of ``CompiledAttention.__call__`` (kernels compiled for sm_90 without a GPU;
the checks run before anything touches CUDA, so CPU tensors reach them).  ``GPU_ROWS`` need CUDA
tensors: layouts, alignment, ``out=``, grid limits, devices, empty problems, NaN propagation and
buffers smaller than the indices read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import attncompiler as ac
from attncompiler.codegen.schedule import ScheduleError
from attncompiler.plan.model import PlanError
from attncompiler.plan.targets import TargetError
from attncompiler.runtime.launch import InputError
from attncompiler.spec import SpecError, TraceError, presets

BF16 = torch.bfloat16
NAN = float("nan")
ROOT = Path(__file__).parent.parent


@dataclass(frozen=True)
class Row:
    """One bad input: ``run()`` must raise ``exc`` with every fragment of ``says`` in its message,
    or (``exc`` None) run its own checks of a documented behaviour."""

    id: str
    run: Callable[[], Any]
    exc: type[BaseException] | None = None
    says: tuple[str, ...] = ()


def _kern(spec: ac.AttentionSpec | None = None, schedule: str = "v2", **kw: Any) -> ac.CompiledAttention:
    """A kernel compiled (planned and rendered) for sm_90 without a GPU."""
    return ac.compile(spec or presets.plain(64), schedule, target="sm_90", build=False, **kw)


def _t(*shape: int, dtype: torch.dtype = BF16, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, device=device).to(dtype)


def _qkv(B: int = 1, H: int = 2, N: int = 64, D: int = 64, Hkv: int | None = None, device: str = "cpu"):
    return _t(B, H, N, D, device=device), _t(B, Hkv or H, N, D, device=device), _t(B, Hkv or H, N, D, device=device)


def _call(spec: ac.AttentionSpec | None = None, *, q=None, k=None, v=None, **kw: Any) -> Callable[[], Any]:
    def run() -> Any:
        q0, k0, v0 = _qkv()
        return _kern(spec)(q0 if q is None else q, k0 if k is None else k, v0 if v is None else v, **kw)
    return run


def _alibi() -> ac.AttentionSpec:
    return presets.alibi(presets.alibi_slopes(4), 64)


def _trace(**kw: Any) -> Callable[[], Any]:
    return lambda: ac.AttentionSpec(64, **kw).trace()


def _py_if(score, b, h, q_idx, kv_idx):
    if score > 0:
        return score
    return -score


_BUF4 = torch.arange(4.0)


class _CliFailed(Exception):
    """A CLI command returned a non-zero code; the message is its stderr."""


def _cli(argv: list[str]) -> Callable[[], None]:
    def run() -> None:
        import contextlib
        import io

        from attncompiler.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(argv)
        if rc != 0:
            raise _CliFailed(f"rc={rc}: {err.getvalue()}")
    return run


def _requires_grad_cpu() -> Any:
    q, k, v = (t.requires_grad_() for t in _qkv())
    return _kern()(q, k, v)


_I32 = torch.int32


def _cu(*vals: int, dtype: torch.dtype = _I32) -> torch.Tensor:
    return torch.tensor(vals, dtype=dtype)


def _vcall(*, q=None, k=None, v=None, cu_q: Any = "default", cu_k: Any = "default", **kw: Any) -> Callable[[], Any]:
    """A packed-sequence call (sequences of 5 and 7 rows) on CPU tensors, with one argument replaced."""
    def run() -> Any:
        dq, dk, dv = _t(12, 2, 64), _t(12, 2, 64), _t(12, 2, 64)
        return _kern()(dq if q is None else q, dk if k is None else k, dv if v is None else v,
                       cu_seqlens_q=_cu(0, 5, 12) if isinstance(cu_q, str) else cu_q,
                       cu_seqlens_k=_cu(0, 5, 12) if isinstance(cu_k, str) else cu_k, **kw)
    return run


CPU_ROWS: tuple[Row, ...] = (
    # --- spec validation
    Row("spec-head-dim-0", lambda: ac.AttentionSpec(0), SpecError, ("head_dim", "multiple of 8 in [8, 256]", "got 0")),
    Row("spec-head-dim-300", lambda: ac.AttentionSpec(300), SpecError, ("got 300", "above 256")),
    Row("spec-head-dim-36", lambda: ac.AttentionSpec(36), SpecError, ("got 36", "zero-pad the head dimension to 40")),
    Row("spec-head-dim-v-12", lambda: ac.AttentionSpec(64, head_dim_v=12), SpecError, ("head_dim_v", "got 12")),
    Row("spec-dtype-float32", lambda: ac.AttentionSpec(64, dtype="float32"), SpecError,
        ("dtype: expected one of", "got 'float32'")),
    Row("spec-dtype-torch-float32", lambda: ac.AttentionSpec(64, dtype=torch.float32), SpecError,
        ("dtype: expected one of", "got torch.float32")),
    Row("spec-dropout-1", lambda: ac.AttentionSpec(64, dropout_p=1.0), SpecError,
        ("dropout_p: expected a probability in [0, 1)", "got 1.0")),
    Row("spec-scale-negative", lambda: ac.AttentionSpec(64, scale=-1.0), SpecError,
        ("scale: expected a finite float > 0", "got -1.0")),
    Row("spec-causal-str", lambda: ac.AttentionSpec(64, causal="yes"), SpecError,
        ("causal: expected True or False", "got 'yes'")),
    Row("spec-score-mod-int", lambda: ac.AttentionSpec(64, score_mod=42), SpecError,
        ("score_mod: expected a callable", "got int")),
    Row("spec-buffers-int", lambda: ac.AttentionSpec(64, buffers=5), SpecError,
        ("buffers: expected a mapping", "got int")),
    # --- tracing
    Row("trace-python-if", _trace(score_mod=_py_if), TraceError, ("Python control flow", "ops.where")),
    Row("trace-mask-returns-number", _trace(mask_mod=lambda b, h, q, kv: q - kv), TraceError,
        ("mask_mod must return a boolean", "got expression")),
    Row("trace-score-returns-bool", _trace(score_mod=lambda s, b, h, q, kv: q >= kv), TraceError,
        ("score_mod must return a number", "got boolean")),
    Row("trace-wrong-signature", _trace(score_mod=lambda s, b: s), TraceError,
        ("must take (score, b, h, q_idx, kv_idx)", "got (s, b)")),
    Row("trace-too-many-indices", _trace(score_mod=lambda s, b, h, q, kv: s + _BUF4[h, q]), TraceError,
        ("has 1 dims", "expected at most 1 indices, got 2")),
    Row("trace-constant-index-out-of-range", _trace(score_mod=lambda s, b, h, q, kv: s + _BUF4[9]), TraceError,
        ("expected a constant index in [0, 4)", "got 9")),
    Row("trace-unsupported-torch-fn", _trace(score_mod=lambda s, b, h, q, kv: torch.softmax(s, 0)), TraceError,
        ("softmax", "is not supported on traced values", "supported:")),
    Row("trace-unsupported-method", _trace(score_mod=lambda s, b, h, q, kv: s.sin()), TraceError,
        ("traced values have no attribute 'sin'", "their tensor-style methods: abs,", "tanh")),
    # --- presets
    Row("preset-unknown", lambda: presets.get_preset("nope"), SpecError, ("unknown preset 'nope'; expected one of",)),
    Row("preset-relative-bias-1d", lambda: presets.relative_bias(torch.zeros(9), 64), SpecError,
        ("table: expected a 2-D floating torch.Tensor of shape (num_heads, 2R + 1)",
         "got torch.float32 tensor of shape (9,)")),
    Row("preset-relative-bias-even-width", lambda: presets.relative_bias(torch.zeros(4, 8), 64), SpecError,
        ("an odd number of relative distances", "shape (4, 8)")),
    Row("preset-relative-bias-int", lambda: presets.relative_bias(torch.zeros(4, 9, dtype=torch.int32), 64),
        SpecError, ("2-D floating", "got torch.int32")),
    Row("preset-alibi-int-slopes", lambda: presets.alibi(torch.arange(4), 64), SpecError,
        ("expected a 1-D floating torch.Tensor", "got torch.int64")),
    Row("preset-field-twice", lambda: presets.softcap(30.0, 64, score_mod=lambda s, b, h, q, kv: s), SpecError,
        ("expected no `score_mod`", "and_masks")),
    # --- planning / compile options
    Row("plan-v2-head-dim-40", lambda: _kern(presets.plain(40)), PlanError,
        ("head_dim=40", "must be a multiple of 16", "m16n8k16")),
    Row("plan-forced-block-m-48", lambda: _kern(block_m=48), PlanError, ("block_m=48", "BLOCK_M=48 not in {64, 128}")),
    Row("plan-v3-option-under-v2", lambda: ac.compile(presets.softcap(30.0, 128), "auto", target="sm_80",
                                                     q_prescale=True, build=False), PlanError,
        ("schedule 'auto' on sm_80 -> v2", "expected plan options among block_m", "got q_prescale")),
    Row("plan-unknown-option-v3", lambda: ac.compile(presets.plain(128), "v3", target="sm_90", blok_n=64,
                                                    build=False), PlanError,
        ("v3: expected plan options among block_n", "got blok_n")),
    Row("compile-unknown-schedule", lambda: _kern(schedule="v9"), ScheduleError,
        ("unknown schedule 'v9'; expected one of v1, v2",)),
    Row("compile-not-a-spec", lambda: ac.compile({"head_dim": 64}, target="sm_90"), TypeError,
        ("spec: expected an AttentionSpec, got dict",)),
    Row("compile-unknown-target", lambda: ac.compile(presets.plain(64), target="sm_99"), TargetError,
        ("unknown target 'sm_99'", "valid names: sm_80")),
    Row("compile-bad-seqlen-hint", lambda: ac.compile(presets.plain(64), target="sm_90", seqlen_hint=0), TypeError,
        ("seqlen_hint: expected a positive int or None, got 0",)),
    # --- tensors (CPU tensors reach every check before the device one)
    Row("call-q-list", _call(q=[1.0]), InputError, ("q: expected a torch.Tensor, got list",)),
    Row("call-v-none", lambda: _kern()(_t(1, 2, 64, 64), _t(1, 2, 64, 64), None), InputError,
        ("v: expected a torch.Tensor, got NoneType",)),
    Row("call-q-3d", _call(q=_t(2, 64, 64)), InputError, ("q: expected 4 dims", "got shape (2, 64, 64)")),
    Row("call-q-float32", _call(q=_t(1, 2, 64, 64, dtype=torch.float32)), InputError,
        ("q: expected dtype torch.bfloat16", "got torch.float32", "cast the input with .to(torch.bfloat16)")),
    Row("call-mixed-dtypes", _call(k=_t(1, 2, 64, 64, dtype=torch.float16)), InputError,
        ("k: expected dtype torch.bfloat16", "got torch.float16", "or compile a spec with dtype=torch.float16")),
    Row("call-q-head-dim", _call(q=_t(1, 2, 64, 32)), InputError, ("q: expected head_dim 64 (compiled), got 32",)),
    Row("call-v-head-dim", _call(v=_t(1, 2, 64, 128)), InputError, ("v: expected head_dim_v 64 (compiled), got 128",)),
    Row("call-batch-mismatch", _call(q=_t(2, 2, 64, 64)), InputError,
        ("batch: expected q, k, v to share it, got 2, 1, 1",)),
    Row("call-kv-seqlen-mismatch", _call(v=_t(1, 2, 63, 64)), InputError,
        ("k and v: expected the same heads and seqlen", "(1, 2, 64, 64)", "(1, 2, 63, 64)")),
    Row("call-hq-not-multiple-of-hkv", _call(q=_t(1, 3, 64, 64)), InputError,
        ("expected q heads (3) to be a multiple of k/v heads (2)",)),
    Row("call-hkv-zero", _call(k=_t(1, 0, 64, 64), v=_t(1, 0, 64, 64)), InputError, ("multiple of k/v heads (0)",)),
    Row("call-cpu-tensors", _call(), InputError, ("q: expected a CUDA tensor, got a tensor on cpu", ".cuda()")),
    Row("call-cpu-requires-grad", _requires_grad_cpu, InputError, ("q: expected a CUDA tensor, got cpu",)),
    # --- scalar arguments
    Row("call-scale-zero", _call(scale=0.0), InputError, ("scale: expected a finite float > 0", "got 0.0")),
    Row("call-scale-negative", _call(scale=-0.125), InputError, ("scale: expected a finite float > 0", "got -0.125")),
    Row("call-scale-nan", _call(scale=NAN), InputError, ("scale: expected a finite float > 0", "got nan")),
    Row("call-scale-str", _call(scale="big"), InputError, ("scale: expected a finite float > 0", "got 'big'")),
    Row("call-dropout-1.5", _call(dropout_p=1.5), InputError, ("dropout_p: expected a value in [0, 1)", "got 1.5")),
    Row("call-dropout-bool", _call(dropout_p=True), InputError, ("dropout_p: expected a value in [0, 1)", "got True")),
    Row("call-dropout-without-dropout-kernel", _call(dropout_p=0.1), InputError,
        ("compiled without dropout", "got dropout_p=0.1")),
    Row("call-seed-float", _call(seed=1.5), InputError, ("seed: expected an int", "got float 1.5")),
    Row("call-offset-str", _call(offset="0"), InputError, ("offset: expected an int", "got str '0'")),
    Row("call-deterministic-str", _call(deterministic="yes"), InputError,
        ("deterministic: expected True, False or None", "got 'yes'")),
    Row("call-out-list", _call(out=[0.0]), InputError, ("out: expected a torch.Tensor or None, got list",)),
    # --- buffers
    Row("buffers-not-mapping", _call(_alibi(), buffers=[("slopes", torch.ones(4))]), InputError,
        ("buffers: expected a mapping name -> torch.Tensor, got list",)),
    Row("buffers-unknown-name", _call(_alibi(), buffers={"slope": torch.ones(4)}), InputError,
        ("buffers: expected names among the spec's captured buffers ['slopes']", "got 'slope'")),
    Row("buffer-wrong-rank", _call(_alibi(), buffers={"slopes": torch.ones(4, 1)}), InputError,
        ("buffer 'slopes': expected 1 dims (as captured)", "got shape (4, 1)")),
    Row("buffer-not-tensor", _call(_alibi(), buffers={"slopes": [1.0, 2.0]}), InputError,
        ("buffer 'slopes': expected a torch.Tensor, got list",)),
    Row("buffer-empty", _call(_alibi(), buffers={"slopes": torch.ones(0)}), InputError,
        ("buffer 'slopes': expected a non-empty tensor", "got shape (0,)")),
    Row("buffer-float-for-int", _call(presets.document(presets.document_ids(64), 64),
                                      buffers={"doc_ids": torch.zeros(64)}), InputError,
        ("buffer 'doc_ids': expected an int or bool tensor", "got dtype torch.float32")),
    Row("buffer-complex", _call(_alibi(), buffers={"slopes": torch.ones(4, dtype=torch.complex64)}), InputError,
        ("buffer 'slopes': expected a float or int tensor", "got dtype torch.complex64")),
    # --- packed sequences (cu_seqlens): every check but the device one runs on CPU tensors
    Row("varlen-q-4d", _vcall(q=_t(1, 12, 2, 64)), InputError,
        ("q: expected 3 dims (total_rows, heads, head_dim)", "got shape (1, 12, 2, 64)")),
    Row("varlen-q-float32", _vcall(q=_t(12, 2, 64, dtype=torch.float32)), InputError,
        ("q: expected dtype torch.bfloat16", "got torch.float32")),
    Row("varlen-kv-rows-mismatch", _vcall(v=_t(11, 2, 64)), InputError,
        ("k and v: expected the same rows and heads", "(12, 2, 64)", "(11, 2, 64)")),
    Row("varlen-cu-list", _vcall(cu_q=[0, 5, 12]), InputError,
        ("cu_seqlens_q: expected an int32 tensor of length B+1", "got list")),
    Row("varlen-cu-int64", _vcall(cu_k=_cu(0, 5, 12, dtype=torch.int64)), InputError,
        ("cu_seqlens_k: expected dtype torch.int32", "got torch.int64")),
    Row("varlen-cu-2d", _vcall(cu_q=_cu(0, 5, 12).view(1, 3)), InputError,
        ("cu_seqlens_q: expected a 1-d tensor of length B+1", "got shape (1, 3)")),
    Row("varlen-cu-not-monotone", _vcall(cu_q=_cu(0, 9, 5, 12)), InputError,
        ("cu_seqlens_q: expected non-decreasing offsets", "cu_seqlens_q[1] = 9 > cu_seqlens_q[2] = 5")),
    Row("varlen-cu-first-not-zero", _vcall(cu_k=_cu(2, 5, 12)), InputError,
        ("cu_seqlens_k: expected cu_seqlens[0] == 0", "got 2")),
    Row("varlen-cu-total-mismatch", _vcall(cu_q=_cu(0, 5, 11)), InputError,
        ("cu_seqlens_q: expected the last offset to equal the packed query rows (12)", "got 11")),
    Row("varlen-cu-length-mismatch", _vcall(cu_k=_cu(0, 12)), InputError,
        ("expected the same length B+1", "got 3 and 2")),
    Row("varlen-only-cu-q", _vcall(cu_k=None), InputError,
        ("cu_seqlens_q, cu_seqlens_k: expected both", "got a tensor and None")),
    Row("varlen-max-seqlen-short", _vcall(max_seqlen_q=4), InputError,
        ("max_seqlen_q: expected at least the longest sequence (7)", "got 4")),
    Row("varlen-max-seqlen-negative", _vcall(max_seqlen_k=-1), InputError,
        ("max_seqlen_k: expected a non-negative int or None", "got -1")),
    Row("varlen-cpu-tensors", _vcall(), InputError, ("q: expected a CUDA tensor, got a tensor on cpu",)),
    Row("functional-varlen-q-4d", lambda: ac.attention(_t(1, 12, 2, 64), _t(12, 2, 64), _t(12, 2, 64),
                                                       cu_seqlens_q=_cu(0, 12), cu_seqlens_k=_cu(0, 12)),
        InputError, ("q: expected a 3-d torch.Tensor (total, heads, dim) with cu_seqlens", "(1, 12, 2, 64)")),
    # --- functional API, reference, CLI
    Row("functional-q-list", lambda: ac.attention([1.0], *_qkv()[1:]), InputError,
        ("q: expected a 4-d torch.Tensor", "got list")),
    Row("functional-float32", lambda: ac.attention(*(_t(1, 2, 64, 64, dtype=torch.float32) for _ in range(3))),
        InputError, ("q: expected dtype torch.bfloat16 or torch.float16", "got torch.float32",
                     ".to(torch.bfloat16)")),
    Row("functional-varlen-float32", lambda: ac.attention(*(_t(12, 2, 64, dtype=torch.float32) for _ in range(3)),
                                                          cu_seqlens_q=_cu(0, 12), cu_seqlens_k=_cu(0, 12)),
        InputError, ("q: expected dtype torch.bfloat16 or torch.float16", "got torch.float32")),
    Row("reference-missing-buffer", lambda: ac.reference_attention(*_qkv(), ac.build_ir(_alibi())), ValueError,
        ("expected buffer 'slopes' (declared by the IR)", "got only []")),
    Row("cli-spec-file-missing", lambda: __import__("attncompiler.cli").cli.load_spec(
        "nope/missing.py:SPEC", head_dim=64, dtype="bf16"), SystemExit,
        ("spec file not found: expected a file at nope/missing.py",)),
    Row("cli-spec-name-missing", lambda: __import__("attncompiler.cli").cli.load_spec(
        str(ROOT / "examples" / "alibi.py") + ":NOPE", head_dim=64, dtype="bf16"), SystemExit,
        ("has no 'NOPE'", "expected an AttentionSpec or a function")),
    Row("cli-unknown-preset", _cli(["plan", "nope", "--arch", "sm_90"]), _CliFailed,
        ("rc=2", "unknown preset 'nope'; expected one of")),
    Row("cli-bad-shape", _cli(["plan", "causal", "--arch", "sm_90", "--shape", "1,2"]), _CliFailed,
        ("rc=2", "--shape: expected", "got '1,2'")),
    Row("cli-unknown-arch", _cli(["show", "causal", "--arch", "sm_99"]), _CliFailed,
        ("rc=2", "unknown target 'sm_99'")),
)


def _check(row: Row) -> None:
    if row.exc is None:
        row.run()
        return
    with pytest.raises(row.exc) as info:
        row.run()
    msg = str(info.value.code if isinstance(info.value, SystemExit) else info.value)
    missing = [s for s in row.says if s not in msg]
    assert not missing, f"{row.id}: message lacks {missing}:\n{msg}"


@pytest.mark.parametrize("row", CPU_ROWS, ids=lambda r: r.id)
def test_bad_input_cpu(row: Row) -> None:
    _check(row)


def test_no_gpu_compile_says_what_to_do() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: compile() targets it")
    _check(Row("compile-no-gpu", lambda: ac.compile(presets.plain(64)), ScheduleError,
               ("no CUDA device: expected a GPU to compile for, got none", "target='sm_90'")))


# ----------------------------------------------------------------------------------- GPU rows
def _gpu_kern(spec: ac.AttentionSpec | None = None, schedule: str = "v2") -> ac.CompiledAttention:
    return ac.compile(spec or presets.plain(64), schedule)


def _gcall(spec: ac.AttentionSpec | None = None, *, q=None, k=None, v=None, H: int = 2,
           **kw: Any) -> Callable[[], Any]:
    def run() -> Any:
        q0, k0, v0 = _qkv(H=H, device="cuda")
        pick = lambda x, d: d if x is None else (x() if callable(x) else x)  # noqa: E731
        return _gpu_kern(spec)(pick(q, q0), pick(k, k0), pick(v, v0),
                               **{n: (x() if callable(x) else x) for n, x in kw.items()})
    return run


def _cuda_t(*shape: int, dtype: torch.dtype = BF16) -> Callable[[], torch.Tensor]:
    return lambda: _t(*shape, dtype=dtype, device="cuda")


def _long_keys() -> torch.Tensor:
    """2^21 + 1 keys as a broadcast view (no memory): past the exact range of the hooks' fast
    index -> float conversion, so an ALiBi spec must refuse it."""
    return torch.randn(1, 4, 1, 64, device="cuda").to(BF16).expand(1, 4, 2**21 + 1, 64)


def _misaligned() -> torch.Tensor:
    flat = torch.randn(2 * 64 * 64 + 1, device="cuda").to(BF16)
    return flat[1:].view(1, 2, 64, 64)  # storage offset 1 element: 2-byte aligned base


def _odd_row_stride() -> torch.Tensor:
    return torch.randn(1, 2, 64, 65, device="cuda").to(BF16)[..., :64]  # row stride 65 elements


def _expanded_heads(h: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(1, 1, 1, 64, device="cuda").to(BF16).expand(1, h, 1, 64)


def _other_arch() -> Any:
    major, minor = torch.cuda.get_device_capability()
    other = "sm_80" if (major, minor) != (8, 0) else "sm_90"
    kern = ac.compile(presets.plain(64), "v2", target=other, build=False)
    return kern(*_qkv(device="cuda"))


def _mixed_devices() -> Any:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    q, k, v = _qkv(device="cuda")
    return _gpu_kern()(q, k.to("cuda:1"), v)


def _out_with_grad() -> Any:
    q, k, v = (t.requires_grad_() for t in _qkv(device="cuda"))
    return _gpu_kern()(q, k, v, out=torch.empty(1, 2, 64, 64, device="cuda", dtype=BF16))


def _empty_queries() -> None:
    for schedule in ("v2", "v1"):
        kern = _gpu_kern(schedule=schedule)
        q = _t(2, 3, 0, 64, device="cuda")
        k, v = _t(2, 3, 50, 64, device="cuda"), _t(2, 3, 50, 64, device="cuda")
        out, lse = kern(q, k, v, return_lse=True)
        assert out.shape == (2, 3, 0, 64) and lse.shape == (2, 3, 0) and lse.dtype == torch.float32
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        grads = torch.autograd.grad(kern(*leaves).float().sum(), leaves, allow_unused=True)
        assert all(g is None or not bool(g.any()) for g in grads)


def _empty_keys() -> None:
    for schedule in ("v2", "v1"):
        kern = _gpu_kern(schedule=schedule)
        q = _t(2, 3, 77, 64, device="cuda")
        k, v = _t(2, 3, 0, 64, device="cuda"), _t(2, 3, 0, 64, device="cuda")
        out, lse = kern(q, k, v, return_lse=True)
        assert out.shape == (2, 3, 77, 64) and bool((out == 0).all())
        assert bool(torch.isinf(lse).all()) and bool((lse < 0).all())
        qg = q.clone().requires_grad_()
        (dq,) = torch.autograd.grad(kern(qg, k, v).float().sum(), [qg])
        assert bool((dq == 0).all())


def _empty_batch() -> None:
    for schedule in ("v2", "v1"):
        q, k, v = _qkv(B=1, device="cuda")
        out, lse = _gpu_kern(schedule=schedule)(q[:0], k[:0], v[:0], return_lse=True)
        assert out.shape == (0, 2, 64, 64) and lse.shape == (0, 2, 64)


def _nan_in_q_stays_in_its_row() -> None:
    for schedule in ("v2", "v1"):
        kern = _gpu_kern(presets.causal(64), schedule)
        q, k, v = _qkv(B=2, H=2, N=150, device="cuda")
        clean, lse_c = kern(q, k, v, return_lse=True)
        q[1, 0, 37, 5] = NAN
        out, lse = kern(q, k, v, return_lse=True)
        row = torch.zeros(out.shape[:3], dtype=torch.bool, device="cuda")
        row[1, 0, 37] = True
        assert torch.equal(out[~row], clean[~row]) and torch.equal(lse[~row], lse_c[~row]), schedule
        assert not torch.equal(out[1, 0, 37], clean[1, 0, 37]), f"{schedule}: the NaN row looks clean"
        assert not math.isfinite(float(lse[1, 0, 37])), f"{schedule}: lse of the NaN row is finite"


def _nan_in_k_reaches_exactly_the_rows_that_see_it() -> None:
    for schedule in ("v2", "v1"):
        kern = _gpu_kern(presets.causal(64), schedule)
        q, k, v = _qkv(B=1, H=2, N=150, device="cuda")
        clean = kern(q, k, v)
        k[0, 1, 50, 3] = NAN
        out = kern(q, k, v)
        assert torch.equal(out[:, 0], clean[:, 0]), f"{schedule}: another head changed"
        assert torch.equal(out[0, 1, :50], clean[0, 1, :50]), f"{schedule}: rows before key 50 changed"
        assert bool(torch.isnan(out[0, 1, 50:]).all()), f"{schedule}: a row that sees key 50 is not NaN"


def _short_buffer_reads_clamp() -> None:
    from attncompiler.reference import eager_attention, error_ratio_check, reference_attention

    spec = _alibi()
    kern = _gpu_kern(spec)
    q, k, v = _qkv(B=1, H=4, N=100, device="cuda")
    short = {"slopes": presets.alibi_slopes(4)[:2]}  # heads 2 and 3 read slopes[1] (clamped index)
    out = kern(q, k, v, buffers=short)
    ref = reference_attention(q, k, v, kern.ir, buffers=short)
    ok, msg = error_ratio_check(out, ref, eager_attention(q, k, v, kern.ir, buffers=short))
    assert ok, msg
    clamped = {"slopes": presets.alibi_slopes(4)[[0, 1, 1, 1]]}
    assert torch.equal(out, kern(q, k, v, buffers=clamped))


GPU_ROWS: tuple[Row, ...] = (
    Row("gpu-head-dim-not-contiguous", _gcall(q=lambda: _t(1, 2, 64, 64, device="cuda").transpose(-1, -2)),
        InputError, ("q: expected a contiguous head dimension (stride 1)", "got strides (8192, 4096, 1, 64)")),
    Row("gpu-misaligned-storage-offset", _gcall(k=_misaligned), InputError,
        ("k: expected 16-byte aligned rows", "16-byte aligned base", "address")),
    Row("gpu-row-stride-not-multiple-of-8", _gcall(v=_odd_row_stride), InputError,
        ("v: expected 16-byte aligned rows", "got strides (8320, 4160, 65, 1)")),
    Row("gpu-hq-not-multiple-of-hkv", _gcall(q=_cuda_t(1, 3, 64, 64)), InputError,
        ("expected q heads (3) to be a multiple of k/v heads (2)",)),
    Row("gpu-mixed-dtypes", _gcall(v=_cuda_t(1, 2, 64, 64, dtype=torch.float16)), InputError,
        ("v: expected dtype torch.bfloat16", "got torch.float16")),
    Row("gpu-k-on-cpu", _gcall(k=lambda: _t(1, 2, 64, 64)), InputError,
        ("k: expected a CUDA tensor, got a tensor on cpu",)),
    Row("gpu-mixed-devices", _mixed_devices, InputError, ("q, k, v: expected one device", "cuda:0", "cuda:1")),
    Row("gpu-heads-over-grid", _gcall(q=_expanded_heads(70000), k=_expanded_heads(70000),
                                      v=_expanded_heads(70000)), InputError,
        ("batch and heads: expected each at most 65535", "got B=1, H=70000")),
    Row("gpu-out-wrong-shape", lambda: _gpu_kern()(*_qkv(device="cuda"), out=_t(1, 2, 64, 32, device="cuda")),
        InputError,
        ("out: expected (1, 2, 64, 64) torch.bfloat16 on cuda", "got (1, 2, 64, 32)")),
    Row("gpu-out-wrong-dtype", lambda: _gpu_kern()(*_qkv(device="cuda"), out=_t(1, 2, 64, 64, dtype=torch.float16,
                                                                                     device="cuda")),
        InputError, ("out: expected (1, 2, 64, 64) torch.bfloat16", "torch.float16")),
    Row("gpu-out-head-dim-not-contiguous", lambda: _gpu_kern()(*_qkv(device="cuda"), out=_t(
        1, 2, 64, 64, device="cuda").transpose(-1, -2)), InputError,
        ("out: expected a contiguous head dim", "strides")),
    Row("gpu-out-with-requires-grad", _out_with_grad, InputError,
        ("out: expected None when inputs require grad", "got a tensor")),
    Row("gpu-buffer-wrong-rank", _gcall(_alibi(), H=4, buffers=lambda: {"slopes": torch.ones(4, 1, device="cuda")}),
        InputError, ("buffer 'slopes': expected 1 dims", "got shape (4, 1)")),
    Row("gpu-alibi-seqlen-over-fast-index-limit", _gcall(_alibi(), H=4, k=_long_keys, v=_long_keys), InputError,
        ("sizes: expected every one of B, H, Nq, Nk <= 2097152", "Nk=2097153")),
    Row("gpu-kernel-for-another-arch", _other_arch, ScheduleError,
        ("kernel was planned for sm_", "got a device of sm_")),
    # documented behaviours (docs/shapes.md)
    Row("gpu-seqlen-q-0-empty-output", _empty_queries),
    Row("gpu-seqlen-k-0-zeros-lse-neg-inf", _empty_keys),
    Row("gpu-batch-0-empty-output", _empty_batch),
    Row("gpu-nan-in-q-stays-in-its-row", _nan_in_q_stays_in_its_row),
    Row("gpu-nan-in-k-reaches-rows-that-see-it", _nan_in_k_reaches_exactly_the_rows_that_see_it),
    Row("gpu-buffer-shorter-than-indices-clamps", _short_buffer_reads_clamp),
)


@pytest.mark.gpu
@pytest.mark.parametrize("row", GPU_ROWS, ids=lambda r: r.id)
def test_bad_input_gpu(row: Row) -> None:
    _check(row)


def test_table_has_at_least_30_rows() -> None:
    assert len(CPU_ROWS) + len(GPU_ROWS) >= 30 and len({r.id for r in CPU_ROWS + GPU_ROWS}) == len(CPU_ROWS + GPU_ROWS)
