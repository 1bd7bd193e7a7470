"""Logit soft-capping (Gemma 2, Grok): score -> cap * tanh(score / cap), written with torch.tanh."""
import torch

import attncompiler as ac
from attncompiler.testing import run_example


def make_spec(head_dim: int = 128, cap: float = 30.0) -> ac.AttentionSpec:
    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return ac.AttentionSpec(head_dim=head_dim, score_mod=softcap, name="softcap")


def main() -> int:
    return run_example(make_spec())


if __name__ == "__main__":
    raise SystemExit(main())
