"""The mHC boundary in one launch: the post of sublayer l, the mixing statistics of its result
for sublayer l + 1, and sublayer l + 1's combine + RMSNorm.

Between two sublayers DeepSeek-V4.1 rebuilds the four residual streams (the post), predicts the
next hyper-connection's ``(pre, post, comb)`` from them (the statistics) and collapses them into
the next sublayer's input (the combine + RMSNorm, with the gates ``pre`` of the previous
statistics: SGLang's lag). At decode and verify sizes each step is a few hundred nanoseconds of
memory traffic behind its own launch and a grid-wide dependency; here they are one kernel
(``sgl-kernel/csrc/hc_boundary.cu``): one cooperative grid, or a dependent pair of grids whose
kernel boundary is the barrier.

Contract (``y [m, H]`` bf16, ``residual [m, 4, H]`` bf16, ``post [m, 4]`` and ``comb [m, 4, 4]``
fp32 (this boundary's triplet), ``pre [m, 4]`` fp32 (the next combine's gates), ``fn [24, 4H]``,
``scale [3]``, ``base [24]`` fp32 (the next statistics'), ``weight [H]`` bf16 (the next norm's)):

- ``updated`` is **bitwise** SGLang 0.5.23's post
  (:func:`dsv41_kernels.reference.hc_boundary.sglang_post`: the fp32 fma chain of its SM90
  kernels, round to nearest even to bf16) for finite values; a NaN stays NaN, its payload
  is not part of the contract (the kernel rounds as SGLang's store does, the torch statement
  stores 0x7FC0);
- the statistics ``(pre', post', comb')`` are **bitwise** :func:`~.hc_mix_stats.hc_mix_stats`
  of ``updated`` (its small-row path, ``mode="auto"`` below 128 rows), and ``normed`` is
  **bitwise** :func:`~.hc_combine_norm.hc_combine_norm` of ``updated`` with ``pre`` and
  ``weight``: on the kernel path the fused kernel shares those ops' kernels' orders (the
  small-row statistics kernel is the same source; the combine is ``hc_combine_norm.cu``'s
  one-CTA shape, which has its cluster shape's bits); the fallback runs the three ops unfused;
- with ``quant_out``, also ``normed``'s e4m3 groups of 32 and their power-of-two scales,
  **bitwise** SGLang 0.5.23's ``sglang_per_token_group_quant_fp8(normed, 32,
  scale_ue8m0=True)`` on SM90 (:mod:`.quant_out`: what the next sublayer's block-FP8 linear
  would compute from these rows), in the same launch.

The kernel runs (:func:`hc_boundary_admission`) on CUDA with the small-row statistics kernel
(:func:`~.hc_mix_stats_plan.rows_kernel_fits`: sm_90+, at least 128 SMs, H = 5120, 1..64 rows,
where ``hc_mix_stats`` runs that kernel too),
contiguous inputs and 16-byte aligned rows; elsewhere the fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_float,
    check_int,
    check_tensor,
    invalid,
    refuse,
)
from dsv41_kernels.devices import cuda_index
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc import hc_mix_stats_plan
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm
from dsv41_kernels.ops.mhc.hc_mix_stats import (
    MAX_SINKHORN_ITERS,
    hc_mix_stats,
    hc_mix_stats_admission,
)
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import (
    ROWS_KERNEL_K,
    ROWS_KERNEL_SLICES,
    Projection,
    rows_kernel_fits,
    rows_kernel_tile,
)
from dsv41_kernels.ops.mhc.hc_post_combine_norm import validate_post
from dsv41_kernels.ops.mhc.quant_out import fill_quant_out, no_quant_out, validate_quant_out
from dsv41_kernels.reference.hc_boundary import sglang_post
from dsv41_kernels.reference.hc_mix_stats import HC_MIX, HC_MULT

MODULE = "hc_boundary"  # sgl-kernel/csrc/hc_boundary.cu
KERNEL = "cuda"
HIDDEN = ROWS_KERNEL_K // HC_MULT  # the kernel's one hidden size


@dataclass(frozen=True)
class BoundaryPlan:
    """What runs: the small-row statistics' kernel with the post and the combine, its rows a
    pass (:func:`~.hc_mix_stats_plan.rows_kernel_tile`), launched as the small-row statistics
    are (``dependent``: the dependent pair, else one cooperative grid;
    :data:`~.hc_mix_stats_plan.ROWS_KERNEL_DEPENDENT`)."""

    row_tile: int
    dependent: bool
    kernel: str = KERNEL


def _validate(y, residual, post, comb, pre, fn, scale, base, weight) -> None:
    """ValueError naming the first argument that is off (shapes, dtypes, devices)."""
    validate_post(y, residual, post, comb, pre, weight)
    h = y.shape[1]
    shapes = {"fn": (fn, (HC_MIX, HC_MULT * h)), "scale": (scale, (3,)), "base": (base, (HC_MIX,))}
    for name, (t, shape) in shapes.items():
        check_tensor(name, t, dtypes=(torch.float32,))
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)}, got {tuple(t.shape)}")
        if t.device != y.device:
            raise ValueError(f"{name} is on {t.device}, y on {y.device}")


def _fits(y, residual, post, comb, pre, fn, scale, base, weight) -> str | None:
    """Why the kernel cannot take these (valid) arguments, or None."""
    aligned = lambda t: t.data_ptr() % 16 == 0
    # stride(0) too: torch calls a one-row tensor contiguous whatever its row stride.
    if not (residual.is_contiguous() and aligned(residual) and residual.stride(0) * 2 % 16 == 0):
        return "residual is not contiguous and 16-byte aligned"
    x_like = residual.flatten(1)  # a view: the admission allocates nothing
    if not rows_kernel_fits(x_like, fn):
        return "the small-row statistics kernel does not fit (sm_90+, 128+ SMs, H 5120, 1-64 rows)"
    stats = hc_mix_stats_admission(x_like, fn)
    if not (stats and stats.plan.projection is Projection.CUDA_FP32):
        return f"hc_mix_stats would not run the small-row kernel here ({stats.reason})"
    if not (y.stride(1) == 1 and aligned(y) and y.stride(0) * 2 % 16 == 0):
        return "y rows are not unit-stride and 16-byte aligned"
    if not all(t.is_contiguous() for t in (post, comb, pre, scale, base)):
        return "post, comb, pre, scale or base is not contiguous"
    if not (weight.is_contiguous() and aligned(weight)):
        return "weight is not contiguous and 16-byte aligned"
    return None


def hc_boundary_admission(y, residual, post, comb, pre, fn, scale, base, weight) -> Admission:
    """Whether the fused kernel runs (pure: shapes, strides, dtypes, devices; never raises)."""
    try:
        _validate(y, residual, post, comb, pre, fn, scale, base, weight)
    except ValueError as e:
        return invalid(e)
    if not y.is_cuda:
        return refuse(f"{y.device.type} tensors: the kernel is CUDA only")
    why = _fits(y, residual, post, comb, pre, fn, scale, base, weight)
    if why is not None:
        return refuse(why)
    plan = BoundaryPlan(rows_kernel_tile(y.shape[0]), hc_mix_stats_plan.ROWS_KERNEL_DEPENDENT)
    return admit(KERNEL, f"{KERNEL}: {y.shape[0]} rows, row tile {plan.row_tile}", MODULE, plan)


def hc_boundary(
    y: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    pre: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    weight: torch.Tensor,
    *,
    iters: int = 20,
    rms_eps: float = 1e-6,
    eps: float = 1e-6,
    post_mult: float = 2.0,
    norm_eps: float = 1e-6,
    admission: Admission | None = None,
    quant_out: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """``(updated [m, 4, H] bf16, normed [m, H] bf16, (pre' [m, 4], post' [m, 4], comb' [m, 4,
    4]))``: the post, then the next sublayer's input and statistics (see the module).

    Args:
        y: the sublayer's output ``[m, H]`` bf16. residual: the streams it joins ``[m, 4, H]``.
        post, comb: this boundary's triplet (fp32). pre: the next combine's gates (fp32).
        fn, scale, base: the next statistics' weights (fp32; fn the raw ``[24, 4H]``).
        weight: the next norm's weight ``[H]`` bf16.
        iters, rms_eps, eps, post_mult: the statistics' (V4's 20, 1e-6, 1e-6, 2.0);
        norm_eps: the norm's epsilon.
        admission: this call's :func:`hc_boundary_admission`, when the caller made it.
        quant_out: ``(q, scales)`` to fill with ``normed``'s FP8 groups: ``q`` float8_e4m3fn
            ``[m, H]`` and ``scales`` fp32 ``[m, H / 32]``, contiguous, apart from the inputs.
    """
    admission = check_admission(admission)
    if admission is None or not admission:
        _validate(y, residual, post, comb, pre, fn, scale, base, weight)
        if admission is None:
            admission = hc_boundary_admission(y, residual, post, comb, pre, fn, scale, base, weight)
    if quant_out is not None:
        inputs = dict(y=y, residual=residual, post=post, comb=comb, pre=pre, fn=fn, scale=scale,
                      base=base, weight=weight)  # fmt: skip
        validate_quant_out(quant_out, *y.shape, y.device, inputs)
    iters = check_int("iters", iters, low=1, high=MAX_SINKHORN_ITERS)
    rms_eps, eps, post_mult, norm_eps = (
        check_float(name, value)
        for name, value in (
            ("rms_eps", rms_eps), ("eps", eps), ("post_mult", post_mult), ("norm_eps", norm_eps)
        )
    )  # fmt: skip
    scalars = dict(iters=iters, rms_eps=rms_eps, eps=eps, post_mult=post_mult)
    if not admission:
        updated, normed, stats = fallback(
            y, residual, post, comb, pre, fn, scale, base, weight, norm_eps, scalars
        )
        if quant_out is not None:
            fill_quant_out(quant_out, normed)
        return updated, normed, stats
    m, h = y.shape
    updated = torch.empty((m, HC_MULT, h), dtype=torch.bfloat16, device=y.device)
    normed = torch.empty((m, h), dtype=torch.bfloat16, device=y.device)
    stats = [torch.empty((m, *shape), dtype=torch.float32, device=y.device) for shape in
             ((HC_MULT,), (HC_MULT,), (HC_MULT, HC_MULT), (HC_MIX,))]  # fmt: skip
    part = torch.empty((m, ROWS_KERNEL_SLICES, HC_MIX + 1), dtype=torch.float32, device=y.device)
    module = load_module(MODULE, cuda_index(y.device))
    q, q_scales = quant_out if quant_out is not None else no_quant_out(y.device, h)
    module.hc_boundary_cuda(
        y, residual, post, comb, pre, weight, fn, scale, base, updated, normed, q, q_scales,
        *stats, part, admission.plan.row_tile, admission.plan.dependent, rms_eps, eps, post_mult,
        norm_eps, iters,
    )  # fmt: skip
    return updated, normed, tuple(stats[:3])


def fallback(y, residual, post, comb, pre, fn, scale, base, weight, norm_eps, scalars):
    """The three steps unfused: SGLang's post (bit-exact in torch), then :func:`hc_mix_stats`
    and :func:`hc_combine_norm` of its result (each on its own kernel or fallback)."""
    updated = sglang_post(y, residual, post, comb)
    flat = updated.flatten(1)
    stats = hc_mix_stats(flat, fn, scale, base, **scalars)
    return updated, hc_combine_norm(flat, pre, weight, norm_eps), stats
