"""CPU: the Hopper (v3) backward without a GPU -- its plan (feasibility and reasons), which backward the
runtime picks, rendering of every preset and example, and nvcc compilation for sm_90a."""
from __future__ import annotations

import dataclasses
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import attncompiler as ac
from _specs import all_specs  # shared with the other render / nvcc tests
from attncompiler.codegen.v2_bwd import BwdKernelSource
from attncompiler.codegen.v3_bwd import DqTiles, V3BwdKernelSource, render_v3_bwd
from attncompiler.ir.build import build_ir
from attncompiler.plan.model import PlanError, ProblemDims
from attncompiler.plan.targets import get_target
from attncompiler.plan.v3_bwd import (CONSUMER_REGS, dq_chunk, plan_v3_bwd, split_width, v3_bwd_auto_refusal,
                                     v3_bwd_refusal, v3_bwd_register_estimate, v3_bwd_smem_bytes)
from attncompiler.runtime.backward import bwd_source
from attncompiler.runtime.compiler import compile_with_nvcc
from attncompiler.spec import presets

SM90 = get_target("sm_90")


def test_plan_d128_splits_dq_by_columns():
    p = plan_v3_bwd(ProblemDims(128), SM90)
    assert (p.block_m, p.block_n, p.consumers, p.stages, p.dq_split_n) == (64, 128, 2, 2, True)
    assert (p.dq_red, p.dq_defer) == (2, True)  # one bulk reduction per warp into the tiled accumulator
    assert p.num_threads == 384 and p.consumer_regs == 240 and p.producer_regs == 24
    # 1024 slack + K, V 2 x 128 x 256 B + 2 stages x 2 x 64 x 256 B + 2 dS^T x 128 x 128 B + rows
    # + staged dQ 8 warps x 16 rows x (64 + 4) fp32 + 5 barriers
    assert p.smem_bytes == 1024 + 65536 + 65536 + 32768 + 2 * 512 + 34816 + 40 == v3_bwd_smem_bytes(128, 128, 2, 2)
    assert p.est_registers_per_thread == v3_bwd_register_estimate(128, 128, 2, True)["total"] <= 240
    text = p.describe()
    assert "BLOCK_N=128" in text and "columns split" in text and "200744" in text and "16-row fp32 tiles" in text
    assert "rejected consumers=2, dq_chunk=64, dq_pad=4, stages=4: smem 267336 B > 232448 B limit" in text
    assert (p.dkv_split, p.dq_chunk, p.dq_pad) == (False, 64, 4)  # widest chunk, padded rows, then the most stages


def test_plan_d64_splits_dq_by_columns_inside_one_box():
    p = plan_v3_bwd(ProblemDims(64), SM90)
    assert p.dq_split_n is True and p.block_n == 128  # 32 columns per warpgroup: B starts inside the swizzled row
    assert "columns split over the warpgroups (32 each)" in p.describe()
    keys = plan_v3_bwd(ProblemDims(64), SM90, dq_split_n=False)
    assert keys.dq_split_n is False and "keys split" in keys.describe()
    assert p.stages == 4 and v3_bwd_smem_bytes(64, 64, 2, 4) == p.smem_bytes  # staged dQ rows of 32 + 4 fp32


def test_plan_rejections_carry_numbers():
    k_split = plan_v3_bwd(ProblemDims(128), SM90, dq_split_n=False)  # dQ in two 64-column chunks: 232 registers
    assert (k_split.dq_split_n, k_split.est_registers_per_thread) == (False, 232)
    assert plan_v3_bwd(ProblemDims(128), SM90, consumers=1).block_n == 64
    with pytest.raises(PlanError, match="multiple of 16 and <= 128.*got 88"):
        plan_v3_bwd(ProblemDims(88), SM90)
    odd = plan_v3_bwd(ProblemDims(96), SM90)  # 48 columns per warpgroup would straddle a box: dQ split by keys
    assert (odd.dq_split_n, dq_chunk(96, 2, False), odd.stages) == (False, 32, 3)
    assert odd.smem_bytes == v3_bwd_smem_bytes(96, 96, 2, 3, 2, False) <= 232448 < v3_bwd_smem_bytes(96, 96, 2, 4, 2, False)
    assert "rejected consumers=2, dq_split_n: D=96 does not split" in odd.describe()
    assert plan_v3_bwd(ProblemDims(32), SM90).dq_split_n and dq_chunk(32, 2, True) == 16
    assert dq_chunk(80, 2, False) == 16 and dq_chunk(128, 2, True) == 64
    with pytest.raises(PlanError, match="got D=160, DV=160"):
        plan_v3_bwd(ProblemDims(160), SM90)
    with pytest.raises(PlanError, match=r"multiple of 64 in \[128, 256\], got D=64, DV=256"):
        plan_v3_bwd(ProblemDims(64, 256), SM90)
    with pytest.raises(PlanError, match="needs sm_90a, got sm_80"):
        plan_v3_bwd(ProblemDims(128), "sm_80")
    with pytest.raises(PlanError, match=r"expected consumers in \(2, 1\), got 3"):
        plan_v3_bwd(ProblemDims(128), SM90, consumers=3)
    with pytest.raises(PlanError, match="expected stages"):
        plan_v3_bwd(ProblemDims(128), SM90, stages=5)
    with pytest.raises(PlanError, match=r"stages=3: smem 234040 B > 232448 B limit"):
        plan_v3_bwd(ProblemDims(128), SM90, consumers=2, stages=3, dq_pad=4, dq_chunk=64)
    swz = plan_v3_bwd(ProblemDims(128), SM90, consumers=2, stages=3)  # fits with swizzled, unpadded dQ rows
    assert (swz.dq_chunk, swz.dq_pad, swz.smem_bytes) == (64, 0, 234040 - 8 * 16 * 4 * 4)
    assert "rows swizzled" in swz.describe()
    assert plan_v3_bwd(ProblemDims(128), SM90, stages=3, dq_pad=4).dq_chunk == 32  # or narrower padded chunks
    with pytest.raises(PlanError, match=r"expected dq_pad in \(4, 0\) \(0 only with dq_red=2\), got 0 with dq_red=1"):
        plan_v3_bwd(ProblemDims(128), SM90, dq_red=1, dq_pad=0)
    with pytest.raises(PlanError, match="dq_chunk=64 does not divide"):
        plan_v3_bwd(ProblemDims(64), SM90, dq_chunk=64, dq_split_n=True, consumers=2)
    assert plan_v3_bwd(ProblemDims(128), SM90, dq_chunk=32).dq_chunk == 32
    three = plan_v3_bwd(ProblemDims(128), SM90, consumers=2, stages=3, dq_red=0)  # no dQ staging area
    assert three.smem_bytes == v3_bwd_smem_bytes(128, 128, 2, 3, dq_red=0) == 199224
    with pytest.raises(PlanError, match=r"expected dq_red in \(0, 1, 2\), got 3"):
        plan_v3_bwd(ProblemDims(128), SM90, dq_red=3)
    assert plan_v3_bwd(ProblemDims(64), SM90, stages=4).stages == 4
    assert CONSUMER_REGS[2] * 256 + 24 * 128 <= 65536 and CONSUMER_REGS[1] * 128 + 24 * 128 <= 65536


def test_plan_d256_splits_dk_dv_by_columns():
    p = plan_v3_bwd(ProblemDims(256), SM90)
    assert (p.dkv_split, p.block_n, p.consumers, p.dq_split_n, p.dq_defer, p.stages) == (True, 64, 2, True, False, 2)
    # K, V 64 x 512 B; 2 stages x 2 x 64 x 512 B; two dS^T tiles of 64 x 128 B; rows; staged dQ 8 warps x 16 x 32 fp32
    # (64-column chunks, or padded rows, do not fit: 231464 is 984 B under the limit)
    assert p.smem_bytes == 1024 + 65536 + 131072 + 16384 + 1024 + 16384 + 40 == 231464
    assert (p.dq_chunk, p.dq_pad) == (32, 0)
    assert p.est_registers_per_thread == 64 + 64 + 64 + 40  # dK + dV halves, S^T + dP^T, overhead
    text = p.describe()
    assert "dK/dV split by columns (128 + 128 each" in text and "7 GEMM units a step for 5" in text
    assert "rejected consumers=2, dq_chunk=64, dq_pad=0, stages=2: smem 247848 B" in text
    with pytest.raises(PlanError, match="consumers=1: dkv_split splits dK/dV over 2 consumer warpgroups"):
        plan_v3_bwd(ProblemDims(256), SM90, consumers=1)
    mixed = plan_v3_bwd(ProblemDims(256, 128), SM90, dkv_split=True)  # D = 256, DV = 128: both halves whole boxes
    assert mixed.dkv_split and mixed.est_registers_per_thread == 64 + 32 + 64 + 40
    forced = plan_v3_bwd(ProblemDims(128), SM90, dkv_split=True)  # the same kernel at d128 (tests compare)
    assert (forced.block_n, forced.dkv_split, forced.dq_defer) == (64, True, False)
    with pytest.raises(PlanError, match="needs dkv_split"):
        plan_v3_bwd(ProblemDims(256), SM90, dkv_split=False)
    with pytest.raises(PlanError, match=r"dkv_split expected D and DV multiples of 64 .*at least 128, got D=64"):
        plan_v3_bwd(ProblemDims(64), SM90, dkv_split=True)
    with pytest.raises(PlanError, match="dkv_split expected dq_defer=False"):
        plan_v3_bwd(ProblemDims(256), SM90, dq_defer=True)
    assert plan_v3_bwd(ProblemDims(256), SM90, deterministic=True).dkv_split  # the warpgroups add disjoint columns
    assert v3_bwd_refusal(ProblemDims(256), SM90) is None
    assert "got D=256, DV=96" in v3_bwd_refusal(ProblemDims(256, 96), SM90)


def test_plan_split_rounds_head_dims_up_to_whole_halves():
    """MLA's D = 192, DV = 128: dK / dV split by columns over D rounded up to 256, so each warpgroup's half is whole
    boxes; the kernel is D = 256's in shared memory and registers, and computes (never stores) columns 192..255."""
    mla = plan_v3_bwd(ProblemDims(192, 128), SM90, dkv_split=True)  # (by default: the roles kernel)
    wide = plan_v3_bwd(ProblemDims(256, 128), SM90, dkv_split=True)
    assert (mla.dkv_split, mla.consumers, mla.dq_split_n, mla.stages, mla.dq_chunk) == (True, 2, True, 2, 64)
    assert not mla.dq_wide and wide.dq_wide  # chunk by chunk skips the zero columns' chunk
    assert plan_v3_bwd(ProblemDims(192, 128), SM90, dkv_split=True, dq_wide=True).dq_wide
    assert (mla.smem_bytes, mla.est_registers_per_thread) == (wide.smem_bytes, wide.est_registers_per_thread)
    assert (split_width(192, True), split_width(128, True), split_width(192, False)) == (256, 128, 192)
    assert "128 + 64 each of D, DV rounded up to 256, 128 (zero columns past D / DV" in mla.describe()
    assert "columns split over the warpgroups (128 each)" in mla.describe()
    assert plan_v3_bwd(ProblemDims(192), SM90, dkv_split=True).smem_bytes == plan_v3_bwd(ProblemDims(256), SM90).smem_bytes
    assert v3_bwd_refusal(ProblemDims(192, 128), SM90) is None and v3_bwd_auto_refusal(ProblemDims(192, 128), SM90) is None
    assert "in [128, 256], got D=160" in v3_bwd_refusal(ProblemDims(160, 128), SM90)
    src = _render(dataclasses.replace(presets.causal(192), head_dim_v=128), dkv_split=True).source
    assert "static constexpr int D = 192;" in src and "DKV_SPLIT = true" in src
    assert "DK_N == 128 && ac::V3BwdLayout<V3BwdConfig>::DV_N == 64" in src and "DQ_N == 128" in src
    assert "m64n128k16" in src and "m64n64k16" in src  # dK (128 columns a warpgroup), dV and the dQ chunks (64)
    assert src.count("void wgmma_bwd_dq(") == 1  # chunk by chunk: no wide overload


def test_plan_dq_wide_where_the_columns_span_several_chunks():
    # one wgmma over the warpgroup's dQ columns, then added chunk by chunk: by default where they span several chunks
    # (d256: 128 columns in 32-column tiles; d = 48 / 80 / 96 / 112 split by keys), never with dropout or a forced chunk
    wide = {d: plan_v3_bwd(ProblemDims(d), SM90).dq_wide for d in (48, 64, 80, 96, 112, 128, 256)}
    assert wide == {48: True, 64: False, 80: True, 96: True, 112: True, 128: False, 256: True}
    assert not plan_v3_bwd(build_ir(ac.AttentionSpec(head_dim=256, dropout_p=0.1)), SM90).dq_wide
    assert not plan_v3_bwd(ProblemDims(128), SM90, dq_chunk=16).dq_wide
    forced = plan_v3_bwd(ProblemDims(64), SM90, dq_chunk=16, dq_wide=True)
    assert forced.dq_wide and "one wgmma of 32 columns added in chunks of 16" in forced.describe()
    # the accumulator of the wide product replaces the chunk's, once the dV / dK fragments have retired
    assert plan_v3_bwd(ProblemDims(112), SM90).est_registers_per_thread == 112 + 64 + 40
    src = bwd_source(build_ir(presets.causal(256)), SM90, options={"schedule": "v3"}).source
    assert "DQ_WIDE = true" in src and src.count("void wgmma_bwd_dq(") == 2 and "m64n128k16" in src  # n32 and n128
    assert bwd_source(build_ir(presets.causal(128)), SM90).source.count("void wgmma_bwd_dq(") == 1


def test_dq_tile_offsets_swizzle_within_rows():
    # the kernel's V3BwdLayout::dq_tile_offset, replayed: rows padded by 4 fp32, or unpadded with the 16-byte groups
    # of row r XORed by r's low bits; either way a bijection of each row's chunk columns onto its own floats
    def offset(row: int, col: int, chunk: int, pad: int) -> int:
        swz = (min(chunk // 4, 8) - 1) if pad == 0 else 0
        return row * (chunk + pad) + ((((col >> 2) ^ (row & swz)) << 2) | (col & 3))

    for chunk in (16, 32, 64):
        for pad in (4, 0):
            for row in range(16):
                got = sorted(offset(row, c, chunk, pad) for c in range(chunk))
                assert got == list(range(row * (chunk + pad), row * (chunk + pad) + chunk))
    # unpadded 32-column rows: a warp's 8-byte stores (lanes g, t at row g, columns 8 nt + 2t) cover all 32 banks
    banks = {(offset(g, 2 * t, 32, 0) % 32) // 2 for g in range(8) for t in range(4)}
    assert len(banks) == 16


def test_deterministic_plan():
    p = plan_v3_bwd(ProblemDims(128), SM90, deterministic=True)
    assert p.deterministic and p.dq_split_n and p.consumers == 2
    assert plan_v3_bwd(ProblemDims(128), SM90, deterministic=True, dq_red=1).dq_red == 1
    with pytest.raises(PlanError, match="deterministic dQ needs the warpgroups to add disjoint columns"):
        plan_v3_bwd(ProblemDims(128), SM90, deterministic=True, dq_split_n=False, consumers=2)
    assert plan_v3_bwd(ProblemDims(96), SM90, deterministic=True).consumers == 1
    assert p.dq_red == 2  # bulk reductions, waited for (complete, not only read) before the turn passes


def test_dq_tiles_of_the_sources():
    assert plan_v3_bwd(ProblemDims(128), SM90, varlen=True).dq_red == 2  # packed sequences too
    assert plan_v3_bwd(ProblemDims(128), SM90, varlen=True, dq_red=0).dq_red == 0
    ir = build_ir(presets.causal(128))
    assert bwd_source(ir, SM90, varlen=True, options={"dq_red": 1}).dq_tiles is None
    assert bwd_source(ir, SM90, varlen=True).dq_tiles == DqTiles(16, 64, 68)
    src = bwd_source(ir, SM90, varlen=True, options={"dq_red": 2}).source
    assert "varlen_bwd_kv_enter<V3BwdConfig::D, ac::V3BwdLayout<V3BwdConfig>::kDqTiledRowFloats>" in src
    assert bwd_source(ir, SM90).dq_tiles == DqTiles(16, 64, 68)
    assert bwd_source(build_ir(presets.plain(64)), SM90).dq_tiles == DqTiles(16, 32, 36)  # dQ split: 32 columns each
    assert bwd_source(ir, SM90, options={"dq_red": 1}).dq_tiles is None
    assert bwd_source(ir, get_target("sm_80")).dq_tiles is None  # the v2 backward: rows
    assert bwd_source(build_ir(presets.causal(256)), SM90, options={"schedule": "v3"}).dq_tiles == DqTiles(16, 32, 32, True)


def test_dq_out_kernel():
    # dq_red 2: a third kernel converts the tiled accumulator into dq; the launcher's geometry matches the header
    import re

    from attncompiler.codegen.v3_bwd import DQ_OUT_ROWS, DQ_OUT_THREADS
    from attncompiler.runtime.launch import AttnInputs

    ir = build_ir(presets.causal(128))
    tiled, rows = bwd_source(ir, SM90), bwd_source(ir, SM90, options={"dq_red": 1})
    entry = "attn_bwd_dq_out(const AttnParams p"
    assert tiled.entries == ("attn_bwd_pre", "attn_bwd_kv", "attn_bwd_dq_out") and entry in tiled.source
    assert rows.entries == ("attn_bwd_pre", "attn_bwd_kv") and entry not in rows.source
    assert [tiled.takes_buffers(e) for e in tiled.entries] == [False, True, False]
    assert tiled.threads("attn_bwd_dq_out") == DQ_OUT_THREADS and tiled.smem("attn_bwd_dq_out") == 0
    dims = AttnInputs(B=3, H=5, H_kv=5, Nq=1023, Nk=77, D=128, DV=128)
    assert tiled.grids(dims)["attn_bwd_dq_out"] == (-(-1023 // DQ_OUT_ROWS), 5, 3)  # (blocks, H, B)
    header = (Path(__file__).parents[1] / "templates/include/attncompiler/v3_bwd_dq.cuh").read_text()
    assert re.search(rf"constexpr int kDqOutThreads = {DQ_OUT_THREADS};", header)
    assert re.search(rf"const int q0 = blockIdx.x \* {DQ_OUT_ROWS};", header)
    packed = bwd_source(ir, SM90, options={"dq_red": 2}, varlen=True)
    assert "varlen_bwd_view<V3BwdConfig::D, AttnBwdParams, ac::V3BwdLayout<V3BwdConfig>::kDqTiledRowFloats>" in \
        packed.source


@pytest.mark.parametrize("lens", [(113, 1, 64, 300, 0, 17), (1023,), (16, 48, 64, 80), (64, 64, 1, 63, 65)])
def test_packed_dq_accumulator_rows(lens):
    # packed sequences: varlen.cuh moves sequence b's accumulator rows to 64 (q_start / 64 + b) + row; the kernel
    # adds whole 64-row query blocks, so each sequence's blocks must lie inside the accumulator and past the
    # previous sequence's
    import torch

    from attncompiler.runtime.varlen import VarlenInputs, varlen_dq_accumulator, varlen_dq_rows

    H, d, chunk = 3, 128, 64
    tiles = DqTiles(16, chunk, chunk + 4)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    B, total = len(lens), cu[-1]
    vi = VarlenInputs(B=B, H=H, H_kv=H, D=d, DV=d, total_q=total, total_k=total, max_q=max(lens), max_k=max(lens),
                      cu_q=tuple(cu), cu_k=tuple(cu))
    acc = varlen_dq_accumulator(tiles, vi, torch.device("cpu"))
    assert acc.shape == (varlen_dq_rows(vi) // 16, H, d // chunk, 16, chunk + 4)  # (zeroed by the preprocess)
    end = 0
    for b in range(B):
        first = 64 * (cu[b] // 64 + b)
        nqp = -(-lens[b] // 64) * 64  # the kernel writes whole 64-row query blocks
        assert first % 16 == 0 and first >= end and first + nqp <= varlen_dq_rows(vi)
        end = first + nqp


def test_refusals():
    assert v3_bwd_refusal(ProblemDims(128), SM90) is None
    assert v3_bwd_refusal(ProblemDims(128), SM90, deterministic=True) is None  # CTAs take turns per query block
    assert v3_bwd_refusal(ProblemDims(128), SM90, varlen=True) is None  # packed sequences run v3 too
    assert v3_bwd_refusal(ProblemDims(64), SM90, deterministic=True, varlen=True) is None
    assert "sm_90a" in v3_bwd_refusal(ProblemDims(64), "sm_89")
    assert v3_bwd_refusal(ProblemDims(128, 96), SM90) is None
    assert "DV" in v3_bwd_refusal(ProblemDims(128, 136), SM90) and "D " in v3_bwd_refusal(ProblemDims(72), SM90)
    # v3 runs at D = 16 / 32, but "auto" keeps v2 there (measured slower); from 48 up it takes v3
    assert v3_bwd_refusal(ProblemDims(32), SM90) is None and v3_bwd_refusal(ProblemDims(128, 16), SM90) is None
    assert "measured slower than v2" in v3_bwd_auto_refusal(ProblemDims(32), SM90)
    assert "D=128, DV=16" in v3_bwd_auto_refusal(ProblemDims(128, 16), SM90)
    assert v3_bwd_auto_refusal(ProblemDims(48), SM90) is None and v3_bwd_auto_refusal(ProblemDims(96, 64), SM90) is None
    assert isinstance(bwd_source(build_ir(presets.causal(32)), SM90), BwdKernelSource)
    assert isinstance(bwd_source(build_ir(presets.causal(32)), SM90, options={"schedule": "v3"}), V3BwdKernelSource)


def test_runtime_picks_the_backward():
    ir = build_ir(presets.causal(128))
    assert isinstance(bwd_source(ir, SM90), V3BwdKernelSource)
    assert isinstance(bwd_source(ir, SM90, options={"schedule": "v2"}), BwdKernelSource)
    det = bwd_source(ir, SM90, deterministic=True)
    assert isinstance(det, V3BwdKernelSource) and det.plan.deterministic and "DETERMINISTIC = true" in det.source
    assert "take turns in key-block order" in det.plan.describe() and not bwd_source(ir, SM90).plan.deterministic
    assert isinstance(bwd_source(ir, SM90, deterministic=True, options={"schedule": "v2"}), BwdKernelSource)
    packed = bwd_source(ir, SM90, varlen=True)
    assert isinstance(packed, V3BwdKernelSource) and packed.varlen and not bwd_source(ir, SM90).varlen
    assert "varlen_bwd_kv_enter" in packed.source and "VARLEN = true" in packed.source
    assert isinstance(bwd_source(ir, SM90, varlen=True, deterministic=True), V3BwdKernelSource)
    assert isinstance(bwd_source(ir, SM90, varlen=True, options={"schedule": "v2"}), BwdKernelSource)
    assert isinstance(bwd_source(ir, SM90, options={"block_m": 64}), BwdKernelSource)  # a v2 plan option
    assert isinstance(bwd_source(ir, get_target("sm_80")), BwdKernelSource)
    assert bwd_source(ir, SM90, options={"stages": 3}).plan.stages == 3
    assert isinstance(bwd_source(build_ir(presets.causal(96)), SM90), V3BwdKernelSource)
    assert bwd_source(build_ir(presets.causal(256)), SM90).plan.dkv_split  # AUTO_DKV_SPLIT
    assert bwd_source(build_ir(presets.causal(256)), SM90, options={"schedule": "v3"}).plan.dkv_split
    with pytest.raises(PlanError, match=r"multiple of 64 in \[128, 256\], got D=160"):
        bwd_source(build_ir(presets.causal(160)), SM90, options={"schedule": "v3"})
    with pytest.raises(PlanError, match="expected one of"):
        bwd_source(ir, SM90, options={"schedule": "v9"})
    with pytest.raises(PlanError, match=r"expected plan options among .*got \['block_m'\]"):
        bwd_source(ir, SM90, options={"schedule": "v3", "block_m": 64})
    src = bwd_source(ir, SM90)
    assert src.entries == ("attn_bwd_pre", "attn_bwd_kv", "attn_bwd_dq_out") and src.smem("attn_bwd_kv") == src.plan.smem_bytes
    assert src.threads("attn_bwd_kv") == 384 and src.threads("attn_bwd_pre") == 256
    assert src.nq_padded(1) == 64 and src.nq_padded(1023) == 1024


def _all_specs(head_dim: int) -> dict[str, ac.AttentionSpec]:
    specs = all_specs(head_dim)
    specs["fp16"] = presets.causal(head_dim, dtype="fp16")
    return specs


def _render(spec: ac.AttentionSpec, varlen: bool = False, **opts) -> V3BwdKernelSource:
    ir = build_ir(spec)
    return render_v3_bwd(ir, plan_v3_bwd(ir, SM90, varlen=varlen, **opts), SM90, varlen=varlen)


class _FakeStruct:
    """The fields of AttnParams / AttnBwdParams that the maps read."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_maps_geometry_padded_and_packed(monkeypatch):
    """The four TMA maps: (B, H, N, d) with the tensors' batch strides, or for packed sequences (1, H, total rows,
    d) with the batch stride unused; boxes of 64 query rows and BLOCK_N key rows."""
    import attncompiler.runtime.tma as tma
    from attncompiler.runtime.launch import AttnInputs

    seen = []
    monkeypatch.setattr(tma, "maps_struct", lambda entries: seen.append(entries) or "maps")
    src = bwd_source(build_ir(presets.causal(128)), SM90)
    P = _FakeStruct(q=16, k=32, v=48, q_sb=9, q_sh=128, q_sn=2048, k_sb=8, k_sh=128, k_sn=1024, v_sb=7, v_sh=128,
                    v_sn=1024)
    bp = _FakeStruct(dout=64, do_sb=6, do_sh=128, do_sn=2048)
    dims = AttnInputs(3, 16, 8, 113, 200, 128, 128)
    assert src.maps(P, bp, dims) == "maps"
    assert [(n, shape, st, box) for n, _, shape, st, _, box in seen[0]] == [
        ("q", (3, 16, 113, 128), (9, 128, 2048), 64), ("k", (3, 8, 200, 128), (8, 128, 1024), 128),
        ("v", (3, 8, 200, 128), (7, 128, 1024), 128), ("dout", (3, 16, 113, 128), (6, 128, 2048), 64)]
    assert src.maps(P, bp, dims, packed_rows=(300, 500)) == "maps"
    assert [(n, shape, st[0]) for n, _, shape, st, _, _ in seen[1]] == [
        ("q", (1, 16, 300, 128), 0), ("k", (1, 8, 500, 128), 0), ("v", (1, 8, 500, 128), 0),
        ("dout", (1, 16, 300, 128), 0)]
    v2 = bwd_source(build_ir(presets.causal(128)), SM90, options={"schedule": "v2"})
    assert v2.maps(P, bp, dims) is None and v2.nq_padded(113) >= 113 and set(v2.entries) <= set(v2.grids(dims))
    # deterministic: one turn counter per (b, h, 64-row query block); none otherwise
    det = bwd_source(build_ir(presets.causal(128)), SM90, deterministic=True)
    assert det.turn_counters(dims) == 3 * 16 * 2 and src.turn_counters(dims) == 0 == v2.turn_counters(dims)
    assert det.grids(dims)["attn_bwd_kv"] == (2, 8, 3) == src.grids(dims)["attn_bwd_kv"]  # (key blocks, H_kv, B)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_render_every_variant(head_dim):
    for name, spec in _all_specs(head_dim).items():
        src = _render(spec).source
        assert '#include "attncompiler/' not in src, name  # headers are inlined for NVRTC
        assert "wgmma.mma_async" in src and "cp.async.bulk.tensor" in src and "setmaxnreg" in src, name
        assert "score_mod_grad" in src and "attn_bwd_pre" in src and "attn_bwd_kv" in src, name
        assert ("m64n64k16.f32.f16.f16" in src) == (spec.dtype == "fp16"), name
        assert "varlen_bwd_kv_enter" not in src, name
        packed = _render(spec, varlen=True).source
        assert "varlen_bwd_kv_enter" in packed and "varlen_bwd_pre_enter" in packed and "rows.q_start" in packed, name
        assert "DETERMINISTIC = false" in src and "DETERMINISTIC = true" in _render(spec, deterministic=True).source


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_nvcc_compiles_every_variant_without_spills(head_dim):
    jobs = {name: _render(spec).source for name, spec in _all_specs(head_dim).items()}
    if head_dim == 256:  # dK / dV split by columns over the two consumers (dkv_split), dQ in one wgmma or by chunks
        jobs["causal dq_wide=False"] = _render(presets.causal(head_dim), dq_wide=False).source
        jobs["causal D=256 DV=128"] = _render(dataclasses.replace(presets.causal(256), head_dim_v=128),
                                              dkv_split=True).source
        # D rounded up to 256 under the split (MLA's 192 x 128): the zero columns' dK stores and dQ chunk skipped
        # (these shapes take the roles kernel by default: test_nvcc_roles_kernels; the split stays for deterministic)
        mla = dataclasses.replace(presets.causal(192), head_dim_v=128)
        jobs["causal D=192 DV=128"] = _render(mla, dkv_split=True).source
        jobs["causal D=192 DV=128 varlen det"] = _render(mla, varlen=True, deterministic=True, dkv_split=True).source
        jobs["causal D=192 DV=128 dq_wide"] = _render(mla, dkv_split=True, dq_wide=True).source
        jobs["causal D=192 DV=192"] = _render(presets.causal(192), dkv_split=True).source
    else:
        jobs["causal consumers=1"] = _render(presets.causal(head_dim), consumers=1).source
        jobs["causal stages=3"] = _render(presets.causal(head_dim), stages=3).source
        jobs["causal dq_split_n=False"] = _render(presets.causal(head_dim), dq_split_n=False).source
    for d, dv in {128: ((96, 96), (32, 32), (80, 80), (128, 96), (96, 64)), 64: ((48, 48), (16, 16))}.get(head_dim, ()):
        jobs[f"causal D={d} DV={dv}"] = _render(dataclasses.replace(presets.causal(d), head_dim_v=dv)).source
    for name in ("causal", "document", "alibi"):  # packed sequences (the view of each CTA's sequence)
        if name in jobs:
            jobs[f"{name} varlen"] = _render(_all_specs(head_dim)[name], varlen=True).source
    for name in ("causal", "document"):  # deterministic dQ (turns per query block), padded and packed
        jobs[f"{name} deterministic"] = _render(_all_specs(head_dim)[name], deterministic=True).source
        jobs[f"{name} det varlen"] = _render(_all_specs(head_dim)[name], varlen=True, deterministic=True).source
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reports.items():
        print(f"v3 bwd d={head_dim} {name:28s}: {rep.registers:3d} regs, spill {rep.spill_stores}/{rep.spill_loads} B")
        # dropout at d = 128 / 256: its Philox words beside dK, dV and the fragments spill 120 / 104 B (nvcc 13.0) in
        # the elementwise step; at d = 256 the packed document mask (sequence view + document ids beside the wide dQ
        # accumulator) spills 8 B; every other variant is spill-free
        limit = 128 if "dropout" in name and head_dim >= 128 else 8 if head_dim == 256 and "varlen" in name else 0
        assert rep.registers > 0 and rep.spill_stores <= limit and rep.spill_loads <= limit, name


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_roles_kernels():
    """The consumers split by role (v3_bwd_roles.cuh), the default above 128: every variant at MLA's 192 x 128, the
    other shapes and options, padded and packed, compile for sm_90a (and through NVRTC) without wgmma serialization."""
    mla = {name: dataclasses.replace(spec, head_dim_v=128) for name, spec in _all_specs(192).items()}
    jobs = {f"{name} 192x128": _render(spec).source for name, spec in mla.items()}
    for name in ("causal", "document"):
        jobs[f"{name} 192x128 varlen"] = _render(mla[name], varlen=True).source
    jobs["causal 192x128 dq_wide=False"] = _render(mla["causal"], dq_wide=False).source
    jobs["causal 192x128 dq_stages=1"] = _render(mla["causal"], dq_stages=1).source
    for d, dv in ((192, 192), (256, 128), (128, 192)):
        jobs[f"causal {d}x{dv}"] = _render(dataclasses.replace(presets.causal(d), head_dim_v=dv)).source
    jobs["causal 64x64 dkv_roles"] = _render(presets.causal(64), dkv_roles=True).source
    jobs["causal 192x128 deterministic"] = _render(mla["causal"], dkv_roles=True, deterministic=True).source
    jobs["document 192x128 det varlen"] = _render(mla["document"], dkv_roles=True, deterministic=True,
                                                  varlen=True).source
    for name, src in jobs.items():
        assert "DKV_ROLES = true" in src, name
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = dict(zip(jobs, pool.map(lambda s: compile_with_nvcc(s, "sm_90a"), jobs.values())))
    for name, rep in reports.items():
        print(f"v3 bwd roles {name:34s}: spill {rep.spill_stores}/{rep.spill_loads} B")
        assert "C751" not in rep.log and "C752" not in rep.log, name  # (every wgmma serialized)
        # nvcc 13.0: warpgroup 0 holds dK beside S^T and dP^T through the elementwise step; dropout's Philox words
        # spill 16 B there (192 x 128), the document mask's reads 16-20 B; every other variant is spill-free
        limit = 32 if "dropout" in name or "document" in name else 0
        assert rep.spill_stores <= limit and rep.spill_loads <= limit, name


def test_plan_roles_default_above_128():
    """Above 128 the consumers split by role by default (deterministic dQ too): every product once, dP^T and P^T /
    dS^T through shared memory; the column split where the roles kernel does not fit (256 x 256)."""
    mla = plan_v3_bwd(ProblemDims(192, 128), SM90)
    assert (mla.dkv_roles, mla.dkv_split, mla.block_n, mla.consumers, mla.dq_split_n, mla.dq_chunk) == (
        True, False, 64, 2, False, 64)
    # 3 staging buffers a warp (one per 64-column chunk), then 2 Q / dO stages: K, V 64 x 640 B; 2 x 64 x 640 B;
    # dS^T and P^T 2 x 2 x 8 KB; dP^T 16 KB; rows; 4 warps x 3 x 16 x 68 fp32
    assert (mla.dq_stages, mla.stages, mla.dq_pad, mla.dq_wide) == (3, 2, 4, True)
    assert mla.smem_bytes == 1024 + 40960 + 81920 + 32768 + 16384 + 1024 + 52224 + 40 == 226344
    assert mla.smem_bytes == v3_bwd_smem_bytes(192, 128, 2, 2, 2, False, chunk=64, pad=4, dkv_roles=True, dq_stages=3)
    text = mla.describe()
    assert "sharing them by role" in text and "every product once" in text and "one step behind" in text
    assert "rejected dkv_roles, stages=4, dq_stages=3, dq_pad=4: smem" in text
    assert plan_v3_bwd(ProblemDims(192, 128), SM90, dq_stages=1).stages == 3  # one buffer leaves room for 3 stages
    for dims, roles in (((192, 192), True), ((256, 128), True), ((128, 192), True), ((256, 256), False),
                        ((128, 128), False), ((64, 64), False)):
        p = plan_v3_bwd(ProblemDims(*dims), SM90)
        assert p.dkv_roles == roles and p.dkv_split == (not roles and max(dims) > 128), dims
    assert not plan_v3_bwd(ProblemDims(192, 192), SM90).dq_wide  # dV 96 + dQ 96 + dP^T 32 exceed 240
    assert plan_v3_bwd(ProblemDims(192, 128), SM90, deterministic=True).dkv_roles
    assert plan_v3_bwd(ProblemDims(256), SM90, deterministic=True).dkv_split  # (256 x 256: roles does not fit)
    assert plan_v3_bwd(ProblemDims(192, 128), SM90, dq_chunk=32).dkv_split  # a forced split option keeps the split
    assert plan_v3_bwd(ProblemDims(64), SM90, dkv_roles=True).dkv_roles  # (forced: every multiple of 64)
    det = plan_v3_bwd(ProblemDims(192, 128), SM90, dkv_roles=True, deterministic=True)  # warpgroup 1 takes the turns
    assert det.dkv_roles and det.deterministic and "warpgroup 1 takes and passes the turn" in det.describe()
    with pytest.raises(PlanError, match=r"dkv_roles expected dq_split_n=False, got True"):
        plan_v3_bwd(ProblemDims(192, 128), SM90, dkv_roles=True, dq_split_n=True)
    with pytest.raises(PlanError, match=r"expected dq_stages in \[1, 3\] .*got 4"):
        plan_v3_bwd(ProblemDims(192, 128), SM90, dkv_roles=True, dq_stages=4)
    with pytest.raises(PlanError, match="dq_stages=2 needs dkv_roles"):
        plan_v3_bwd(ProblemDims(128), SM90, dq_stages=2)
    with pytest.raises(PlanError, match=r"dkv_roles expected D and DV multiples of 64 in \[64, 256\], got D=96"):
        plan_v3_bwd(ProblemDims(96), SM90, dkv_roles=True)
    with pytest.raises(PlanError, match=r"smem 280616 B > 232448 B limit"):
        plan_v3_bwd(ProblemDims(256, 256), SM90, dkv_roles=True)
    src = _render(dataclasses.replace(presets.causal(192), head_dim_v=128)).source
    assert "DKV_ROLES = true" in src and "DQ_STAGES = 3" in src and "m64n192k16" in src  # dK and the wide dQ
    assert "p, 1, 1, 0, 1" in src  # dV: A (the P^T tile) K-major, B (dO) MN-major


def test_cli_show_backward_prints_what_backward_runs(capsys):
    from attncompiler.cli import main

    assert main(["show", "causal", "--backward", "--arch", "sm_90", "--head-dim", "128"]) == 0
    assert "schedule v3 backward" in capsys.readouterr().out
    assert main(["show", "causal", "--backward", "--arch", "sm_90", "--head-dim", "128", "--option", "schedule=v2"]) == 0
    assert "schedule v2 backward" in capsys.readouterr().out
    assert main(["show", "causal", "--backward", "--arch", "sm_80", "--head-dim", "128"]) == 0
    assert "schedule v2 backward" in capsys.readouterr().out
    assert main(["show", "causal", "--backward", "--arch", "sm_90", "--head-dim", "64", "--option", "stages=3"]) == 0
    assert "3 Q/dO stages" in capsys.readouterr().out
    assert main(["show", "causal", "--backward", "--arch", "sm_90", "--head-dim", "160", "--option", "schedule=v3"]) != 0
    assert "multiple of 16 and <= 128" in capsys.readouterr().err


def test_cli_plan_backward_explains_the_choice(capsys):
    from attncompiler.cli import main

    assert main(["plan", "causal", "--backward", "--arch", "sm_90", "--head-dim", "128"]) == 0
    out = capsys.readouterr().out
    assert "v3_bwd plan for sm_90" in out and "registers ~ dK+dV 128" in out and "200744 B" in out
    assert "one bulk TMA reduction per warp into a tiled accumulator" in out
    assert "deferred one step" in out and "not used" not in out
    assert main(["plan", "causal", "--backward", "--arch", "sm_90", "--head-dim", "256"]) == 0
    out = capsys.readouterr().out
    assert "v3_bwd plan" in out and "dK/dV split by columns (128 + 128 each" in out and "231464 B" in out
    assert main(["plan", "causal", "--backward", "--arch", "sm_90", "--head-dim", "160"]) == 0
    out = capsys.readouterr().out
    assert "v2_bwd plan" in out and "v3 backward not used: v3 backward: expected D a multiple of 16 and <= 128" in out
    assert main(["plan", "causal", "--backward", "--arch", "sm_90", "--head-dim", "96"]) == 0
    out = capsys.readouterr().out
    assert "v3_bwd plan" in out and "keys split over the warpgroups" in out and "D=96 does not split" in out
    assert main(["plan", "causal", "--backward", "--arch", "sm_90", "--deterministic"]) == 0
    out = capsys.readouterr().out
    assert "v3_bwd plan" in out and "deterministic: the CTAs adding into a query block take turns" in out
    assert "one bulk TMA reduction per warp into a tiled accumulator" in out
    assert main(["plan", "causal", "--backward", "--arch", "sm_90", "--head-dim", "96", "--deterministic"]) == 0
    out = capsys.readouterr().out  # 48 dQ columns per warpgroup would straddle a box: one consumer warpgroup
    assert "v3_bwd plan" in out and "1 consumer warpgroups" in out and "deterministic dQ needs" in out
