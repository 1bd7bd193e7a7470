"""Attention dropout, fused into the kernel.

The keep mask comes from Philox4x32-10 keyed by (seed, offset) and counted by (b, h, q, k); the
reference implements the same generator in torch, so the check below is exact, not statistical.
"""
import attncompiler as ac
from attncompiler.testing import run_example


def make_spec(head_dim: int = 64, p: float = 0.1) -> ac.AttentionSpec:
    return ac.AttentionSpec(head_dim=head_dim, dropout_p=p, causal=True, name="dropout")


def main() -> int:
    return run_example(make_spec())


if __name__ == "__main__":
    raise SystemExit(main())
