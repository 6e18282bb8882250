"""Launch shapes of ``inverse_rope_quant_fp8``'s two kernels, for the benchmark's ``--sweep``.

Each shape is an :class:`InverseRopeQuantPlan` handed to the op's launcher, as its admission's
plan would be: the Triton kernel at groups a program x warps, the CUDA kernel at warps a CTA x
groups a warp. Every shape must give the bits of the default launch; each is checked so before
it is timed.
"""

from __future__ import annotations

import torch
import triton
from common import timed

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.inverse_rope_quant_fp8 import AttentionOutput, same_layout
from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import (
    CUDA,
    CUDA_GROUP_SIZE,
    InverseRopeQuantKernel,
    InverseRopeQuantPlan,
    inverse_rope_quant_fp8,
    inverse_rope_quant_fp8_admission,
    launch,
)

OP = "inverse_rope_quant_fp8"
SWEEP_BLOCK_GROUPS = (1, 2, 4, 8, 16, 32)
SWEEP_WARPS = (1, 2, 4, 8)
SWEEP_WARP_GROUPS = (1, 2, 4)
"""The Triton kernel's launch shapes in the sweep (groups a program x warps); the CUDA
kernel's: SWEEP_WARPS warps a CTA x SWEEP_WARP_GROUPS groups a warp."""


def launch_shapes(o: torch.Tensor, *, cuda: bool) -> list[tuple[str, InverseRopeQuantPlan]]:
    """(arm, plan) of every shape swept for ``o`` at group size 128; the CUDA kernel's only
    where it runs (``cuda``: sm_90+ with the module at hand)."""
    groups_per_token = o.shape[1] * o.shape[2] // CUDA_GROUP_SIZE
    triton_kernel, cuda_kernel = InverseRopeQuantKernel.TRITON, InverseRopeQuantKernel.CUDA
    shapes = [
        (f"triton {g} groups x {w} warps",
         InverseRopeQuantPlan(triton_kernel, w, min(triton.next_power_of_2(groups_per_token), g)))
        for g in SWEEP_BLOCK_GROUPS
        for w in SWEEP_WARPS
        if 32 * w <= g * 64  # at least a pair a thread
    ]  # fmt: skip
    if cuda:
        shapes += [
            (f"cuda {w} warps x {g} groups", InverseRopeQuantPlan(cuda_kernel, w, g))
            for w in SWEEP_WARPS
            for g in SWEEP_WARP_GROUPS
        ]
    return shapes


def sweep(call: AttentionOutput, shape: str) -> list[dict]:
    """Both kernels at every launch shape on one call (``rotate_o``, the CUDA kernel with
    ``tables_ready``), each checked bitwise against the default launch first: the shape must
    not change the bits."""
    table, positions, groups = call.freqs_cis, call.positions, call.o_groups
    want_o = same_layout(call.o)
    want = inverse_rope_quant_fp8(want_o, table, positions, o_groups=groups, rotate_o=True)
    kernel = inverse_rope_quant_fp8_admission(want_o, table, positions, o_groups=groups).kernel

    def run(plan, o, out):
        launch(plan, o, table, positions, *out, group_size=CUDA_GROUP_SIZE, rotate_o=True,
               tables_ready=True)  # fmt: skip

    records = []
    for arm, plan in launch_shapes(call.o, cuda=kernel == CUDA):
        outputs = tuple(torch.empty_like(t) for t in want)
        got_o = same_layout(call.o)
        run(plan, got_o, outputs)
        exact = bit_mismatches((*outputs, got_o), (*want, want_o)) == 0
        work = same_layout(call.o)
        records.append(
            timed(OP, shape, arm, lambda p=plan, o=work, out=outputs: run(p, o, out), exact=exact)
        )
    return records
