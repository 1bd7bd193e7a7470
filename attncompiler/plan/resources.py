"""The resource model: shared memory, registers and HBM traffic as sympy expressions.

One source of truth for the planners (:mod:`.v1`, :mod:`.v2`), the IO report (:mod:`.planner`)
and the kernels' layouts.  Every quantity is a sympy expression in named plan symbols --
``BLOCK_M``, ``BLOCK_N`` (FA1's B_r, B_c for v1), ``D``, ``DV``, ``WARPS``, ``STAGES``,
``ELEM_BYTES``, ``Q_IN_REGS`` -- the variant's features (``HAS_SCORE_MOD``, ``HAS_DROPOUT``,
``HAS_BUFFER_MASK``) and the problem size (``BATCH``, ``HEADS``, ``NQ``, ``NK``); :func:`evaluate`
puts numbers in.  Feasibility is a set of :class:`Constraint` (``expr <= limit`` or ``expr in
allowed``) over the same symbols plus the target's limits (``SMEM_LIMIT``, ``REG_LIMIT``,
``THREAD_LIMIT``, from :func:`target_values`); each failed :class:`Check` carries its numbers.

Shared memory (bytes) must equal the kernels' layouts exactly -- the templates
``static_assert`` it:

* v2 (``V2Layout::kSmemBytes`` in ``include/attncompiler/v2_fwd.cuh``): a Q tile whose rows are
  padded to max(D, DV) + 8 elements (the Q buffer is reused to stage O), and per K/V stage one
  K tile (D + 8) and one V tile (DV + 8)::

      (BLOCK_M*(max(D, DV) + 8) + STAGES*BLOCK_N*((D + 8) + (DV + 8))) * ELEM_BYTES

* v1 (``v1_fwd.cuh``): Q_i, K_j, V_j in the element type and the fp32 S/P tile::

      BLOCK_M*D*ELEM_BYTES + BLOCK_N*D*ELEM_BYTES + BLOCK_N*DV*ELEM_BYTES + BLOCK_M*BLOCK_N*4

Registers per thread (v2) are an estimate of the values that must stay live across the K/V
loop: the O accumulator MT*(DV/8)*4 fp32, the S accumulator MT*(BLOCK_N/8)*4, Q's A fragments
MT*(D/16)*4 when kept in registers, 40 for addresses, indices, m and l, and -- when the variant
carries a score_mod, dropout (Philox counters and words) or a mask that reads a buffer -- one more
per m16 x n8 tile of S, MT*(BLOCK_N/8) (per-column values the element loop keeps live).  The
variant term is calibrated with ``nvcc -Xptxas -v`` (CUDA 13.0, sm_90a) on the rendered kernels
of nine variants at d = 64, 128, 256 over every BLOCK_M x BLOCK_N x warps x Q-in-registers x
STAGES combination (972 kernels; repeated on the 214 near the limit after the kernel's softmax /
P V interleave): ``est > 255`` flags the kernels that spill more than 64 B, with 5 misses
(softcap, softcap + dropout and causal dropout at d = 128, 68-88 B) and false alarms mostly on
Q-in-registers configurations the planner keeps Q out of anyway.  E.g. d = 64, BLOCK_M = 128,
BLOCK_N = 128, 4 warps: est 232 plain (ptxas: 255 registers, 0-24 B spill) but 232 + 32 = 264
with dropout, alibi, softcap or a document mask (16-96 B spill), so those variants get
BLOCK_N = 64 (``tests/test_planner.py::test_nvcc_default_plans_do_not_spill`` guards the planner's
choices).  MT = BLOCK_M / (16*WARPS).  HBM traffic: see :data:`V2_HBM_TERMS`,
:data:`V1_HBM_TERMS` and :data:`STANDARD_HBM_TERMS`.
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping, Union

import sympy

__all__ = [
    # symbols
    "BLOCK_M", "BLOCK_N", "D", "DV", "WARPS", "STAGES", "ELEM_BYTES", "Q_IN_REGS", "HAS_SCORE_MOD",
    "HAS_DROPOUT", "HAS_BUFFER_MASK", "BATCH", "HEADS", "NQ", "NK", "KV_ROWS", "PAIR_ROWS", "SMEM_LIMIT",
    "REG_LIMIT", "THREAD_LIMIT", "PLAN_SYMBOLS",
    # kernel facts
    "MMA_M", "MMA_N", "MMA_K", "ACC_REGS_PER_TILE", "A_FRAG_REGS_PER_TILE", "SMEM_ROW_PAD", "REG_OVERHEAD",
    "VARIANT_REGS_PER_S_TILE", "V1_S_TILE_ELEM_BYTES", "V1_EST_REGISTERS", "WARP_SIZE",
    # expressions
    "MT", "THREADS", "V2_SMEM_BYTES", "V2_REGISTER_TERMS", "V2_REGISTERS", "V1_SMEM_BYTES", "V1_REGISTERS",
    "FLOPS", "STANDARD_HBM_TERMS", "V1_HBM_TERMS", "V2_HBM_TERMS", "V1_PAIR_ROWS_DENSE", "V2_KV_ROWS_DENSE",
    # machinery
    "Value", "ModelError", "VariantFeatures", "variant_features", "evaluate", "Constraint", "Check",
    "check_all", "target_values",
]

Value = Union[int, float]


class ModelError(ValueError):
    """An expression could not be evaluated (a symbol without a value, a bad value)."""


def _int(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def _flag(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


# --- symbols ------------------------------------------------------------------------------------
BLOCK_M = _int("BLOCK_M")  # query rows per tile (v1: B_r)
BLOCK_N = _int("BLOCK_N")  # keys per tile (v1: B_c)
D = _int("D")  # q/k head dim
DV = _int("DV")  # v/o head dim
WARPS = _int("WARPS")  # warps per CTA (v2)
STAGES = _int("STAGES")  # K/V shared-memory buffers (v2)
ELEM_BYTES = _int("ELEM_BYTES")  # bytes of one q/k/v element (2 for bf16 / fp16)
Q_IN_REGS = _flag("Q_IN_REGS")  # 1: Q's A fragments stay in registers across the K/V loop (v2)
HAS_SCORE_MOD = _flag("HAS_SCORE_MOD")  # variant features, 0 or 1
HAS_DROPOUT = _flag("HAS_DROPOUT")
HAS_BUFFER_MASK = _flag("HAS_BUFFER_MASK")  # the mask reads a captured buffer (e.g. document ids)
BATCH = _int("BATCH")
HEADS = _int("HEADS")  # query heads
NQ = _int("NQ")
NK = _int("NK")
KV_ROWS = _flag("KV_ROWS")  # v2: K/V rows the query blocks of one head read (all blocks together)
PAIR_ROWS = _flag("PAIR_ROWS")  # v1: sum over the (K/V block j, Q block i) pairs of Q_i's rows
SMEM_LIMIT = _int("SMEM_LIMIT")  # target: max dynamic shared memory per block (opt-in), bytes
REG_LIMIT = _int("REG_LIMIT")  # target: max registers per thread
THREAD_LIMIT = _int("THREAD_LIMIT")  # target: max threads per block

PLAN_SYMBOLS: tuple[sympy.Symbol, ...] = (BLOCK_M, BLOCK_N, D, DV, WARPS, STAGES, ELEM_BYTES, Q_IN_REGS)

# --- kernel facts -------------------------------------------------------------------------------
WARP_SIZE = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16  # mma.sync.aligned.m16n8k16 (bf16/fp16 in, fp32 accumulate)
ACC_REGS_PER_TILE = 4  # an m16n8 fp32 accumulator is 128 values over 32 lanes: 4 per thread
A_FRAG_REGS_PER_TILE = 4  # an m16k16 bf16 A fragment is 256 values over 32 lanes: 8 halves = 4 regs
SMEM_ROW_PAD = 8  # elements of padding per smem row (16 B) so ldmatrix rows hit distinct banks
REG_OVERHEAD = 40  # addresses, loop indices, row max m and row sum l, masks
# score_mod / dropout / buffer-reading mask: registers per m16 x n8 tile of S (per-column indices,
# Philox counters and words kept live across the tile's element loop); calibrated with nvcc, above
VARIANT_REGS_PER_S_TILE = 1
V1_S_TILE_ELEM_BYTES = 4  # v1 keeps the S/P tile (B_r x B_c) in shared memory as fp32
# v1 runs one thread per row with scalar loops and no per-thread arrays (Q_i, O_i stream through
# smem and HBM): register use is small; a rough estimate (the real count comes from ptxas).
V1_EST_REGISTERS = 64

# --- expressions --------------------------------------------------------------------------------
MT = BLOCK_M / (MMA_M * WARPS)  # m16 row tiles per warp (v2)
THREADS = WARP_SIZE * WARPS

V2_SMEM_BYTES = (BLOCK_M * (sympy.Max(D, DV) + SMEM_ROW_PAD)
                 + STAGES * BLOCK_N * ((D + SMEM_ROW_PAD) + (DV + SMEM_ROW_PAD))) * ELEM_BYTES

V2_REGISTER_TERMS: tuple[tuple[str, sympy.Expr], ...] = (
    ("o", MT * (DV / MMA_N) * ACC_REGS_PER_TILE),
    ("s", MT * (BLOCK_N / MMA_N) * ACC_REGS_PER_TILE),
    ("q", Q_IN_REGS * MT * (D / MMA_K) * A_FRAG_REGS_PER_TILE),
    ("overhead", sympy.Integer(REG_OVERHEAD)),
    ("variant", VARIANT_REGS_PER_S_TILE * MT * (BLOCK_N / MMA_N)
     * sympy.Max(HAS_SCORE_MOD, HAS_DROPOUT, HAS_BUFFER_MASK)),
)
V2_REGISTERS = sympy.Add(*(e for _, e in V2_REGISTER_TERMS))

V1_SMEM_BYTES = (BLOCK_M * D * ELEM_BYTES + BLOCK_N * D * ELEM_BYTES + BLOCK_N * DV * ELEM_BYTES
                 + BLOCK_M * BLOCK_N * V1_S_TILE_ELEM_BYTES)
V1_REGISTERS = sympy.Integer(V1_EST_REGISTERS)

_BH = BATCH * HEADS
FLOPS = 2 * _BH * NQ * NK * (D + DV)  # the two matmuls, 2 FLOPs per multiply-add (dense)

STANDARD_HBM_TERMS: tuple[tuple[str, sympy.Expr], ...] = (
    ("qkv", _BH * (NQ * D + NK * D + NK * DV) * ELEM_BYTES),  # Q, K, V read
    ("s", _BH * 2 * NQ * NK * ELEM_BYTES),  # S = QK^T written, read by softmax
    ("p", _BH * 2 * NQ * NK * ELEM_BYTES),  # P written, read by PV
    ("o", _BH * NQ * DV * ELEM_BYTES),  # O written
)
#: v2 without a mask: every query block reads all of K and V, Tr = ceil(NQ / BLOCK_M) times.
V2_KV_ROWS_DENSE = sympy.ceiling(NQ / BLOCK_M) * NK
V2_HBM_TERMS: tuple[tuple[str, sympy.Expr], ...] = (
    ("q", _BH * NQ * D * ELEM_BYTES),  # Q read once
    ("o", _BH * NQ * DV * ELEM_BYTES),  # O written once
    ("kv", _BH * KV_ROWS * (D + DV) * ELEM_BYTES),  # K, V read once per query block (KV_ROWS)
)
#: v1 without a mask: each of the Tc = ceil(NK / BLOCK_N) K/V passes visits every query row.
V1_PAIR_ROWS_DENSE = sympy.ceiling(NK / BLOCK_N) * NQ
V1_HBM_TERMS: tuple[tuple[str, sympy.Expr], ...] = (
    ("init", _BH * NQ * (DV + 2) * 4),  # workspace O, l, m (fp32) written
    ("kv", _BH * NK * (D + DV) * ELEM_BYTES),  # K_j, V_j read once
    ("q", _BH * PAIR_ROWS * D * ELEM_BYTES),  # Q_i read per (j, i) pair
    ("o", _BH * PAIR_ROWS * DV * 4 * 2),  # O_i fp32 read + written per pair
    ("lm", _BH * PAIR_ROWS * 2 * 4 * 2),  # l_i, m_i fp32 read + written per pair
    ("final", _BH * NQ * DV * (4 + ELEM_BYTES)),  # final pass: O fp32 read, O written
)


# --- variant features ---------------------------------------------------------------------------
@dataclass(frozen=True)
class VariantFeatures:
    """What of an attention variant changes its kernel's resources (values of the HAS_* flags)."""

    has_score_mod: bool = False
    has_dropout: bool = False
    has_buffer_mask: bool = False

    @property
    def costly(self) -> bool:
        """True when the variant register term (:data:`VARIANT_REGS_PER_S_TILE`) applies."""
        return self.has_score_mod or self.has_dropout or self.has_buffer_mask

    def values(self) -> dict[sympy.Symbol, int]:
        return {HAS_SCORE_MOD: int(self.has_score_mod), HAS_DROPOUT: int(self.has_dropout),
                HAS_BUFFER_MASK: int(self.has_buffer_mask)}

    def describe(self) -> str:
        parts = [n for n, on in (("score_mod", self.has_score_mod), ("dropout (Philox)", self.has_dropout),
                                 ("a mask reading a buffer", self.has_buffer_mask)) if on]
        return " + ".join(parts) if parts else "no score_mod, dropout or buffer mask"


def variant_features(obj: Any) -> VariantFeatures:
    """The features of an AttentionIR (anything with score_expr / mask_expr / dropout_p); a
    :class:`~attncompiler.plan.model.ProblemDims` or other object without them is a plain variant."""
    if isinstance(obj, VariantFeatures):
        return obj
    score = getattr(obj, "score_expr", None)
    mask = getattr(obj, "mask_expr", None)
    p = getattr(obj, "dropout_p", 0.0) or 0.0
    reads_buffer = isinstance(mask, sympy.Basic) and mask.has(sympy.Indexed)
    return VariantFeatures(has_score_mod=score is not None, has_dropout=float(p) > 0.0,
                           has_buffer_mask=bool(reads_buffer))


# --- evaluation ---------------------------------------------------------------------------------
def _key(s: sympy.Symbol | str) -> str:
    return s if isinstance(s, str) else s.name


_Fn = Callable[[Mapping[str, Any]], Any]


def _num(x: Fraction) -> int | Fraction:
    """Whole numbers as int (fast), others as Fraction (exact)."""
    return int(x) if x.denominator == 1 else x
_FOLDS: dict[type, Callable[[Any, Any], Any]] = {sympy.Add: operator.add, sympy.Mul: operator.mul,
                                                sympy.Max: max, sympy.Min: min}


@functools.lru_cache(maxsize=None)
def _compiled(expr: sympy.Basic) -> _Fn:
    """``expr`` as a closure over a name -> int / Fraction mapping: exact rational arithmetic for the
    node kinds the model uses (numbers, symbols, +, *, integer powers, Max, Min, ceiling, floor,
    Mod)."""
    if expr.is_Rational or expr.is_Float:
        c = _num(Fraction(int(expr.p), int(expr.q)) if expr.is_Rational else Fraction(float(expr)))
        return lambda env: c
    if expr.is_Symbol:
        name = expr.name
        return lambda env: env[name]
    kids = tuple(_compiled(a) for a in expr.args)
    for cls, op in _FOLDS.items():
        if isinstance(expr, cls):
            return lambda env: functools.reduce(op, (k(env) for k in kids))
    if expr.is_Pow and expr.exp.is_Integer:
        base, n = kids[0], int(expr.exp)
        return lambda env: Fraction(base(env)) ** n
    if isinstance(expr, (sympy.ceiling, sympy.floor)):
        rnd = math.ceil if isinstance(expr, sympy.ceiling) else math.floor
        return lambda env: rnd(kids[0](env))
    if isinstance(expr, sympy.Mod):
        return lambda env: kids[0](env) % kids[1](env)
    raise ModelError(f"expected a model expression (+, *, integer powers, Max, Min, ceiling, floor, Mod), "
                     f"got {type(expr).__name__}: {expr}")


@functools.lru_cache(maxsize=None)
def _program(expr: sympy.Basic) -> tuple[tuple[str, ...], _Fn]:
    return tuple(sorted(s.name for s in expr.free_symbols)), _compiled(expr)


def evaluate(expr: sympy.Expr | int, values: Mapping[sympy.Symbol | str, Value] | None = None,
             **more: Value) -> Value:
    """The number ``expr`` takes for ``values`` (symbol or symbol name -> number) and ``more``.

    Exact (rational arithmetic): integer results come back as ``int``, anything else (e.g.
    MT = 64 / (16*8)) as ``float``.  Raises :class:`ModelError` naming the symbols left without a
    value."""
    e = expr if isinstance(expr, sympy.Basic) else sympy.sympify(expr)
    given = {_key(k): v for k, v in (values or {}).items()}
    given.update(more)
    names, fn = _program(e)
    env: dict[str, Any] = {}
    for name in names:
        if name not in given:
            raise ModelError(f"expected values for {', '.join(n for n in names if n not in given)}, got none")
        v = given[name]
        if isinstance(v, bool):
            v = int(v)
        if not isinstance(v, (int, float)):
            raise ModelError(f"{name}: expected an int or float, got {type(v).__name__}")
        env[name] = v if isinstance(v, int) else _num(Fraction(v))
    r = fn(env)
    if isinstance(r, int):
        return r
    return int(r) if r.denominator == 1 else float(r)


def target_values(target: Any) -> dict[sympy.Symbol, int]:
    """The target's limits as values of SMEM_LIMIT, REG_LIMIT, THREAD_LIMIT."""
    return {SMEM_LIMIT: int(target.max_smem_per_block_optin), REG_LIMIT: int(target.max_registers_per_thread),
            THREAD_LIMIT: int(target.max_threads_per_block)}


# --- constraints --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constraint:
    """``expr <= limit`` (``limit`` set) or ``expr in allowed`` (``allowed`` set), named."""

    name: str
    expr: sympy.Expr
    limit: sympy.Expr | None = None
    allowed: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.limit is None) == (self.allowed is None):
            raise ModelError(f"constraint {self.name!r}: expected exactly one of limit / allowed, got "
                             f"limit={self.limit!r}, allowed={self.allowed!r}")

    def check(self, values: Mapping[sympy.Symbol | str, Value]) -> "Check":
        v = evaluate(self.expr, values)
        if self.limit is not None:
            lim = evaluate(self.limit, values)
            return Check(self, v, lim, v <= lim)
        return Check(self, v, self.allowed, v in (self.allowed or ()))

    def describe(self) -> str:
        rhs = f"<= {self.limit}" if self.limit is not None else "in {" + ", ".join(map(str, self.allowed or ())) + "}"
        return f"{self.name}: {self.expr} {rhs}"


@dataclass(frozen=True)
class Check:
    """One constraint evaluated: its value, the bound (a number or the allowed set) and the verdict."""

    constraint: Constraint
    value: Value
    bound: Value | tuple[int, ...] | None
    ok: bool

    @property
    def name(self) -> str:
        return self.constraint.name

    def describe(self) -> str:
        if isinstance(self.bound, tuple):
            rel = "in" if self.ok else "not in"
            return f"{self.name} = {self.value:g} {rel} {{{', '.join(map(str, self.bound))}}}"
        return f"{self.name} = {self.value:g} {'<=' if self.ok else '>'} {self.bound:g}"


def check_all(constraints: tuple[Constraint, ...], values: Mapping[sympy.Symbol | str, Value]) -> dict[str, Check]:
    """Every constraint checked, by name (in order)."""
    return {c.name: c.check(values) for c in constraints}
