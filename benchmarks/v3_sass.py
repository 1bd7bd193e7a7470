"""Machine-code check of v3 kernels: HGMMA count and local memory (LDL/STL) per variant, from
``cuobjdump -sass`` of the cubin (nvcc 13 ``-gencode=arch=compute_90a,code=sm_90a`` when nvcc is
installed, else NVRTC).  PYTHONPATH=. python3 benchmarks/v3_sass.py"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path


def main() -> int:
    import attncompiler as ac
    from attncompiler.runtime.compiler import _nvrtc_cubin, compile_with_nvcc
    from attncompiler.spec import presets

    specs = []
    for d in (64, 128, 256):
        specs += [(f"plain d={d}", presets.plain(d)), (f"causal d={d}", presets.causal(d))]
    specs += [("alibi d=128", presets.alibi(presets.alibi_slopes(16), 128)), ("softcap d=128", presets.softcap(30.0, 128)),
              ("sliding_window d=128", presets.sliding_window(1024, 128)),
              ("dropout d=128", ac.AttentionSpec(head_dim=128, dropout_p=0.1, name="dropout"))]
    for name, spec in specs:
        ks = ac.compile(spec, "v3", build=False, target="sm_90").kernel_source
        if shutil.which("nvcc"):
            cubin = compile_with_nvcc(ks.source, ks.arch).cubin
        else:
            cubin, _ = _nvrtc_cubin(ks.source, ks.arch, "sass")
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "k.cubin"
            p.write_bytes(cubin)
            sass = subprocess.run(["cuobjdump", "-sass", str(p)], capture_output=True, text=True, check=True).stdout
        hg = re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass)
        shapes = sorted(set(hg))
        print(f"{name:22s} BN={ks.plan.block_n} stages={ks.plan.stages}: {len(hg)} HGMMA {shapes}, "
              f"LDL {len(re.findall(r'LDL', sass))}, STL {len(re.findall(r'STL', sass))}, "
              f"HMMA {len(re.findall(r' HMMA', sass))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
