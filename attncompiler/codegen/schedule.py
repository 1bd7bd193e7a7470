"""Schedules: how an AttentionIR becomes a kernel (plan -> CUDA source -> launch geometry).

Halide's split: the IR says *what*, a schedule says *how*.  Each schedule is one module in this
package exposing ``SCHEDULE`` (a :class:`Schedule`); adding one is one new file plus one line in
:data:`_MODULES`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..ir.types import AttentionIR
from ..plan.model import Plan
from ..plan.targets import Target
from ..runtime.launch import AttnInputs

__all__ = ["Schedule", "KernelSource", "get_schedule", "schedule_names", "ScheduleError"]

# name -> module (relative to this package) holding SCHEDULE
_MODULES: dict[str, str] = {"v1": ".v1", "v2": ".v2", "decode": ".decode", "v3": ".v3"}


class ScheduleError(ValueError):
    """Unknown schedule, or a schedule asked for on a target it cannot run on."""


@dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: the CUDA translation unit and everything needed to launch it."""

    schedule: str
    entry: str
    arch: str  # NVRTC / nvcc target, e.g. "sm_90" or "sm_90a"
    source: str
    plan: Plan
    threads: int
    smem_bytes: int
    #: what the launch needs beyond the plan (v3 with ``tile_list``: the mask's K/V range, for the tiles' costs);
    #: not part of the kernel's identity
    launch_info: Any = field(default=None, compare=False, repr=False)


class Schedule(Protocol):
    """What every schedule provides.  Optional: ``forward_launch(ks, dims, buffers, device)``, the call's launch
    (:class:`attncompiler.runtime.fastpath.Launch`) where it is more than the one kernel with (params, buffers)
    (v3: its TMA maps and tile list; decode: split and combine), and ``prepare_forward(ks, dims, params, q, k, v)``
    to fill per-call parameters derived from the inputs (v2, v3: the score skip's bound), returning what must
    stay alive until the launch is queued."""

    name: str

    def make_plan(self, ir: AttentionIR, target: Target, **options: Any) -> Plan: ...

    def render(self, ir: AttentionIR, plan: Plan, target: Target) -> KernelSource: ...

    def grid(self, ks: KernelSource, dims: AttnInputs) -> tuple[int, int, int]: ...

    def workspace_floats(self, ks: KernelSource, dims: AttnInputs) -> int: ...


def schedule_names() -> tuple[str, ...]:
    return tuple(_MODULES)


def get_schedule(name: str) -> Schedule:
    if name not in _MODULES:
        raise ScheduleError(f"unknown schedule {name!r}; expected one of {', '.join(_MODULES)} or 'auto'")
    return importlib.import_module(_MODULES[name], __package__).SCHEDULE
