"""Check cases of :func:`dsv41_kernels.ops.mhc.hc_mix_stats.hc_mix_stats`, its example inputs and
accuracy measures, and the single-pass TF32 statistics the compensation is measured against."""

from __future__ import annotations

import functools

import torch

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32
from dsv41_kernels.ops.mhc.hc_mix_stats import (
    MIX_RTOL,
    MODULE,
    hc_mix_stats,
    hc_mix_stats_admission,
    launch,
)
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import (
    Numerics,
    Path,
    Projection,
    default_plan,
    make_plan,
)
from dsv41_kernels.reference.hc_mix_stats import HC_MIX, HC_MULT, hc_gates, hc_mix
from dsv41_kernels.reference.hc_mix_stats import hc_mix_stats as reference_mix_stats
from dsv41_kernels.reference.hc_mix_stats import split_tf32 as reference_split_tf32

OPS = ("hc_mix_stats", "split_tf32")
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""


def single_pass_tf32(x, fn, scale, base, *, return_mix: bool = False):
    """Upstream's numerics on our kernels: one TF32 pass over the raw ``fn`` (the tensor core
    truncates it), the compensated path's Triton launch shape, V4's defaults. Not an op path:
    what the tests and the benchmark measure the compensation against."""
    x2d = x.flatten(1)
    compensated = default_plan(Path.COMPENSATED, Projection.TRITON, *x2d.shape, x.device)
    plan = make_plan(compensated.path, compensated.projection, compensated.config, Numerics.TF32)
    return launch(
        x2d,
        fn,
        None,
        scale,
        base,
        plan,
        iters=20,
        rms_eps=1e-6,
        eps=1e-6,
        post_mult=2.0,
        return_mix=return_mix,
    )


def forced_admission(x, weights, mode: str, projection: Projection, config=None) -> Admission:
    """``hc_mix_stats_admission(x, weights, mode)`` with the projection's kernel (and, given, the
    launch shape ``config``) forced: what the tests and the benchmark compare the admitted
    plan against. ``mode`` names a path (not ``"auto"``)."""
    x2d = x.flatten(1)
    plan = default_plan(Path(mode), projection, *x2d.shape, x.device)
    if config is not None:
        plan = make_plan(plan.path, plan.projection, config)
    module = None if projection is Projection.TRITON else MODULE
    return admit(plan.kernel, f"{mode}: forced {plan.kernel}", module, plan)


def stats_relative_error(ours, ref) -> float:
    """The statistics' error against float64: the largest ``max|o - r| / max|r|`` over
    ``pre``, ``post`` and ``comb``."""
    return max(mix_relative_error(o, r) for o, r in zip(ours[:3], ref[:3], strict=True))


def mix_relative_error(mix: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|mix - ref| / max|ref|`` in float64: the projection's error relative to its scale."""
    ref = ref.double()
    return ((mix.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def stats_tolerances(mix_ref, scale, *, post_mult=2.0, mix_rtol=MIX_RTOL):
    """Absolute tolerances ``(mix, pre, post, comb)`` that a mix within ``mix_rtol`` implies.

    From ``δ = mix_rtol·max|mix_ref|``: σ' <= 1/4 gives ``|s0|·δ/4`` for ``pre`` and
    ``post_mult·|s1|·δ/4`` for ``post``; Sinkhorn moved at most 0.6 per unit of logit in
    float64 perturbation runs, bounded here by ``2·|s2|·δ``. Each adds fp32 rounding of the
    gates (measured <= 3e-7; Sinkhorn's 40 steps included)."""
    delta = mix_rtol * mix_ref.double().abs().max().item()
    s0, s1, s2 = scale.double().abs().tolist()
    return (delta, s0 * delta / 4 + 1e-6, post_mult * s1 * delta / 4 + 2e-6, 2 * s2 * delta + 4e-6)


def stats_mismatches(ours, ref, scale, *, post_mult=2.0, mix_rtol=MIX_RTOL) -> int:
    """Elements of ``(pre, post, comb, mix)`` farther from the float64 ``ref`` than tolerated."""
    mix_tol, pre_tol, post_tol, comb_tol = stats_tolerances(
        ref[3], scale, post_mult=post_mult, mix_rtol=mix_rtol
    )
    bad = 0
    for a, b, tol in zip(
        ours, (ref[0], ref[1], ref[2], ref[3]), (pre_tol, post_tol, comb_tol, mix_tol), strict=True
    ):
        bad += int(((a.double() - b.double()).abs() > tol).sum().item())
        bad += int((~torch.isfinite(a)).sum().item())
    return bad


def example_inputs(m: int, hidden: int, *, device, seed: int = 0):
    """``(x [m, 4·hidden] bf16, fn [24, 4·hidden], scale [3], base [24])`` with mix values of
    order one and ``fn`` using all 23 mantissa bits (so single-pass TF32 visibly truncates)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = HC_MULT * hidden
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    fn = torch.randn(HC_MIX, k, generator=gen) / k**0.5
    scale = 0.5 + torch.rand(3, generator=gen)
    base = 0.5 * torch.randn(HC_MIX, generator=gen)
    return tuple(t.to(device) for t in (x, fn, scale, base))


def reference_with_mix(x, fn, scale, base, *, dtype=torch.float64):
    """Float64 (or fp32) ``(pre, post, comb, mix)`` at V4's defaults."""
    mix = hc_mix(x.flatten(1), fn, dtype=dtype)
    return (*hc_gates(mix, scale, base), mix)


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    hidden = 40 if small else 5120
    shapes = (
        [(5, "auto"), (130, "auto"), (7, "batch_invariant")]
        if small
        else [(m, "auto") for m in (1, 6, 64, 128, 1024, 4096, 16384)]
        + [(6, "batch_invariant"), (4096, "batch_invariant")]
    )
    cases = []
    for m, mode in shapes:
        x, fn, scale, base = example_inputs(m, hidden, device=device, seed=m)
        weights = HcDerivedWeights(fn)
        run = functools.partial(hc_mix_stats, x, weights, scale, base, mode=mode, return_mix=True)
        cases.append(
            CheckCase(
                op="hc_mix_stats",
                shape=f"m={m} H={hidden} {mode}",
                admission=hc_mix_stats_admission(x, weights, mode),
                run=run,
                reference=functools.partial(reference_with_mix, x, fn, scale, base),
                mismatches=functools.partial(stats_mismatches, scale=scale),
                baseline=functools.partial(
                    reference_mix_stats, x, fn, scale, base, dtype=torch.float32
                ),
            )
        )
    return cases + split_tf32_cases(device, hidden)


def split_tf32_cases(device: torch.device, hidden: int) -> list[CheckCase]:
    """The derived weights' split of a mixing weight ``fn [24, 4H]`` holding ±0, ±Inf, NaN,
    subnormals and fp32's extremes."""
    gen = torch.Generator(device="cpu").manual_seed(71)
    fn = torch.randn(HC_MIX, HC_MULT * hidden, generator=gen) * 1e-2
    specials = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -3e-39, 3.4e38]
    fn.view(-1)[: len(specials)] = torch.tensor(specials)
    fn = fn.to(device)
    return [
        CheckCase(
            op="split_tf32",
            shape=f"[{HC_MIX}, {HC_MULT * hidden}] fp32",
            admission=refuse("torch bit operations on every device: no kernel to admit"),
            run=lambda: split_tf32(fn),
            reference=lambda: reference_split_tf32(fn),
            mismatches=bit_mismatches,
        )
    ]
