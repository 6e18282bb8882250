"""Check cases of :func:`dsv41_kernels.ops.quantization.mxfp8_quantize.mxfp8_quantize`, and
the special-value inputs its tests share."""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.ops.quantization.mxfp8_quantize import mxfp8_quantize, mxfp8_quantize_admission
from dsv41_kernels.reference.mxfp8_quantize import SF_VEC_SIZE
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize as reference_mxfp8_quantize

OPS = ("mxfp8_quantize",)
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""


def special_values_bf16(k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rows of hand-picked blocks covering docs/specs.md B.3: zeros of both signs, 448, the largest
    bf16, ±Inf, NaN in even / odd / all positions, blocks below 448·2^-126, bf16 subnormals."""
    nan, inf = float("nan"), float("inf")
    tiny = 448 * 2.0**-126
    blocks = []

    def block(fill: float, **at: float) -> list[float]:
        values = [fill] * SF_VEC_SIZE
        for index, value in at.items():
            values[int(index[1:])] = value
        return values

    blocks.append([0.0, -0.0] * 16)
    blocks.append(block(1.0, i0=448.0, i1=-3.0))
    blocks.append(block(-2.5, i3=3.3895313892515355e38))
    blocks.append(block(0.75, i4=inf, i9=-inf))
    blocks.append(block(1.5, i2=nan, i6=nan, i7=nan))
    blocks.append([1.0, nan] * 16)  # every odd position NaN: scale 255
    blocks.append([nan, 1.0] * 16)  # every even position NaN: scale from the odd ones
    blocks.append([nan] * 32)
    blocks.append(block(2.0**-120, i5=-(2.0**-119)))  # amax < 448·2^-126: scale 0
    blocks.append(block(2.0**-127, i0=tiny, i1=-(2.0**-128)))  # subnormals flushed
    blocks.append(block(1.5 * 2.0**-118))  # between 448·2^-127 and 448·2^-126
    values = torch.tensor([v for b in blocks for v in b], dtype=torch.float32)
    rows = -(-values.numel() // k)
    values = values.repeat(-(-rows * k // values.numel()))[: rows * k]
    return values.reshape(rows, k).to(torch.bfloat16).to(device)


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    shapes = [(3, 64), (130, 96)] if small else [(6, 5120), (128, 5120), (300, 4096)]
    cases = []
    for rows, k in shapes:
        gen = torch.Generator(device="cpu").manual_seed(rows * k)
        scale = torch.logspace(-3, 3, rows)[:, None]
        x = (torch.randn(rows, k, generator=gen) * scale).to(torch.bfloat16)
        specials = special_values_bf16(k)[: rows // 2]
        x[: specials.shape[0]] = specials
        x = x.to(device)
        for swizzled in (True, False):
            layout = "swizzled" if swizzled else "linear"
            cases.append(
                CheckCase(
                    op="mxfp8_quantize",
                    shape=f"[{rows}, {k}] bf16, {layout}",
                    admission=mxfp8_quantize_admission(x, swizzled=swizzled),
                    run=lambda x=x, s=swizzled: mxfp8_quantize(x, swizzled=s),
                    reference=lambda x=x, s=swizzled: reference_mxfp8_quantize(x, swizzled=s),
                    mismatches=bit_mismatches,
                    # No baseline: FlashInfer's kernel is empty on Hopper, and the torch
                    # reference is a statement, not something a server would run.
                )
            )
    return cases
