"""Document masking for packed sequences: a query sees only keys of its own document.

The document ids are a captured int tensor, indexed inside the mask as doc[q_idx] == doc[kv_idx].
"""
import torch

import attncompiler as ac
from attncompiler.testing import run_example

SEQLEN = 1023


def make_spec(head_dim: int = 128, seqlen: int = SEQLEN) -> ac.AttentionSpec:
    lengths = [300, 17, 450, seqlen - 767]  # uneven documents
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(torch.int32)

    def same_document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    return ac.AttentionSpec(head_dim=head_dim, mask_mod=same_document, name="document")


def main() -> int:
    return run_example(make_spec(), seqlens=(SEQLEN,))


if __name__ == "__main__":
    raise SystemExit(main())
