"""Check cases of the mHC combine+norm (:mod:`dsv41_kernels.ops.mhc.hc_combine_norm`), its
example inputs, the one-bf16-ulp measure, and the two forms the tests and the benchmark
compare: the unfused pair, and the Triton kernel at a chosen launch shape."""

from __future__ import annotations

import torch

from dsv41_kernels.admission import Admission, admit
from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.ops.mhc.hc_combine_norm import (
    TRITON,
    hc_combine_norm,
    hc_combine_norm_admission,
    hc_combine_norm_mxfp8,
    run_kernel,
)
from dsv41_kernels.ops.mhc.hc_combine_norm_plan import (
    DEFAULT_VARIANT,
    CombineNormPlan,
    Kernel,
    KernelVariant,
    epilogue_writes,
)
from dsv41_kernels.ops.mhc.quant_out import QUANT_GROUP, empty_quant_out
from dsv41_kernels.ops.quantization.mxfp8_quantize import Mxfp8SwizzledInput, mxfp8_quantize
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as reference_hc_combine_norm
from dsv41_kernels.reference.hc_mix_stats import HC_MULT
from dsv41_kernels.reference.mxfp8_quantize import scale_buffer_size
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0

OPS = ("hc_combine_norm", "hc_combine_norm_mxfp8")
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""


def beyond_one_bf16_ulp(y: torch.Tensor, y64: torch.Tensor) -> int:
    """Elements of bf16 ``y`` farther than one bf16 ulp (at ``y64``'s magnitude) from the float64
    ``y64``; NaN matches NaN and an infinity itself."""
    yd = y.double()
    _, exponent = torch.frexp(y64)
    ulp = torch.ldexp(torch.ones_like(y64), torch.clamp(exponent - 1, min=-126) - 7)
    close = (yd - y64).abs() <= ulp
    special = (torch.isnan(yd) & torch.isnan(y64)) | (torch.isinf(y64) & (yd == y64))
    return int((~(close | special)).sum().item())


def example_inputs(m: int, h: int, device, *, seed: int, scale: float = 1.0):
    """x [m, 4h] bf16 at magnitude ``scale``, pre [m, 4] fp32 gates in (0, 1], weight [h] bf16."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(m, HC_MULT * h, generator=gen) * scale).to(torch.bfloat16)
    pre = torch.rand(m, HC_MULT, generator=gen) + 1e-6
    weight = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16)
    return x.to(device), pre.to(device), weight.to(device)


def mxfp8_outputs(m: int, h: int, device) -> tuple[torch.Tensor, Mxfp8SwizzledInput]:
    """Empty ``(y, Mxfp8SwizzledInput)`` for the fused form's ``out``."""
    return torch.empty(m, h, dtype=torch.bfloat16, device=device), Mxfp8SwizzledInput(
        torch.empty(m, h, dtype=torch.float8_e4m3fn, device=device),
        torch.empty(scale_buffer_size(m, h, swizzled=True), dtype=torch.uint8, device=device),
    )


def unfused(x, pre, weight, eps):
    """The pair the fused op replaces: ``hc_combine_norm`` then ``mxfp8_quantize``."""
    y = hc_combine_norm(x, pre, weight, eps)
    return y, mxfp8_quantize(y, swizzled=True)


def triton_plan(variant: KernelVariant = DEFAULT_VARIANT, quantized=None) -> CombineNormPlan:
    """The Triton kernel at ``variant``'s launch shape, wherever the CUDA kernel would run;
    ``quantized``: the fused form's ``(data, scales)``, whose layout decides the epilogue."""
    epilogue = quantized is None or epilogue_writes(*quantized, cuda=False)
    return CombineNormPlan(Kernel.TRITON, None, variant, epilogue)


def triton_admission(variant: KernelVariant = DEFAULT_VARIANT, quantized=None) -> Admission:
    """An admission for :func:`triton_plan` (what the tests pass the ops to force it)."""
    return admit(TRITON, "forced triton", None, triton_plan(variant, quantized))


def triton_forms(x, pre, weight, eps, variant: KernelVariant = DEFAULT_VARIANT, *, out=None):
    """``(y alone, (y, quantized) fused)`` from the Triton kernel at ``variant``'s launch shape,
    wherever the CUDA kernel would run (``out``: the fused form's outputs, else fresh ones)."""
    m, h = x.shape[0], x.shape[1] // HC_MULT
    y_alone = torch.empty(m, h, dtype=torch.bfloat16, device=x.device)
    run_kernel(x, pre, weight, eps, y_alone, None, triton_plan(variant))
    y, quantized = out or mxfp8_outputs(m, h, x.device)
    run_kernel(x, pre, weight, eps, y, quantized, triton_plan(variant, quantized))
    return y_alone, (y, quantized)


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    eps = 1e-6
    shapes = [(3, 64), (5, 96)] if small else [(1, 5120), (6, 5120), (64, 5120), (300, 4096)]
    cases = []
    for m, h in shapes:
        x, pre, weight = example_inputs(m, h, device, seed=m * h)
        args = (x, pre, weight, eps)
        cases.append(
            CheckCase(
                op="hc_combine_norm",
                shape=f"[{m}, 4x{h}] bf16 (mismatches: beyond 1 bf16 ulp of float64)",
                admission=hc_combine_norm_admission(x, pre, weight),
                run=lambda a=args: hc_combine_norm(*a),
                reference=lambda a=args: reference_hc_combine_norm(*a, dtype=torch.float64),
                mismatches=beyond_one_bf16_ulp,
            )
        )
        cases.append(
            CheckCase(
                op="hc_combine_norm_mxfp8",
                shape=f"[{m}, 4x{h}] bf16 vs hc_combine_norm + mxfp8_quantize",
                admission=hc_combine_norm_admission(x, pre, weight, quantize=True),
                run=lambda a=args: hc_combine_norm_mxfp8(*a),
                reference=lambda a=args: unfused(*a),
                mismatches=bit_mismatches,
                baseline=lambda a=args: unfused(*a),
            )
        )
        q = empty_quant_out(m, h, device)
        cases.append(
            CheckCase(
                op="hc_combine_norm",
                shape=f"[{m}, 4x{h}] bf16, FP8 groups of {QUANT_GROUP} vs SGLang's quantizer of y",
                admission=hc_combine_norm_admission(x, pre, weight),
                run=lambda a=args, q=q: (hc_combine_norm(*a, quant_out=q), *q),
                reference=lambda a=args: with_groups(hc_combine_norm(*a)),
                mismatches=bit_mismatches,
                baseline=lambda a=args: with_groups(hc_combine_norm(*a)),
            )
        )
    return cases


def with_groups(y: torch.Tensor) -> tuple:
    """``y`` and SGLang's quantizer of it (:mod:`~dsv41_kernels.ops.mhc.quant_out`)."""
    return (y, *group_quant_ue8m0(y, QUANT_GROUP))
