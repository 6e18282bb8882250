"""The mHC boundary without its statistics: the post of sublayer l and sublayer l + 1's combine
+ RMSNorm in one launch.

Where the next statistics run on a side stream beside the sublayer (SGLang's stats stream), the
critical path of a boundary is the post, which rebuilds the four residual streams, and the
combine + RMSNorm, which collapses them into the next sublayer's input. Both read the same row;
here a thread keeps its columns of the updated streams in registers from the one to the other
(``sgl-kernel/csrc/hc_post_combine_norm.cu``), so the updated residual is written once and
never read back. :func:`~.hc_boundary.hc_boundary` is the same boundary with the statistics in
the launch, for where they are on the critical path anyway.

Contract (``y [m, H]`` bf16, ``residual [m, 4, H]`` bf16, ``post [m, 4]`` and ``comb [m, 4, 4]``
fp32 (this boundary's triplet), ``pre [m, 4]`` fp32 (the next combine's gates), ``weight [H]``
bf16 (the next norm's)):

- ``updated`` is **bitwise** SGLang 0.5.23's post
  (:func:`dsv41_kernels.reference.hc_boundary.sglang_post`, the fp32 fma chain of its SM90
  kernels rounded to nearest even to bf16) for finite values; a NaN stays NaN, its payload is
  not part of the contract;
- ``normed`` is **bitwise** :func:`~.hc_combine_norm.hc_combine_norm` of ``updated`` with
  ``pre`` and ``weight``: the kernel is hc_combine_norm's own template with the post in front,
  run in the launch shape hc_combine_norm's plan gives the same rows, so it has that kernel's
  bits (batch-invariant: a row's bits depend on the row alone); the fallback runs the post and
  :func:`~.hc_combine_norm.hc_combine_norm` unfused;
- with ``quant_out``, also ``normed``'s e4m3 groups of 32 and their power-of-two scales,
  **bitwise** SGLang 0.5.23's ``sglang_per_token_group_quant_fp8(normed, 32,
  scale_ue8m0=True)`` on SM90 (:mod:`.quant_out`), in the same launch: the next sublayer's
  block-FP8 linear need not quantize its input.

The kernel runs (:func:`hc_post_combine_norm_admission`) where hc_combine_norm runs its CUDA
kernel (sm_90+, 16-byte aligned rows) with a contiguous residual, unit-stride ``y`` rows and
contiguous coefficients, up to 640 threads a CTA at one vector a thread (any H = 5120 shape);
elsewhere the fallback.
"""

from __future__ import annotations

import torch

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_float,
    check_tensor,
    invalid,
    refuse,
)
from dsv41_kernels.devices import cuda_index
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm
from dsv41_kernels.ops.mhc.hc_combine_norm_plan import CUDA_VECTOR, Kernel, make_plan
from dsv41_kernels.ops.mhc.quant_out import fill_quant_out, no_quant_out, validate_quant_out
from dsv41_kernels.reference.hc_boundary import sglang_post
from dsv41_kernels.reference.hc_mix_stats import HC_MULT

MODULE = "hc_post_combine_norm"  # sgl-kernel/csrc/hc_post_combine_norm.cu
MAX_THREADS_ONE_VECTOR = 640
"""Threads a CTA of the kernel may have at one vector a thread: the post's inputs and
coefficients take about 40 registers more than the combine alone (its launch bounds)."""


def validate_post(y, residual, post, comb, pre, weight) -> None:
    """ValueError naming the first of the post's and the combine's arguments that is off
    (shapes, dtypes, devices); :func:`~.hc_boundary.hc_boundary` checks its own with it."""
    check_tensor("y", y, dtypes=(torch.bfloat16,), ndim=2)
    m, h = y.shape
    check_tensor("residual", residual, dtypes=(torch.bfloat16,), ndim=3)
    if tuple(residual.shape) != (m, HC_MULT, h):
        raise ValueError(f"residual must be [{m}, {HC_MULT}, {h}], got {tuple(residual.shape)}")
    shapes = {"post": (m, HC_MULT), "comb": (m, HC_MULT, HC_MULT), "pre": (m, HC_MULT)}
    for name, t in (("post", post), ("comb", comb), ("pre", pre)):
        check_tensor(name, t, dtypes=(torch.float32,))
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"{name} must be {list(shapes[name])}, got {tuple(t.shape)}")
    check_tensor("weight", weight, dtypes=(torch.bfloat16,))
    if tuple(weight.shape) != (h,):
        raise ValueError(f"weight must be [{h}], got {tuple(weight.shape)}")
    for name, t in (("residual", residual), ("post", post), ("comb", comb), ("pre", pre),
                    ("weight", weight)):  # fmt: skip
        if t.device != y.device:
            raise ValueError(f"{name} is on {t.device}, y on {y.device}")
    if y.is_meta:
        raise ValueError("y is a meta tensor: the boundary needs its values")


def hc_post_combine_norm_admission(y, residual, post, comb, pre, weight) -> Admission:
    """Whether the kernel runs, with hc_combine_norm's plan for the rows (pure: shapes, strides,
    alignment, dtypes, devices; never raises)."""
    try:
        validate_post(y, residual, post, comb, pre, weight)
    except ValueError as e:
        return invalid(e)
    if not y.is_cuda:
        return refuse(f"{y.device.type} tensors: the kernel is CUDA only")
    aligned = lambda t: t.data_ptr() % 16 == 0
    # stride(0) too: torch calls a one-row tensor contiguous whatever its row stride.
    if not (residual.is_contiguous() and aligned(residual) and residual.stride(0) * 2 % 16 == 0):
        return refuse("residual is not contiguous and 16-byte aligned")
    if not (y.stride(1) == 1 and aligned(y) and y.stride(0) * 2 % 16 == 0):
        return refuse("y rows are not unit-stride and 16-byte aligned")
    if not (post.is_contiguous() and comb.is_contiguous()):
        return refuse("post or comb is not contiguous")
    m, h = y.shape
    if h == 0 or h % 32:
        return refuse(f"H = {h} is not a positive multiple of 32")
    plan = make_plan(residual.flatten(1), weight)  # a view: the admission allocates nothing
    if plan.kernel is Kernel.TRITON:
        return refuse("hc_combine_norm would not run its CUDA kernel here (sm_90+, aligned rows)")
    cluster, threads = plan.cuda
    one_vector = h // cluster // CUDA_VECTOR <= threads
    if one_vector and threads > MAX_THREADS_ONE_VECTOR:
        return refuse(f"H = {h}: {threads} threads a CTA exceed the kernel's registers")
    kernel = plan.kernel.value
    return admit(kernel, f"{kernel}: {m} rows, H = {h}, post + combine + norm", MODULE, plan)


def hc_post_combine_norm(
    y: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    admission: Admission | None = None,
    quant_out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(updated [m, 4, H] bf16, normed [m, H] bf16)``: the post, then the next sublayer's
    input (see the module).

    Args:
        y: the sublayer's output ``[m, H]`` bf16. residual: the streams it joins ``[m, 4, H]``.
        post, comb: this boundary's triplet (fp32). pre: the next combine's gates (fp32).
        weight: the next norm's weight ``[H]`` bf16. eps: the norm's epsilon.
        admission: this call's :func:`hc_post_combine_norm_admission`, when the caller made it.
        quant_out: ``(q, scales)`` to fill with ``normed``'s FP8 groups: ``q`` float8_e4m3fn
            ``[m, H]`` and ``scales`` fp32 ``[m, H / 32]``, contiguous, apart from the inputs.
    """
    admission = check_admission(admission)
    if admission is None or not admission:
        validate_post(y, residual, post, comb, pre, weight)
        if admission is None:
            admission = hc_post_combine_norm_admission(y, residual, post, comb, pre, weight)
    if quant_out is not None:
        inputs = dict(y=y, residual=residual, post=post, comb=comb, pre=pre, weight=weight)
        validate_quant_out(quant_out, *y.shape, y.device, inputs)
    eps = check_float("eps", eps, low=0.0)
    if not admission:
        updated, normed = fallback(y, residual, post, comb, pre, weight, eps)
        if quant_out is not None:
            fill_quant_out(quant_out, normed)
        return updated, normed
    m, h = y.shape
    updated = torch.empty((m, HC_MULT, h), dtype=torch.bfloat16, device=y.device)
    normed = torch.empty((m, h), dtype=torch.bfloat16, device=y.device)
    if m == 0:
        return updated, normed
    cluster, threads = admission.plan.cuda
    q, q_scales = quant_out if quant_out is not None else no_quant_out(y.device, h)
    module = load_module(MODULE, cuda_index(y.device))
    module.hc_post_combine_norm_cuda(
        y, residual, post, comb, pre, weight, updated, normed, q, q_scales, eps, cluster, threads
    )
    return updated, normed


def fallback(y, residual, post, comb, pre, weight, eps):
    """The two steps unfused: SGLang's post (bit-exact in torch), then
    :func:`~.hc_combine_norm.hc_combine_norm` of its result (its kernel or its fallback)."""
    updated = sglang_post(y, residual, post, comb)
    return updated, hc_combine_norm(updated.flatten(1), pre, weight, eps)
