"""DeepSeek-V4.1's Q side on Hopper in SGLang 0.5.23, stated in torch: RMSNorm, then e4m3
groups with power-of-two scales.

On SM90 the attention normalizes ``q_lora`` with ``q_norm`` (``RMSNorm.forward_cuda`` ->
``sgl_kernel.rmsnorm``: FlashInfer's ``RMSNormKernel``, built with ``-use_fast_math``, as
FlashInfer's own JIT builds it) and ``wq_b`` quantizes the bf16 result per token group
(``sglang_per_token_group_quant_fp8(y, 32, scale_ue8m0=True)``: the JIT kernel
``per_token_group_quant_8bit_v2``, row-major fp32 scales) before DeepGEMM's block-FP8 GEMM.

**The norm** (:func:`rmsnorm`): ``y = bf16(x * rsqrt(mean(x²) + eps) * w)``. FlashInfer's bits
come from hardware approximations (``div.approx.ftz``, ``rsqrt.approx.ftz``: see
``sgl-kernel/csrc/rmsnorm_quant_fp8.cu``) that have no exact model here; this statement rounds
once per IEEE operation in fp32, so it may differ from the GPU's in the last bit of ``y``.

**The quantization** (:func:`group_quant_ue8m0`), exact, of each run of ``group`` bf16 values:

1. ``amax = max(|y|)`` over the group, NaN ignored, and at least ``fp32(1e-10)``;
2. ``e = ceil(log2(amax * RN(1/448)))`` read from the fp32 bits of the product (exponent field
   minus 127, plus one if any fraction bit is set; +Inf gives 128);
3. the stored scale is the fp32 whose exponent field is ``e + 127`` (``2^e``; SGLang builds it
   from bits, so ``e = 128`` stores +Inf), and the multiplier the one of ``-e + 127``
   (``-e = -128`` gives the bits of -Inf);
4. ``q = e4m3(min(max(y * multiplier, -448), 448))``, rounded to nearest even, where the
   maximum of NaN and -448 is -448 (``fmaxf``): a NaN ``y`` becomes -448.
"""

from __future__ import annotations

import torch

from dsv41_kernels.reference.inverse_rope_quant_fp8 import AMAX_FLOOR_BITS
from dsv41_kernels.reference.mxfp8_quantize import E4M3_MAX, RCP_448_BITS, e4m3_rne_satfinite


def _f32(bits: int, device) -> torch.Tensor:
    # A fill on the device, not a host copy: the fallback stays capturable in CUDA graphs.
    return torch.full((), bits, dtype=torch.int32, device=device).view(torch.float32)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``bf16(x * rsqrt(mean(x²) + eps) * w)`` over the last axis, in fp32 (IEEE roundings)."""
    xf = x.float()
    rms = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return ((xf * rms) * weight.float()).to(torch.bfloat16)


def _pow2_bits(e: torch.Tensor) -> torch.Tensor:
    """The fp32 with exponent field ``e + 127`` (SGLang's ``fast_pow2``: its 32-bit shift keeps
    the field's ninth bit as the sign, so ``e = -128`` is -Inf)."""
    bits = ((e.long() + 127) & 0x1FF) << 23
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)


def group_quant_ue8m0(y: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's power-of-two-scale quantizer of bf16 ``y [..., K]``: (float8_e4m3fn
    ``[..., K]``, fp32 scales ``[..., K / group]``)."""
    groups = y.float().unflatten(-1, (-1, group))
    magnitude = groups.abs()
    amax = torch.where(torch.isnan(magnitude), 0.0, magnitude).amax(-1)
    amax = torch.maximum(amax, _f32(AMAX_FLOOR_BITS, y.device))
    bits = (amax * _f32(RCP_448_BITS, y.device)).view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    scales, multiplier = _pow2_bits(e), _pow2_bits(-e)
    scaled = groups * multiplier[..., None]
    clamped = torch.where(torch.isnan(scaled), -E4M3_MAX, scaled.clamp(-E4M3_MAX, E4M3_MAX))
    codes = e4m3_rne_satfinite(clamped)
    return codes.flatten(-2).view(torch.float8_e4m3fn), scales


def rmsnorm_quant_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float, group: int):
    """``(y, q, scales)``: :func:`rmsnorm`, then :func:`group_quant_ue8m0` of its ``y``."""
    y = rmsnorm(x, weight, eps)
    return (y, *group_quant_ue8m0(y, group))
