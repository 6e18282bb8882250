"""DeepSeek-V4 mHC (manifold-constrained hyper-connections) stated in torch (docs/specs.md C)."""

from __future__ import annotations

import torch

HC_MULT = 4
"""Residual streams in DeepSeek-V4's hyper-connections."""


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


def split_tf32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``w`` -> ``(hi, lo)``: ``hi`` is ``w`` rounded toward zero to TF32's 11
    significant bits (what a TF32 tensor core reads, docs/specs.md C.7), ``lo = w - hi``.

    Stated in float64 values, not bits: a finite normal ``w`` with ``frexp`` exponent ``e``
    keeps multiples of ``2^(e - 11)``; subnormals keep multiples of ``2^-136`` (the quantum of
    the smallest normals, fp32's 23 fraction bits less 13). Both parts carry ``w``'s sign
    (``-0.0 -> (-0.0, -0.0)``); ``±Inf`` and NaN are not split: ``hi = w``, ``lo = ±0``.
    """
    wide = w.double()
    _, exponent = torch.frexp(wide)
    quantum = torch.ldexp(torch.ones_like(wide), torch.clamp(exponent, min=-125) - 11)
    kept = torch.trunc(wide / quantum) * quantum  # exact in float64; -0.0 stays -0.0
    finite = torch.isfinite(w)
    hi = torch.where(finite, kept.float(), w)  # NaN payloads kept
    lo = torch.where(finite, (wide - kept).float(), torch.zeros_like(w))
    return hi, torch.copysign(lo, w)


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
    eps32 = torch.tensor(eps, dtype=torch.float32, device=x.device)
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


# ---- hc_pre / hc_post and the mixing statistics (docs/specs.md C.3-C.4) -------------------
# ``dtype=torch.float64`` is the accuracy yardstick; ``torch.float32`` is what a plain fp32
# torch composition computes (TF32 off).

HC_MIX = (2 + HC_MULT) * HC_MULT
"""Rows of ``fn``/``base``: 4 pre, 4 post, 16 comb (``comb_logit[i][j] = mix[8 + 4i + j]``)."""


def hc_mix(x_flat, fn, *, rms_eps=1e-6, dtype=torch.float64):
    """``mix = (x · fnᵀ) · rsqrt(Σx² / 4H + rms_eps)``: the projection with the RMS factor applied
    after it (no norm weight). ``x_flat [m, 4H]`` bf16, ``fn [24, 4H]`` fp32 → ``[m, 24]`` in
    ``dtype``."""
    xf = x_flat.to(dtype)
    projection = xf @ fn.to(dtype).T
    rms_factor = torch.rsqrt(xf.square().sum(-1) / xf.shape[-1] + rms_eps)
    return projection * rms_factor[:, None]


def hc_sinkhorn(logits, *, iters=20, eps=1e-6):
    """Sinkhorn-Knopp on ``[m, 4, 4]`` logits ``L[i][j]``: a row softmax plus ``eps``, a column
    normalisation, then ``iters - 1`` rounds of rows then columns (it ends on columns)."""
    m = torch.softmax(logits, dim=-1) + eps
    m = m / (m.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(-1, keepdim=True) + eps)
        m = m / (m.sum(-2, keepdim=True) + eps)
    return m


def hc_gates(mix, scale, base, *, iters=20, eps=1e-6, post_mult=2.0):
    """From ``mix [m, 24]`` to ``(pre [m, 4], post [m, 4], comb [m, 4, 4])`` in ``mix.dtype``:
    ``pre = σ(mix·scale[0] + base) + eps``, ``post = post_mult·σ(mix·scale[1] + base)``,
    ``comb = sinkhorn(mix·scale[2] + base)``."""
    n = HC_MULT
    scale, base = scale.to(mix.dtype), base.to(mix.dtype)
    pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + eps
    post = torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n]) * post_mult
    logits = (mix[:, 2 * n :] * scale[2] + base[2 * n :]).reshape(-1, n, n)
    return pre, post, hc_sinkhorn(logits, iters=iters, eps=eps)


def hc_mix_stats(
    x_flat, fn, scale, base, *, iters=20, eps=1e-6, rms_eps=1e-6, post_mult=2.0, dtype=torch.float64
):
    """The mixing statistics ``(pre [m, 4], post [m, 4], comb [m, 4, 4])`` in ``dtype`` for
    ``x_flat [m, 4H]`` bf16 (or ``[m, 4, H]``)."""
    mix = hc_mix(x_flat.flatten(1), fn, rms_eps=rms_eps, dtype=dtype)
    return hc_gates(mix, scale, base, iters=iters, eps=eps, post_mult=post_mult)


def hc_pre(
    x, fn, scale, base, *, iters=20, eps=1e-6, rms_eps=1e-6, post_mult=2.0, dtype=torch.float64
):
    """Collapse the streams: ``x [m, 4, H]`` bf16 → ``(x_in [m, H] bf16, pre, post, comb)`` with
    ``x_in = bf16(Σ_i pre_i · x_i)`` and the statistics of :func:`hc_mix_stats` in ``dtype``."""
    pre, post, comb = hc_mix_stats(
        x, fn, scale, base, iters=iters, eps=eps, rms_eps=rms_eps, post_mult=post_mult, dtype=dtype
    )
    x_in = (pre[:, :, None] * x.to(dtype)).sum(1).to(torch.bfloat16)
    return x_in, pre, post, comb


def hc_post(y, res, post, comb, *, dtype=torch.float64):
    """Expand back to four streams: ``out[j] = bf16(post_j · y + Σ_i comb[i][j] · res[i])``.

    ``y [m, H]`` bf16, ``res [m, 4, H]`` bf16, ``post [m, 4]``, ``comb [m, 4, 4]``; the sum
    runs over the first index of ``comb``, the source stream. Returns ``[m, 4, H]`` bf16.
    """
    expanded = post.to(dtype)[:, :, None] * y.to(dtype)[:, None, :]
    mixed = torch.einsum("tij,tih->tjh", comb.to(dtype), res.to(dtype))
    return (expanded + mixed).to(torch.bfloat16)
