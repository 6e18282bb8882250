"""FlashInfer's ``mxfp8_quantize`` stated in torch: MXFP8 (e4m3 data, UE8M0 scale per 32 values).

This follows the ``cuda`` backend of ``flashinfer.mxfp8_quantize(x, is_sf_swizzled_layout=...)``
as it stands since the ±448 clamp (docs/specs.md B.2; the code SGLang 0.5.23 pins, 0.7.2-era,
is that backend). Every row ``r`` and scale column ``c`` (elements ``32c .. 32c+31``) is
quantized on its own:

1. ``mx`` / ``my`` = NaN-ignoring max of ``|x|`` over the even / odd positions, and
   ``vmax = mx if mx > my else my``: NaN exactly when all 16 odd positions are NaN.
2. ``S = ftz(vmax * R)`` in fp32 with ``R = 0x3B124925`` (``rcp.approx.ftz(448)``, equal to
   ``RN(1/448)``); results below 2^-126 flush to zero (the JIT builds with fast math).
3. UE8M0 code, rounding up to a power of two: NaN -> 255, 0 -> 0, otherwise
   ``min(E + (mantissa != 0), 254)`` (+inf -> 254). This is the stored scale byte ``e``.
4. ``osc = 2^(127 - e)``, except ``e = 0`` and ``e = 254`` give 0 (a flushed reciprocal) and
   ``e = 255`` gives NaN.
5. ``v = ftz(ftz(x) * osc)`` (bf16 subnormal inputs become ±0), then ``fmaxf(fminf(v, 448), -448)``,
   which sends every NaN to +448.
6. e4m3 round-to-nearest-even with saturation (``cvt.rn.satfinite.e4m3x2.f32``); the sign of
   zero is kept (-0 -> 0x80).

Scales go to the 128x4 swizzled layout (rows padded to 128, scale columns to 4) or the linear
layout; every byte of the scale buffer is written, padding as 0.

``backend="cute-dsl"`` gives FlashInfer's CuTe-DSL quantizer instead (docs/specs.md B.4). It agrees
with ``cuda`` on ordinary finite data and differs only on degenerate blocks:

- NaN placement: its amax ignores NaN symmetrically over all 32 values, so a block whose odd
  positions are all NaN takes the amax of the rest (``cuda``: scale 255, every output 0x7E),
  and an all-NaN block gets scale 254 (``cuda``: 255; the outputs are 0x7E in both).
- Tiny blocks: no flush to zero. For ``448·2^-127 < amax < 448·2^-126`` it gives scale 1 and
  non-zero outputs where ``cuda`` gives scale 0 and zeros, and bf16 subnormal elements can
  quantize to non-zero codes where ``cuda`` flushes them.
"""

from __future__ import annotations

import torch

SF_VEC_SIZE = 32
"""Elements per scale (FlashInfer's ``sf_vec_size`` for MXFP8)."""

E4M3_MAX = 448.0
RCP_448_BITS = 0x3B124925
"""``rcp.approx.ftz.f32(448)`` as measured on the H200 (docs/specs.md B.9); equals RN(1/448)."""

FP32_MIN_NORMAL = 2.0**-126
BACKENDS = ("cuda", "cute-dsl")


def _f32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent in fp32 for integer exponents in [-126, 127], built from the bits (exact)."""
    return _f32_from_bits((exponent + 127) << 23)


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """fp32 flush-to-zero: subnormals become a zero of the same sign."""
    return torch.where(v.abs() < FP32_MIN_NORMAL, torch.copysign(torch.zeros_like(v), v), v)


def e4m3_rne_satfinite(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3 codes (uint8) as ``cvt.rn.satfinite.e4m3x2.f32`` does.

    Round to nearest, ties to even, over the e4m3 grid (subnormal quantum 2^-9, three mantissa
    bits above 2^-6); finite values and infinities beyond 448 saturate to ±448; NaN -> 0x7F;
    the sign of zero is kept. The rounding is done here with ``torch.round`` (half to even) on
    an exactly scaled value, so torch's float8 cast only ever sees representable values.
    """
    v = v.float()
    a = v.abs()
    _, frexp_exp = torch.frexp(a)  # a = m * 2**frexp_exp, m in [0.5, 1)
    quantum_exp = torch.clamp(frexp_exp - 1, min=-6) - 3
    # a * 2**-quantum_exp is exact (a power-of-two scaling within fp32's normal range).
    steps = torch.round(a * _pow2(torch.clamp(-quantum_exp, max=127)))
    rounded = steps * _pow2(torch.clamp(quantum_exp, min=-126))
    rounded = torch.where(torch.isinf(a), E4M3_MAX, torch.clamp(rounded, max=E4M3_MAX))
    codes = torch.copysign(rounded, v).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(v), torch.full_like(codes, 0x7F), codes)


def swizzled_scale_offset(row, col, padded_cols: int):
    """Byte offset of scale (row, col) in the 128x4 layout with ``padded_cols`` (a multiple of 4)
    scale columns: the buffer is ``[rows/128, padded_cols/4, 32, 4, 4]`` in C order, indexed
    ``[row // 128, col // 4, row % 32, (row % 128) // 32, col % 4]``. Works on ints and tensors."""
    return (
        (row // 128) * (128 * padded_cols)
        + (col // 4) * 512
        + (row % 32) * 16
        + ((row % 128) // 32) * 4
        + col % 4
    )


def scale_buffer_size(rows: int, k: int, *, swizzled: bool) -> int:
    """Bytes of the scale buffer for ``rows`` x ``k`` data: rows padded to 128 and scale columns
    to 4 in the swizzled layout, no padding in the linear one."""
    cols = k // SF_VEC_SIZE
    if not swizzled:
        return rows * cols
    return -(-rows // 128) * 128 * (-(-cols // 4) * 4)


def _ue8m0(s: torch.Tensor, backend: str) -> torch.Tensor:
    """Round a non-negative fp32 (or NaN) up to a power of two and return its biased exponent."""
    bits = s.view(torch.int32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if backend == "cuda":
        # After the flush no subnormal reaches here: exponent 0 means S == 0.
        e = torch.where(exponent == 0, 0, torch.clamp(exponent + (mantissa != 0).int(), max=254))
        return torch.where(torch.isnan(s), 255, e)
    # cute-dsl: a subnormal S is bumped to 1 only above half the smallest normal; NaN -> 254.
    bump = torch.where(exponent == 0, mantissa > 0x400000, mantissa != 0).int()
    e = torch.clamp(exponent + bump, max=254)
    return torch.where(torch.isnan(s), 254, torch.where(s <= 0, 0, e))


def _quantize_blocks(blocks: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """blocks: fp32 [..., 32] -> (e4m3 codes uint8 [..., 32], scale bytes int32 [...])."""
    magnitude = blocks.abs()
    ignoring_nan = torch.where(torch.isnan(magnitude), -1.0, magnitude)  # -1 marks "all NaN"
    if backend == "cuda":
        mx = ignoring_nan[..., 0::2].amax(-1)
        my = ignoring_nan[..., 1::2].amax(-1)
        # (mx > my) ? mx : my with NaN operands: NaN exactly when the odd maximum is NaN.
        vmax = torch.where(my < 0, float("nan"), torch.maximum(mx, my))
    else:
        vmax = ignoring_nan.amax(-1)
        vmax = torch.where(vmax < 0, float("nan"), vmax)
    rcp_448 = _f32_from_bits(torch.full((), RCP_448_BITS, device=blocks.device))
    flush = _ftz if backend == "cuda" else (lambda t: t)  # cute-dsl keeps subnormals
    e = _ue8m0(flush(vmax * rcp_448).contiguous(), backend)
    osc = torch.where((e == 0) | (e >= 254), 0.0, _pow2(torch.clamp(127 - e, -126, 127)))
    osc = torch.where(e == 255, float("nan"), osc)
    v = flush(flush(blocks) * osc[..., None])
    v = torch.where(torch.isnan(v), E4M3_MAX, torch.clamp(v, -E4M3_MAX, E4M3_MAX))
    return e4m3_rne_satfinite(v), e


def mxfp8_quantize(
    x: torch.Tensor, *, swizzled: bool = True, backend: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize ``x`` [M, K] (bf16 or fp16, ``K % 32 == 0``) along K.

    Returns ``(q, scales)``: ``q`` float8_e4m3fn [M, K] and ``scales`` uint8 1-D, in the 128x4
    swizzled layout (``swizzled=True``, length ``rup(M, 128) * rup(K/32, 4)``) or the linear
    layout (length ``M * K/32``). ``backend`` is ``"cuda"`` (default) or ``"cute-dsl"``.
    """
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"x must be a 2-D bf16/fp16 tensor, got {x.dtype} {tuple(x.shape)}")
    if x.shape[1] % SF_VEC_SIZE:
        raise ValueError(f"x.shape[1] must be a multiple of {SF_VEC_SIZE}, got {x.shape[1]}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    m, k = x.shape
    cols = k // SF_VEC_SIZE
    codes, e = _quantize_blocks(x.float().reshape(m, cols, SF_VEC_SIZE), backend)
    q = codes.reshape(m, k).view(torch.float8_e4m3fn)
    scales = torch.zeros(
        scale_buffer_size(m, k, swizzled=swizzled), dtype=torch.uint8, device=x.device
    )
    if swizzled:
        rows = torch.arange(m, device=x.device)[:, None]
        offsets = swizzled_scale_offset(
            rows, torch.arange(cols, device=x.device), -(-cols // 4) * 4
        )
        scales[offsets.reshape(-1)] = e.reshape(-1).to(torch.uint8)
    else:
        scales.copy_(e.reshape(-1))
    return q, scales
