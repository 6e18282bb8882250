"""Check cases of :func:`dsv41_kernels.ops.mhc.hc_boundary.hc_boundary`: the fused boundary
against the three steps unfused, and its FP8 groups against SGLang's quantizer of its normed
rows."""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_boundary import HIDDEN, QUANT_GROUP, fallback, hc_boundary
from dsv41_kernels.ops.mhc.hc_boundary import hc_boundary_admission as admission_of
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0

OPS = ("hc_boundary",)
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""
EPS = 1e-6
SCALARS = dict(iters=20, rms_eps=EPS, eps=EPS, post_mult=2.0)


def boundary_inputs(m: int, *, seed: int, hidden: int = HIDDEN, device="cpu", special=False):
    """(y, residual, post, comb, pre, fn, scale, base, weight) as a verify step has them: post
    in (0, 2), comb and pre positive, streams and outputs of order one. ``special`` puts
    zeros, negative zeros, large and tiny values into y and the residual."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(m, hidden, generator=gen)
    residual = torch.randn(m, 4, hidden, generator=gen)
    if special:
        for t in (y, residual.view(m, -1)):
            idx = torch.randint(0, t.shape[1], (m, 64), generator=gen)
            values = torch.tensor([0.0, -0.0, 3.0e4, -3.0e4, 1e-30, -1e-38, 448.0, 2.0**-126])
            t.scatter_(1, idx, values[torch.randint(0, 8, (m, 64), generator=gen)])
    post = 2 * torch.rand(m, 4, generator=gen)
    comb = torch.rand(m, 4, 4, generator=gen)
    comb = comb / comb.sum(1, keepdim=True)
    pre = torch.rand(m, 4, generator=gen) + 1e-6
    _, fn, scale, base = example_inputs(1, hidden, device="cpu", seed=seed + 1)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).bfloat16()
    tensors = (y.bfloat16(), residual.bfloat16(), post, comb, pre, fn, scale, base, weight)
    return tuple(t.to(device) for t in tensors)


def flat(outputs) -> tuple:
    """``(updated, normed, (pre, post, comb))`` as one tuple of tensors."""
    updated, normed, stats = outputs
    return (updated, normed, *stats)


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    hidden, rows = (64, (2,)) if small else (5120, (1, 6, 64))
    cases = []
    for m in rows:
        args = boundary_inputs(m, seed=40 + m, hidden=hidden, device=device)
        quant_out = (
            torch.empty(m, hidden, dtype=torch.float8_e4m3fn, device=device),
            torch.empty(m, hidden // QUANT_GROUP, device=device),
        )
        unfused = lambda args=args: fallback(*args, EPS, SCALARS)  # noqa: E731

        def with_groups(args=args, quant_out=quant_out):
            return (*flat(hc_boundary(*args, norm_eps=EPS, quant_out=quant_out)), *quant_out)

        def unfused_groups(unfused=unfused):
            outputs = flat(unfused())
            return (*outputs, *group_quant_ue8m0(outputs[1], QUANT_GROUP))

        admission = admission_of(*args)
        shape = f"[{m}, 4, {hidden}] bf16"
        cases += [
            CheckCase(
                op="hc_boundary",
                shape=shape,
                admission=admission,
                run=lambda args=args: flat(hc_boundary(*args, norm_eps=EPS)),
                reference=lambda unfused=unfused: flat(unfused()),
                mismatches=bit_mismatches,
                baseline=unfused,
            ),
            CheckCase(
                op="hc_boundary",
                shape=f"{shape}, FP8 groups of {QUANT_GROUP}",
                admission=admission,
                run=with_groups,
                reference=unfused_groups,
                mismatches=bit_mismatches,
                baseline=unfused_groups,
            ),
        ]
    return cases
