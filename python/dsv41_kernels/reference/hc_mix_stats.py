"""DeepSeek-V4 mHC (manifold-constrained hyper-connections) mixing statistics stated in torch:
the projection, the gates, Sinkhorn, ``hc_pre`` / ``hc_post`` and the TF32 split of ``fn``
(docs/specs.md C.3-C.4, C.7).

``dtype=torch.float64`` is the accuracy yardstick; ``torch.float32`` is what a plain fp32 torch
composition computes (TF32 off)."""

from __future__ import annotations

import torch

HC_MULT = 4
"""Residual streams in DeepSeek-V4's hyper-connections."""

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
