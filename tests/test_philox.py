"""Philox4x32-10: known-answer vectors, torch vs host-compiled philox.cuh, device compile, statistics."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from attncompiler.philox import dropout_keep_mask, dropout_threshold, philox4x32_10
from attncompiler.runtime.params import PARAM_FIELDS, c_struct

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "templates" / "include"
M32 = 0xFFFFFFFF

# Random123 kat_vectors, philox4x32_10: (counter, key, expected output)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]

# (B, H, Nq, Nk, seed, offset, p) grids for the keep-bit comparison
KEEP_GRIDS = [
    (2, 3, 37, 45, 0, 0, 0.3),
    (1, 2, 50, 33, 0x1234_5678_9ABC_DEF0, (7 << 32) | 0xDEADBEEF, 0.5),
    (3, 1, 19, 24, 2**64 - 1, 2**32 - 1, 0.1),
    (1, 1, 1, 1, 42, 1, 0.9),
]


def _counter_grid() -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(1234)
    rows = [c + k for c, k, _ in KAT]
    edges = [0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, M32]
    for i, e in enumerate(edges):
        rows.append(tuple(edges[(i + j) % len(edges)] for j in range(5)) + (e,))
    rand = torch.randint(0, 2**32, (64, 6), generator=g, dtype=torch.int64)
    rows += [tuple(int(x) for x in r) for r in rand]
    return rows


def _naive_keep(B: int, H: int, Nq: int, Nk: int, seed: int, offset: int, p: float) -> torch.Tensor:
    """Element-by-element counter mapping, written straight from docs/architecture.md."""
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    q = torch.arange(Nq).view(1, 1, Nq, 1)
    k = torch.arange(Nk).view(1, 1, 1, Nk)
    words = philox4x32_10(q & ~8, k >> 1, b * H + h, offset & M32, seed & M32, seed >> 32)
    words = torch.stack(torch.broadcast_tensors(*words), dim=-1)
    idx = ((q >> 3) & 1) * 2 + (k & 1)
    word = torch.gather(words, -1, idx.expand(B, H, Nq, Nk).unsqueeze(-1)).squeeze(-1)
    return word < dropout_threshold(p)


# ---------------------------------------------------------------------------------------- torch


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answer_ints(ctr, key, expected):
    assert philox4x32_10(*ctr, *key) == expected


def test_known_answer_tensors_broadcast():
    c = [torch.tensor([kat[0][i] for kat in KAT]).view(3, 1) for i in range(4)]
    k = [torch.tensor([kat[1][i] for kat in KAT]).view(3, 1) for i in range(2)]
    out = philox4x32_10(*c, *k)
    for i in range(4):
        assert out[i].shape == (3, 1)
        assert out[i].dtype == torch.int64
        assert out[i].view(-1).tolist() == [kat[2][i] for kat in KAT]
    # broadcasting: a row of counters against a scalar key equals one call per counter
    c0 = torch.arange(5).view(5, 1)
    c1 = torch.tensor([0, M32]).view(1, 2)
    out = philox4x32_10(c0, c1, 7, 9, 11, 13)
    for i in range(5):
        for j, v in enumerate([0, M32]):
            assert tuple(int(w[i, j]) for w in out) == philox4x32_10(i, v, 7, 9, 11, 13)


def test_words_stay_uint32_and_inputs_checked():
    g = torch.Generator().manual_seed(0)
    c = torch.randint(0, 2**32, (4, 1000), generator=g, dtype=torch.int64)
    for w in philox4x32_10(c[0], c[1], c[2], c[3], M32, M32):
        assert int(w.min()) >= 0 and int(w.max()) <= M32
    with pytest.raises(ValueError, match="expected c0 in"):
        philox4x32_10(2**32, 0, 0, 0, 0, 0)
    with pytest.raises(TypeError, match="expected c1 as an int64 tensor"):
        philox4x32_10(0, torch.zeros(2, dtype=torch.int32), 0, 0, 0, 0)


def test_threshold():
    assert dropout_threshold(0.0) == M32
    assert dropout_threshold(1.0) == 0
    assert dropout_threshold(0.5) == 2**31
    assert dropout_threshold(0.1) == round(0.9 * 2**32)
    with pytest.raises(ValueError, match="expected dropout probability"):
        dropout_threshold(1.5)


@pytest.mark.parametrize("B,H,Nq,Nk,seed,offset,p", KEEP_GRIDS)
def test_keep_mask_matches_naive_mapping(B, H, Nq, Nk, seed, offset, p):
    got = dropout_keep_mask(B, H, Nq, Nk, seed=seed, offset=offset, p=p)
    assert got.dtype == torch.bool and got.shape == (B, H, Nq, Nk)
    assert torch.equal(got, _naive_keep(B, H, Nq, Nk, seed, offset, p))


def test_keep_mask_row_blocks_and_internal_chunks(monkeypatch):
    import attncompiler.philox as ph

    full = dropout_keep_mask(2, 2, 77, 31, seed=5, offset=3, p=0.4)
    for q0, q1 in [(0, 77), (3, 40), (8, 9), (16, 32), (70, 77), (5, 5)]:
        part = dropout_keep_mask(2, 2, 77, 31, seed=5, offset=3, p=0.4, q_start=q0, q_end=q1)
        assert torch.equal(part, full[:, :, q0:q1])
    # 32-row blocks over all heads; 16-row blocks split over heads (2 or 1 at a time)
    for budget in (32 * 4 * 31, 16 * 2 * 31, 1):
        monkeypatch.setattr(ph, "_CHUNK_ELEMS_CPU", budget)
        assert torch.equal(dropout_keep_mask(2, 2, 77, 31, seed=5, offset=3, p=0.4), full)
        part = dropout_keep_mask(2, 2, 77, 31, seed=5, offset=3, p=0.4, q_start=13, q_end=61)
        assert torch.equal(part, full[:, :, 13:61])


def test_keep_mask_depends_on_seed_offset_and_only_low_offset_bits():
    a = dropout_keep_mask(1, 2, 32, 32, seed=1, offset=0, p=0.5)
    assert not torch.equal(a, dropout_keep_mask(1, 2, 32, 32, seed=2, offset=0, p=0.5))
    assert not torch.equal(a, dropout_keep_mask(1, 2, 32, 32, seed=1 + 2**32, offset=0, p=0.5))
    assert not torch.equal(a, dropout_keep_mask(1, 2, 32, 32, seed=1, offset=1, p=0.5))
    assert torch.equal(a, dropout_keep_mask(1, 2, 32, 32, seed=1, offset=2**32, p=0.5))
    # heads and batches use distinct counters
    assert not torch.equal(a[0, 0], a[0, 1])


def test_keep_mask_argument_errors():
    with pytest.raises(ValueError, match="expected seed < 2\\*\\*64"):
        dropout_keep_mask(1, 1, 4, 4, seed=2**64, offset=0, p=0.5)
    with pytest.raises(ValueError, match="expected offset >= 0"):
        dropout_keep_mask(1, 1, 4, 4, seed=0, offset=-1, p=0.5)
    with pytest.raises(ValueError, match="q_start <= q_end"):
        dropout_keep_mask(1, 1, 4, 4, seed=0, offset=0, p=0.5, q_start=3, q_end=5)
    with pytest.raises(TypeError, match="expected Nk as an int"):
        dropout_keep_mask(1, 1, 4, 4.0, seed=0, offset=0, p=0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_within_4_sigma(p):
    B, H, Nq, Nk = 2, 4, 256, 256
    keep = dropout_keep_mask(B, H, Nq, Nk, seed=0xC0FFEE, offset=17, p=p)
    n = keep.numel()
    rate = keep.double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(rate - (1 - p)) <= 4 * sigma, (rate, 1 - p, sigma)
    # the four elements served by one Philox call are not correlated
    k = keep.double()
    for a, b in [(k[..., 0::2], k[..., 1::2]), (k[:, :, 0::16], k[:, :, 8::16])]:
        cov = (a * b).mean().item() - a.mean().item() * b.mean().item()
        assert abs(cov) <= 4 * p * (1 - p) / math.sqrt(a.numel())


# ---------------------------------------------------------------------------------- philox.cuh


def _harness_source(counters: list[tuple[int, ...]], device_pair: bool = False) -> str:
    """The host harness; ``device_pair``: built with AC_DROPOUT_RNG_ON_DEVICE, the key and offset in ``rng_state``
    (the by-value fields hold other values, which must not be read)."""
    setup = ("    p.H = g.H; p.seed = g.seed; p.offset = g.offset; p.dropout_threshold = g.thr;" if not device_pair else
             "    const unsigned long long state[2] = {g.seed, g.offset};\n"
             "    p.H = g.H; p.seed = ~g.seed; p.offset = g.offset + 7; p.rng_state = state; p.dropout_threshold = g.thr;")
    lines = [
        "#define AC_DROPOUT_RNG_ON_DEVICE 1" if device_pair else "",
        "#define __device__",
        "#define __host__",
        "#define __forceinline__ inline",
        "#define AC_HOST_DEVICE",
        "#include <cstdio>",
        c_struct("AttnParams", PARAM_FIELDS),
        '#include "attncompiler/philox.cuh"',
        "static const unsigned int kCtr[][6] = {",
    ]
    lines += ["  {" + ", ".join(f"0x{v:08x}u" for v in c) + "}," for c in counters]
    lines += ["};", "struct Grid { int B, H, Nq, Nk; unsigned long long seed, offset; unsigned int thr; };",
              "static const Grid kGrid[] = {"]
    for B, H, Nq, Nk, seed, offset, p in KEEP_GRIDS:
        lines.append(f"  {{{B}, {H}, {Nq}, {Nk}, 0x{seed:x}ull, 0x{offset:x}ull, {dropout_threshold(p)}u}},")
    lines += [
        "};",
        "int main() {",
        "  for (const auto& c : kCtr) {",
        "    ac_u32x4 ctr = {c[0], c[1], c[2], c[3]};",
        "    ac_u32x4 w = ac_philox4x32_10(ctr, c[4], c[5]);",
        '    std::printf("W %08x %08x %08x %08x\\n", w.x, w.y, w.z, w.w);',
        "  }",
        "  for (const auto& g : kGrid) {",
        "    AttnParams p = {};",
        setup,
        "    for (int b = 0; b < g.B; ++b) for (int h = 0; h < g.H; ++h) for (int q = 0; q < g.Nq; ++q) {",
        '      std::printf("K ");',
        '      for (int k = 0; k < g.Nk; ++k) std::printf("%d", ac_dropout_keep(p, b, h, q, k) ? 1 : 0);',
        '      std::printf(" %08x\\n", ac_dropout_select(ac_dropout_words(p, b, h, q, g.Nk - 1), q, g.Nk - 1));',
        "    }",
        "  }",
        "  return 0;",
        "}",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module", params=[False, True], ids=["by_value", "device_pair"])
def host_harness_output(request, tmp_path_factory) -> tuple[list[tuple[int, ...]], list[str]]:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    counters = _counter_grid()
    d = tmp_path_factory.mktemp("philox_host")
    src, exe = d / "harness.cpp", d / "harness"
    src.write_text(_harness_source(counters, device_pair=request.param))
    cmd = [gxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", str(src), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    return counters, r.stdout.splitlines()


def test_cuh_words_match_torch(host_harness_output):
    counters, lines = host_harness_output
    wlines = [ln for ln in lines if ln.startswith("W ")]
    assert len(wlines) == len(counters)
    t = torch.tensor(counters, dtype=torch.int64)
    ref = torch.stack(philox4x32_10(*(t[:, i] for i in range(6))), dim=-1)
    got = torch.tensor([[int(x, 16) for x in ln.split()[1:]] for ln in wlines], dtype=torch.int64)
    assert torch.equal(got, ref)
    for i, (_, _, expected) in enumerate(KAT):
        assert tuple(got[i].tolist()) == expected


def test_cuh_keep_bits_match_torch(host_harness_output):
    _, lines = host_harness_output
    klines = [ln.split() for ln in lines if ln.startswith("K ")]
    pos = 0
    for B, H, Nq, Nk, seed, offset, p in KEEP_GRIDS:
        rows = klines[pos:pos + B * H * Nq]
        pos += B * H * Nq
        got = torch.tensor([[c == "1" for c in r[1]] for r in rows]).view(B, H, Nq, Nk)
        assert torch.equal(got, dropout_keep_mask(B, H, Nq, Nk, seed=seed, offset=offset, p=p))
        # the selected word of (q, Nk-1) equals the torch word for that element
        b = torch.arange(B).view(B, 1, 1)
        h = torch.arange(H).view(1, H, 1)
        q = torch.arange(Nq).view(1, 1, Nq)
        k = Nk - 1
        w = philox4x32_10(q & ~8, k >> 1, b * H + h, offset & M32, seed & M32, seed >> 32)
        w = torch.stack(torch.broadcast_tensors(*w), dim=-1)
        idx = (((q >> 3) & 1) * 2 + (k & 1)).expand(B, H, Nq).unsqueeze(-1)
        ref = torch.gather(w, -1, idx).view(-1)
        assert [int(r[2], 16) for r in rows] == ref.tolist()
    assert pos == len(klines)


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base and Path(base, "bin", "nvcc").exists():
            return str(Path(base, "bin", "nvcc"))
    return None


@pytest.mark.parametrize("device_pair", [False, True], ids=["by_value", "device_pair"])
def test_cuh_compiles_for_device(tmp_path, device_pair):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = tmp_path / "keep.cu"
    src.write_text("\n".join([
        "#define AC_DROPOUT_RNG_ON_DEVICE 1" if device_pair else "",
        c_struct("AttnParams", PARAM_FIELDS),
        '#include "attncompiler/common.cuh"',
        '#include "attncompiler/philox.cuh"',
        'extern "C" __global__ void keep_kernel(const AttnParams p, unsigned char* keep, unsigned int* words) {',
        "  const int b = blockIdx.z, h = blockIdx.y, q = blockIdx.x, k = threadIdx.x;",
        "  const long long i = (((long long)b * p.H + h) * p.Nq + q) * p.Nk + k;",
        "  keep[i] = ac_dropout_keep(p, b, h, q, k) ? 1 : 0;",
        "  ac_u32x4 c = {(unsigned)q, (unsigned)k, 1u, 2u};",
        "  ac_u32x4 w = ac_philox4x32_10(c, (unsigned)p.seed, 3u);",
        "  words[i] = w.x ^ w.y ^ w.z ^ w.w;",
        "}",
    ]) + "\n")
    out = tmp_path / "keep.cubin"
    r = subprocess.run([nvcc, "-arch=sm_80", "-cubin", "-std=c++17", f"-I{INCLUDE}", str(src), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    assert out.stat().st_size > 0
