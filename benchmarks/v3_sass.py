"""Machine-code check of v3 kernels: HGMMA count and local memory (LDL/STL) per variant, from
``cuobjdump -sass`` of the cubin (nvcc 13 ``-gencode=arch=compute_90a,code=sm_90a`` when nvcc is
installed, else NVRTC).

    PYTHONPATH=. python3 benchmarks/v3_sass.py            # HGMMA / spill table
    PYTHONPATH=. python3 benchmarks/v3_sass.py --model    # + the softmax issue model per stretch
    PYTHONPATH=. python3 benchmarks/v3_sass.py --option late_pv_wait=false  # plan options for every kernel
    PYTHONPATH=. python3 benchmarks/v3_sass.py --define NAME   # '#define NAME 1' in front (A/B of source variants)

``P V overlap`` says, for each wait on the S GEMM (``WARPGROUP.DEPBAR.LE gsb0, 0x1``: the main loop), whether the
softmax's exponentials that follow run before the wait on the previous block's P V (``gsb0, 0x0``), i.e. under
that GEMM ("yes"), or after it ("no": ptxas hoisted the wait; plan option late_pv_wait, on by default where it
measured faster: perf-notes, twenty-fourth and twenty-fifth sessions).

``--model`` splits the machine code into the stretches between HGMMA groups and branches (one copy of a
softmax each) and estimates each stretch's time for one warp issuing in order, on one SM sub-partition:
one issue slot per instruction, the XU pipe (MUFU: tanh, ex2) busy 8 cycles per warp instruction (16 lanes
per SM per cycle, measured by mufu_rates.py), the integer/compare pipe 2 cycles; latencies are ignored, so
the estimate is a floor.  Beside it, one warpgroup's two GEMMs of a K/V block at the tensor cores' peak
(4096 FLOP per SM per cycle): in the ping-pong a warpgroup's softmax must fit under the other's GEMMs, so a
softmax longer than the GEMMs bounds the kernel below the tensor peak by their ratio.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from _results import option_value

XU_CYCLES = 8        # cycles a warp's MUFU instruction holds its sub-partition's XU pipe
ALU_CYCLES = 2       # half-rate integer / compare / select pipe
_ALU_OPS = {"FMNMX", "LOP3", "SHF", "IADD3", "ISETP", "FSETP", "SEL", "FSEL", "SHL", "LEA", "PRMT"}


def sass_ops(sass: str) -> list[tuple[int, str, int | None]]:
    """(address, opcode, branch target or None) of ``cuobjdump -sass`` text in program order (predicates
    dropped)."""
    ops = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", line)
        if m:
            toks = m.group(2).split()
            op = toks[1] if toks[0].startswith("@") and len(toks) > 1 else toks[0]
            tgt = re.search(r"BRA(?:\.\S+)?\s+(0x[0-9a-f]+)", m.group(2))
            ops.append((int(m.group(1), 16), op, int(tgt.group(1), 16) if tgt else None))
    return ops


def issue_floor(ops: list[str]) -> int:
    """Cycles for one warp to issue ``ops`` in order (see the module docstring)."""
    t = xu_free = alu_free = 0
    for op in ops:
        if op.startswith("MUFU"):
            t = max(t, xu_free)
            xu_free = t + XU_CYCLES
        elif op.split(".")[0] in _ALU_OPS:
            t = max(t, alu_free)
            alu_free = t + ALU_CYCLES
        t += 1
    return max(t, xu_free)


def softmax_stretches(ops: list[tuple[int, str, int | None]], min_mufu: int = 20) -> list[tuple[int, int, int]]:
    """(instructions, MUFU ops, issue floor) of every straight-line stretch (cut at HGMMA groups, branches,
    reconvergence points and branch targets) holding at least ``min_mufu`` MUFU ops, in program order (the
    first visited block's softmax, then the main loop's copies)."""
    targets = {t for _, _, t in ops if t is not None}
    cuts = [i for i, (addr, o, _) in enumerate(ops)
            if o.startswith(("HGMMA", "BRA", "BSYNC", "BSSY", "EXIT")) or addr in targets]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        seg = [o for _, o, _ in ops[a + 1:b]]
        nm = sum(o.startswith("MUFU") for o in seg)
        if nm >= min_mufu:
            out.append((len(seg), nm, issue_floor(seg)))
    return out


def pv_overlap(sass: str) -> list[bool]:
    """Per ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` of ``cuobjdump -sass`` text: True where no ``gsb0, 0x0`` wait comes
    between it and the next MUFU.EX2 (the softmax runs under the in-flight P V), False where one does."""
    lines = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]
    out = []
    for i, line in enumerate(lines):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            j = next((k for k in range(i + 1, len(lines)) if "MUFU.EX2" in lines[k]), None)
            if j is not None:
                out.append(not any("WARPGROUP.DEPBAR.LE gsb0, 0x0" in lines[k] for k in range(i + 1, j)))
    return out


def main() -> int:
    import attncompiler as ac
    from attncompiler.runtime.compiler import _nvrtc_cubin, compile_with_nvcc
    from attncompiler.spec import presets

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="store_true", help="print the softmax issue model per stretch")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a v3 plan option")
    ap.add_argument("--define", action="append", default=[], metavar="NAME",
                    help="compile with '#define NAME 1' in front (A/B of source-level variants)")
    ap.add_argument("--only", default=None, metavar="TEXT", help="only the kernels whose name contains TEXT")
    args = ap.parse_args()
    options = {k: option_value(v) for k, v in (o.split("=", 1) for o in args.option)}
    specs = []
    for d in (64, 128, 256):
        specs += [(f"plain d={d}", presets.plain(d)), (f"causal d={d}", presets.causal(d))]
    specs += [("alibi d=128", presets.alibi(presets.alibi_slopes(16), 128)), ("softcap d=64", presets.softcap(30.0, 64)),
              ("softcap d=128", presets.softcap(30.0, 128)),
              ("sliding_window d=128", presets.sliding_window(1024, 128)),
              ("dropout d=128", ac.AttentionSpec(head_dim=128, dropout_p=0.1, name="dropout"))]
    for name, spec in specs:
        if args.only is not None and args.only not in name:
            continue
        ks = ac.compile(spec, "v3", build=False, target="sm_90", **options).kernel_source
        source = "".join(f"#define {n} 1\n" for n in args.define) + ks.source
        if shutil.which("nvcc"):
            cubin = compile_with_nvcc(source, ks.arch).cubin
        else:
            cubin, _ = _nvrtc_cubin(source, ks.arch, "sass")
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "k.cubin"
            p.write_bytes(cubin)
            sass = subprocess.run(["cuobjdump", "-sass", str(p)], capture_output=True, text=True, check=True).stdout
        hg = re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass)
        shapes = sorted(set(hg))
        pl = ks.plan
        print(f"{name:22s} BM={pl.block_m} BN={pl.block_n} stages={pl.stages}: {len(hg)} HGMMA {shapes}, "
              f"LDL {len(re.findall(r'LDL', sass))}, STL {len(re.findall(r'STL', sass))}, "
              f"HMMA {len(re.findall(r' HMMA', sass))}, P V overlap "
              f"{' '.join('yes' if o else 'no' for o in pv_overlap(sass)) or '-'}", flush=True)
        if args.model:
            gemm = 2 * 2 * 64 * pl.block_n * spec.head_dim // 4096  # S and P V of one warpgroup, d = d_v
            for n, nm, t in softmax_stretches(sass_ops(sass)):
                print(f"    softmax stretch: {n} instructions, {nm} MUFU; issue floor {t} cycles "
                      f"(XU alone {XU_CYCLES * nm}); one warpgroup's GEMMs {gemm} cycles", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
