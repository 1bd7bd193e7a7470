"""CPU: the short-sequence rule (plan/short.py) and which kernels carry it (api.compile's ``auto_short``)."""
from __future__ import annotations

from types import SimpleNamespace

import attncompiler as ac
from attncompiler.plan.model import PlanError
from attncompiler.plan.short import SHORT_BLOCK_M, short_applies, short_reason
from attncompiler.spec import presets


def test_rule_applies_to_tall_v3_tiles_at_few_queries() -> None:
    tall = SimpleNamespace(block_m=128)
    assert short_applies("v3", tall, 1)[0] and short_applies("v3", tall, SHORT_BLOCK_M)[0]
    ok, why = short_applies("v3", tall, SHORT_BLOCK_M + 1)
    assert not ok and "Nq=65 > 64" in why
    assert not short_applies("v3", SimpleNamespace(block_m=64), 10)[0]  # already one warpgroup's rows
    assert not short_applies("v2", tall, 10)[0]  # v2: unmeasured where auto takes it


def test_reason_only_where_the_64_row_plan_exists() -> None:
    def refuse(**_: int) -> None:
        raise PlanError("no")

    tall = SimpleNamespace(block_m=192)
    assert "Nq <= 64 run v3 at BLOCK_M = 64" in short_reason(lambda **o: None, "v3", tall)
    assert short_reason(refuse, "v3", tall) is None
    assert short_reason(lambda **o: None, "v3", SimpleNamespace(block_m=64)) is None


def test_auto_kernels_carry_the_rule_and_forced_ones_do_not() -> None:
    auto = ac.compile(presets.plain(64), target="sm_90", build=False)
    assert auto.schedule == "v3" and auto.auto_short and auto.plan.block_m > SHORT_BLOCK_M
    assert any("BLOCK_M = 64 instead" in r for r in auto.plan.reasons)
    sib = auto._short_kernel(49)
    assert sib is not None and sib.schedule == "v3" and sib.plan.block_m == SHORT_BLOCK_M and not sib.auto_short
    assert auto._short_kernel(49) is sib  # compiled once
    assert auto._short_kernel(65) is None
    for forced in (ac.compile(presets.plain(64), target="sm_90", build=False, block_m=128),
                   ac.compile(presets.plain(64), "v3", target="sm_90", build=False)):
        assert not forced.auto_short and forced._short_kernel(49) is None
        assert not any("BLOCK_M = 64 instead" in r for r in forced.plan.reasons)
    assert ac.compile(presets.plain(64), target="sm_80", build=False)._short_kernel(49) is None  # v2 there


def test_a_variant_without_a_64_row_plan_keeps_its_own() -> None:
    kern = ac.compile(presets.alibi(presets.alibi_slopes(8), 256), target="sm_90", build=False)
    assert not any("BLOCK_M = 64 instead" in r for r in kern.plan.reasons)
    assert kern._short_kernel(49) is None and not kern.auto_short


def test_a_plan_already_64_rows_tall_carries_no_rule() -> None:
    kern = ac.compile(presets.sliding_window(256, 64), target="sm_90", build=False)  # the band picks 64-row tiles
    assert kern.schedule == "v3" and kern.plan.block_m == SHORT_BLOCK_M and not kern.auto_short
    assert kern._short_kernel(49) is None
