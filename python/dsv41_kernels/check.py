"""The cases ``dsv41-kernels check`` runs: every op against its reference, on the device present.

Each module of :mod:`dsv41_kernels.cases` defines ``check_cases(device, small) ->
list[CheckCase]`` and ``OPS``, the op names its cases carry; :data:`CASE_MODULES` lists them.
A case runs the op through its public function (so the path taken is the one admission
picks), compares with the reference, and on a GPU times ours against the baseline it replaces
under CUDA-graph replay.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dsv41_kernels.cases import (
    accept_greedy,
    accept_greedy_epilogue,
    decoding_sched_meta,
    hc_boundary,
    hc_combine_norm,
    hc_mix_stats,
    inverse_rope_quant_fp8,
    moe_fused_gate,
    mxfp8_quantize,
    rmsnorm_quant_fp8,
    row_argmax,
    sharded_row_argmax,
)
from dsv41_kernels.cases.common import CheckCase
from dsv41_kernels.interpreter import triton_interpreter
from dsv41_kernels.jit import module_source
from dsv41_kernels.timing import graph_time_us

CASE_MODULES = (
    row_argmax,
    accept_greedy,
    accept_greedy_epilogue,
    sharded_row_argmax,
    decoding_sched_meta,
    mxfp8_quantize,
    hc_combine_norm,
    moe_fused_gate,
    hc_mix_stats,
    hc_boundary,
    inverse_rope_quant_fp8,
    rmsnorm_quant_fp8,
)


def op_names() -> tuple[str, ...]:
    """Every op name a check case carries, in the table's order."""
    return tuple(op for module in CASE_MODULES for op in module.OPS)


def cases(device: torch.device, small: bool, only: Iterable[str] | None = None) -> list[CheckCase]:
    """The cases of every op, or of the ops named in ``only`` (names from :func:`op_names`)."""
    wanted = set(only) if only else set(op_names())
    found = []
    for module in CASE_MODULES:
        if wanted.intersection(module.OPS):
            found += [c for c in module.check_cases(device, small) if c.op in wanted]
    return found


def mode(device: torch.device) -> str:
    """How the kernels run on ``device``: ``cuda``, ``triton interpreter`` or, on a CPU without
    the interpreter, ``fallbacks only``."""
    if triton_interpreter():
        return "triton interpreter"
    return "cuda" if device.type == "cuda" else "fallbacks only"


def run_case(case: CheckCase, *, timed: bool) -> dict:
    """One record. An op that raises counts as inexact, with the error as its reason; a timing
    that fails leaves its time empty and says why, without touching exactness. ``module``:
    where the CUDA module the op ran came from (prebuilt, cached or built now), None when
    it ran none."""
    us = baseline_us = None
    reason = case.admission.reason
    try:
        bad = case.mismatches(case.run(), case.reference())
    except Exception as e:
        bad, reason = -1, f"{reason}; error: {type(e).__name__}: {e}"[:200]
    if timed and bad == 0:
        try:
            us = graph_time_us(case.run)
            baseline_us = graph_time_us(case.baseline) if case.baseline else None
        except Exception as e:
            reason = f"{reason}; timing failed: {type(e).__name__}: {e}"[:200]
    return {
        "op": case.op,
        "shape": case.shape,
        "path": case.admission.path,
        "module": module_source(case.admission.module) if case.admission.module else None,
        "reason": reason,
        "exact": bad == 0,
        "mismatches": bad,
        "us": us,
        "baseline_us": baseline_us,
    }
