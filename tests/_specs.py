"""Shared by the CPU render / nvcc tests: every preset and example of the repository as an AttentionSpec."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import attncompiler as ac
from attncompiler.spec import presets

ROOT = Path(__file__).parent.parent
PRESET_NAMES = ("plain", "causal", "sliding_window", "alibi", "softcap", "prefix_lm", "document")


def example_specs(head_dim: int) -> dict[str, ac.AttentionSpec]:
    """``examples/*.py``'s ``make_spec(head_dim=...)``, keyed ``example:NAME``."""
    out = {}
    for path in sorted((ROOT / "examples").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"ex_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out[f"example:{path.stem}"] = mod.make_spec(head_dim=head_dim)
    return out


def all_specs(head_dim: int) -> dict[str, ac.AttentionSpec]:
    """Every preset (4 heads, seqlen 1024), causal attention with dropout 0.1, and every example."""
    specs = {n: presets.get_preset(n, head_dim=head_dim, num_heads=4, seqlen=1024) for n in PRESET_NAMES}
    specs["dropout"] = ac.AttentionSpec(head_dim=head_dim, dropout_p=0.1, causal=True, name="dropout")
    specs.update(example_specs(head_dim))
    return specs
