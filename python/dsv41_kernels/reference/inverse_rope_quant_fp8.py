"""SGLang 0.5.23's attention output on Hopper, stated in torch: inverse RoPE, then FP8 groups.

Before its FP8 ``wo_a``, DeepSeek-V4's attention layer on SM90 runs two JIT CUDA kernels of
SGLang's on the attention output ``o [T, H, head_dim]`` (bf16): the inverse rotary embedding,
in place on the last ``rope_dim`` values of every head (``fused_rope_inplace(...,
inverse=True)``), and the per-token-group quantizer (``sglang_per_token_group_quant_fp8(x,
group_size=128, scale_ue8m0=False)``) on ``o`` seen as ``[T * G, H * head_dim / G]``. The two
functions here restate them bit for bit, as nvcc 13.0 compiles them for sm_90a (read from the
SASS; docs/sglang.md, "The attention output on the path to wo_a"):

**Inverse RoPE.** The rope values form interleaved pairs ``(x_r, x_i) = (x[2j], x[2j+1])``;
``(c, s)`` is ``freqs_cis[position, j]`` (complex64: cosine, sine). In fp32, with one FMA
each (the cosine product is the fused one, the sine product rounded first):

    x_r' = fma(c, x_r,  s * x_i)        x_i' = fma(c, x_i, -(s * x_r))

then rounded to bf16 to nearest even, NaN to the canonical 0x7FFF. No flush to zero.

**Group quantization** of each run of ``group_size`` bf16 values ``x``:

1. ``amax = max(|x|)`` over the group, NaN ignored, and at least ``fp32(1e-10)``;
2. the stored scale ``amax * R`` in fp32 with ``R = 0x3B124925 = RN(1/448)``;
3. the multiplier ``m = 448 * rcp(amax)`` in fp32, where ``rcp`` is ``rcp.approx.ftz.f32``
   (the JIT builds with fast math; ``MUFU.RCP``), 0 where the result would be subnormal
   (``amax > 2^126``, ``+Inf``); see :func:`rcp_approx_ftz` for its model;
4. ``e4m3(x * m)``: round to nearest even with saturation to ±448 (``cvt.rn.satfinite``),
   NaN -> 0x7F, the sign of zero kept. ``Inf * 0`` is NaN.

``amax`` only ever takes a bf16 value or ``fp32(1e-10)``, so the model of ``rcp`` needs to hold
on 128 significands only; the GPU tier compares the hardware with it on all of them at several
exponents (``test/ops/attention/test_inverse_rope_quant_fp8.py``).

Outputs as SGLang's chain leaves them: ``o_fp8`` e4m3 ``[T, G, D]`` and ``o_scales`` fp32
``[T, G, D / group_size]``, both contiguous (row-major scales, one per group), with
``D = H * head_dim / G``. A position outside the table gives NaN in that token's rotated values
(SGLang reads out of bounds there).
"""

from __future__ import annotations

import torch

from dsv41_kernels.reference.mxfp8_quantize import E4M3_MAX, RCP_448_BITS, e4m3_rne_satfinite

AMAX_FLOOR_BITS = 0x2EDBE6FF
"""``fp32(1e-10)``, the quantizer's floor on a group's maximum."""
BF16_CANONICAL_NAN = 0x7FFF
RCP_FLUSH_ABOVE = 2.0**126
"""Above this the reciprocal is subnormal, which ``rcp.approx.ftz`` flushes to zero."""
RCP_APPROX_STEPS = {
    4: -1, 6: 1, 11: -1, 13: 1, 20: -1, 22: -1, 37: 1, 38: 1, 51: 1, 61: 1,
    65: 1, 66: 1, 81: 1, 91: 1, 109: 1, 115: 1, 116: 1, 118: 1, 121: 1, 127: -1,
}  # fmt: skip
"""The bf16 significands (the 7-bit fraction field) where ``rcp.approx.ftz.f32`` is not the
correctly rounded reciprocal, and its step from it in ulps: there it returns the other
neighbour of the exact value (a faithful rounding). Measured on the H200, and held against
the hardware at exponents from -33 to 125: the same 20 fields at each
(``test_gpu_reciprocal_model_holds_on_every_amax``)."""


_RCP_STEP_TABLE = torch.zeros(128, dtype=torch.int32)
_RCP_STEP_TABLE[list(RCP_APPROX_STEPS)] = torch.tensor(
    list(RCP_APPROX_STEPS.values()), dtype=torch.int32
)
""":data:`RCP_APPROX_STEPS` by significand field (0 where the reciprocal is correctly rounded)."""


def _f32(bits: int, device) -> torch.Tensor:
    # A fill on the device, not a host copy: the fallbacks stay capturable in CUDA graphs.
    return torch.full((), bits, dtype=torch.int32, device=device).view(torch.float32)


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``fma(a, b, c)`` of fp32 tensors, rounded once to fp32 (to nearest even).

    ``a * b`` is exact in float64 (48 significant bits); the sum is rounded to odd in float64
    (its error found by TwoSum, the last bit forced to 1 when inexact), which makes the final
    rounding to fp32 a correct one (53 >= 24 + 2)."""
    p = a.double() * b.double()
    c = c.double()
    s = p + c
    v = s - p
    error = (p - (s - v)) + (c - v)
    even = (s.view(torch.int64) & 1) == 0
    inexact = (error != 0) & torch.isfinite(s) & even
    toward = torch.where(error > 0, torch.inf, -torch.inf).to(s.dtype)
    s = torch.where(inexact, torch.nextafter(s, toward), s)
    return s.float()


def round_to_bf16(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 to nearest even (overflow to ±Inf), NaN -> 0x7FFF as the CUDA conversion."""
    bits = torch.where(torch.isnan(v), BF16_CANONICAL_NAN, v.to(torch.bfloat16).view(torch.int16))
    return bits.view(torch.bfloat16)


def rcp_approx_ftz(amax: torch.Tensor) -> torch.Tensor:
    """``rcp.approx.ftz.f32`` of fp32 ``amax`` holding bf16 values or ``fp32(1e-10)``: the
    correctly rounded reciprocal stepped by :data:`RCP_APPROX_STEPS`, 0 above 2^126."""
    bits = amax.view(torch.int32)
    steps = _RCP_STEP_TABLE.to(amax.device)
    on_bf16 = (bits & 0xFFFF) == 0
    step = torch.where(on_bf16, steps[(bits >> 16) & 0x7F], 0)
    rcp = ((1.0 / amax).view(torch.int32) + step).view(torch.float32)
    return torch.where(amax > RCP_FLUSH_ABOVE, 0.0, rcp)


def inverse_rope(o: torch.Tensor, freqs_cis: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``o [T, H, head_dim]`` bf16 with the last ``2 * freqs_cis.shape[1]`` values of each head
    rotated back (a new tensor; SGLang's kernel writes in place)."""
    rope_dim = 2 * freqs_cis.shape[1]
    pairs = o[..., o.shape[-1] - rope_dim :].float().unflatten(-1, (-1, 2))
    x_r, x_i = pairs[..., 0], pairs[..., 1]
    table = torch.view_as_real(freqs_cis.to(o.device))
    positions = positions.to(o.device).long()
    inside = (positions >= 0) & (positions < table.shape[0])
    row = table[positions.clamp(0, table.shape[0] - 1)]
    row = torch.where(inside[:, None, None], row, torch.nan)[:, None]  # [T, 1, rope_dim/2, 2]
    c, s = row[..., 0], row[..., 1]
    rotated = torch.stack((fma_f32(c, x_r, s * x_i), fma_f32(c, x_i, -(s * x_r))), dim=-1)
    out = o.clone()
    out[..., o.shape[-1] - rope_dim :] = round_to_bf16(rotated.flatten(-2))
    return out


def group_quant_fp8(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's fp32-scale group quantizer of bf16 ``x [..., K]``: (e4m3 ``[..., K]``, fp32
    scales ``[..., K / group_size]``)."""
    groups = x.float().unflatten(-1, (-1, group_size))
    magnitude = groups.abs()
    amax = torch.where(torch.isnan(magnitude), 0.0, magnitude).amax(-1)
    amax = torch.maximum(amax, _f32(AMAX_FLOOR_BITS, x.device))
    scales = amax * _f32(RCP_448_BITS, x.device)
    multiplier = E4M3_MAX * rcp_approx_ftz(amax)
    codes = e4m3_rne_satfinite(groups * multiplier[..., None])
    return codes.flatten(-2).view(torch.float8_e4m3fn), scales


def inverse_rope_quant_fp8(
    o: torch.Tensor,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
    *,
    o_groups: int,
    group_size: int = 128,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's chain on ``o [T, H, head_dim]``: ``(o_fp8 [T, G, D], o_scales [T, G, D /
    group_size], rotated o [T, H, head_dim])`` with ``G = o_groups``."""
    rotated = inverse_rope(o, freqs_cis, positions)
    tokens, heads, head_dim = o.shape
    # The width spelled out: reshape cannot infer a -1 from zero tokens.
    grouped = rotated.reshape(tokens, o_groups, heads * head_dim // o_groups)
    codes, scales = group_quant_fp8(grouped, group_size)
    return codes, scales, rotated
