"""Philox4x32-10 counter-based RNG in torch, bit-identical to ``philox.cuh``.

The generator (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC 2011)
maps a 128-bit counter and a 64-bit key to four 32-bit words.  Here every word is held in a torch
``int64`` tensor (values in ``[0, 2**32)``) so the arithmetic is exact on any device: the 32x32->64
bit products are formed from 16-bit halves of one factor so no intermediate leaves ``[0, 2**63)``.

Dropout uses the counter mapping of ``docs/architecture.md`` ("Dropout RNG"):

    c0 = q & ~8    c1 = k >> 1    c2 = b * H + h    c3 = offset & 0xffffffff
    key = (seed & 0xffffffff, seed >> 32)
    word = philox(c, key)[((q >> 3) & 1) * 2 + (k & 1)]
    keep = word < dropout_threshold(p)

so one Philox call serves the four elements (q, k), (q, k^1), (q^8, k), (q^8, k^1).
"""
from __future__ import annotations

from typing import Union

import torch

__all__ = [
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_W0",
    "PHILOX_W1",
    "philox4x32_10",
    "dropout_threshold",
    "dropout_keep_mask",
]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85

_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF
_ROUNDS = 10
# Keep bits produced per internal block.  On the CPU the int64 temporaries (a quarter as many
# counters) should stay small enough to be reused by the allocator instead of page-faulted anew.
_CHUNK_ELEMS_CPU = 1 << 18
_CHUNK_ELEMS_CUDA = 1 << 24

Word = Union[torch.Tensor, int]


def _check_word(name: str, x: Word) -> Word:
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.int64:
            raise TypeError(f"expected {name} as an int64 tensor, got dtype {x.dtype}")
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected {name} as an int or int64 tensor, got {type(x).__name__}")
    if not 0 <= x <= _MASK32:
        raise ValueError(f"expected {name} in [0, 2**32), got {x}")
    return x


def _mulhilo(m: int, x: Word) -> tuple[Word, Word]:
    """(hi, lo) 32-bit halves of the 64-bit product m * x of a uint32 constant and uint32 values.

    m is split into 16-bit halves: m_lo * x and m_hi * x are below 2**48 and the recombination
    stays below 2**49, so nothing overflows signed 64-bit arithmetic.  The temporaries are fresh,
    so they are updated in place (large CPU tensors are mostly allocation cost)."""
    p_lo = (m & _MASK16) * x             # < 2**48
    p_hi = (m >> 16) * x                 # < 2**48; contributes p_hi * 2**16
    if not isinstance(p_hi, torch.Tensor):
        t = p_lo + ((p_hi & _MASK16) << 16)
        return (p_hi >> 16) + (t >> 32), t & _MASK32
    t = (p_hi & _MASK16).bitwise_left_shift_(16).add_(p_lo)    # < 2**49
    hi = p_hi.bitwise_right_shift_(16).add_(t >> 32)           # < 2**32 because m * x < 2**64
    return hi, t.bitwise_and_(_MASK32)


def _xor3(fresh: Word, a: Word, key: Word) -> Word:
    """fresh ^ a ^ key, updating ``fresh`` (a temporary of this module) in place where shapes allow."""
    if not isinstance(fresh, torch.Tensor):
        return fresh ^ a ^ key
    for other in (a, key):
        if isinstance(other, torch.Tensor) and other.shape != fresh.shape:
            fresh = fresh ^ other  # broadcasting grows the shape: a new tensor
        else:
            fresh.bitwise_xor_(other)
    return fresh


def philox4x32_10(c0: Word, c1: Word, c2: Word, c3: Word, k0: Word, k1: Word) -> tuple[Word, Word, Word, Word]:
    """Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1).

    Each argument is an ``int`` or an ``int64`` tensor holding uint32 values; tensors broadcast
    against each other.  Returns the four output words in the same representation (``int64``
    tensors of the broadcast shape, or plain ints when every input is an int).
    """
    c0, c1, c2, c3 = (_check_word(n, v) for n, v in (("c0", c0), ("c1", c1), ("c2", c2), ("c3", c3)))
    k0, k1 = _check_word("k0", k0), _check_word("k1", k1)
    for r in range(_ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W0) & _MASK32
            k1 = (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = _xor3(hi1, c1, k0), lo1, _xor3(hi0, c3, k1), lo0
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """Keep threshold for drop probability ``p``: a Philox word ``w`` is kept iff ``w < threshold``.

    ``min(2**32 - 1, round((1 - p) * 2**32))`` (mirrored into ``AttnParams.dropout_threshold``)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"expected dropout probability in [0, 1], got {p}")
    return min(_MASK32, round((1.0 - p) * 2.0**32))


def _check_index(name: str, v: int, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected {name} as an int, got {type(v).__name__}")
    if v < lo:
        raise ValueError(f"expected {name} >= {lo}, got {v}")
    return v


def _keep_block(bh0: int, bh1: int, q0: int, q1: int, Nk: int, key: tuple[int, int], c3: int, threshold: int,
                device: torch.device) -> torch.Tensor:
    """Keep bits (bh1 - bh0, q1 - q0, Nk) of heads b*H+h in [bh0, bh1) and rows [q0, q1).

    One Philox call per distinct counter: rows q and q^8 share c0, keys k and k^1 share c1."""
    rows = torch.arange(q0, q1, dtype=torch.int64, device=device)
    c0_unique, row_pos = torch.unique(rows & ~8, sorted=True, return_inverse=True)
    nk2 = (Nk + 1) // 2
    c0 = c0_unique.view(1, -1, 1)
    c1 = torch.arange(nk2, dtype=torch.int64, device=device).view(1, 1, -1)
    c2 = torch.arange(bh0, bh1, dtype=torch.int64, device=device).view(-1, 1, 1)
    words = torch.broadcast_tensors(*philox4x32_10(c0, c1, c2, c3, key[0], key[1]))
    keep = torch.stack([w < threshold for w in words], dim=-1)  # (nbh, nc0, nk2, 4): half*2 + (k&1)
    nbh, nc0 = keep.shape[:2]
    keep = keep.view(nbh, nc0, nk2, 2, 2).permute(0, 1, 3, 2, 4).reshape(nbh, nc0 * 2, nk2 * 2)
    half = (rows >> 3) & 1
    return keep[:, row_pos * 2 + half, :Nk]


def dropout_keep_mask(
    B: int,
    H: int,
    Nq: int,
    Nk: int,
    *,
    seed: int,
    offset: int,
    p: float,
    device: torch.device | str | None = None,
    q_start: int = 0,
    q_end: int | None = None,
    b_start: int = 0,
) -> torch.Tensor:
    """Dropout keep bits, ``torch.bool`` of shape (B, H, q_end - q_start, Nk) (by default (B, H, Nq, Nk)).

    Element [b, h, i, k] is the keep bit of query row ``q_start + i`` and key ``k`` exactly as the
    CUDA kernels compute it (``ac_dropout_keep``).  ``seed`` is a 64-bit Philox key; only the low
    32 bits of ``offset`` are used.  ``q_start``/``q_end`` select a block of query rows, so callers
    that work in row chunks get the same bits as a full call; ``b_start`` likewise makes batch entry
    ``b`` of the result batch ``b_start + b`` (one sequence of a packed batch).  Generated internally in
    row chunks so that the int64 temporaries stay small whatever the size of the result.
    """
    B, H, Nq, Nk = (_check_index(n, v) for n, v in (("B", B), ("H", H), ("Nq", Nq), ("Nk", Nk)))
    seed = _check_index("seed", seed)
    if seed >= 1 << 64:
        raise ValueError(f"expected seed < 2**64, got {seed}")
    offset = _check_index("offset", offset)
    q_start = _check_index("q_start", q_start)
    q_end = Nq if q_end is None else _check_index("q_end", q_end)
    b_start = _check_index("b_start", b_start)
    if not q_start <= q_end <= Nq:
        raise ValueError(f"expected 0 <= q_start <= q_end <= Nq={Nq}, got q_start={q_start}, q_end={q_end}")
    if (b_start + B) * H > 1 << 32:
        raise ValueError(f"expected (b_start + B) * H <= 2**32 (counter word c2), got {(b_start + B) * H}")
    threshold = dropout_threshold(p)
    device = torch.device(device) if device is not None else torch.device("cpu")
    out = torch.empty((B * H, q_end - q_start, Nk), dtype=torch.bool, device=device)
    if out.numel() == 0:
        return out.view(B, H, q_end - q_start, Nk)
    key = (seed & _MASK32, seed >> 32)
    c3 = offset & _MASK32
    # Blocks of whole 16-row groups (q and q^8 share a counter), split over heads if still too big.
    budget = _CHUNK_ELEMS_CUDA if device.type == "cuda" else _CHUNK_ELEMS_CPU
    BH = B * H
    if 16 * BH * Nk <= budget:
        bh_step, rows = BH, budget // (BH * Nk) // 16 * 16
    else:
        bh_step, rows = max(1, budget // (16 * max(1, Nk))), 16
    r0 = q_start
    while r0 < q_end:
        r1 = min(q_end, (r0 // 16) * 16 + rows)
        for bh0 in range(0, BH, bh_step):
            bh1 = min(BH, bh0 + bh_step)
            out[bh0:bh1, r0 - q_start:r1 - q_start] = _keep_block(b_start * H + bh0, b_start * H + bh1, r0, r1, Nk,
                                                                  key, c3, threshold, device)
        r0 = r1
    return out.view(B, H, q_end - q_start, Nk)
