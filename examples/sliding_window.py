"""Causal sliding-window attention (Mistral): each query sees itself and the `window` keys before it.

Only the tiles along the diagonal band run; the planner's tile classifier proves the others empty.
"""
import attncompiler as ac
from attncompiler.spec import presets
from attncompiler.testing import run_example


def make_spec(head_dim: int = 128, window: int = 100) -> ac.AttentionSpec:
    return presets.sliding_window(window, head_dim=head_dim)


def main() -> int:
    return run_example(make_spec())


if __name__ == "__main__":
    raise SystemExit(main())
