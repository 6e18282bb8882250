"""mHC combine + RMSNorm, optionally with the MXFP8 quantization of its output, in one launch.

On DeepSeek-V4.1's hyper-connection path the four residual streams are collapsed with the
``pre`` gates, rounded to bf16 and RMS-normalised before the attention's first projection,
which (with an MXFP8 GEMM) then quantizes the result again in a second launch that only
re-reads what the first wrote. ``hc_combine_norm_mxfp8`` writes y, its e4m3 data and the
swizzled UE8M0 scales from the registers that hold the row.

Contract (``x [m, 4*H]`` bf16, ``pre [m, 4]`` fp32, ``weight [H]`` bf16, ``H % 32 == 0``):

- ``hc_combine_norm``: ``x_in = bf16(((p0·x0 + p1·x1) + p2·x2) + p3·x3)`` in fp32 without
  fused multiply-adds (each product and sum rounded), then ``y = bf16((x_in · inv) · weight)``
  with ``inv = 1/sqrt(Σx_in²/H + eps)``: fp32 throughout, the division ``ss/H``, the square
  root and ``1/sqrt`` each one IEEE fp32 rounding (``div.rn``/``sqrt.rn``, not rsqrt).
- Two kernels, each with a fixed order for Σx_in² (fp32; each square is exact), so a row's
  bits depend only on the row, H and the kernel, never on ``m`` or the row's position
  (batch-invariant), and ``hc_combine_norm`` and the fused form, which always take the same
  kernel for the same shapes, give the same y:

  - on sm_90+ (aligned rows, :func:`~.hc_combine_norm_plan.cuda_kernel_fits`) the CUDA
    kernel ``sgl-kernel/csrc/hc_combine_norm.cu``: a row is split over a thread-block cluster
    of C CTAs (C = 4 for H = 5120 and 4096), each holding H/C columns, and the sum is per
    thread in column order, a butterfly over each warp, then the warp sums of the whole
    cluster (exchanged through distributed shared memory) by a fixed butterfly, identical
    in every CTA (the order is spelled out in the source's header);
  - elsewhere (and under the interpreter) the Triton kernel (:mod:`.hc_combine_norm_triton`):
    the row is two tiles of 32-value blocks, head ``[HEAD, 32]`` and tail ``[TAIL, 32]``
    (128 + 32 blocks for H = 5120, 64 + 64 for 4096; blocks past H are zeros), each summed by
    ``tl.sum`` along the 32 values of a block and then across blocks, under a layout fixed by
    H and the launch shape (:data:`~.hc_combine_norm_plan.DEFAULT_VARIANT`: 8 warps); then
    ``head + tail``.

  The two orders differ, so the kernels' y may differ by one bf16 ulp; each is within one bf16
  ulp of the same norm in float64 (away from fp32 overflow of Σx_in²). y feeds the residual
  streams every rank of a tensor-parallel group holds a copy of, so the choice is a function of
  shapes, strides and the GPU's architecture only, never of the toolchain: a machine that
  cannot build or load the CUDA module gets that error from the op, not the other kernel's bits.
- The torch fallback (and :func:`dsv41_kernels.reference.hc_combine_norm.hc_combine_norm`)
  computes Σx_in² order-free and rounded once, so it is within one bf16 ulp of float64 too but
  **not bitwise equal** to the kernel; the Triton interpreter's sum order is numpy's, not the
  GPU's.
- ``hc_combine_norm(..., quant_out=(q, scales))`` also fills y's e4m3 groups of 32 and their
  power-of-two scales, **bitwise** SGLang 0.5.23's ``sglang_per_token_group_quant_fp8(y, 32,
  scale_ue8m0=True)`` (:mod:`.quant_out`: what an SM90 block-FP8 linear computes from y), in the
  CUDA kernel's launch (the Triton kernel and the fallback quantize after it).
- ``hc_combine_norm_mxfp8`` returns ``(y, Mxfp8SwizzledInput(data, scales))`` **bitwise equal**
  to ``hc_combine_norm`` followed by
  :func:`dsv41_kernels.ops.quantization.mxfp8_quantize.mxfp8_quantize` (FlashInfer's cuda
  backend bytes, 128x4 swizzled scales); the scale buffer is written in full, padding rows up
  to the 128-row tile and padding columns 0, for any ``m`` (on the kernel path both forms run
  the kernel; with the fallback, both the reference).

Why two kernels: at decode sizes one CTA per row is bound by instruction issue (~1300
instructions a thread in the fused Triton kernel); the cluster spreads a row over 4 SMs, faster
on the H200 at decode sizes. The Triton kernel stays for other GPUs and the interpreter.

The admission chooses the kernel and its launch shape once, as a
:class:`~.hc_combine_norm_plan.CombineNormPlan` (``Admission.plan``); its ``kernel`` names the
kernel: ``"cuda cluster"`` (a row over a cluster of 1, 2 or 4 CTAs), ``"cuda one CTA a row"``
(64-192 rows, where the cluster shape's threads fit one CTA: the same bits, without the
cluster's launch and exchange) or ``"triton"``.
"""

from __future__ import annotations

import torch

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_flag,
    check_float,
    check_outputs,
    check_tensor,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc.hc_combine_norm_plan import (
    MAX_ROW_BLOCK,
    CombineNormPlan,
    Kernel,
    make_plan,
    row_tiles,
)
from dsv41_kernels.ops.mhc.hc_combine_norm_triton import launch
from dsv41_kernels.ops.mhc.quant_out import fill_quant_out, no_quant_out, validate_quant_out
from dsv41_kernels.ops.quantization.mxfp8_quantize import Mxfp8SwizzledInput, quantize_into
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as reference_hc_combine_norm
from dsv41_kernels.reference.hc_mix_stats import HC_MULT
from dsv41_kernels.reference.mxfp8_quantize import SF_VEC_SIZE, scale_buffer_size

CUDA_CLUSTER = Kernel.CUDA_CLUSTER.value
CUDA_ONE_CTA = Kernel.CUDA_ONE_CTA.value
TRITON = Kernel.TRITON.value
"""The admission's ``kernel`` names."""
MODULE = "hc_combine_norm"  # sgl-kernel/csrc/hc_combine_norm.cu


def _validate(x, pre, weight, eps, *, quantize: bool, out=None) -> tuple[int, int, float]:
    """Raise ValueError naming the argument unless the shapes and dtypes are the contract's;
    returns ``(m, H, eps)``, ``eps`` a Python float. ``out``: y, or ``(y, (data, scales))`` with
    ``quantize``."""
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    if x.is_meta:  # the fallback would "compute" a meta y from no data
        raise ValueError("x is a meta tensor: the norm needs its values")
    m, width = x.shape
    if width % HC_MULT or width == 0:
        raise ValueError(f"x must be [m, {HC_MULT}*H] with H > 0, got {tuple(x.shape)}")
    h = width // HC_MULT
    if quantize and h % SF_VEC_SIZE:
        raise ValueError(f"x: H = {h} must be a multiple of {SF_VEC_SIZE} for MXFP8")
    check_tensor("pre", pre, dtypes=(torch.float32,), ndim=2)
    if tuple(pre.shape) != (m, HC_MULT):
        raise ValueError(f"pre must be [{m}, {HC_MULT}], got {tuple(pre.shape)}")
    check_tensor("weight", weight, dtypes=(torch.bfloat16,), ndim=1)
    if weight.shape[0] != h:
        raise ValueError(f"weight must be [{h}], got {tuple(weight.shape)}")
    for name, t in (("pre", pre), ("weight", weight)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    eps = check_float("eps", eps, low=0.0)
    if out is None:
        return m, h, eps
    if not quantize:
        _check_out("out", out, (m, h), torch.bfloat16, x.device)
        check_outputs({"out": out})
        return m, h, eps
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ValueError(f"out must be (y, (data, scales)), got {_structure(out)}")
    y, quantized = out
    if not (isinstance(quantized, (tuple, list)) and len(quantized) == 2):
        raise ValueError(f"out[1] must be (data, scales), got {_structure(quantized)}")
    data, scales = quantized
    _check_out("out y", y, (m, h), torch.bfloat16, x.device)
    _check_out("out data", data, (m, h), torch.float8_e4m3fn, x.device)
    size = scale_buffer_size(m, h, swizzled=True)
    _check_out("out scales", scales, (size,), torch.uint8, x.device)
    check_outputs({"out y": y, "out data": data, "out scales": scales})
    return m, h, eps


def _structure(value) -> str:
    """What ``value`` is, for a message: a type, or a tuple's length."""
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def _check_out(name: str, t, shape, dtype, device) -> None:
    check_tensor(name, t, dtypes=(dtype,), ndim=len(shape))
    if tuple(t.shape) != tuple(shape) or t.device != device:
        raise ValueError(
            f"{name} must be {list(shape)} on {device}, got {tuple(t.shape)} on {t.device}"
        )


def _plan(x, weight, y, quantized, *, quantize: bool) -> Admission:
    """The admission for valid arguments, the one place the plan is chosen: ``y`` and
    ``quantized`` (its ``(data, scales)``) are the caller's outputs or None, whose strides and
    alignment matter."""
    where = triton_device(x)
    if not where:
        return where
    h = x.shape[1] // HC_MULT
    if h % SF_VEC_SIZE:
        return refuse(f"H = {h} is not a multiple of {SF_VEC_SIZE}")
    if sum(row_tiles(h)) * SF_VEC_SIZE > MAX_ROW_BLOCK:
        return refuse(f"H = {h}: a row does not fit one program's registers")
    if x.stride(1) != 1:
        return refuse("x's last-dim stride != 1")
    if y is not None and y.stride(1) != 1:
        return refuse("out y's last-dim stride != 1")
    form = "combine+norm+mxfp8" if quantize else "combine+norm"
    plan = make_plan(x, weight, y, quantized if quantize else None)
    kernel = plan.kernel.value
    module = None if plan.kernel is Kernel.TRITON else MODULE
    return admit(kernel, f"{where.reason}, {kernel}, {form}, H = {h}", module, plan)


def hc_combine_norm_admission(
    x: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, *, quantize: bool = False, out=None
) -> Admission:
    """Whether a kernel runs, which, and its plan (``quantize``: the fused MXFP8 form); pure:
    shapes, dtypes, strides, alignment and the device, never values. ``out`` is the caller's
    output (y, or ``(y, Mxfp8SwizzledInput)`` with ``quantize``), the one the op will be given:
    y's strides matter too, and e4m3 data or scales that the epilogue cannot write in place
    (strided, unaligned) are filled by the quantizer after the kernel, so the bits stay those
    of the unfused pair."""
    try:
        quantize = check_flag("quantize", quantize)
        _validate(x, pre, weight, 0.0, quantize=quantize, out=out)
    except ValueError as e:
        return invalid(e)
    y, quantized = (out[0], out[1]) if quantize and out is not None else (out, None)
    return _plan(x, weight, y, quantized, quantize=quantize)


def run_kernel(
    x, pre, weight, eps: float, y: torch.Tensor, quantized, plan: CombineNormPlan, quant_out=None
) -> None:
    """Run ``plan`` into ``y`` and, given, ``quantized`` (an :class:`Mxfp8SwizzledInput`) or
    ``quant_out`` (y's FP8 groups). Where the plan's epilogue does not write the MXFP8 outputs
    in place, or the Triton kernel runs with ``quant_out``, the combine runs alone and the
    quantizer after it: the same bits."""
    fused = quantized is not None and plan.epilogue
    if plan.kernel is Kernel.TRITON:
        launch(x, pre, weight, eps, y, quantized if fused else None, plan.variant)
        if quant_out is not None:
            fill_quant_out(quant_out, y)
    else:
        data, scales = (quantized.data.view(torch.uint8), quantized.scales) if fused else (y, y)
        q, q_scales = quant_out if quant_out is not None else no_quant_out(y.device, y.shape[1])
        module = load_module(MODULE, x.device.index or 0)
        cluster, threads = plan.cuda
        module.hc_combine_norm_cuda(
            x, pre, weight, y, data, scales, q, q_scales, eps, fused, cluster, threads
        )
    if quantized is not None and not fused:
        quantize_into(y, quantized.data, quantized.scales, swizzled=True)


def hc_combine_norm(
    x: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    admission: Admission | None = None,
    quant_out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Combine the 4 streams of ``x [m, 4*H]`` bf16 with ``pre [m, 4]`` fp32, round to bf16 and
    RMS-normalise with ``weight [H]`` bf16: ``y [m, H]`` bf16 (see the module contract).

    ``out`` (bf16 ``[m, H]``) is written in place, keeping the call allocation-free inside
    CUDA-graph capture. ``admission``: this call's :func:`hc_combine_norm_admission` (made
    with this ``out``), when the caller already made it: its plan is what runs, and an
    admitted one is not validated again. ``quant_out``: ``(q, scales)`` to fill with y's FP8
    groups, ``q`` float8_e4m3fn ``[m, H]`` and ``scales`` fp32 ``[m, H / 32]``, contiguous,
    apart from the inputs and ``out``.
    """
    admission = check_admission(admission)
    if admission is None or not admission:
        m, h, eps = _validate(x, pre, weight, eps, quantize=False, out=out)
        admission = _plan(x, weight, out, None, quantize=False) if admission is None else admission
    else:  # the admission checked the tensors, not eps, nor an out it was not made with
        m, h, eps = x.shape[0], x.shape[1] // HC_MULT, check_float("eps", eps, low=0.0)
        check_outputs({"out": out})
    if quant_out is not None:
        validate_quant_out(quant_out, m, h, x.device, {"x": x, "pre": pre, "weight": weight,
                                                       "out": out})  # fmt: skip
    if out is None:
        out = torch.empty((m, h), dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return out
    if admission:
        run_kernel(x, pre, weight, eps, out, None, admission.plan, quant_out)
    else:
        out.copy_(reference_hc_combine_norm(x, pre, weight, eps))
        if quant_out is not None:
            fill_quant_out(quant_out, out)
    return out


def hc_combine_norm_mxfp8(
    x: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: tuple[torch.Tensor, Mxfp8SwizzledInput] | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, Mxfp8SwizzledInput]:
    """:func:`hc_combine_norm` and its MXFP8 quantization in one launch (``H % 32 == 0``).

    Returns ``(y, Mxfp8SwizzledInput(data, scales))``: y bf16 [m, H], data float8_e4m3fn
    [m, H], scales uint8 ``rup(m, 128) * rup(H/32, 4)`` bytes in the 128x4 layout, bitwise
    equal to ``hc_combine_norm`` then ``mxfp8_quantize``. ``out`` (the same structure) is
    written in place. ``admission``: this call's ``hc_combine_norm_admission(...,
    quantize=True)`` (made with this ``out``), when the caller already made it: its plan is
    what runs, and an admitted one is not validated again.
    """
    admission = check_admission(admission)
    if admission is None or not admission:
        m, h, eps = _validate(x, pre, weight, eps, quantize=True, out=out)
    else:  # the admission checked the tensors, not eps
        m, h, eps = x.shape[0], x.shape[1] // HC_MULT, check_float("eps", eps, low=0.0)
    if out is None:
        y = torch.empty((m, h), dtype=torch.bfloat16, device=x.device)
        quantized = Mxfp8SwizzledInput(
            torch.empty((m, h), dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(scale_buffer_size(m, h, swizzled=True), dtype=torch.uint8, device=x.device),
        )
    else:
        y, quantized = out[0], Mxfp8SwizzledInput(*out[1])
        # On every path (an admitted call skips _validate): aliased outputs would lose rows.
        check_outputs({"out y": y, "out data": quantized.data, "out scales": quantized.scales})
    if admission is None:
        given = (y, quantized) if out is not None else (None, None)
        admission = _plan(x, weight, *given, quantize=True)
    if m == 0:
        return y, quantized
    if admission:
        run_kernel(x, pre, weight, eps, y, quantized, admission.plan)
    else:
        y.copy_(reference_hc_combine_norm(x, pre, weight, eps))
        quantize_into(y, quantized.data, quantized.scales, swizzled=True)
    return y, quantized
