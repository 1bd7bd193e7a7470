"""Helpers of the GPU tests of recorded launches (not a test module)."""
from __future__ import annotations

from typing import Sequence

import torch


def assert_recorded_grads(fast: Sequence[torch.Tensor], full: Sequence[torch.Tensor], first: Sequence[torch.Tensor],
                          deterministic: bool) -> None:
    """(dq, dk, dv) from a recorded backward against the full path on the same inputs: finite, not the recording
    call's own gradients (pointers patched), bit-identical where the summation order is fixed (dK, dV; dQ when
    ``deterministic``), else dQ within its atomic-order rounding."""
    for name, f, s, o in zip(("dq", "dk", "dv"), fast, full, first):
        assert torch.isfinite(f).all() and not torch.equal(f, o), f"{name}: the recording's pointers were not patched"
        if deterministic or name != "dq":
            assert torch.equal(f, s), f"{name}: recorded launch differs from the full path"
        else:
            torch.testing.assert_close(f, s, rtol=2e-2, atol=2e-2 * s.abs().max().item())
