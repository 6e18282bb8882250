"""DeepSeek-V4 mHC combine + RMSNorm stated in torch (docs/specs.md C): the combine of the four
streams rounded to bf16, then an RMSNorm whose sum of squares is order-free."""

from __future__ import annotations

import torch

from dsv41_kernels.reference.hc_mix_stats import HC_MULT


def bf16_round(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 round-to-nearest-even on the bits, NaN -> 0x7FC0 on every device.

    torch's own cast is RNE too but its NaN bits differ between CPU and CUDA; the kernels
    use the same bit rule, so NaN outputs match bit for bit.
    """
    bits = v.float().contiguous().view(torch.int32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    rounded = torch.where(torch.isnan(v), 0x7FC0, rounded)
    return rounded.to(torch.int16).view(torch.bfloat16)


def bf16_sum_of_squares(v: torch.Tensor) -> torch.Tensor:
    """Σ v² over the last dim of bf16 ``v``, as fp32, independent of any summation order.

    Each square is an exact multiple of a power of two (an 8-bit significand squared), so the
    sum is accumulated in int64 fixed point with its unit 2^-48 of the row's largest binade:
    ``v² = s² · 2^(2E)`` (``s`` the 8-bit significand, ``E`` the exponent of its lowest bit)
    contributes ``floor(s² · 2^(2(E - Emax) + 32))`` units of ``2^(2·Emax - 32)``. Integer
    addition is associative, so any order (any tiling, any m, any batch position) gives the
    same total; terms more than 2^-48 below the largest binade are truncated, a relative error
    below 2^-32 for rows of up to 2^14 values. The total goes to float64 (RNE) and is scaled
    exactly, then rounded once to fp32. Inf in the row gives +inf; NaN gives NaN.
    """
    bits = v.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    exponent, mantissa = (bits >> 7) & 0xFF, bits & 0x7F
    biased = torch.clamp(exponent, min=1)  # subnormals share the smallest normal's exponent
    emax = biased.amax(-1, keepdim=True)
    significand = torch.where(exponent > 0, mantissa | 0x80, mantissa).long()
    shift = (2 * (biased - emax) + 32).long()
    square = significand * significand
    units = torch.where(
        shift >= 0, square << shift.clamp(min=0), square >> (-shift).clamp(max=20)
    ).sum(-1)
    # |v| = s * 2^(biased - 134), so one unit is 2^(2 * emax - 268 - 32).
    unit_exp = (2 * emax[..., 0] - 300).long()
    ss = units.double() * ((unit_exp + 1023) << 52).view(torch.float64)
    nonfinite = exponent == 0xFF
    ss = torch.where(nonfinite.any(-1), float("inf"), ss)
    ss = torch.where((nonfinite & (mantissa != 0)).any(-1), float("nan"), ss)
    return ss.float()


def _combine_bf16(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """x [m, 4*H] bf16, pre [m, 4] fp32 -> bf16 [m, H]: ((p0·x0 + p1·x1) + p2·x2) + p3·x3 in
    fp32, each product and sum rounded (no fused multiply-add), then rounded to bf16."""
    m = x.shape[0]
    streams = x.view(m, HC_MULT, x.shape[1] // HC_MULT).float()  # m may be 0
    weights = pre.float()
    acc = streams[:, 0] * weights[:, 0:1]
    for i in range(1, HC_MULT):
        acc = acc + streams[:, i] * weights[:, i : i + 1]
    return bf16_round(acc)


def _fp32_op(fn, *args: torch.Tensor) -> torch.Tensor:
    """One IEEE fp32 operation on fp32 values, evaluated in float64 and rounded once: the same
    bits on every device (torch's CUDA division by a scalar is a reciprocal multiply)."""
    return fn(*(a.double() for a in args)).float()


def hc_combine_norm(
    x: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """mHC combine then RMSNorm: ``x [m, 4*H]`` bf16, ``pre [m, 4]`` fp32, ``weight [H]`` bf16.

    ``x_in = bf16(Σ_i pre_i · x_i)`` (see :func:`_combine_bf16`; the rounding to bf16 before
    the norm is part of the contract), then with ``dtype=torch.bfloat16`` (the op's bits)::

        ss   = bf16_sum_of_squares(x_in)                # order-free, rounded once to fp32
        r    = fp32(fp32(ss / H) + fp32(eps))
        inv  = fp32(1 / fp32(sqrt(r)))                  # IEEE sqrt and division
        y    = bf16(fp32(fp32(x_in · inv) · weight))    # [m, H] bf16

    ``dtype=torch.float64`` returns the same norm of the same ``x_in`` evaluated in float64
    and not rounded: the yardstick the op is measured against (every element within one bf16
    ulp, away from fp32 overflow of Σ x_in²). The Triton kernel sums the squares in fp32 in a
    fixed order instead, so its y is within one bf16 ulp of float64 but not bitwise equal to
    this function's; this function is the op's torch fallback.
    """
    x_in = _combine_bf16(x, pre)
    h = x_in.shape[-1]
    eps32 = torch.full((), eps, dtype=torch.float32, device=x.device)
    if dtype == torch.float64:
        xd = x_in.double()
        inv = 1.0 / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps32.double())
        return xd * inv * weight.double()
    if dtype != torch.bfloat16:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float64, got {dtype}")
    ss = bf16_sum_of_squares(x_in)[:, None]
    r = _fp32_op(torch.add, _fp32_op(lambda s: s / h, ss), eps32)
    inv = _fp32_op(lambda s: 1.0 / s, _fp32_op(torch.sqrt, r))
    return bf16_round((x_in.float() * inv) * weight.float())
