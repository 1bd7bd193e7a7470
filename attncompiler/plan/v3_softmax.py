"""v3 planning: how the consumer's main loop lays out its softmax and GEMMs (plan options ``softmax_copies``,
``late_pv_wait`` and ``half_blocks``).

Every K/V block either needs the masked softmax (a PARTIAL tile for the warpgroup's rows, or the ragged last
block) or not.  The kernel either keeps **two copies** of the softmax, one per kind, and branches on the block's
class before it (``V3Consumer::kTwoSoftmaxCopies``), or **one copy** with the branch around the mask pass alone.
With one copy ptxas hoists the main loop's wait for the previous block's P V above the exponentials (to the mask
pass's merge point), so the softmax never runs under that GEMM; ``late_pv_wait`` branches again right after the
softmax to keep the wait below it.  With two copies each copy is straight-line code and the wait stays below the
exponentials on its own.  The class is voted warp-uniform (``__any_sync``) in masked kernels: without the vote
ptxas treats the branch between the copies as divergent and guards every shuffle of the row reductions
(``BRA.DIV``, ``BSSY``), which made two copies slower than one before (thirty-first session).

``half_blocks``: a visited K/V block whose low or high half of keys the mask leaves EMPTY for a consumer
warpgroup's 64 rows (a causal diagonal, a sliding window's far edge) takes that warpgroup's S and P V GEMMs over
the other half only: a window of W keys then costs W + 64 + BLOCK_N / 2 keys per row instead of W + 128 + ...
with BLOCK_M = 128 (the two-consumer tile's floor at W = 1024: 1088 / 1025 instead of 1152 / 1025).

Pure functions over named constants; the numbers behind each constant are in its comment.
"""
from __future__ import annotations

from .model import PlanError

__all__ = ["LATE_PV_WAIT_DEFAULT", "LATE_PV_WAIT_MIN_DV", "LATE_PV_WAIT_MIN_DV_SEPARABLE", "MASK_TWO_COPIES_MAX_BN",
           "MASK_TWO_COPIES_MAX_DV", "SEPARABLE_TWO_COPIES_MIN_DV", "HALF_BLOCKS_DEFAULT", "softmax_layout",
           "half_blocks_choice"]

#: ``late_pv_wait``: in a kernel with one softmax copy the option branches right after the softmax on the block's
#: class (uniform over the warpgroup, as wgmma.wait_group's .aligned asks) and waits in both arms, which keeps the
#: wait below the exponentials (fixed-offset kernels, which never rescale, and two-copy kernels are unchanged).
#: Measured on an H200 (2026-11-28, N = 16k, bf16, `v3_sweep.py`, TFLOP/s, default -> option, two calls): d256
#: causal 681 -> 708 and 723 -> 722, a mask that hides nothing 697 -> 747 and 736 -> 758; ALiBi d128 1702 -> 1728
#: and 1731 -> 1798; ALiBi d64 1376 -> 1375; d128 causal 601 -> 598, sliding window 438 -> 430, document 1506 ->
#: 1499, d64 causal 443 -> 446 (flat to -2 %). A third call: d192 causal 692 -> 700, fullmask 720 -> 749; d160
#: causal 595 -> 592, d96 505 -> 503; d256 window 505 -> 512, document and ALiBi-causal d256 flat; ALiBi-causal
#: d128 1183 -> 1180. An earlier form that voted over the warpgroup with a named barrier lost 1-3 % at d64 / d128.
#: So it is on by default from LATE_PV_WAIT_MIN_DV on, and for a separable score_mod without a mask (ALiBi) from
#: LATE_PV_WAIT_MIN_DV_SEPARABLE.
LATE_PV_WAIT_DEFAULT = True
LATE_PV_WAIT_MIN_DV = 192
LATE_PV_WAIT_MIN_DV_SEPARABLE = 128
#: Two softmax copies in a masked kernel (no score_mod or a non-separable one, no fixed offset) where BLOCK_N and
#: DV are at most these: the S and O accumulators then leave room for the second copy. Measured on an H200
#: (2026-11-29, N = 16k, bf16, `benchmarks/run_mask_copies.sh`, 5 interleaved rounds, TFLOP/s, one copy -> two
#: copies with the voted class): sliding window 1024 d128 467.5 -> 488.9 (BN 128), d64 330.5 -> 342.6; causal d128
#: 607.4 -> 619.7 (BN 128); document d128 1504.5 -> 1524.6; a mask that hides nothing d128 593.4 -> 607.9 (plain
#: 659.4); but causal d64 (BN 192) 446.0 -> 437.5 and causal d256 (BN 80, DV 256, late_pv_wait) 717.6 -> 693.7.
#: Traces (`v3_trace.py`): the window's main loop per block 1.59 -> 1.53 us, the all-FULL mask's 1.55 -> 1.46
#: (plain 1.43). A second call (`run_copies_check.sh`, 3 rounds, the option in the planner): causal d128 613.3 ->
#: 627.8, sliding window d128 474.4 -> 475.8 (its rounds spread 444-484).
MASK_TWO_COPIES_MAX_BN = 128
MASK_TWO_COPIES_MAX_DV = 128
#: Without a mask the masked softmax serves only the ragged last block: two copies, except for a separable
#: score_mod (ALiBi) below this DV. Measured on the H200 (same process, N = 16k), two copies vs one, TFLOP/s:
#: plain d256 722 vs 693, softcap d128 535 vs 510, plain d128 636 vs 633; ALiBi d64 412 vs 432, d128 562 vs 581,
#: d256 663 vs 647.
SEPARABLE_TWO_COPIES_MIN_DV = 256


def softmax_layout(*, masked: bool, separable: bool, static: bool, block_n: int, dv: int,
                   softmax_copies: int | None, late_pv_wait: bool | None) -> tuple[int, bool, list[str]]:
    """(softmax copies, late_pv_wait, reasons) for a v3 plan.

    ``masked``: the spec has a mask; ``separable``: a separable score_mod (ALiBi), masked or not; ``static``: a
    fixed row offset (bounded score_mod, softcap); ``softmax_copies`` / ``late_pv_wait``: forced values or None.
    """
    if softmax_copies is not None and (type(softmax_copies) is not int or softmax_copies not in (1, 2)):
        raise PlanError(f"v3: expected softmax_copies 1 or 2, got {softmax_copies!r}")
    if late_pv_wait is not None and not isinstance(late_pv_wait, bool):
        raise PlanError(f"v3: expected late_pv_wait a bool, got {late_pv_wait!r}")
    reasons: list[str] = []
    if softmax_copies is not None:
        copies = softmax_copies
        reasons.append(f"{copies} softmax cop{'ies' if copies == 2 else 'y'} (forced)")
    elif masked:
        fits = block_n <= MASK_TWO_COPIES_MAX_BN and dv <= MASK_TWO_COPIES_MAX_DV
        copies = 2 if fits and not separable and not static else 1
        if copies == 2:
            reasons.append(f"two softmax copies, masked and unmasked, chosen per block by its class voted "
                           f"warp-uniform (a mask, BLOCK_N {block_n} <= MASK_TWO_COPIES_MAX_BN = "
                           f"{MASK_TWO_COPIES_MAX_BN}, DV {dv} <= MASK_TWO_COPIES_MAX_DV = {MASK_TWO_COPIES_MAX_DV})")
        else:
            why = ("a separable score_mod" if separable else "a fixed row offset" if static else
                   f"BLOCK_N {block_n} > MASK_TWO_COPIES_MAX_BN = {MASK_TWO_COPIES_MAX_BN}"
                   if block_n > MASK_TWO_COPIES_MAX_BN else
                   f"DV {dv} > MASK_TWO_COPIES_MAX_DV = {MASK_TWO_COPIES_MAX_DV}")
            reasons.append(f"one softmax copy, the branch around the mask pass alone ({why})")
    else:
        copies = 1 if separable and dv < SEPARABLE_TWO_COPIES_MIN_DV else 2
        reasons.append(f"one softmax copy (a separable score_mod, DV {dv} < SEPARABLE_TWO_COPIES_MIN_DV = "
                       f"{SEPARABLE_TWO_COPIES_MIN_DV})" if copies == 1 else
                       "two softmax copies (the masked one serves only the ragged last block)")
    # where late_pv_wait acts: one softmax copy and a moving row offset
    one_copy = copies == 1 and not static
    min_name, min_dv = (("LATE_PV_WAIT_MIN_DV_SEPARABLE", LATE_PV_WAIT_MIN_DV_SEPARABLE) if separable and not masked
                        else ("LATE_PV_WAIT_MIN_DV", LATE_PV_WAIT_MIN_DV))
    late = (LATE_PV_WAIT_DEFAULT and one_copy and dv >= min_dv) if late_pv_wait is None else late_pv_wait
    if late and one_copy:
        reasons.append(f"the previous block's P V waited for below the softmax (late_pv_wait"
                       f"{' forced' if late_pv_wait else f': DV = {dv} >= {min_name} = {min_dv}'}; "
                       f"a branch on the block's class right after the softmax)")
    elif late:
        reasons.append("late_pv_wait forced, without effect here (two softmax copies or a fixed offset: the wait "
                       "already stays below the softmax)")
    elif one_copy:
        reasons.append(f"the previous block's P V waited for where ptxas puts it (late_pv_wait off: DV = {dv} < "
                       f"{min_name} = {min_dv}, where it measured flat or slower)"
                       if late_pv_wait is None else "late_pv_wait off (forced)")
    return copies, late, reasons


#: ``half_blocks`` is off unless asked for (the autotuner tries it for masks): it computes less but measured slower.
#: H200, 2026-11-29, `benchmarks/run_half_blocks.sh`, N = 16k, bf16, 3 interleaved rounds, TFLOP/s, default ->
#: half_blocks: sliding window 1024 d128 469.1 -> 454.3, d64 343.8 -> 306.7 (BLOCK_N 128 both), causal d128
#: 634.6 -> 597.7. The main loop is not bound by the tensor cores' work there: the half GEMMs' arms and copies
#: (take_half) and the fences ptxas injects around them (C7519) cost more than the half GEMMs save.
HALF_BLOCKS_DEFAULT = False


def half_blocks_choice(*, masked: bool, block_n: int, half_blocks: bool | None) -> tuple[bool, str | None]:
    """(half_blocks, reason or None): forced on only with a mask and BLOCK_N a multiple of 32 (each half a whole
    number of P V k16 steps), refused otherwise with what was expected; by default HALF_BLOCKS_DEFAULT where it
    applies."""
    if half_blocks is not None and not isinstance(half_blocks, bool):
        raise PlanError(f"v3: expected half_blocks a bool, got {half_blocks!r}")
    if half_blocks is None:
        on = HALF_BLOCKS_DEFAULT and masked and block_n % 32 == 0
        return on, ("half blocks (HALF_BLOCKS_DEFAULT)" if on else None)
    if half_blocks:
        if not masked:
            raise PlanError("v3: half_blocks expected a mask (the halves it may leave EMPTY), got a spec without one")
        if block_n % 32:
            raise PlanError(f"v3: half_blocks expected BLOCK_N a multiple of 32 (two halves of whole k16 steps), "
                            f"got {block_n}")
        return True, (f"half blocks (forced): a K/V block whose low or high {block_n // 2} keys are EMPTY for a "
                      f"consumer warpgroup's rows takes its GEMMs over the other half only")
    return False, None
