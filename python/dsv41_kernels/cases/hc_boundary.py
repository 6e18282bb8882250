"""Check cases of the mHC boundary ops, :func:`dsv41_kernels.ops.mhc.hc_boundary.hc_boundary`
and :func:`dsv41_kernels.ops.mhc.hc_post_combine_norm.hc_post_combine_norm`: each fused
boundary against its steps unfused, and its FP8 groups against SGLang's quantizer of its normed
rows."""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc import hc_post_combine_norm as post_form
from dsv41_kernels.ops.mhc.hc_boundary import HIDDEN, fallback, hc_boundary
from dsv41_kernels.ops.mhc.hc_boundary import hc_boundary_admission as admission_of
from dsv41_kernels.ops.mhc.quant_out import QUANT_GROUP, empty_quant_out
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0

OPS = ("hc_boundary", "hc_post_combine_norm")
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


def with_groups(outputs: tuple) -> tuple:
    """A boundary's ``outputs`` (``updated, normed, ...``) and SGLang's quantizer of ``normed``."""
    return (*outputs, *group_quant_ue8m0(outputs[1], QUANT_GROUP))


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    hidden, rows = (64, (2,)) if small else (5120, (1, 6, 64))
    cases = []
    for m in rows:
        args = boundary_inputs(m, seed=40 + m, hidden=hidden, device=device)
        shape = f"[{m}, 4, {hidden}] bf16"
        grouped = f"{shape}, FP8 groups of {QUANT_GROUP}"
        unfused = lambda args=args: flat(fallback(*args, EPS, SCALARS))  # noqa: E731
        fused = lambda args=args, **kw: flat(hc_boundary(*args, norm_eps=EPS, **kw))  # noqa: E731
        post_args = (*args[:5], args[8], EPS)  # y, residual, post, comb, pre, weight, eps
        post_unfused = lambda a=post_args: post_form.fallback(*a)  # noqa: E731
        post_fused = lambda a=post_args, **kw: post_form.hc_post_combine_norm(*a, **kw)  # noqa: E731
        forms = (
            ("hc_boundary", admission_of(*args), fused, unfused),
            ("hc_post_combine_norm", post_form.hc_post_combine_norm_admission(*post_args[:6]),
             post_fused, post_unfused),
        )  # fmt: skip
        for op, admission, run, reference in forms:
            q = empty_quant_out(m, hidden, device)
            ours_groups = lambda run=run, q=q: (*run(quant_out=q), *q)  # noqa: E731
            reference_groups = lambda reference=reference: with_groups(reference())  # noqa: E731
            cases += [
                CheckCase(op, shape, admission, run, reference, bit_mismatches, baseline=reference),
                CheckCase(op, grouped, admission, ours_groups, reference_groups, bit_mismatches,
                          baseline=reference_groups),
            ]  # fmt: skip
    return cases
