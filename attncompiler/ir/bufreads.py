"""Buffer reads in tile classification: the value range of ``buf[..., idx, ...]`` over a tile.

The tile classifier (:mod:`attncompiler.ir.bounds`) bounds each relational of a mask over the tile
``q_idx in [q_lo, q_hi]`` x ``kv_idx in [kv_lo, kv_hi]``.  A read of an **int** buffer whose indices
are all fixed over the tile (built from ``b``, ``h``, the lengths and constants) except one, the
*range axis*, whose index has a known range ``[i_lo, i_hi]`` over the tile (``q_idx``, ``kv_idx``,
``q_idx + 3``, ``floor(kv_idx / 2)`` ...), takes its values in ``[min, max]`` of the buffer's
entries at indices ``[clamp(i_lo), clamp(i_hi)]`` along that axis (the kernels clamp buffer indices
into range, and clamping is monotone, so no read of the tile leaves that range).  Those two numbers
are read at run time; the bounds treat them as the integer symbols ``rd<k>_lo`` / ``rd<k>_hi``
(:class:`~attncompiler.ir.bounds.ReadBound`).  So ``doc[q_idx] == doc[kv_idx]`` is EMPTY when the
two value ranges are disjoint and FULL when both are the same single value, and conjunctions such
as causal & document compose through the classifier's Kleene logic.

Run time (CUDA).  The min / max is **exact** (not a granule-rounded superset): raw entries from
the range's start up to a multiple of :data:`GRANULE` and from its end down to one, and the whole
granules between from the *range table* ``buf.<name>_gminmax`` (filled by
:mod:`attncompiler.runtime.blockstats`; granules of GRANULE entries along the range axis, fixed,
independent of the plan): int32 ``(*other dims, levels, ng, 2)``, level ``k`` holding at granule
``g`` the (min, max) of granules ``[g, g + 2^k)`` (a sparse table), so any run of whole granules
``[g0, g1]`` is the union of two entries of level ``floor(log2(g1 - g0 + 1))``: two pair loads per
read whatever the range's length (the kernels call ``tile_class`` once per block while they scan
for the next non-EMPTY block).  Every tile size the planners pick (BLOCK_M, BLOCK_N, the v3
warpgroups' 64 rows, backward tiles) is a multiple of GRANULE = 16, so aligned tiles read no raw
entries.  A null ``_gminmax`` pointer (a launcher that does not fill it) makes the read unknown.

Soundness guards.  A read is unknown -- its relationals are PARTIAL -- when the min or max is
outside ``(-INDEX_LIMIT, INDEX_LIMIT)`` (so the classifier's int arithmetic cannot overflow), when
the buffer is float, has more than one index that varies over the tile, or has range axes that
differ between reads of the same buffer (one table per buffer), and in Python when no buffer values
are given.  Python (:meth:`BufferRead.evaluate`, exact min / max of the entries) and CUDA agree
exactly.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from attncompiler.codegen.cuda_printer import CudaPrinter
from attncompiler.spec.symbols import B, H, KV_LEN, Q_LEN

from .bounds import _INT32_MAX, _PRINTER, INDEX_LIMIT, ReadBound, _exact_int, _mag
from .intervals import Interval, _compile

__all__ = ["GRANULE", "BufferValues", "BufferRead", "ReadContext", "granule_count", "level_count"]

#: Entries per granule of the run-time (min, max) tables along a buffer's range axis.
GRANULE = 16
_SHIFT = GRANULE.bit_length() - 1
assert GRANULE == 1 << _SHIFT, "GRANULE must be a power of two (the CUDA uses shifts and masks)"

_POINT_SYMBOLS = frozenset({B, H, Q_LEN, KV_LEN})


def granule_count(n: int) -> int:
    """Granules covering ``n`` entries along the range axis."""
    return -(-n // GRANULE)


def level_count(ng: int) -> int:
    """Levels of the range table over ``ng`` granules: floor(log2(ng)) + 1 (level k spans 2^k granules)."""
    return max(ng, 1).bit_length()


@dataclass(frozen=True)
class BufferValues:
    """One int buffer's entries for Python classification: its shape and row-major values."""

    shape: tuple[int, ...]
    flat: tuple[int, ...]

    @classmethod
    def of(cls, value: Any) -> "BufferValues":
        """From a torch tensor (any int / bool dtype, any device), nested lists, or a BufferValues."""
        if isinstance(value, BufferValues):
            return value
        if hasattr(value, "shape") and hasattr(value, "reshape") and hasattr(value, "tolist"):
            if getattr(value, "is_floating_point", lambda: False)() or getattr(value, "is_complex", lambda: False)():
                raise ValueError(f"expected an int or bool buffer, got dtype {value.dtype}")
            return cls._checked(tuple(int(d) for d in value.shape), value.reshape(-1).tolist())
        shape: list[int] = []
        x = value
        while isinstance(x, (list, tuple)):
            shape.append(len(x))
            x = x[0] if x else None
        flat: list[Any] = []

        def walk(v: Any, depth: int) -> None:
            if depth == len(shape):
                flat.append(v)
                return
            if not isinstance(v, (list, tuple)) or len(v) != shape[depth]:
                raise ValueError(f"expected a rectangular nested list of shape {tuple(shape)}, got a ragged one")
            for y in v:
                walk(y, depth + 1)

        walk(value, 0)
        return cls._checked(tuple(shape), flat)

    @classmethod
    def _checked(cls, shape: tuple[int, ...], flat: Sequence[Any]) -> "BufferValues":
        if not shape or any(d <= 0 for d in shape):
            raise ValueError(f"expected a non-empty buffer with at least one dim, got shape {shape}")
        bad = next((v for v in flat if isinstance(v, float) or not isinstance(v, int)), None)
        if bad is not None:
            raise ValueError(f"expected int or bool entries, got {bad!r}")
        return cls(shape, tuple(int(v) for v in flat))


@dataclass(frozen=True)
class BufferRead:
    """One read ``name[indices]``: ``indices[axis]`` ranges over ``[lo, hi]`` on the tile, the others
    are the fixed ``points`` (expressions in b, h, q_len, kv_len).  Its value range is the pair of
    run-time symbols ``lo_sym`` / ``hi_sym`` (CUDA ``rd<k>_lo`` / ``rd<k>_hi``, valid iff ``rd<k>_ok``)."""

    k: int
    expr: sympy.Indexed
    name: str
    axis: int
    lo: sympy.Expr
    hi: sympy.Expr
    points: tuple[sympy.Expr | None, ...]  # None at the axis
    lo_sym: ReadBound = field(init=False)
    hi_sym: ReadBound = field(init=False)
    _fns: tuple[Callable[[Mapping[sympy.Symbol, Any]], Any] | None, ...] = field(
        init=False, default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lo_sym", ReadBound(f"rd{self.k}_lo", integer=True))
        object.__setattr__(self, "hi_sym", ReadBound(f"rd{self.k}_hi", integer=True))
        fns = [None if p is None else _compile(p) for p in self.points] + [_compile(self.lo), _compile(self.hi)]
        object.__setattr__(self, "_fns", tuple(fns))

    @property
    def ok_name(self) -> str:
        return self.lo_sym.ok_name

    def inputs(self) -> frozenset[sympy.Symbol]:
        """The tile inputs (q_lo, ..., b, h, lengths) the read's indices use."""
        out: set[sympy.Symbol] = set(self.lo.free_symbols | self.hi.free_symbols)
        for p in self.points:
            if p is not None:
                out |= p.free_symbols
        return frozenset(out)

    def evaluate(self, env: Mapping[sympy.Symbol, Any], values: Mapping[str, BufferValues]) -> tuple[int, int] | None:
        """Exact (min, max) of the entries the tile can read, or None when unknown."""
        bv = values.get(self.name)
        if bv is None:
            return None
        nd = len(self.points)
        if len(bv.shape) != nd:
            raise ValueError(f"buffer {self.name!r}: expected {nd} dims, got shape {bv.shape}")
        strides = [1] * nd
        for j in range(nd - 2, -1, -1):
            strides[j] = strides[j + 1] * bv.shape[j + 1]
        base = 0
        for j, fn in enumerate(self._fns[:nd]):
            if fn is not None:
                base += min(max(int(fn(env)), 0), bv.shape[j] - 1) * strides[j]
        n, st = bv.shape[self.axis], strides[self.axis]
        i0 = min(max(int(self._fns[nd](env)), 0), n - 1)
        i1 = min(max(int(self._fns[nd + 1](env)), 0), n - 1)
        if i0 > i1:
            return None
        vals = bv.flat[base + i0 * st: base + i1 * st + 1: st]
        lo, hi = min(vals), max(vals)
        return (lo, hi) if -INDEX_LIMIT < lo and hi < INDEX_LIMIT else None

    def to_cuda(self, printer: CudaPrinter) -> list[str]:
        """Statements declaring ``rd<k>_lo``, ``rd<k>_hi`` (0 unless valid) and ``rd<k>_ok``."""
        k, nm, nd, ax = self.k, self.name, len(self.points), self.axis
        dims = [f"buf.{nm}_d{j}" for j in range(nd)]
        base: list[str] = []
        row = ""
        for j, pt in enumerate(self.points):
            if pt is None:
                continue
            c = f"ac_clamp({printer.print(pt, 'int')}, {dims[j]})"
            stride = " * ".join(dims[j + 1:])
            base.append(f"{c} * {stride}" if stride else c)
            row = c if not row else f"({row}) * {dims[j]} + {c}"
        sv = " * ".join(dims[ax + 1:])

        def at(x: str) -> str:
            return f"{x} * ({sv})" if sv else x

        m, lim = GRANULE - 1, INDEX_LIMIT
        v = f"buf.{nm}" + (f" + {' + '.join(base)}" if base else "")
        lines = [
            f"// {self.expr}: exact min / max of its entries at [{self.lo}, {self.hi}] (clamped) along dim {ax}:",
            f"// raw entries up to / from a multiple of {GRANULE}, the whole granules between from the range",
            f"// table buf.{nm}_gminmax (two (min, max) pairs of one level, whatever the length)",
            f"int rd{k}_lo = 0, rd{k}_hi = 0;",
            f"bool rd{k}_ok = false;",
            f"if (buf.{nm}_gminmax != nullptr) {{",
            f"  const int n = {dims[ax]}, ng = (n + {m}) >> {_SHIFT};",
            f"  const int i0 = ac_clamp({printer.print(self.lo, 'int')}, n), "
            f"i1 = ac_clamp({printer.print(self.hi, 'int')}, n);",
            f"  const int* v = {v};",
            f"  int mn = {lim}, mx = -{lim}, i = i0, e = i1;",
            f"  for (; i <= e && (i & {m}) != 0; ++i) {{ const int x = v[{at('i')}]; "
            "mn = min(mn, x); mx = max(mx, x); }",
            f"  for (; e >= i && (e & {m}) != {m}; --e) {{ const int x = v[{at('e')}]; "
            "mn = min(mn, x); mx = max(mx, x); }",
            "  if (i <= e) {  // whole granules [g0, g1]: level k covers 2^k granules from each start",
            f"    const int g0 = i >> {_SHIFT}, g1 = e >> {_SHIFT}, len = g1 - g0 + 1;",
            "    int k = 0;",
            "    while ((2 << k) <= len) ++k;",
        ]
        if row:
            lines += ["    int levels = 1;", "    while ((1 << levels) <= ng) ++levels;",
                      f"    const int* t = buf.{nm}_gminmax + 2 * ((long long)(({row}) * levels + k) * ng);"]
        else:
            lines += [f"    const int* t = buf.{nm}_gminmax + 2 * ((long long)k * ng);"]
        lines += [
            "    const int g2 = g1 - (1 << k) + 1;",
            "    mn = min(mn, min(t[2 * g0], t[2 * g2]));",
            "    mx = max(mx, max(t[2 * g0 + 1], t[2 * g2 + 1]));",
            "  }",
            f"  rd{k}_ok = mn <= mx && mn > -{lim} && mx < {lim};",
            f"  if (rd{k}_ok) {{ rd{k}_lo = mn; rd{k}_hi = mx; }}",
            "}",
        ]
        return lines


def _kinds(buffers: object) -> dict[str, tuple[str, int]]:
    """name -> (kind, ndim or -1) from BufferInfo's or a {name: kind} mapping."""
    if buffers is None:
        return {}
    if isinstance(buffers, Mapping):
        return {str(n): (str(kd), -1) for n, kd in buffers.items()}
    return {b.name: (b.kind, b.ndim) for b in buffers}  # type: ignore[attr-defined]


def _is_point(e: sympy.Basic) -> bool:
    return not e.has(sympy.Indexed) and e.free_symbols <= _POINT_SYMBOLS


class ReadContext:
    """Collects the buffer reads that a mask's relationals bound (one :class:`BufferRead` per
    distinct ``Indexed``), with each int buffer's range axis fixed up front."""

    def __init__(self, mask: sympy.Basic | None, buffers: object) -> None:
        self.kinds = _kinds(buffers)
        self.axes: dict[str, int] = {}
        self.reads: dict[sympy.Indexed, BufferRead] = {}
        atoms = sorted(mask.atoms(sympy.Indexed), key=sympy.default_sort_key) if isinstance(mask, sympy.Basic) else []
        free: dict[str, int] = {}
        for e in atoms:
            name = str(e.base.label)
            kind, ndim = self.kinds.get(name, ("int" if e.base.is_integer else "float", -1))
            if kind != "int" or (ndim >= 0 and ndim != len(e.indices)) or not name.isidentifier():
                continue
            ranged = [j for j, i in enumerate(e.indices) if not _is_point(i)]
            if len(ranged) == 1:
                self.axes.setdefault(name, ranged[0])
            elif not ranged:
                free.setdefault(name, len(e.indices) - 1)
        for name, ax in free.items():
            self.axes.setdefault(name, ax)

    def interval(self, e: sympy.Indexed, bounder: Any) -> Interval | None:
        """``(rd<k>_lo, rd<k>_hi)`` for the read ``e`` on the bounder's tile box, or None (unknown)."""
        name = str(e.base.label)
        axis = self.axes.get(name)
        if axis is None or len(e.indices) <= axis:
            return None
        hit = self.reads.get(e)
        if hit is not None:
            return hit.lo_sym, hit.hi_sym
        points: list[sympy.Expr | None] = []
        lo = hi = None
        for j, idx in enumerate(e.indices):
            if idx.has(sympy.Indexed):
                return None
            if j == axis:
                iv = bounder.bound(idx)
                if iv is None:
                    return None
                lo, hi = iv
                points.append(None)
            elif _is_point(idx):
                points.append(idx)
            else:
                return None
        exprs = [x for x in (lo, hi, *points) if x is not None]
        if not all(_exact_int(x) and _mag(x) <= _INT32_MAX for x in exprs):
            return None
        read = BufferRead(len(self.reads), e, name, axis, lo, hi, tuple(points))
        self.reads[e] = read
        return read.lo_sym, read.hi_sym

    def printer(self) -> CudaPrinter:
        """The bounds printer, also spelling the reads' symbols."""
        names: dict[sympy.Symbol, str] = {}
        for r in self.reads.values():
            names[r.lo_sym], names[r.hi_sym] = r.lo_sym.name, r.hi_sym.name
        return _PRINTER.with_names(names)
