"""Planning: GPU targets as data, and schedule plans (v1: FA1 block rule, v2: FA2 tile search, v3:
Hopper tiles; ``choose_auto``: what ``schedule="auto"`` picks)."""
from __future__ import annotations

from .model import Candidate, Plan, PlanError, ProblemDims
from .planner import (
    AutoChoice, IOReport, SCHEDULES, auto_schedule, choose_auto, format_candidates, format_io_report,
    format_resource_model, io_report, plan,
)
from .targets import TARGETS, Target, TargetError, detect_target, get_target, target_names
from .v1 import V1Plan, fa1_block_sizes, plan_v1
from .v2 import V2Plan, candidates_v2, plan_v2

__all__ = [
    "Target", "TargetError", "TARGETS", "get_target", "detect_target", "target_names",
    "Plan", "V1Plan", "V2Plan", "Candidate", "ProblemDims", "PlanError", "IOReport",
    "plan", "plan_v1", "plan_v2", "candidates_v2", "fa1_block_sizes", "auto_schedule", "choose_auto", "AutoChoice",
    "SCHEDULES",
    "io_report", "format_io_report", "format_candidates", "format_resource_model",
]
