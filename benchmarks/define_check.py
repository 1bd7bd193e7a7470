"""Correctness of a source-level variant (``#define NAME 1`` in front of the generated v3 kernel) by the
error-ratio rule, beside the unchanged kernel, over presets and awkward lengths.

    PYTHONPATH=.:benchmarks python3 benchmarks/define_check.py AC_P_INT_PACK
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import attncompiler as ac
    from attncompiler.spec import presets
    from attncompiler.testing import check_kernel
    from v3_sweep import with_define

    define = argv[0]
    specs = [("plain", presets.plain), ("causal", presets.causal), ("softcap", lambda d: presets.softcap(30.0, d)),
             ("sliding_window", lambda d: presets.sliding_window(256, d)),
             ("alibi", lambda d: presets.alibi(presets.alibi_slopes(4), d))]
    bad = 0
    for name, make in specs:
        for d in (64, 128):
            for variant in ("", define):
                kern = ac.compile(make(d), "v3")
                if variant:
                    kern = with_define(kern, variant)
                for n in (1, 113, 1023, 4096):
                    r = check_kernel(kern, 2, 4, n)
                    bad += not r.ok
                    print(f"{name} d={d} N={n} {variant or 'unchanged'}: {'ok' if r.ok else 'FAIL'} {r.message}",
                          flush=True)
    print(f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
