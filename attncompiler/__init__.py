"""attncompiler: Python attention variants -> fused FlashAttention-style CUDA kernels, compiled at run time.

    import attncompiler as ac
    spec = ac.AttentionSpec(head_dim=128, score_mod=lambda s, b, h, q, k: 30 * torch.tanh(s / 30))
    kern = ac.compile(spec)          # plans, renders CUDA, compiles with NVRTC
    out = kern(q, k, v)              # q, k, v: (B, H, N, D) CUDA tensors
    print(kern.source, kern.plan.describe())
"""
from __future__ import annotations

from typing import Any

__all__ = [
    "AttentionSpec", "compile", "attention", "CompiledAttention", "presets", "ops", "reference_attention",
    "build_ir", "autotune", "__version__",
]

__version__ = "0.1.0"

_LAZY = {
    "AttentionSpec": ("attncompiler.spec.spec", "AttentionSpec"),
    "compile": ("attncompiler.api", "compile"),
    "attention": ("attncompiler.api", "attention"),
    "CompiledAttention": ("attncompiler.api", "CompiledAttention"),
    "presets": ("attncompiler.spec.presets", None),
    "ops": ("attncompiler.ops", None),
    "reference_attention": ("attncompiler.reference", "reference_attention"),
    "build_ir": ("attncompiler.ir.build", "build_ir"),
    "autotune": ("attncompiler.runtime.autotune", "autotune"),
}


def __getattr__(name: str) -> Any:
    # Lazy imports keep `import attncompiler` cheap and free of torch/sympy until used.
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        m = importlib.import_module(mod)
        return m if attr is None else getattr(m, attr)
    raise AttributeError(f"module 'attncompiler' has no attribute {name!r}")
