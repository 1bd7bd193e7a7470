"""The kernel parameter block, defined once and mirrored in C and ctypes.

Every generated kernel takes ``(const AttnParams p, const AttnBuffers buf)`` by value.  The C
struct text (emitted into the generated source) and the ctypes ``Structure`` used to launch are
both produced from :data:`PARAM_FIELDS`, so they cannot drift apart.

Strides are in elements.  Tensors are addressed as ``base + b*s_b + h*s_h + n*s_n + d`` (the head
dimension is contiguous).  ``lse`` is float32 of shape (B, H, Nq), contiguous; it may be null.
``workspace`` is float32 scratch owned by the launcher (v1 keeps O, l and m there).
``cu_seqlens_q`` / ``cu_seqlens_k`` are null except in the varlen kernels (rendered with
``varlen=True``, templates/include/attncompiler/varlen.cuh), which read them at entry, with ``total_q`` /
``total_k`` (the packed rows) and ``varlen_errors``.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

__all__ = ["PARAM_FIELDS", "BWD_PARAM_FIELDS", "CField", "c_struct", "ctypes_struct", "buffer_fields", "set_strides"]


@dataclass(frozen=True)
class CField:
    name: str
    ctype: str  # C spelling
    comment: str = ""


_CTYPES = {
    "const void*": ctypes.c_void_p,
    "void*": ctypes.c_void_p,
    "float*": ctypes.c_void_p,
    "const float*": ctypes.c_void_p,
    "const int*": ctypes.c_void_p,
    "const unsigned long long*": ctypes.c_void_p,
    "int*": ctypes.c_void_p,
    "long long": ctypes.c_longlong,
    "int": ctypes.c_int,
    "unsigned int": ctypes.c_uint,
    "unsigned long long": ctypes.c_ulonglong,
    "float": ctypes.c_float,
}

PARAM_FIELDS: tuple[CField, ...] = (
    CField("q", "const void*", "query  (B, H, Nq, D) by strides"),
    CField("k", "const void*", "key    (B, H_kv, Nk, D)"),
    CField("v", "const void*", "value  (B, H_kv, Nk, DV)"),
    CField("o", "void*", "output (B, H, Nq, DV)"),
    CField("lse", "float*", "log-sum-exp (B, H, Nq) float32 contiguous, natural log; may be null"),
    CField("workspace", "float*", "float32 scratch owned by the launcher; may be null"),
    CField("q_sb", "long long"), CField("q_sh", "long long"), CField("q_sn", "long long"),
    CField("k_sb", "long long"), CField("k_sh", "long long"), CField("k_sn", "long long"),
    CField("v_sb", "long long"), CField("v_sh", "long long"), CField("v_sn", "long long"),
    CField("o_sb", "long long"), CField("o_sh", "long long"), CField("o_sn", "long long"),
    CField("B", "int", "batch"),
    CField("H", "int", "query heads"),
    CField("H_kv", "int", "key/value heads (H % H_kv == 0)"),
    CField("Nq", "int", "query length"),
    CField("Nk", "int", "key/value length"),
    CField("scale", "float", "softmax scale applied to q.k before score_mod"),
    CField("dropout_p", "float", "drop probability"),
    CField("dropout_threshold", "unsigned int", "keep iff philox word < threshold"),
    CField("dropout_rescale", "float", "1 / (1 - dropout_p)"),
    CField("seed", "unsigned long long", "Philox key"),
    CField("offset", "unsigned long long", "Philox counter offset (low 32 bits used)"),
    CField("cu_seqlens_q", "const int*", "varlen: (B+1) query row offsets, int32; null otherwise (runtime/varlen.py)"),
    CField("cu_seqlens_k", "const int*", "varlen: (B+1) key row offsets, int32; null otherwise"),
    CField("row_norms_sq", "const float*", "score skip: the largest squared row norms of q per (b, h), then of k per "
           "(b, h_kv), float32 (runtime/scoreskip.py); null: nothing is skipped"),
    CField("rng_state", "const unsigned long long*", "dropout: device int64 [seed, offset] read in place of seed and "
           "offset (a call captured in a CUDA graph: the graph refills it per replay); null: seed, offset above"),
    CField("total_q", "int", "varlen: packed query rows (q.shape[0]); each sequence's view is clamped into them"),
    CField("total_k", "int", "varlen: packed key rows (k.shape[0])"),
    CField("varlen_errors", "int*", "varlen: error bits a view ORs in when cu_seqlens disagree with the launch (a call "
           "a CUDA graph replays; runtime/varlen.py reads them); null: the host checked cu_seqlens"),
)

#: The backward kernels' extra parameters (``struct AttnBwdParams``), passed after AttnParams.
#: ``lse2`` and ``dsum`` are written by the preprocess kernel: float32 (B*H, Nq_pad) rows, Nq_pad a
#: multiple of the backward's query tile; padded rows hold lse2 = +inf, dsum = 0.
BWD_PARAM_FIELDS: tuple[CField, ...] = (
    CField("dout", "const void*", "dO (B, H, Nq, DV) by strides"),
    CField("dq", "void*", "dQ (B, H, Nq, D) in the element type (separate dQ pass); may be null"),
    CField("dk", "void*", "dK (B, H_kv, Nk, D)"),
    CField("dv", "void*", "dV (B, H_kv, Nk, DV)"),
    CField("dq_accum", "float*", "fp32 dQ accumulator (atomic dQ), zeroed by the preprocess; may be null"),
    CField("dlse", "const float*", "dL/dlse (B, H, Nq) float32 contiguous; may be null"),
    CField("lse2", "float*", "lse * log2(e) per row, +inf for empty and padded rows"),
    CField("dsum", "float*", "D = rowsum(dO * O) - dlse per row, 0 for padded rows"),
    CField("do_sb", "long long"), CField("do_sh", "long long"), CField("do_sn", "long long"),
    CField("dq_sb", "long long"), CField("dq_sh", "long long"), CField("dq_sn", "long long"),
    CField("dk_sb", "long long"), CField("dk_sh", "long long"), CField("dk_sn", "long long"),
    CField("dv_sb", "long long"), CField("dv_sh", "long long"), CField("dv_sn", "long long"),
    CField("Nq_pad", "int", "rows of lse2 / dsum per (b, h)"),
    CField("dq_sem", "int*", "deterministic v3 dQ: a turn counter per (b, h, 64-row query block of Nq_pad), zero at "
           "launch and left zero; may be null"),
    CField("dq_accum_floats", "long long", "floats of dq_accum (16-byte aligned) that the preprocess zeroes before the "
           "main kernel adds into them; 0: none"),
)


def c_struct(name: str, fields: tuple[CField, ...]) -> str:
    """C definition of a struct with these fields (one per line, commented)."""
    lines = [f"struct {name} {{"]
    if not fields:
        lines.append("  int _unused;")
    for f in fields:
        c = f"  // {f.comment}" if f.comment else ""
        lines.append(f"  {f.ctype} {f.name};{c}")
    lines.append("};")
    return "\n".join(lines)


def ctypes_struct(name: str, fields: tuple[CField, ...]) -> type[ctypes.Structure]:
    """A ctypes Structure laid out exactly like :func:`c_struct` (host ABI = CUDA ABI)."""
    cf = [(f.name, _CTYPES[f.ctype]) for f in fields] or [("_unused", ctypes.c_int)]
    return type(name, (ctypes.Structure,), {"_fields_": cf})


_STRIDE_NAMES: dict[str, tuple[str, str, str]] = {}


def set_strides(struct: ctypes.Structure, prefix: str, strides: tuple[int, ...]) -> None:
    """``struct.<prefix>_sb``, ``_sh``, ``_sn`` <- the first three of a (B, H, N, d) tensor's ``strides``
    (the field names are built once per prefix: this runs several times per launch)."""
    names = _STRIDE_NAMES.get(prefix)
    if names is None:
        names = _STRIDE_NAMES.setdefault(prefix, (f"{prefix}_sb", f"{prefix}_sh", f"{prefix}_sn"))
    setattr(struct, names[0], strides[0])
    setattr(struct, names[1], strides[1])
    setattr(struct, names[2], strides[2])


def buffer_fields(buffers) -> tuple[CField, ...]:
    """Fields of ``AttnBuffers`` for the IR's captured buffers: a pointer and each dimension, and
    for int buffers ``<name>_gminmax``, the (min, max) range table the tile classifier reads
    (attncompiler/ir/bufreads.py, filled by runtime/blockstats.py; null when the mask needs none)."""
    out: list[CField] = []
    for b in buffers:
        ptr = "const float*" if b.kind == "float" else "const int*"
        out.append(CField(b.name, ptr, f"captured buffer, {b.ndim}-d, {b.kind}, contiguous"))
        for i in range(b.ndim):
            out.append(CField(f"{b.name}_d{i}", "int", f"size of dim {i}"))
        if b.kind == "int":
            out.append(CField(f"{b.name}_gminmax", "const int*", "range table of (min, max) over granules along "
                              "the tile classifier's range axis, int32; may be null"))
    return tuple(out)
