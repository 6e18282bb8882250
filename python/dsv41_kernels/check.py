"""The cases ``dsv41-kernels check`` runs: every op against its reference, on the device present.

Each op module defines ``check_cases(device, small) -> list[CheckCase]``; :data:`OP_MODULES`
lists those modules. A case runs the op through its public function (so the path taken is
the one admission picks), compares with the reference, and on a GPU times ours against the
baseline it replaces under CUDA-graph replay.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from dsv41_kernels.admission import Admission

OP_MODULES = [
    "dsv41_kernels.ops.speculative.row_argmax",
    "dsv41_kernels.ops.speculative.accept_greedy",
    "dsv41_kernels.ops.attention.decoding_sched_meta",
    "dsv41_kernels.ops.quantization.mxfp8_quantize",
    "dsv41_kernels.ops.layernorm.hc_combine_norm",
    "dsv41_kernels.ops.moe.moe_fused_gate",
    "dsv41_kernels.ops.mhc.hc_mix_stats",
]


@dataclass
class CheckCase:
    op: str
    shape: str
    admission: Admission
    run: Callable[[], Any]
    reference: Callable[[], Any]
    mismatches: Callable[[Any, Any], int]
    """Elements of ours that differ from the reference (bits, or past the op's stated tolerance)."""
    baseline: Callable[[], Any] | None = None
    """What the op replaces (torch or upstream), timed beside ours on a GPU."""


def bit_mismatches(ours: Any, ref: Any) -> int:
    """Elements whose raw bits differ (NaN payloads included); tuples are summed per element."""
    if isinstance(ours, (tuple, list)):
        if len(ours) != len(ref):
            raise ValueError(f"ours has {len(ours)} outputs, the reference {len(ref)}")
        return sum(bit_mismatches(a, b) for a, b in zip(ours, ref))
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return max(ours.numel(), ref.numel(), 1)
    if ours.dtype.is_floating_point:
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[ours.element_size()]
        ours, ref = ours.view(view), ref.view(view)
    return int((ours != ref).sum().item())


def cases(device: torch.device, small: bool, only: Iterable[str] | None = None) -> list[CheckCase]:
    found = []
    for name in OP_MODULES:
        found += importlib.import_module(name).check_cases(device, small)
    if only:
        wanted = set(only)
        found = [c for c in found if c.op in wanted]
    return found


def run_case(case: CheckCase, *, timed: bool) -> dict:
    """One record. An op that raises counts as inexact, with the error as its reason; a timing
    that fails leaves its time empty and says why, without touching exactness."""
    us = baseline_us = None
    reason = case.admission.reason
    try:
        bad = case.mismatches(case.run(), case.reference())
    except Exception as e:
        bad, reason = -1, f"{reason}; error: {type(e).__name__}: {e}"[:200]
    if timed and bad == 0:
        from dsv41_kernels.timing import graph_time_us

        try:
            us = graph_time_us(case.run)
            baseline_us = graph_time_us(case.baseline) if case.baseline else None
        except Exception as e:
            reason = f"{reason}; timing failed: {type(e).__name__}: {e}"[:200]
    return {
        "op": case.op,
        "shape": case.shape,
        "path": case.admission.path,
        "reason": reason,
        "exact": bad == 0,
        "mismatches": bad,
        "us": us,
        "baseline_us": baseline_us,
    }
