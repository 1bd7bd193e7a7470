"""Causal attention as a FlexAttention-style mask_mod.

The compiler bounds ``q_idx >= kv_idx`` over each (query block, key block) tile: tiles above the
diagonal are skipped, tiles below it run without evaluating the mask at all.
"""
import attncompiler as ac
from attncompiler.testing import run_example


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def make_spec(head_dim: int = 128) -> ac.AttentionSpec:
    return ac.AttentionSpec(head_dim=head_dim, mask_mod=causal_mask, name="causal")


def main() -> int:
    return run_example(make_spec())


if __name__ == "__main__":
    raise SystemExit(main())
