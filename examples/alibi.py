"""ALiBi: a per-head linear bias, read from a captured tensor of slopes inside the score_mod."""
import torch

import attncompiler as ac
from attncompiler.testing import run_example

NUM_HEADS = 4


def make_spec(head_dim: int = 128, num_heads: int = NUM_HEADS) -> ac.AttentionSpec:
    slopes = torch.exp2(-8.0 * torch.arange(1, num_heads + 1) / num_heads)  # captured: becomes a kernel buffer

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return ac.AttentionSpec(head_dim=head_dim, score_mod=alibi, causal=True, name="alibi")


def main() -> int:
    return run_example(make_spec(), H=NUM_HEADS)


if __name__ == "__main__":
    raise SystemExit(main())
