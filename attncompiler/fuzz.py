"""Random attention specs and shapes, for fuzzing every schedule against the float64 reference.

A fuzz case is a random :class:`~attncompiler.spec.spec.AttentionSpec` and a random problem shape:

* a **preset** (none, ``causal=True``, sliding window, prefix-LM, document, ALiBi, softcap,
  relative bias) composed with
* a **score_mod** from a small grammar: linear and ``abs`` distance terms, ``tanh`` of index
  distances, softcapping, scaling by constants or a captured 0-dim temperature, ``where`` on index
  relations, ``min`` / ``max`` against constants, and reads of captured float buffers (per head, per
  query, per key, a relative-position table with a clamped index) -- nested up to two levels;
* a **mask_mod** from a grammar of index relations (causal, offsets, windows, prefixes, modulo
  stripes, chunks, per-head / per-batch terms, ``abs``), reads of a document-id buffer and a bool
  buffer, combined with ``&``, ``|`` and ``~``; preset masks are And-ed or Or-ed in;
* random head dims (v2 needs multiples of 16), dtype, ``causal`` flag and sometimes dropout;
* for the v3 schedule, a plan-option set per seed (:func:`v3_options`: the persistent grid, one or three
  consumer warpgroups, the descending K/V walk, FMA-pipe exponentials, narrow K/V tiles), so the fuzz
  reaches the plans the autotuner may pick, not only the model's.

Every score_mod is bounded (no ``exp``; additive terms are at most ~16 in magnitude at the largest
fuzzed length, multiplications by constants at most 1.5 per level), so every output is finite;
rows that the mask leaves empty give 0 (lse -inf), as documented.  The mods are generated as Python
source, ``exec``-ed with the captured buffers as globals (so the tracer names them ``fz_*``), and
the source is kept in :attr:`FuzzSpec.description` for reproduction.

Everything is a pure function of the seed: :func:`random_case` ``(seed)`` returns the same spec
(same IR, same buffer values) and the same shape on every call and machine.  Buffers are sized for
:data:`MAX_SEQLEN` positions and :data:`MAX_HEADS` heads; shapes never exceed those (indices past a
buffer's end would read its edge element, as the kernels clamp).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .spec import ops, presets
from .spec.spec import AttentionSpec

__all__ = [
    "FuzzSpec", "random_spec", "random_shape", "random_case", "compile_jobs", "run_case", "MAX_SEQLEN",
    "MAX_HEADS", "SEQLENS", "GPU_HEAD_DIMS", "CPU_HEAD_DIMS", "PRESET_CHOICES", "V3_OPTION_SETS", "v3_options",
    "accepted_options", "DECODE_MAX_SEQLEN", "DECODE_OPTION_SETS", "random_decode_spec", "random_decode_shape",
    "decode_options",
]

MAX_SEQLEN = 320
MAX_HEADS = 4
#: Sequence lengths shapes are drawn from: tile edges +-1, primes, 1 and 2.
SEQLENS: tuple[int, ...] = (1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 191, 200, 255, 257, 300)
#: (head_dim, head_dim_v) pairs for GPU cases (multiples of 16: what v2 and the backward tile).
GPU_HEAD_DIMS: tuple[tuple[int, int], ...] = ((64, 64), (128, 128), (32, 32), (96, 96), (64, 32), (128, 64),
                                              (32, 64))
#: Small pairs for CPU simulation.
CPU_HEAD_DIMS: tuple[tuple[int, int], ...] = ((16, 16), (32, 32), (16, 32), (32, 16))
PRESET_CHOICES: tuple[str, ...] = ("none", "none", "causal", "sliding_window", "prefix_lm", "document", "alibi",
                                   "softcap", "relative_bias")
_TABLE_RADII = (4, 16, 64)
#: Decode cases (:func:`random_decode_shape`): few query rows against K/V up to this long.
DECODE_MAX_SEQLEN = 4096
_DECODE_NQ = (1, 1, 2, 3, 5, 8, 16)
_DECODE_NK = (512, 513, 777, 1023, 1024, 1500, 2049, 3001, 4096)
#: decode plan options the fuzz draws from (the loaders other than cp.async need sm_90; refused sets fall back)
DECODE_OPTION_SETS: tuple[dict[str, Any], ...] = (
    {}, {}, {"loader": "bulk"}, {"loader": "tma"}, {"fold_combine": False}, {"stages": 2}, {"num_warps": 2},
)
#: v3 plan options the fuzz draws from (one set per seed); a set the planner refuses for a spec (three
#: consumers beyond their registers) falls back to the model's plan (:func:`accepted_options`).  Not here:
#: ``q_prescale``, which rounds ``c q`` to bf16 and so computes the attention of a perturbed q; its LSE then
#: misses check_kernel's bound by design (fuzz seeds 5, 22, 100045, 100160, 100201 on an H100, 2026-11-27), and
#: tests/test_gpu_qscale.py checks it against the attention of that q instead.
#: Nor ``q_prefetch`` or ``tile_list`` as sets of their own (tests/test_v3_q_prefetch.py, test_v3_tile_list.py): a
#: new set moves every seed's draw, and the fixed GPU seeds of tests/test_gpu_fuzz.py must then reach every set again
#: (test_gpu_fuzz_seeds_reach_every_option_set). Both are on by default where the plan qualifies (a band, a mask with
#: a K/V range on the persistent grid: plan/v3_grid.py), so the sets with ``persistent`` draw them.
V3_OPTION_SETS: tuple[dict[str, Any], ...] = (
    {}, {}, {"persistent": True}, {"block_m": 64}, {"block_m": 192}, {"kv_descending": True},
    {"exp2_poly": 3}, {"block_n": 64, "stages": 2}, {"persistent": True, "block_m": 192}, {"late_pv_wait": True},
    {"persistent": True, "tma_store_o": True}, {"softmax_copies": 1}, {"softmax_copies": 2},
    {"half_blocks": True}, {"persistent": True, "tma_store_o": True, "tiles_by_head": False},
)


@dataclass(frozen=True)
class FuzzSpec:
    """A random spec and how it was made (``description``: preset, flags and the mods' source)."""

    seed: int
    spec: AttentionSpec
    description: str = field(repr=False)

    def __str__(self) -> str:
        return self.description


# ----------------------------------------------------------------------------------- buffers
class _Buffers:
    """The captured tensors a generated mod may read, created on first use from one generator."""

    def __init__(self, seed: int, n: int = MAX_SEQLEN) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.n = n
        self.values: dict[str, torch.Tensor] = {}
        self.table_radius = 0

    def use(self, name: str, rng: random.Random) -> str:
        if name in self.values:
            return name
        g, n, hmax = self.gen, self.n, MAX_HEADS
        if name == "fz_hbias":
            t = torch.rand(hmax, generator=g) * 2.0 - 1.0
        elif name in ("fz_qbias", "fz_kvbias"):
            t = 0.5 * torch.randn(n, generator=g)
        elif name == "fz_table":
            self.table_radius = rng.choice(_TABLE_RADII)
            t = 0.5 * torch.randn(hmax, 2 * self.table_radius + 1, generator=g)
        elif name == "fz_temp":
            t = (0.5 + torch.rand((), generator=g)).to(torch.float32)
        elif name == "fz_doc":  # sorted ids: 1..6 documents of random lengths
            cuts = torch.rand(n, generator=g) < rng.choice((0.01, 0.02, 0.05))
            t = torch.cumsum(cuts.to(torch.int32), 0).to(torch.int32)
        elif name == "fz_keep":
            t = torch.rand(n, generator=g) < 0.8
        else:  # pragma: no cover - the grammar names only the buffers above
            raise KeyError(f"expected a fuzz buffer name, got {name!r}")
        self.values[name] = t.to(torch.float32) if t.is_floating_point() else t
        return name


# ----------------------------------------------------------------------------------- grammar
class _Grammar:
    """Python source of random mask relations and score expressions (``s``: the current score)."""

    def __init__(self, rng: random.Random, bufs: _Buffers) -> None:
        self.rng, self.bufs = rng, bufs

    def relation(self) -> str:
        r = self.rng
        k = r.randrange(14)
        if k == 0:
            return "q_idx >= kv_idx"
        if k == 1:
            return f"kv_idx <= q_idx + {r.randint(-8, 40)}"
        if k == 2:
            return f"q_idx - kv_idx <= {r.choice((0, 3, 17, 64))}"
        if k == 3:
            return f"kv_idx < {r.choice((1, 5, 16, 33, 100))}"
        if k == 4:
            return f"q_idx >= {r.choice((1, 8, 50))}"
        if k == 5:
            m = r.choice((2, 3, 5))
            return f"kv_idx % {m} != {r.randrange(m)}"
        if k == 6:
            c = r.choice((8, 16, 24))
            return f"q_idx // {c} == kv_idx // {c}"
        if k == 7:
            return f"kv_idx <= q_idx + {r.choice((3, 20))} * h"
        if k == 8:
            return f"(kv_idx + b) % {r.choice((2, 3))} != 0"
        if k == 9:
            d = self.bufs.use("fz_doc", r)
            return f"{d}[q_idx] == {d}[kv_idx]"
        if k == 10:
            return f"{self.bufs.use('fz_keep', r)}[kv_idx]"
        if k == 11:
            return f"abs(q_idx - kv_idx) <= {r.choice((2, 9, 40))}"
        if k == 12:
            return f"(q_idx - kv_idx) % {r.choice((2, 4))} == 0"
        return f"q_idx + {r.choice((0, 5))} >= 2 * kv_idx"

    def mask(self, depth: int) -> str:
        r = self.rng
        if depth == 0 or r.random() < 0.4:
            return self.relation()
        op = r.choice(("&", "&", "|", "~"))
        if op == "~":
            return f"~({self.mask(depth - 1)})"
        return f"({self.mask(depth - 1)}) {op} ({self.mask(depth - 1)})"

    def score(self, depth: int, inner: str = "s") -> str:
        r = self.rng
        if depth == 0:
            return inner
        x = self.score(depth - 1, inner) if r.random() < 0.6 else inner
        k = r.randrange(16)
        if k == 0:
            return f"{x} + {r.choice((0.01, 0.03, 0.05))} * (kv_idx - q_idx)"
        if k == 1:
            return f"{x} - {r.choice((0.02, 0.05))} * abs(q_idx - kv_idx)"
        if k == 2:
            return f"{x} + {r.choice((0.5, 1.0, 2.0))} * torch.tanh((q_idx - kv_idx) / {r.choice((4, 16, 64))})"
        if k == 3:
            c = r.choice((5.0, 10.0, 20.0, 30.0))
            return f"{c} * torch.tanh(({x}) / {c})"
        if k == 4:
            return f"({x}) * {r.choice((0.5, 0.75, 1.25, 1.5))}"
        if k == 5:
            return f"ops.where({self.relation()}, {x} + {r.choice((-2.0, -1.0, 1.0, 2.0))}, {x})"
        if k == 6:
            return f"ops.where({self.relation()}, ({x}) * {r.choice((0.5, 1.5))}, {x})"
        if k == 7:
            return f"{x} + {self.bufs.use('fz_hbias', r)}[h]"
        if k == 8:
            return f"{x} + {self.bufs.use('fz_kvbias', r)}[kv_idx]"
        if k == 9:
            return f"{x} + {self.bufs.use('fz_qbias', r)}[q_idx]"
        if k == 10:
            t = self.bufs.use("fz_table", r)
            rad = self.bufs.table_radius
            return f"{x} + {t}[h, ops.clamp(kv_idx - q_idx + {rad}, 0, {2 * rad})]"
        if k == 11:
            return f"ops.max({x}, {r.choice((-4.0, -2.0))})"
        if k == 12:
            return f"ops.min({x}, {r.choice((2.0, 3.0, 5.0))})"
        if k == 13:
            return f"({x}) * {self.bufs.use('fz_temp', r)}"
        if k == 14:
            return f"{x} + {r.choice((0.25, 0.5))} * ((q_idx + kv_idx) % {r.choice((3, 5))})"
        return f"{x} + {r.choice((0.25, 0.5))} * (h + 1) - {r.choice((0.5, 1.0))} * b"


def _make_fn(src: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    glb: dict[str, Any] = {"torch": torch, "ops": ops, "__builtins__": __builtins__, **namespace}
    exec(compile(src, f"<fuzz {name}>", "exec"), glb)  # noqa: S102 - source generated above
    fn = glb[name]
    fn.__fuzz_source__ = src
    return fn


@dataclass(frozen=True)
class _Preset:
    """A preset's modifier (score or mask, or neither) and its own constructor ``build(head_dim, **kw)``."""

    text: str
    score_mod: Any = None
    mask_mod: Any = None
    build: Callable[..., AttentionSpec] | None = None


def _preset(name: str, rng: random.Random, gen: torch.Generator) -> _Preset:
    if name == "sliding_window":
        w = rng.choice((8, 33, 100))
        return _Preset(f"sliding_window({w})", mask_mod=presets.sliding_window_mask(w),
                       build=lambda d, **kw: presets.sliding_window(w, d, **kw))
    if name == "prefix_lm":
        n = rng.choice((4, 40))
        return _Preset(f"prefix_lm({n})", mask_mod=presets.prefix_lm_mask(n),
                       build=lambda d, **kw: presets.prefix_lm(n, d, **kw))
    if name == "document":
        docs = (torch.arange(MAX_SEQLEN) // rng.choice((16, 50, 128))).to(torch.int32)
        return _Preset("document(doc_ids)", mask_mod=presets.document_mask(docs),
                       build=lambda d, **kw: presets.document(docs, d, **kw))
    if name == "alibi":
        slopes = presets.alibi_slopes(MAX_HEADS)
        return _Preset(f"alibi(alibi_slopes({MAX_HEADS}))", score_mod=presets.alibi_score_mod(slopes),
                       build=lambda d, **kw: presets.alibi(slopes, d, **kw))
    if name == "softcap":
        c = rng.choice((10.0, 20.0, 30.0))
        return _Preset(f"softcap({c})", score_mod=presets.softcap_score_mod(c),
                       build=lambda d, **kw: presets.softcap(c, d, **kw))
    if name == "relative_bias":
        rad = rng.choice(_TABLE_RADII)
        table = 0.5 * torch.randn(MAX_HEADS, 2 * rad + 1, generator=gen)
        return _Preset(f"relative_bias(table {MAX_HEADS}x{2 * rad + 1})",
                       score_mod=presets.relative_bias_score_mod(table),
                       build=lambda d, **kw: presets.relative_bias(table, d, **kw))
    if name == "causal":
        return _Preset("causal", build=lambda d, **kw: presets.causal(d, **kw))
    return _Preset("none")


def random_spec(seed: int, *, head_dims: tuple[tuple[int, int], ...] = GPU_HEAD_DIMS,
                dropout: bool = True, max_seqlen: int = MAX_SEQLEN) -> FuzzSpec:
    """A random spec for ``seed`` (see the module docstring); ``head_dims`` are the (D, DV) pairs to
    draw from, ``dropout`` allows dropout (p 0.1 or 0.25, one spec in ten); ``max_seqlen``: the positions
    the captured per-query / per-key buffers cover (the shapes run with it must not exceed it)."""
    _check_seed(seed)
    rng = random.Random(f"attncompiler-fuzz-spec:{seed}")
    bufs = _Buffers(seed, max_seqlen)
    gram = _Grammar(rng, bufs)
    pre = _preset(rng.choice(PRESET_CHOICES), rng, bufs.gen)
    d, dv = rng.choice(head_dims)
    dtype = rng.choice(("bf16", "fp16"))
    causal = pre.text == "causal" or rng.random() < 0.15
    p_drop = rng.choice((0.1, 0.25)) if dropout and rng.random() < 0.1 else 0.0

    score_src = mask_src = ""
    if rng.random() < 0.75:
        head = "s = base(score, b, h, q_idx, kv_idx)" if pre.score_mod is not None else "s = score"
        score_src = (f"def score_mod(score, b, h, q_idx, kv_idx):\n    {head}\n"
                     f"    return {gram.score(rng.choice((1, 1, 2)))}\n")
    if rng.random() < 0.6:
        expr = gram.mask(rng.choice((0, 1, 2)))
        if pre.mask_mod is not None:
            expr = f"({expr}) {rng.choice(('&', '|'))} base_mask(b, h, q_idx, kv_idx)"
        mask_src = f"def mask_mod(b, h, q_idx, kv_idx):\n    return {expr}\n"
    ns = {**bufs.values, "base": pre.score_mod, "base_mask": pre.mask_mod}
    score_mod = _make_fn(score_src, "score_mod", ns) if score_src else pre.score_mod
    mask_mod = _make_fn(mask_src, "mask_mod", ns) if mask_src else pre.mask_mod

    kw: dict[str, Any] = dict(head_dim_v=dv, dtype=dtype, dropout_p=p_drop, name=f"fuzz{seed}")
    if pre.text != "causal":
        kw["causal"] = causal
    # The preset's own constructor when the generated mods do not replace its field (they compose
    # with it through ``base`` / ``base_mask`` otherwise): exercises presets + extra modifiers.
    if pre.build is not None and pre.score_mod is not None and not score_src:
        spec = pre.build(d, mask_mod=mask_mod, **kw)
    elif pre.build is not None and pre.mask_mod is not None and not mask_src:
        spec = pre.build(d, score_mod=score_mod, **kw)
    elif pre.text == "causal":
        spec = pre.build(d, score_mod=score_mod, mask_mod=mask_mod, **kw)  # type: ignore[misc]
    else:
        spec = AttentionSpec(d, score_mod=score_mod, mask_mod=mask_mod, **kw)
    desc = (f"fuzz seed {seed}: preset {pre.text}, causal={spec.causal}, dropout_p={p_drop}, D={d}, DV={dv}, "
            f"{dtype}\n{score_src or f'score_mod: {pre.text if pre.score_mod else None}'}\n"
            f"{mask_src or f'mask_mod: {pre.text if pre.mask_mod else None}'}")
    return FuzzSpec(seed, spec, desc)


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")


def random_shape(seed: int, *, max_seqlen: int = MAX_SEQLEN, max_heads: int = MAX_HEADS,
                 layouts: tuple[str, ...] = ("bhnd", "bhnd", "bnhd")) -> dict[str, Any]:
    """A random problem shape: B, H, H_kv (divides H), Nq, Nk (often different), layout."""
    _check_seed(seed)
    rng = random.Random(f"attncompiler-fuzz-shape:{seed}")
    lens = [n for n in SEQLENS if n <= max_seqlen] or [1]
    h = rng.randint(1, max_heads)
    h_kv = rng.choice([x for x in range(1, h + 1) if h % x == 0])
    nq = rng.choice(lens)
    nk = nq if rng.random() < 0.4 else rng.choice(lens)
    return {"B": rng.choice((1, 2)), "H": h, "H_kv": h_kv, "Nq": nq, "Nk": nk, "layout": rng.choice(layouts)}


def random_case(seed: int, *, small: bool = False) -> tuple[AttentionSpec, dict[str, Any]]:
    """``(spec, shape)`` for ``seed``: :func:`random_spec` and :func:`random_shape` of the same seed.

    ``small``: CPU-sized (head dims 16/32, seqlens <= 100).  The shape dict has B, H, H_kv, Nq, Nk,
    layout and the spec's D and DV."""
    fs = random_spec(seed, head_dims=CPU_HEAD_DIMS if small else GPU_HEAD_DIMS)
    shape = random_shape(seed, max_seqlen=100 if small else MAX_SEQLEN)
    shape.update(D=fs.spec.head_dim, DV=fs.spec.head_dim_v)
    return fs.spec, shape


# ----------------------------------------------------------------------------------- GPU runs
def _option_set(seed: int, tag: str, sets: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    _check_seed(seed)
    return dict(random.Random(f"attncompiler-fuzz-{tag}:{seed}").choice(sets))


def v3_options(seed: int) -> dict[str, Any]:
    """The v3 plan options fuzzed with seed ``seed`` (one of :data:`V3_OPTION_SETS`)."""
    return _option_set(seed, "v3", V3_OPTION_SETS)


def random_decode_spec(seed: int) -> FuzzSpec:
    """A random spec for the decode schedule: :func:`random_spec` with buffers over
    :data:`DECODE_MAX_SEQLEN` positions and no dropout (inference)."""
    return random_spec(seed, dropout=False, max_seqlen=DECODE_MAX_SEQLEN)


def random_decode_shape(seed: int) -> dict[str, Any]:
    """A decode shape: Nq <= 16 query rows against 512..4096 keys (odd lengths among them), GQA, both layouts."""
    _check_seed(seed)
    rng = random.Random(f"attncompiler-fuzz-decode-shape:{seed}")
    h = rng.randint(1, MAX_HEADS)
    h_kv = rng.choice([x for x in range(1, h + 1) if h % x == 0])
    return {"B": rng.choice((1, 2)), "H": h, "H_kv": h_kv, "Nq": rng.choice(_DECODE_NQ), "Nk": rng.choice(_DECODE_NK),
            "layout": rng.choice(("bhnd", "bhnd", "bnhd"))}


def decode_options(seed: int) -> dict[str, Any]:
    """The decode plan options fuzzed with seed ``seed`` (one of :data:`DECODE_OPTION_SETS`)."""
    return _option_set(seed, "decode", DECODE_OPTION_SETS)


def _plan_or_model(sched: Any, ir: Any, target: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(plan, options taken): the plan for ``options``, or the model's plan and {} where the planner refuses them."""
    from .plan.model import PlanError

    if options:
        try:
            return sched.make_plan(ir, target, **options), dict(options)
        except PlanError:
            pass
    return sched.make_plan(ir, target), {}


def accepted_options(spec: AttentionSpec, schedule: str, target: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` if ``schedule``'s planner accepts them for ``spec`` on ``target``, else ``{}`` (the model's
    plan): a fuzzed option set is a request, and its refusal is tested elsewhere (tests/test_planner.py)."""
    from .codegen.schedule import get_schedule
    from .ir.build import build_ir

    if not options:
        return {}
    return _plan_or_model(get_schedule(schedule), build_ir(spec), target, options)[1]


def compile_jobs(specs: Any, target: Any, *, schedules: tuple[str, ...] = ("v2",), backward: bool = False,
                 options: Any = None) -> list[tuple[str, str]]:
    """``(source, nvrtc arch)`` of every kernel ``compile(spec, schedule, **opts)`` (and, with ``backward``,
    the default backward) renders for ``specs`` on ``target`` -- deduplicated, for
    :func:`attncompiler.runtime.compiler.precompile_to_disk` (parallel NVRTC before the runs).  ``options``:
    one plan-option dict per spec (as :func:`run_case` gets them; refused ones fall back as there)."""
    from .codegen.schedule import get_schedule
    from .ir.build import build_ir
    from .runtime.backward import bwd_source

    specs = list(specs)
    opts = list(options) if options is not None else [{}] * len(specs)
    if len(opts) != len(specs):
        raise ValueError(f"options: expected one dict per spec ({len(specs)}), got {len(opts)}")
    jobs: dict[tuple[str, str], None] = {}
    for spec, o in zip(specs, opts):
        ir = build_ir(spec)
        for name in schedules:
            sched = get_schedule(name)
            plan, _ = _plan_or_model(sched, ir, target, o)
            jobs[(sched.render(ir, plan, target).source, target.nvrtc_arch)] = None
        if backward:
            jobs[(bwd_source(ir, target).source, target.nvrtc_arch)] = None
    return list(jobs)


def run_case(fs: FuzzSpec, shape: dict[str, Any], *, schedule: str = "v2", backward: bool = False,
             seed: int = 0, options: dict[str, Any] | None = None, repeat: bool | None = None) -> tuple[bool, str]:
    """Run one case on the GPU: ``compile(fs.spec, schedule, **options)`` checked against the float64
    reference by :func:`attncompiler.testing.check_kernel` (and, with ``backward``, its dq, dk, dv by
    :func:`~attncompiler.testing.check_kernel_grads`: the backward kernels fed by this forward's LSE).
    Options the planner refuses for the spec fall back to its own plan (:func:`accepted_options`).  Inputs
    come from ``torch.manual_seed(seed)``.  ``repeat`` (default: odd ``seed``) checks a second call of the shape,
    which takes the launch the first recorded (``check_kernel(repeat=True)``), instead of a call with ``out=``: the
    draws stay as they were, and half the cases cover each path.  Returns ``(ok, message)``; the message carries
    the case's description and the plan options when it fails."""
    from .api import compile as ac_compile
    from .plan.targets import detect_target
    from .testing import check_kernel, check_kernel_grads

    opts = accepted_options(fs.spec, schedule, detect_target(), options or {})
    kern = ac_compile(fs.spec, schedule, **opts)
    dims = (shape["B"], shape["H"], shape["Nq"], shape["Nk"])
    torch.manual_seed(seed)
    rep = seed % 2 == 1 if repeat is None else repeat
    res: Any = check_kernel(kern, *dims, H_kv=shape["H_kv"], layout=shape["layout"], seed=seed, repeat=rep)
    msgs = [f"{schedule}{f' {opts}' if opts else ''} forward{' (repeated call)' if rep else ''}: {res}"]
    ok = res.ok
    if backward:
        torch.manual_seed(seed + 1)
        g = check_kernel_grads(kern, *dims, H_kv=shape["H_kv"], layout=shape["layout"], seed=seed)
        msgs.append(f"backward: {g}")
        ok = ok and g.ok
    text = "; ".join(msgs)
    return ok, text if ok else f"{text}\nshape {shape}\n{fs.description}"
