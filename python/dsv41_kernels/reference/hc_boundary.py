"""The mHC boundary stated in torch: SGLang 0.5.23's post rounded as its kernel rounds it, then
the next sublayer's statistics and combine + RMSNorm of the result (docs/specs.md C).

``sglang_post`` is bit-exact: each fp32 fused multiply-add is computed exactly in float64 and
rounded once (:func:`fma_fp32`), the order SGLang's SM90 post kernels use
(``mhc_post_split_h``, and the TileLang ``mhc_post`` it matches)."""

from __future__ import annotations

import torch

from dsv41_kernels.reference.hc_combine_norm import bf16_round, hc_combine_norm
from dsv41_kernels.reference.hc_mix_stats import HC_MULT, hc_mix_stats


def fma_fp32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a·b + c`` for fp32 tensors, rounded once to fp32 (nearest even), as a hardware fma.

    ``a·b`` is exact in float64 (two 24-bit significands); the float64 sum ``s`` and its exact
    error ``e`` (TwoSum) hold ``a·b + c = s + e``. Rounding ``s`` to fp32 is then correct except
    when ``s`` lies exactly halfway between two fp32 numbers and ``e`` is not zero: the true
    value is then off the tie, on ``e``'s side. Finite inputs and results only (no overflow)."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bv = s - p
    e = (p - (s - bv)) + (cd - bv)
    r = s.float()
    toward = torch.where(e > 0, torch.full_like(r, float("inf")), torch.full_like(r, -float("inf")))
    other = torch.nextafter(r, toward)
    tie = (r.double() + other.double()) / 2 == s
    return torch.where((e != 0) & tie, other, r)


def sglang_post(y, residual, post, comb) -> torch.Tensor:
    """``out[r, c, h] = bf16(fma(comb[r,3,c], R3, fma(comb[r,2,c], R2, fma(comb[r,1,c], R1,
    fma(post[r,c], y, comb[r,0,c]·R0)))))`` in fp32, ``Ri = residual[r, i, h]``: the first
    product rounded, each fma rounded once, round to nearest even to bf16.

    ``y [m, H]`` bf16, ``residual [m, 4, H]`` bf16, ``post [m, 4]`` fp32, ``comb [m, 4, 4]`` fp32
    (``comb[r, i, c]`` weighs source stream i into output stream c) -> ``[m, 4, H]`` bf16."""
    yf = y.float()[:, None, :]
    rf = residual.float()
    weight = lambda i: comb.float()[:, i, :, None]  # [m, 4 outputs, 1]
    acc = fma_fp32(post.float()[:, :, None], yf, (weight(0) * rf[:, 0:1, :]).float())
    for i in range(1, HC_MULT):
        acc = fma_fp32(weight(i).expand_as(acc), rf[:, i : i + 1, :].expand_as(acc), acc)
    return bf16_round(acc)


def hc_boundary(
    y, residual, post, comb, pre, fn, scale, base, weight, *, iters=20, rms_eps=1e-6, eps=1e-6,
    post_mult=2.0, norm_eps=1e-6, dtype=torch.float64,
):  # fmt: skip
    """``(updated, normed, (pre', post', comb'))``: ``updated = sglang_post(y, residual, post,
    comb)`` (bit-exact), the statistics of ``updated`` for the next sublayer (``fn``, ``scale``,
    ``base``) and its combine + RMSNorm with ``pre`` and ``weight``, both in ``dtype``."""
    updated = sglang_post(y, residual, post, comb)
    flat = updated.flatten(1)
    stats = hc_mix_stats(
        flat, fn, scale, base, iters=iters, eps=eps, rms_eps=rms_eps, post_mult=post_mult,
        dtype=dtype,
    )  # fmt: skip
    return updated, hc_combine_norm(flat, pre, weight, norm_eps, dtype=dtype), stats
