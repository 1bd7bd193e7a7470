"""CPU tile simulator: a plan's exact loop order, tiling, online softmax and tile classification.

:func:`simulate` executes, in float64 torch on the CPU, what a schedule's kernel does, tile by
tile, with the plan's block sizes -- so the tiling math of every schedule is proved against
:func:`attncompiler.reference.reference_attention` without a GPU:

* **v1** (FlashAttention-1, Algorithm 1): K/V blocks outer, Q blocks inner; O (normalized after
  every step), l and m live "in HBM" (whole-problem tensors) between steps; each step computes
  the tile's own max and sum and merges them: m_new = max(m, m~), l_new = e^(m - m_new) l +
  e^(m~ - m_new) l~, O = (l e^(m - m_new) O + e^(m~ - m_new) P~ V) / l_new.  Rows with no visible
  key in a tile are left unchanged.  LSE = m + log l.
* **v2** (FlashAttention-2 forward): Q blocks outer, K/V blocks inner; the running max m, the sum
  l and the unnormalized O stay with the Q block; scores in the log2 domain, the row max of a
  row that has seen nothing yet referenced as 0 so that exp2(-inf - ref) = 0, O rescaled by
  alpha = 2^(m_old - m_new) per tile, one final division by l; LSE = (m + log2 l) ln 2.

* **v3** (FlashAttention-3 style forward, Hopper): Q tiles of BLOCK_M = 64 x consumers rows, each consumer
  warpgroup owning 64 of them with its own (m, l, O); the CTA walks the K/V blocks not EMPTY for *all* its
  rows, ascending or (``kv_descending``) from the last block down, and every warpgroup takes every
  visited block: one that is EMPTY for a warpgroup's rows goes through the masked softmax and adds
  nothing -- except where the kernel walks per warpgroup (a mask, two or three warpgroups, and BLOCK_N <
  BLOCK_M): there a warpgroup multiplies only the blocks that meet the K/V range of its own rows
  (:func:`attncompiler.ir.ranges.kv_range`, per (b, h)), and its first such block is its first block.
  The offset is lazy (FlashAttention-4's rescaling): it moves to a block's row maximum only
  when that exceeds it by more than :data:`V3_RESCALE_SLACK` (log2 units), so P reaches 2^8; a bounded
  score_mod (softcap) instead fixes the offset at the first visited block's row maximum clamped into
  the window of :func:`attncompiler.codegen.hooks.static_offset_of`.  (The score skip and the rounding
  of P to 16 bits are precision features the float64 simulation leaves out.)

All three classify every tile ``[q_lo, q_hi] x [kv_lo, kv_hi]`` (inclusive, clipped to the sequence
lengths, as the kernels do) with the IR's :class:`~attncompiler.ir.bounds.TileClassifier`:
EMPTY tiles are skipped (no score, no softmax update), FULL tiles run without evaluating the mask,
PARTIAL tiles evaluate it.  So the result matches the reference only if the classifier is right.
Masks reading int buffers (document ids) are classified from the buffers' values, exactly as the
kernels' run-time reads do (:mod:`attncompiler.ir.bufreads`).
Dropout keep bits come from :func:`attncompiler.philox.dropout_keep_mask` (the kernels' Philox
counters); the softmax sum l is taken before dropout, as in the kernels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

import torch

from .ir.bounds import TILE_EMPTY, TILE_FULL, TILE_PARTIAL, tile_classifier
from .ir.types import AttentionIR
from .philox import dropout_keep_mask
from .reference import _check_qkv, _prepare_buffers, evaluate
from .spec.symbols import B as SYM_B
from .spec.symbols import H as SYM_H
from .spec.symbols import KV_IDX, KV_LEN, Q_IDX, Q_LEN, SCORE

__all__ = ["TileSchedule", "SimStats", "SimResult", "SimulateError", "simulate", "tile_classes", "SIM_SCHEDULES",
           "V3_RESCALE_SLACK", "V3_WG_ROWS"]

SIM_SCHEDULES: tuple[str, ...] = ("v1", "v2", "v3")
_LOG2E = 1.0 / math.log(2.0)
#: v3: the log2 units a block's row maximum may exceed the offset before it moves (V3Consumer::kRescaleSlack in
#: templates/include/attncompiler/v3_consumer.cuh; tests/test_simulate.py checks that the two agree)
V3_RESCALE_SLACK = 8.0
#: v3: query rows per consumer warpgroup (the M of wgmma; plan/v3.py WGMMA_M)
V3_WG_ROWS = 64


class SimulateError(ValueError):
    """An invalid schedule, block size or input for the simulator."""


class _HasTiles(Protocol):
    schedule: str
    block_m: int
    block_n: int


@dataclass(frozen=True)
class TileSchedule:
    """The part of a plan the simulator reads: the schedule and its query / key tile sizes.

    Any :class:`~attncompiler.plan.model.Plan` has these fields too; this type lets tests and
    tools simulate tilings that no hardware target would pick (e.g. 16 x 16 tiles)."""

    schedule: str
    block_m: int
    block_n: int
    kv_descending: bool = False  # v3: the K/V walk from the last block down


@dataclass(frozen=True)
class SimStats:
    """Tiles visited, counted per (batch, head): by class, and how many scores were computed."""

    tiles_empty: int
    tiles_partial: int
    tiles_full: int
    scores_computed: int  # elements of S computed (skipped EMPTY tiles compute none)
    mask_evaluations: int  # elements the mask was evaluated on (PARTIAL tiles only)

    @property
    def tiles(self) -> int:
        return self.tiles_empty + self.tiles_partial + self.tiles_full


@dataclass(frozen=True)
class SimResult:
    """Output (B, H, Nq, DV) float64, LSE (B, H, Nq) float64 (natural log), and the tile counts."""

    out: torch.Tensor
    lse: torch.Tensor
    stats: SimStats


def _positive(name: str, x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
        raise SimulateError(f"{name}: expected a positive int, got {x!r}")
    return x


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    """[(lo, hi)] inclusive tiles of ``size`` covering [0, n), the last one clipped to n - 1."""
    return [(lo, min(lo + size, n) - 1) for lo in range(0, n, size)]


class _Tiles:
    """Tile classes of one problem, per (b, h) when the mask reads b or h, else shared."""

    def __init__(self, ir: AttentionIR, B: int, H: int, Nq: int, Nk: int,
                 buffers: Optional[Mapping[str, Any]] = None) -> None:
        self.cls = tile_classifier(ir.mask_expr, ir.buffers)
        self.values = self.cls.buffer_values(buffers)  # int buffers the mask's reads range over
        self.B, self.H, self.Nq, self.Nk = B, H, Nq, Nk
        self.per_head = bool(self.cls.inputs() & {SYM_B, SYM_H})
        self.has_mask = ir.mask_expr is not None

    def classes(self, q_lo: int, q_hi: int, kv_lo: int, kv_hi: int) -> torch.Tensor:
        """int64 (B, H) tensor of TILE_* for the tile."""
        if not self.has_mask:
            return torch.full((self.B, self.H), TILE_FULL, dtype=torch.int64)
        if not self.per_head:
            c = self.cls.classify(q_lo, q_hi, kv_lo, kv_hi, 0, 0, self.Nq, self.Nk, self.values)
            return torch.full((self.B, self.H), c, dtype=torch.int64)
        return torch.tensor([[self.cls.classify(q_lo, q_hi, kv_lo, kv_hi, b, h, self.Nq, self.Nk, self.values)
                              for h in range(self.H)] for b in range(self.B)], dtype=torch.int64)


class _Problem:
    """Inputs in float64 (K/V expanded over GQA groups), buffers, dropout bits, counters."""

    def __init__(self, ir: AttentionIR, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 buffers: Optional[Mapping[str, torch.Tensor]], scale: Optional[float], dropout_p: Optional[float],
                 seed: int, offset: int) -> None:
        if not isinstance(ir, AttentionIR):
            raise SimulateError(f"expected an AttentionIR, got {type(ir).__name__}")
        try:
            B, H, Hkv, Nq, Nk, DV = _check_qkv(q, k, v, ir)
        except ValueError as e:
            raise SimulateError(str(e)) from None
        self.ir = ir
        self.B, self.H, self.Nq, self.Nk, self.DV = B, H, Nq, Nk, DV
        cpu = torch.device("cpu")
        self.q = q.detach().to(cpu, torch.float64)
        group = H // Hkv
        self.k = k.detach().to(cpu, torch.float64).repeat_interleave(group, dim=1)
        self.v = v.detach().to(cpu, torch.float64).repeat_interleave(group, dim=1)
        self.scale = float(ir.scale if scale is None else scale)
        self.p_drop = float(ir.dropout_p if dropout_p is None else dropout_p)
        if not 0.0 <= self.p_drop < 1.0:
            raise SimulateError(f"dropout_p: expected a value in [0, 1), got {self.p_drop}")
        self.bufs = _prepare_buffers(ir, buffers, torch.float64, cpu)
        self.keep = (dropout_keep_mask(B, H, Nq, Nk, seed=seed, offset=offset, p=self.p_drop)
                     if self.p_drop > 0.0 and Nq and Nk else None)
        self.tiles = _Tiles(ir, B, H, Nq, Nk, self.bufs)
        self.counts = {TILE_EMPTY: 0, TILE_PARTIAL: 0, TILE_FULL: 0}
        self.scores = 0
        self.mask_evals = 0
        self.b_idx = torch.arange(B).view(B, 1, 1, 1)
        self.h_idx = torch.arange(H).view(1, H, 1, 1)

    def stats(self) -> SimStats:
        return SimStats(self.counts[TILE_EMPTY], self.counts[TILE_PARTIAL], self.counts[TILE_FULL], self.scores,
                        self.mask_evals)

    def tile_scores(self, q_lo: int, q_hi: int, kv_lo: int, kv_hi: int) -> torch.Tensor | None:
        """Scores of one tile after scale, score_mod and mask (-inf where masked), or None if every
        (b, h) of the tile is EMPTY.  (b, h) pairs classified EMPTY are all -inf -- exactly what
        skipping them does to either schedule's update -- and FULL ones never see the mask."""
        cls = self.tiles.classes(q_lo, q_hi, kv_lo, kv_hi)
        for c in (TILE_EMPTY, TILE_PARTIAL, TILE_FULL):
            self.counts[c] += int((cls == c).sum())
        live = cls != TILE_EMPTY
        if not bool(live.any()):
            return None
        rows, cols = q_hi - q_lo + 1, kv_hi - kv_lo + 1
        self.scores += int(live.sum()) * rows * cols
        s = self.q[:, :, q_lo:q_hi + 1] @ self.k[:, :, kv_lo:kv_hi + 1].transpose(-1, -2) * self.scale
        shape = s.shape
        env = {SCORE.name: s, SYM_B.name: self.b_idx, SYM_H.name: self.h_idx,
               Q_IDX.name: torch.arange(q_lo, q_hi + 1).view(1, 1, rows, 1),
               KV_IDX.name: torch.arange(kv_lo, kv_hi + 1).view(1, 1, 1, cols),
               Q_LEN.name: self.Nq, KV_LEN.name: self.Nk}
        if self.ir.score_expr is not None:
            val = evaluate(self.ir.score_expr, env, self.bufs, float_dtype=torch.float64)
            s = torch.broadcast_to(torch.as_tensor(val, dtype=torch.float64), shape).clone()
        visible = (cls == TILE_FULL).view(self.B, self.H, 1, 1).expand(shape).clone()
        partial = cls == TILE_PARTIAL
        if bool(partial.any()):
            self.mask_evals += int(partial.sum()) * rows * cols
            m = evaluate(self.ir.mask_expr, env, self.bufs, float_dtype=torch.float64)
            m = torch.as_tensor(m)
            if m.dtype != torch.bool:
                m = m != 0
            m = torch.broadcast_to(m, shape)
            pv = partial.view(self.B, self.H, 1, 1).expand(shape)
            visible = torch.where(pv, m, visible)
        return s.masked_fill(~visible, -math.inf)

    def dropped(self, p: torch.Tensor, q_lo: int, q_hi: int, kv_lo: int, kv_hi: int) -> torch.Tensor:
        if self.keep is None:
            return p
        keep = self.keep[:, :, q_lo:q_hi + 1, kv_lo:kv_hi + 1]
        return p.masked_fill(~keep, 0.0) / (1.0 - self.p_drop)


def _run_v1(pr: _Problem, br: int, bc: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, Nq, DV = pr.B, pr.H, pr.Nq, pr.DV
    o = torch.zeros(B, H, Nq, DV, dtype=torch.float64)  # [A1 line 2], "in HBM"
    l = torch.zeros(B, H, Nq, dtype=torch.float64)
    m = torch.full((B, H, Nq), -math.inf, dtype=torch.float64)
    for kv_lo, kv_hi in _blocks(pr.Nk, bc):  # [A1 line 5]: K/V blocks outer
        vj = pr.v[:, :, kv_lo:kv_hi + 1]
        for q_lo, q_hi in _blocks(Nq, br):  # [A1 line 7]: Q blocks inner
            s = pr.tile_scores(q_lo, q_hi, kv_lo, kv_hi)
            if s is None:
                continue
            rows = slice(q_lo, q_hi + 1)
            m_old, l_old, o_old = m[:, :, rows], l[:, :, rows], o[:, :, rows]
            m_tile = s.amax(dim=-1)  # [A1 line 10]
            live = m_tile != -math.inf  # rows with no visible key in this tile are left unchanged
            p = torch.exp(s - torch.where(live, m_tile, 0.0).unsqueeze(-1))
            l_tile = p.sum(dim=-1)
            p = pr.dropped(p, q_lo, q_hi, kv_lo, kv_hi)
            m_new = torch.maximum(m_old, m_tile)  # [A1 line 11]
            m_safe = torch.where(live, m_new, 0.0)
            alpha = torch.where(m_old == -math.inf, 0.0, torch.exp(m_old - m_safe))
            beta = torch.exp(torch.where(live, m_tile - m_safe, 0.0))
            l_new = alpha * l_old + beta * l_tile
            l_div = torch.where(live, l_new, 1.0)
            o_new = ((l_old * alpha / l_div).unsqueeze(-1) * o_old
                     + (beta / l_div).unsqueeze(-1) * (p @ vj))  # [A1 line 12]
            lv = live.unsqueeze(-1)
            o[:, :, rows] = torch.where(lv, o_new, o_old)
            l[:, :, rows] = torch.where(live, l_new, l_old)  # [A1 line 13]
            m[:, :, rows] = torch.where(live, m_new, m_old)
    lse = torch.where(m == -math.inf, -math.inf, m + torch.log(torch.where(m == -math.inf, 1.0, l)))
    return o, lse


def _finish(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The v2 / v3 epilogue of one row block: O = acc / l and LSE = (m + log2 l) ln 2 (m in log2 units); a row
    with no visible key (l = 0 or m = -inf) gets O = 0 and LSE = -inf."""
    ok = (l > 0) & (m != -math.inf)
    inv = torch.where(ok, 1.0 / torch.where(ok, l, 1.0), 0.0)
    lse = torch.where(ok, (m + torch.log2(torch.where(ok, l, 1.0))) * math.log(2.0), -math.inf)
    return acc * inv.unsqueeze(-1), lse


def _run_v2(pr: _Problem, bm: int, bn: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, Nq, DV = pr.B, pr.H, pr.Nq, pr.DV
    out = torch.zeros(B, H, Nq, DV, dtype=torch.float64)
    lse = torch.full((B, H, Nq), -math.inf, dtype=torch.float64)
    kv_blocks = _blocks(pr.Nk, bn)
    for q_lo, q_hi in _blocks(Nq, bm):  # Q blocks outer (one CTA each)
        rows = q_hi - q_lo + 1
        acc = torch.zeros(B, H, rows, DV, dtype=torch.float64)
        m = torch.full((B, H, rows), -math.inf, dtype=torch.float64)  # running max, log2 domain
        l = torch.zeros(B, H, rows, dtype=torch.float64)
        for kv_lo, kv_hi in kv_blocks:  # K/V blocks inner
            s = pr.tile_scores(q_lo, q_hi, kv_lo, kv_hi)
            if s is None:
                continue
            x = s * _LOG2E
            m_new = torch.maximum(m, x.amax(dim=-1))
            m_ref = torch.where(m_new == -math.inf, 0.0, m_new)  # a row that has seen nothing: ref 0
            alpha = torch.exp2(m - m_ref)  # 1 when the max is unchanged, 0 from -inf
            p = torch.exp2(x - m_ref.unsqueeze(-1))
            l = l * alpha + p.sum(dim=-1)  # before dropout
            p = pr.dropped(p, q_lo, q_hi, kv_lo, kv_hi)
            acc = acc * alpha.unsqueeze(-1) + p @ pr.v[:, :, kv_lo:kv_hi + 1]
            m = m_new
        out[:, :, q_lo:q_hi + 1], lse[:, :, q_lo:q_hi + 1] = _finish(acc, m, l)  # one final rescale
    return out, lse


def _wg_blocks(rng: Any, lo: int, hi: int, B: int, H: int, Nq: int, Nk: int, bn: int) -> torch.Tensor:
    """The per-warpgroup walk's run: int64 (B, H, 2), the K/V blocks ``[first, past)`` that meet the K/V range of
    query rows ``[lo, hi]`` (the kernel's kv_block_range of the warpgroup's rows; none where the range is empty)."""
    out = torch.zeros(B, H, 2, dtype=torch.int64)
    for b in range(B):
        for h in range(H):
            r_lo, r_hi = (0, Nk - 1) if rng.is_full() else rng.evaluate(lo, hi, b, h, q_len=Nq, kv_len=Nk)
            r_lo, r_hi = max(r_lo, 0), min(r_hi, Nk - 1)
            if r_lo <= r_hi:
                out[b, h, 0], out[b, h, 1] = r_lo // bn, r_hi // bn + 1
    return out


def _run_v3(pr: _Problem, bm: int, bn: int, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from .codegen.hooks import static_offset_of  # lazy: codegen imports the planner
    from .ir.ranges import kv_range

    B, H, Nq, DV = pr.B, pr.H, pr.Nq, pr.DV
    static = static_offset_of(pr.ir)
    # v3_fwd.cuh kWgWalk: with a mask, two or three warpgroups and blocks narrower than the tile, each warpgroup
    # multiplies only its own rows' run of the CTA's walk
    wg_walk = pr.ir.mask_expr is not None and bm // V3_WG_ROWS >= 2 and bn < bm
    rng = kv_range(pr.ir.mask_expr) if wg_walk else None
    out = torch.zeros(B, H, Nq, DV, dtype=torch.float64)
    lse = torch.full((B, H, Nq), -math.inf, dtype=torch.float64)
    kv_blocks = _blocks(pr.Nk, bn)
    if descending:
        kv_blocks = kv_blocks[::-1]
    for q0, q_hi in _blocks(Nq, bm):  # one CTA per Q tile
        wgs = [(lo, min(lo + V3_WG_ROWS, q_hi + 1) - 1) for lo in range(q0, q_hi + 1, V3_WG_ROWS)]
        acc = [torch.zeros(B, H, hi - lo + 1, DV, dtype=torch.float64) for lo, hi in wgs]
        m = [torch.full((B, H, hi - lo + 1), -math.inf, dtype=torch.float64) for lo, hi in wgs]
        l = [torch.zeros(B, H, hi - lo + 1, dtype=torch.float64) for lo, hi in wgs]
        # (b, h) whose walk has given the warpgroup a block (the CTA's walk, shared, unless wg_walk)
        started = [torch.zeros(B, H, dtype=torch.bool) for _ in wgs]
        runs = [_wg_blocks(rng, lo, hi, B, H, pr.Nq, pr.Nk, bn) for lo, hi in wgs] if wg_walk else []
        for kv_lo, kv_hi in kv_blocks:
            visit = pr.tiles.classes(q0, q_hi, kv_lo, kv_hi) != TILE_EMPTY  # the CTA's walk, per (b, h)
            if not bool(visit.any()):
                continue
            for w, (lo, hi) in enumerate(wgs):
                mine = visit
                if wg_walk:
                    j = kv_lo // bn
                    mine = visit & (runs[w][..., 0] <= j) & (j < runs[w][..., 1])
                    if not bool(mine.any()):
                        continue
                vis = mine.view(B, H, 1)
                s = pr.tile_scores(lo, hi, kv_lo, kv_hi)  # this warpgroup's classes; None: EMPTY for all (b, h)
                if s is None:
                    s = torch.full((B, H, hi - lo + 1, kv_hi - kv_lo + 1), -math.inf, dtype=torch.float64)
                x = s * _LOG2E
                m_tile = x.amax(dim=-1)
                if static is not None:
                    first = (~started[w]).view(B, H, 1)
                    m_ref = torch.where(first, m_tile.clamp(static[0], static[1]), m[w])
                    alpha = torch.ones_like(m_ref)
                    m_new = m_ref
                else:
                    m_new = torch.where(m_tile > m[w] + V3_RESCALE_SLACK, m_tile, m[w])
                    m_ref = torch.where(m_new == -math.inf, 0.0, m_new)
                    alpha = torch.where(m_new == m[w], 1.0, torch.exp2(m[w] - m_ref))
                p = torch.exp2(x - m_ref.unsqueeze(-1))
                l_new = l[w] * alpha + p.sum(dim=-1)  # before dropout
                p = pr.dropped(p, lo, hi, kv_lo, kv_hi)
                acc_new = acc[w] * alpha.unsqueeze(-1) + p @ pr.v[:, :, kv_lo:kv_hi + 1]
                acc[w] = torch.where(vis.unsqueeze(-1), acc_new, acc[w])
                l[w] = torch.where(vis, l_new, l[w])
                m[w] = torch.where(vis, m_new, m[w])
                started[w] |= mine
        for w, (lo, hi) in enumerate(wgs):  # each warpgroup's epilogue
            out[:, :, lo:hi + 1], lse[:, :, lo:hi + 1] = _finish(acc[w], m[w], l[w])
    return out, lse


def simulate(ir: AttentionIR, plan: _HasTiles, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
             buffers: Optional[Mapping[str, torch.Tensor]] = None, scale: Optional[float] = None,
             dropout_p: Optional[float] = None, seed: int = 0, offset: int = 0) -> SimResult:
    """Run ``plan``'s schedule tile by tile on the CPU in float64 (see the module docstring).

    ``plan``: a :class:`~attncompiler.plan.model.Plan` or :class:`TileSchedule` (``schedule`` "v1",
    "v2" or "v3", ``block_m`` query rows and ``block_n`` keys per tile; v3: ``block_m`` a multiple of
    64 and ``kv_descending``).  q (B, H, Nq, D), k (B, H_kv,
    Nk, D), v (B, H_kv, Nk, DV) on any device; other arguments as for
    :func:`~attncompiler.reference.reference_attention`.  Returns float64 CPU tensors.
    """
    sched = getattr(plan, "schedule", None)
    if sched not in SIM_SCHEDULES:
        raise SimulateError(f"plan.schedule: expected one of {', '.join(SIM_SCHEDULES)}, got {sched!r}")
    bm = _positive("plan.block_m", getattr(plan, "block_m", None))
    bn = _positive("plan.block_n", getattr(plan, "block_n", None))
    if sched == "v3" and bm % V3_WG_ROWS:
        raise SimulateError(f"plan.block_m: expected a multiple of {V3_WG_ROWS} for v3 (64 rows per consumer "
                            f"warpgroup), got {bm}")
    pr = _Problem(ir, q, k, v, buffers=buffers, scale=scale, dropout_p=dropout_p, seed=seed, offset=offset)
    if pr.Nq == 0 or pr.Nk == 0 or pr.B * pr.H == 0:
        out = torch.zeros(pr.B, pr.H, pr.Nq, pr.DV, dtype=torch.float64)
        return SimResult(out, torch.full((pr.B, pr.H, pr.Nq), -math.inf, dtype=torch.float64), pr.stats())
    if sched == "v3":
        out, lse = _run_v3(pr, bm, bn, bool(getattr(plan, "kv_descending", False)))
    else:
        out, lse = (_run_v1 if sched == "v1" else _run_v2)(pr, bm, bn)
    return SimResult(out, lse, pr.stats())


def tile_classes(ir: AttentionIR, plan: _HasTiles, Nq: int, Nk: int, *, B: int = 1, H: int = 1,
                 buffers: Optional[Mapping[str, Any]] = None) -> torch.Tensor:
    """TILE_* of every tile of ``plan``'s grid: int64 (B, H, ceil(Nq / block_m), ceil(Nk / block_n)).

    Computes nothing but the classification (cheap at any size): e.g. the share of tiles a sliding
    window leaves non-empty at N = 16k.  ``buffers``: values of the int buffers the mask reads
    (e.g. document ids), without which their reads are unknown (PARTIAL)."""
    bm = _positive("plan.block_m", getattr(plan, "block_m", None))
    bn = _positive("plan.block_n", getattr(plan, "block_n", None))
    tiles = _Tiles(ir, _positive("B", B), _positive("H", H), _positive("Nq", Nq), _positive("Nk", Nk), buffers)
    qb, kb = _blocks(Nq, bm), _blocks(Nk, bn)
    out = torch.empty(B, H, len(qb), len(kb), dtype=torch.int64)
    for i, (q_lo, q_hi) in enumerate(qb):
        for j, (kv_lo, kv_hi) in enumerate(kb):
            out[:, :, i, j] = tiles.classes(q_lo, q_hi, kv_lo, kv_hi)
    return out
