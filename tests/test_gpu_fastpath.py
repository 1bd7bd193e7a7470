"""GPU: repeated forward calls take the launch recorded for their signature (runtime/fastpath.py), and what that
launch must still see per call: new pointers, new seeds, buffers changed in place or passed anew, another layout,
misaligned inputs (refused by the full path's error), CUDA graph capture."""
from __future__ import annotations

import pytest
import torch

import attncompiler as ac
from attncompiler.runtime import fastpath
from attncompiler.runtime.launch import InputError
from attncompiler.spec import presets
from attncompiler.testing import check_kernel

from _recordings import assert_recorded_grads
from _v3 import GPU_PRESETS, hopper, needs_hopper, v3_gpu_spec

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _schedules() -> list[str]:
    return ["v1", "v2", "v3"] if hopper() else ["v1", "v2"]


@needs_cuda
@pytest.mark.parametrize("schedule,layout", [("v3", "bhnd"), ("v3", "bnhd"), ("v2", "bhnd"), ("v2", "bnhd"),
                                             ("v1", "bhnd")])
@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_repeated_call_is_correct(schedule: str, name: str, layout: str) -> None:
    if schedule not in _schedules():
        pytest.skip("v3 needs an sm_90 GPU")
    d = 64 if schedule == "v1" else 128
    seqlens = (113,) if schedule == "v1" else (113, 1023)  # (v1's FA1 loop order is slow by design)
    kern = ac.compile(v3_gpu_spec(name, d), schedule)
    for N in seqlens:
        res = check_kernel(kern, 2, 3, N, layout=layout, repeat=True)
        assert res.ok, f"{schedule} {name} {layout} N={N}: {res}"
    assert len(kern._recipes) == len(seqlens), f"{schedule} {name}: expected a recorded launch per shape"


def _qkv(B: int, H: int, N: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))


@needs_cuda
@pytest.mark.parametrize("schedule", _schedules())
def test_gpu_recipe_matches_the_full_path(schedule: str) -> None:
    """Same inputs, the recorded launch against the full path: bit-identical; each call's own pointers and seed."""
    kern = ac.compile(ac.AttentionSpec(head_dim=64, dropout_p=0.1, name="dropout"), schedule)
    kern(*_qkv(2, 3, 300, 64, 0))  # records
    assert len(kern._recipes) == 1
    q, k, v = _qkv(2, 3, 300, 64, 1)
    hits = fastpath.stats["hits"]
    fast_a, lse_fast = kern(q, k, v, seed=11, return_lse=True)  # return_lse: another signature, the full path
    fast_b = kern(q, k, v, seed=11)
    fast_c = kern(q, k, v, seed=12)
    unseeded = kern(q, k, v)
    assert fastpath.stats["hits"] == hits + 3 and len(kern._recipes) == 2
    assert kern.last_seed is not None and kern.last_offset == 0
    kern._recipes.clear()
    slow_b = kern(q, k, v, seed=11)
    assert torch.equal(fast_b, slow_b) and torch.equal(fast_a, slow_b)
    assert not torch.equal(fast_c, slow_b) and not torch.equal(unseeded, slow_b)  # new seeds, new dropout masks
    q[0, 0, 0, 0] += 1.0  # in place: a pointer the recipe holds sees the new values
    again = kern(q, k, v, seed=11)
    assert not torch.equal(again, slow_b) and torch.isfinite(again).all()


@needs_cuda
@pytest.mark.parametrize("schedule", _schedules())
def test_gpu_recipe_sees_buffer_changes(schedule: str) -> None:
    """ALiBi's slopes changed in place: the next call takes the full path (new device copies) and records again;
    slopes passed per call (``buffers=``) always take the full path."""
    H = 4
    spec = presets.alibi(presets.alibi_slopes(H), 64)
    kern = ac.compile(spec, schedule)
    q, k, v = _qkv(1, H, 257, 64, 2)
    base = kern(q, k, v)
    hits = fastpath.stats["hits"]
    assert torch.equal(kern(q, k, v), base) and fastpath.stats["hits"] == hits + 1
    name = next(iter(kern._buffers))
    kern._buffers[name].mul_(4.0)  # in place: a new version
    changed = kern(q, k, v)
    assert fastpath.stats["hits"] == hits + 1  # the full path ran
    assert torch.equal(kern(q, k, v), changed) and fastpath.stats["hits"] == hits + 2  # and recorded again
    kern2 = ac.compile(presets.alibi(presets.alibi_slopes(H) * 4.0, 64), schedule)
    assert not torch.equal(changed, base) and torch.equal(changed, kern2(q, k, v))
    for scale in (1.0, 0.5, 2.0):  # a new tensor per call
        got = kern(q, k, v, buffers={name: presets.alibi_slopes(H) * scale})
        want = ac.compile(presets.alibi(presets.alibi_slopes(H) * scale, 64), schedule)(q, k, v)
        assert torch.equal(got, want), scale
    assert fastpath.stats["hits"] == hits + 2


@needs_cuda
def test_gpu_misaligned_repeat_is_refused() -> None:
    kern = ac.compile(ac.AttentionSpec(head_dim=64), "v2")
    q, k, v = _qkv(1, 2, 128, 64, 3)
    kern(q, k, v)
    kern(q, k, v)
    flat = torch.randn(2 * 128 * 64 + 8, device="cuda", dtype=torch.bfloat16)
    q_off = flat[4:4 + 2 * 128 * 64].view(1, 2, 128, 64)  # same shape and strides, base 8 bytes off
    with pytest.raises(InputError, match="16-byte aligned"):
        kern(q_off, k, v)


def _out_specs() -> list[tuple[str, str, ac.AttentionSpec]]:
    cases = [("v2", "plain-d64", presets.plain(64)), ("v1", "causal-d64", presets.causal(64))]
    if hopper():
        cases += [("v3", "plain-d128", presets.plain(128)),  # the persistent grid with TMA stores of O
                  ("v3", "window-d128", presets.sliding_window(256, 128)), ("auto", "decode-d128", presets.causal(128))]
    return cases


@needs_cuda
@pytest.mark.parametrize("schedule,name,spec", _out_specs(), ids=lambda x: x if isinstance(x, str) else "")
def test_gpu_calls_with_out_take_the_recorded_launch(schedule: str, name: str, spec: ac.AttentionSpec) -> None:
    """``out=`` calls record per signature (out's strides included) and write the caller's tensor: bit-identical to
    the full path, in both output layouts, a new out tensor per call (a poisoned one: every element is written);
    the auto schedule's decode sibling (Nq = 1) too. A misaligned out keeps the full path's error."""
    decode = name.startswith("decode")
    B, H, Nq, Nk = (2, 4, 1, 3000) if decode else (2, 3, 300, 300)
    d = spec.head_dim
    kern = ac.compile(spec, schedule)
    g = torch.Generator(device="cuda").manual_seed(6)
    q = torch.randn(B, H, Nq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, H, Nk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    layouts = {"bhnd": lambda: torch.full((B, H, Nq, d), float("nan"), device="cuda", dtype=torch.bfloat16),
               "bnhd": lambda: torch.full((B, Nq, H, d), float("nan"), device="cuda",
                                          dtype=torch.bfloat16).transpose(1, 2)}
    for layout, make in layouts.items():
        kern(torch.randn_like(q), k, v, out=make())  # records
        hits = fastpath.stats["hits"]
        out = make()
        res = kern(q, k, v, out=out)
        assert res is out and fastpath.stats["hits"] == hits + 1, f"{name} {layout}: expected the recorded launch"
        kern._recipes.clear()
        want = kern(q, k, v, out=make())
        assert torch.isfinite(out).all() and torch.equal(out, want), f"{name} {layout}: recorded != full path"
        assert torch.equal(kern(q, k, v), want)  # no out=: its own signature, the same result
    kern(q, k, v, out=layouts["bhnd"]())  # recorded again: the misaligned out below has this signature
    flat = torch.empty(B * H * Nq * d + 8, device="cuda", dtype=torch.bfloat16)
    bad = flat[4:4 + B * H * Nq * d].view(B, H, Nq, d)  # the same shape and strides, base 8 bytes off
    assert fastpath.signature(q, k, v, False, None, None, bad) in kern._recipes
    for _ in range(2):
        with pytest.raises(InputError, match="16-byte aligned"):
            kern(q, k, v, out=bad)


@needs_cuda
@needs_hopper
def test_gpu_recipe_under_graph_capture() -> None:
    """A sliding window (tile list: its launch holds device memory) and plain, captured after recipes exist: the
    captured call takes the full path (the graph must hold its per-call GPU work), and the replay is right."""
    for spec in (presets.sliding_window(256, 128), presets.plain(128)):
        kern = ac.compile(spec, "v3")
        q, k, v = _qkv(1, 4, 2048, 128, 4)
        want = kern(q, k, v)
        kern(q, k, v)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            kern(q, k, v)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        hits = fastpath.stats["hits"]
        with torch.cuda.graph(g):
            out = kern(q, k, v)
        assert fastpath.stats["hits"] == hits
        q.copy_(torch.randn_like(q))
        g.replay()
        torch.cuda.synchronize()
        kern._recipes.clear()
        assert torch.equal(out, kern(q, k, v)) and not torch.equal(out, want)


@needs_cuda
@pytest.mark.parametrize("schedule", _schedules())
def test_gpu_training_steps_take_the_recorded_forward(schedule: str) -> None:
    """Autograd's forward records and takes launches too (the kernel's own buffers): a second step with the same
    shapes takes it and gives bit-identical outputs and gradients (deterministic backward)."""
    H = 4
    kern = ac.compile(presets.alibi(presets.alibi_slopes(H), 64, causal=True), schedule)
    leaves = [t.requires_grad_() for t in _qkv(1, H, 300, 64, 5)]
    go = torch.randn(1, H, 300, 64, device="cuda", dtype=torch.bfloat16)
    results = []
    for step in range(2):
        hits = fastpath.stats["hits"]
        out = kern(*leaves, deterministic=True)
        grads = torch.autograd.grad(out, leaves, go)
        assert fastpath.stats["hits"] == hits + step  # the first step records, the second takes it
        results.append((out.detach(), *grads))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def _decode_opts() -> list[dict]:
    opts = [dict(fold_combine=False), dict(fold_combine=True), dict(loader="cp_async")]
    if hopper():
        opts += [dict(loader="tma"), dict(loader="bulk", fold_combine=True)]
    return opts


@needs_cuda
@pytest.mark.parametrize("opts", _decode_opts(), ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_gpu_decode_calls_take_a_recorded_launch(opts: dict) -> None:
    """The decode schedule's split and combine kernels are recorded per signature like one kernel: a repeated call
    takes the recording (new pointers: the TMA maps of the new k, v) and passes the reference; shapes with one split
    and several, GQA, a seqlen that is no multiple of any block."""
    kern = ac.compile(presets.causal(128), "decode", **opts)
    shapes = ((1, 8, 2, 1, 4099), (2, 4, 4, 3, 32768), (1, 4, 4, 16, 1023))
    for B, H, H_kv, Nq, Nk in shapes:
        res = check_kernel(kern, B, H, Nq, Nk, H_kv=H_kv, repeat=True)
        assert res.ok, f"{opts} {(B, H, H_kv, Nq, Nk)}: {res}"
    assert len(kern._recipes) == len(shapes)


@needs_cuda
def test_gpu_auto_decode_records_its_siblings_launch() -> None:
    """schedule="auto" hands decode shapes to its decode sibling (and, on sm_90, K/V that TMA cannot describe to the
    cp.async one): the launch is recorded under the called kernel's signature, bit-identical to the full path, on
    another stream too (the folded combine's counters are per stream)."""
    kern = ac.compile(presets.plain(128))
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 20000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ke, ve = k[:, :1].expand(2, 2, 20000, 128), v[:, :1].expand(2, 2, 20000, 128)
    wants = [kern(q, k, v), kern(q, ke, ve)]  # each records
    assert kern._decode is not None and len(kern._recipes) == 2
    hits = fastpath.stats["hits"]
    got = [kern(q, k, v), kern(q, ke, ve)]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got.append(kern(q, k, v))
    torch.cuda.current_stream().wait_stream(s)
    assert fastpath.stats["hits"] == hits + 3
    kern._recipes.clear()
    full = [kern(q, k, v), kern(q, ke, ve)]
    assert all(torch.equal(a, b) for a, b in zip(got, wants + wants[:1]))
    assert all(torch.equal(a, b) for a, b in zip(full, wants))
    assert not torch.equal(wants[0], wants[1])
    res = check_kernel(kern, 1, 4, 300, repeat=True)  # a prefill shape: the kernel's own launch
    assert res.ok, res


def _bwd_cases() -> list[tuple]:
    """(id, spec, backward options, deterministic, layout, H_kv, use_lse): v3's backward where the GPU is a Hopper,
    v2's everywhere."""
    H = 4
    cases = [
        ("causal-d128-det", presets.causal(128), None, True, "bhnd", H, False),
        ("alibi-d64-gqa-bnhd", presets.alibi(presets.alibi_slopes(H), 64), None, False, "bnhd", 2, False),
        ("dropout-d64-det-lse", ac.AttentionSpec(head_dim=64, dropout_p=0.1, name="dropout"), None, True, "bhnd",
         H, True),
        ("softcap-d64-v2", presets.softcap(30.0, 64), {"schedule": "v2"}, False, "bhnd", H, False),
        ("window-d64-v2-det", presets.sliding_window(100, 64), {"schedule": "v2"}, True, "bnhd", H, False),
    ]
    if hopper():
        cases.append(("plain-d64-v3-det", presets.plain(64), {"schedule": "v3"}, True, "bhnd", H, False))
    return cases


def _leaves(B: int, H: int, H_kv: int, N: int, d: int, layout: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = ((B, H, N, d), (B, H_kv, N, d), (B, H_kv, N, d))
    ts = [torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g) for s in shapes]
    if layout == "bnhd":
        ts = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in ts]
    return [t.requires_grad_() for t in ts]


@needs_cuda
@pytest.mark.parametrize("case", _bwd_cases(), ids=lambda c: c[0])
def test_gpu_backward_takes_the_recorded_launch(case: tuple) -> None:
    """A backward with a recorded signature takes the recording (new pointers, the same seed) and gives what the full
    path gives for the same inputs: bit-identical where dQ's sum order is fixed (deterministic), dK and dV always;
    dQ within fp32 reduction order otherwise. Inputs of 300 rows (no multiple of any block), gradients of out and
    (with use_lse) of lse."""
    from attncompiler.runtime import bwd_fastpath

    _, spec, opts, det, layout, H_kv, use_lse = case
    kern = ac.compile(spec)
    kern.backward_options = opts
    B, H, N, d = 2, 4, 300, spec.head_dim
    gen = torch.Generator(device="cuda").manual_seed(9)
    go = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    gl = torch.randn(B, H, N, device="cuda", generator=gen)

    def step(leaves: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        out, lse = kern(*leaves, seed=7, deterministic=det, return_lse=True)
        loss = (out.float() * go.float()).sum() + ((lse * gl).sum() if use_lse else 0.0)
        return torch.autograd.grad(loss, leaves)

    a, b = _leaves(B, H, H_kv, N, d, layout, 1), _leaves(B, H, H_kv, N, d, layout, 2)
    hits = bwd_fastpath.stats["hits"]
    first = step(a)  # records
    assert len(kern._bwd_recipes) == 1 and bwd_fastpath.stats["hits"] == hits
    fast = step(b)  # other tensors, the same signature
    assert bwd_fastpath.stats["hits"] == hits + 1
    kern._bwd_recipes.clear()
    full = step(b)
    assert bwd_fastpath.stats["hits"] == hits + 1 and len(kern._bwd_recipes) == 1
    assert_recorded_grads(fast, full, first, det)


@needs_cuda
def test_gpu_backward_recipe_sees_buffer_changes() -> None:
    """ALiBi's slopes changed in place between steps: the backward takes the full path (new device copies) and records
    again; gradients equal the full path's on the new slopes. Slopes passed per call (``buffers=``) never record."""
    from attncompiler.runtime import bwd_fastpath

    H = 4
    slopes = presets.alibi_slopes(H).clone()
    kern = ac.compile(presets.alibi(slopes, 64, causal=True))
    leaves = _leaves(1, H, H, 257, 64, "bhnd", 3)
    go = torch.randn(1, H, 257, 64, device="cuda", dtype=torch.bfloat16)

    def step(**kw: object) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(kern(*leaves, deterministic=True, **kw), leaves, go)

    step()
    hits = bwd_fastpath.stats["hits"]
    before = step()
    assert bwd_fastpath.stats["hits"] == hits + 1
    kern._buffers[next(iter(kern._buffers))].mul_(0.5)
    changed = step()
    assert bwd_fastpath.stats["hits"] == hits + 1  # the full path ran and recorded anew
    kern._bwd_recipes.clear()
    full = step()
    assert all(torch.equal(x, y) for x, y in zip(changed, full))
    assert not torch.equal(changed[0], before[0])
    own = {n: t.clone() for n, t in kern._buffers.items()}
    n_rec = len(kern._bwd_recipes)
    step(buffers=own)
    step(buffers=own)
    assert bwd_fastpath.stats["hits"] == hits + 1 and len(kern._bwd_recipes) == n_rec
