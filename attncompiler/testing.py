"""Checking a compiled kernel against the float64 reference (the error-ratio rule).

Used by the GPU tests, the examples and ``attncompiler run``: random inputs (never zeros), the
output poisoned with NaN before the run, and the kernel's error compared with what eager PyTorch in
the same dtype errs against the float64 reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch

from .reference import eager_attention, error_ratio_check, reference_attention

__all__ = ["CheckResult", "GradCheckResult", "LSE_ULPS", "TransformerBlock", "check_kernel", "check_kernel_grads",
           "lse_check", "random_qkv"]


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    message: str
    lse_max_err: float
    shape: tuple[int, int, int, int]

    def __str__(self) -> str:
        B, H, Nq, Nk = self.shape
        return f"B={B} H={H} Nq={Nq} Nk={Nk}: {self.message}; lse max err {self.lse_max_err:.2e}"


def random_qkv(B: int, H: int, Nq: int, Nk: int, D: int, DV: int, dtype: torch.dtype, *, H_kv: int | None = None,
               device: str = "cuda", generator: torch.Generator | None = None):
    """Random normal q, k, v in (B, H, N, d) layout."""
    hk = H if H_kv is None else H_kv
    mk = lambda *s: torch.randn(*s, device=device, dtype=torch.float32, generator=generator).to(dtype)  # noqa: E731
    return mk(B, H, Nq, D), mk(B, hk, Nk, D), mk(B, hk, Nk, DV)


def _inputs_generator(seed: int, device: str = "cuda") -> torch.Generator:
    """The checks' inputs come from their own generator seeded with ``seed``: the same call draws the same
    inputs whatever ran before it (test order, pytest-xdist workers), so a failure reproduces."""
    return torch.Generator(device=device).manual_seed(seed)


#: fp32 ulps of |LSE| that check_kernel's LSE bound allows beside ``lse_tol``
LSE_ULPS = 4


def check_kernel(kernel, B: int, H: int, Nq: int, Nk: int | None = None, *, seed: int = 1234,
                 factor: float = 2.0, lse_tol: float = 2e-3, layout: str = "bhnd",
                 H_kv: int | None = None, repeat: bool = False) -> CheckResult:
    """Run ``kernel`` (a CompiledAttention) on random inputs and compare with the float64 reference.

    ``layout`` "bnhd" passes (B, N, H, d) storage viewed as (B, H, N, d); ``H_kv`` (default H)
    gives k and v fewer heads (GQA / MQA). The LSE passes within ``lse_tol`` + LSE_ULPS fp32 ulps of
    |LSE|, or, when the score_mod holds a tanh (the kernels' ``tanh.approx.f32``, relative error up to
    2^-11, so a logit of magnitude x may be off by ~x 2^-11 and the LSE with it), within ``factor`` times
    eager's LSE error (the error-ratio rule; fuzz seed 100733: softcap 30 times 1.5, five keys per row, LSE
    3.2e-3 off in v2 and v3 alike against eager's 1e-2).  ``seed`` seeds the inputs (their own generator: the
    same call draws the same inputs whatever ran before it) and is the dropout seed.

    ``repeat``: the kernel first runs on other inputs of the same shapes and strides, so the checked call takes the
    launch recorded then (``runtime/fastpath.py``; RuntimeError if one was recorded and not taken; calls the fast
    path leaves alone, such as the score skip's, run the full path twice); that call allocates its output itself, over
    memory filled with NaN and freed just before (the caching allocator hands the block back)."""
    Nk = Nq if Nk is None else Nk
    ir = kernel.ir
    dt = torch.bfloat16 if ir.dtype == "bf16" else torch.float16
    q, k, v = random_qkv(B, H, Nq, Nk, ir.head_dim, ir.head_dim_v, dt, H_kv=H_kv, generator=_inputs_generator(seed))
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    if repeat:
        out, lse = _run_repeated(kernel, q, k, v, seed)
    else:
        out = torch.full((B, H, Nq, ir.head_dim_v), float("nan"), device=q.device, dtype=dt)
        _, lse = kernel(q, k, v, out=out, return_lse=True, seed=seed)
    bufs = kernel._buffers
    ref, ref_lse = reference_attention(q, k, v, ir, buffers=bufs, seed=seed, return_lse=True)
    eag, eag_lse = eager_attention(q, k, v, ir, buffers=bufs, seed=seed, return_lse=True)
    ok, msg = error_ratio_check(out, ref, eag, factor=factor)
    floor = 0.0
    if ir.score_expr is not None and ir.score_expr.has(sympy.tanh):
        floor = factor * lse_check(eag_lse.to(ref_lse.device), ref_lse)[1]
    lse_ok, lse_err = lse_check(lse, ref_lse, lse_tol, floor)
    return CheckResult(ok and lse_ok, msg, lse_err, (B, H, Nq, Nk))


def _run_repeated(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``check_kernel(repeat=True)``'s call: (o, lse) of a call that took a recorded launch."""
    from .runtime import fastpath

    kernel(*(torch.randn_like(t) for t in (q, k, v)), return_lse=True, seed=seed + 1)  # the full path records
    recorded = fastpath.signature(q, k, v, True, None, None) in kernel._recipes
    B, H, Nq, DV = q.shape[0], q.shape[1], q.shape[2], kernel.ir.head_dim_v
    poison = torch.full((B, H, Nq, DV), float("nan"), device=q.device, dtype=q.dtype)
    poison_lse = torch.full((B, H, Nq), float("nan"), device=q.device, dtype=torch.float32)
    del poison, poison_lse
    hits = fastpath.stats["hits"]
    out, lse = kernel(q, k, v, return_lse=True, seed=seed)
    if recorded and fastpath.stats["hits"] != hits + 1:
        raise RuntimeError(f"check_kernel(repeat=True): expected the second call of one signature to take its "
                           f"recorded launch, got the full path ({len(kernel._recipes)} recipes recorded)")
    return out, lse


def lse_check(lse: torch.Tensor, ref_lse: torch.Tensor, lse_tol: float = 2e-3,
              floor: float = 0.0) -> tuple[bool, float]:
    """(every LSE within max(lse_tol + LSE_ULPS fp32 ulps of |ref|, floor), the largest absolute error). Equal
    infinities (rows with no visible key) match; a NaN never does. The kernel holds the LSE in fp32: where |LSE|
    is large (ALiBi over 64k keys reaches 16386, whose fp32 ulp is 2^-9 = 1.95e-3) lse_tol alone would ask
    for less than one ulp.  ``floor``: an error the caller accepts anyway (check_kernel: eager's, for
    score_mods with an approximate transcendental)."""
    ref = ref_lse.double()
    both_inf = torch.isinf(ref) & (lse.double() == ref)
    lerr = (lse.double() - ref).abs().masked_fill(both_inf, 0.0)
    lerr = lerr.masked_fill(torch.isnan(lerr), float("inf"))
    bound = (lse_tol + LSE_ULPS * 2.0**-23 * ref.abs().masked_fill(torch.isinf(ref), 0.0)).clamp(min=floor)
    return bool((lerr <= bound).all()), (float(lerr.max()) if lerr.numel() else 0.0)


@dataclass(frozen=True)
class GradCheckResult:
    """dq, dk, dv (and buffer gradients) of a kernel against the float64 reference."""

    ok: bool
    messages: tuple[tuple[str, str], ...]
    shape: tuple[int, int, int, int]

    def __str__(self) -> str:
        B, H, Nq, Nk = self.shape
        return f"B={B} H={H} Nq={Nq} Nk={Nk}: " + "; ".join(f"{n}: {m}" for n, m in self.messages)


def check_kernel_grads(kernel, B: int, H: int, Nq: int, Nk: int | None = None, *, H_kv: int | None = None,
                       seed: int = 1234, factor: float = 2.0, layout: str = "bhnd", deterministic: bool = False,
                       buffer_grads: tuple[str, ...] = (), use_lse: bool = False) -> GradCheckResult:
    """Backward of ``kernel`` on random inputs against float64 autograd of the reference, by the
    error-ratio rule (eager autograd in the inputs' dtype sets the bound).  The kernel's gradient
    outputs are poisoned with NaN before it runs.  ``buffer_grads`` names float buffers made
    learnable for the check; ``use_lse`` adds lse to the loss (tests dL/dlse).  ``seed`` seeds the
    inputs and output gradients (their own generator) and is the dropout seed.

    The backward's row term D = rowsum(dO * O) reads the forward's output as stored, rounded to the
    element type (FlashAttention's algorithm).  That shifts dS by -P D's rounding, exactly the gradient
    of -sum_i delta_i lse_i with delta_i = dO_i . (O_stored - O_exact)_i.  Where eager has no such term
    (a row whose softmax is one key, with dropout: eager's gradient is exactly 0, the algorithm's is
    delta k), a gradient that fails against the exact reference is checked once more against the
    float64 gradient of the loss with that term (:func:`_stored_output_reference`), with eager's error
    as the bound plus 2^-7 of the term for the kernel's own rounding of it."""
    from . import autograd

    Nk = Nq if Nk is None else Nk
    ir = kernel.ir
    dt = torch.bfloat16 if ir.dtype == "bf16" else torch.float16
    gen = _inputs_generator(seed)
    q, k, v = random_qkv(B, H, Nq, Nk, ir.head_dim, ir.head_dim_v, dt, H_kv=H_kv, generator=gen)
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    dout = torch.randn(B, H, Nq, ir.head_dim_v, device=q.device, generator=gen).to(dt)
    dlse = torch.randn(B, H, Nq, device=q.device, generator=gen) if use_lse else None

    def run(fn, tensors, bufs, row_coef=None):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        bl = {n: (t.detach().clone().requires_grad_() if n in buffer_grads else t) for n, t in bufs.items()}
        o, lse = fn(*leaves, bl)
        loss = (o.double() * dout.double()).sum()
        coef = dlse.double() if dlse is not None else None
        if row_coef is not None:
            coef = row_coef if coef is None else coef + row_coef
        if coef is not None:
            loss = loss + (torch.where(torch.isfinite(lse), lse.double(), 0.0) * coef.to(lse.device)).sum()
        grads = torch.autograd.grad(loss, leaves + [bl[n] for n in buffer_grads])
        return grads, o.detach()

    bufs = dict(kernel._buffers)
    old = autograd.POISON_GRADS
    autograd.POISON_GRADS = True
    try:
        got, o_kernel = run(lambda q_, k_, v_, b_: kernel(q_, k_, v_, seed=seed, buffers=b_, return_lse=True,
                                                          deterministic=deterministic), (q, k, v), bufs)
    finally:
        autograd.POISON_GRADS = old
    bufs64 = {n: t.double() if t.is_floating_point() else t for n, t in bufs.items()}
    q64 = [t.double() for t in (q, k, v)]

    def reference(q_, k_, v_, b_):
        return reference_attention(q_, k_, v_, ir, buffers=b_, seed=seed, return_lse=True)

    ref, o_ref = run(reference, q64, bufs64)
    eag, _ = run(lambda q_, k_, v_, b_: eager_attention(q_, k_, v_, ir, buffers=b_, seed=seed, return_lse=True),
                 (q, k, v), bufs)
    names = ("dq", "dk", "dv", *(f"d{n}" for n in buffer_grads))
    msgs, ok = [], True
    ref_stored = None
    for i, (name, g, r, e) in enumerate(zip(names, got, ref, eag)):
        good, msg = error_ratio_check(g, r, e.to(r.device), factor=factor)
        if not good:
            if ref_stored is None:
                ref_stored = _stored_output_reference(run, reference, q64, bufs64, o_kernel, o_ref, dout)
            good, msg = _check_with_stored_output(g, r, ref_stored[i], e.to(r.device), factor, msg)
        ok = ok and good
        msgs.append((name, msg))
    return GradCheckResult(ok, tuple(msgs), (B, H, Nq, Nk))


def _stored_output_reference(run, reference, q64, bufs64, o_kernel, o_ref, dout):
    """Float64 gradients of the loss plus -sum_i delta_i lse_i, delta_i = dO_i . (O_kernel - O_exact)_i: what
    the exact backward gives with D computed from the stored output (see :func:`check_kernel_grads`)."""
    delta = ((o_kernel.double().to(o_ref.device) - o_ref) * dout.double().to(o_ref.device)).sum(-1)
    delta = torch.nan_to_num(delta, nan=0.0, posinf=0.0, neginf=0.0)
    grads, _ = run(reference, q64, bufs64, row_coef=-delta)
    return grads


def _check_with_stored_output(g, r, r_stored, e, factor: float, strict_msg: str) -> tuple[bool, str]:
    """``g`` against ``r_stored`` (the exact gradient with D from the stored output), eager's error against the
    exact ``r`` as the bound, plus 2^-7 of the stored-output term (max-abs and relative Frobenius), plus, for
    the max-abs error, one ulp of ``g``'s element type (bf16 / fp16) at ``r_stored``'s largest magnitude.

    That ulp is the resolution of the gradient as the kernel writes it. Where a gradient is the sum of a few
    rounded terms (Nq = 2, rows that see one or two keys), eager's realized error is one draw of a few
    roundings and can sit far below that resolution; the kernel's, which rounds dS for the tensor cores and
    the result to the element type as eager does, is another draw (fuzz seed 101282, docs/backward.md)."""
    r = r.detach().double()
    rs = r_stored.detach().double().to(r.device)
    term = (rs - r).nan_to_num(0.0)
    t_max = float(term.abs().max()) if term.numel() else 0.0
    t_fro = float(torch.linalg.vector_norm(term)) / max(float(torch.linalg.vector_norm(rs.nan_to_num(0.0))), 1e-300)
    if t_max == 0.0:
        return False, strict_msg
    top = float(rs.nan_to_num(0.0, posinf=0.0, neginf=0.0).abs().max())
    low = g.dtype in (torch.bfloat16, torch.float16)  # the kernels' element types
    ulp = torch.finfo(g.dtype).eps * 2.0 ** math.floor(math.log2(top)) if top > 0.0 and low else 0.0
    good, msg = error_ratio_check(g, rs, e.double() + term, factor=factor, atol=1e-5 + 2.0 ** -7 * t_max + ulp,
                                  rel_atol=1e-6 + 2.0 ** -7 * t_fro)
    ulp_text = f", 1 ulp {ulp:.1e} allowed" if ulp > 0.0 else ""
    return good, (f"{strict_msg}; against D from the stored output (term max {t_max:.3e}{ulp_text}): {msg}")


def run_example(spec, *, B: int = 2, H: int = 4, seqlens: tuple[int, ...] = (113, 1023),
                schedules: tuple[str, ...] = ("v2", "v1"), verbose: bool = True) -> int:
    """What every example's ``main()`` does: on a GPU, compile ``spec`` with each schedule and check it
    against the float64 reference at each seqlen; without one, plan and render it for sm_90.
    Returns 0 on success (a process exit code)."""
    from .api import compile as ac_compile

    say = print if verbose else (lambda *a, **k: None)
    if not torch.cuda.is_available():
        from .codegen.schedule import get_schedule
        from .ir.build import build_ir, format_ir
        from .plan.targets import get_target

        ir = build_ir(spec)
        say(format_ir(ir))
        for name in schedules:
            sched = get_schedule(name)
            ks = sched.render(ir, sched.make_plan(ir, get_target("sm_90")), get_target("sm_90"))
            say(f"[no GPU] {name}: planned {ks.plan.block_m}x{ks.plan.block_n}, {ks.threads} threads, "
                f"{ks.smem_bytes} B smem; {len(ks.source.splitlines())} lines of CUDA rendered")
        return 0
    failures = 0
    for name in schedules:
        kern = ac_compile(spec, name)
        for n in seqlens:
            res = check_kernel(kern, B, H, n)
            failures += not res.ok
            say(f"{spec.name} {name}: {res} -> {'OK' if res.ok else 'FAIL'}")
    return 1 if failures else 0


class TransformerBlock(torch.nn.Module):
    """A small pre-norm transformer block whose attention is ``attend(q, k, v)`` on (B, H, N, d) views of (B, N, H,
    d) storage (heads inner): what the torch.compile tests and ``benchmarks/reduce_overhead.py`` train."""

    def __init__(self, dim: int, heads: int, attend) -> None:
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(self.norm1(x)).view(B, N, 3, self.heads, C // self.heads)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        a = self.attend(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(B, N, C))
        return x + self.mlp(self.norm2(x))
