"""Triton device functions for MXFP8 in FlashInfer's byte format, shared by two ops.

:mod:`.mxfp8_quantize` and :mod:`dsv41_kernels.ops.mhc.hc_combine_norm` (its fused epilogue)
encode 32-value blocks with :func:`mxfp8_encode_blocks` and write the 128x4 swizzled scale
layout with :func:`swizzled_scale_offset` and :func:`zero_padding_scale_words`, so the fused
form gives the quantizer's bytes by construction. The byte rules are FlashInfer's ``cuda``
backend, restated in docs/specs.md section B (B.2 the block algorithm, B.5 the layouts).
:func:`e4m3_rne_satfinite` is also the e4m3 rounding of
:mod:`dsv41_kernels.ops.attention.inverse_rope_quant_fp8_triton` under the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

PAD_WORDS = 1024  # 4-byte words of swizzled scale padding zeroed per extra program
_PAD_WORDS = tl.constexpr(PAD_WORDS)  # kernels see module constants only as constexpr


@triton.jit
def swizzled_scale_offset(row, col, PADDED_COLS: tl.constexpr):
    """Byte offset of scale (row, col) in the 128x4 layout [rows/128, PADDED_COLS/4, 32, 4, 4]."""
    return (
        (row // 128) * (128 * PADDED_COLS)
        + (col // 4) * 512
        + (row % 32) * 16
        + ((row % 128) // 32) * 4
        + col % 4
    )


def padding_programs(rows: int, padded_cols: int) -> int:
    """Programs of :func:`zero_padding_scale_words` for a swizzled buffer of ``rows`` rows."""
    if rows % 128 == 0:
        return 0
    return triton.cdiv(padded_cols * 32, PAD_WORDS)


@triton.jit
def zero_padding_scale_words(sf_ptr, program, rows, PADDED_COLS: tl.constexpr):
    """Scale 0 for the rows of the last 128-row tile that lie past ``rows``, PAD_WORDS 4-byte
    words of the tile per program (``program`` counts from 0).

    In the 128x4 layout each 4-byte word holds one row's 4 consecutive scale columns: word
    ``i`` of a 512-byte column group is row ``i // 4 + 32 * (i % 4)`` of the tile. Padding is
    written as whole words of padding rows, so it never touches a byte of a real row."""
    word = program * _PAD_WORDS + tl.arange(0, _PAD_WORDS)
    in_group = word % 128
    tile_row = in_group // 4 + 32 * (in_group % 4)
    tile = (sf_ptr + (rows // 128).to(tl.int64) * (128 * PADDED_COLS)).to(tl.pointer_type(tl.int32))
    pad = (tile_row >= rows % 128) & (word < PADDED_COLS * 32)
    tl.store(tile + word, tl.zeros([_PAD_WORDS], dtype=tl.int32), mask=pad)


@triton.jit
def bf16_bits_to_f32(bits):
    """bf16 bits (int16, or int32 holding them in the low half) -> the fp32 value, exactly.

    Used instead of a cast because the Triton interpreter mis-converts bf16 subnormals."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_rne_satfinite(v):
    """fp32 in [-448, 448] (no NaN) -> e4m3 code (int32 0..255), round to nearest even; fp32
    subnormals give a zero of their sign. Integer emulation of ``cvt.rn.satfinite.e4m3x2.f32``
    for the interpreter, whose float8 cast is not the hardware's."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    # |v| >= 2^-6: drop 20 of fp32's 23 mantissa bits with ties to even; the carry may bump
    # the exponent, and the fp32 bias 127 becomes e4m3's 7.
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    # |v| < 2^-6: the code is |v| / 2^-9 rounded to an integer, ties to even (8 means 2^-6).
    shift = tl.minimum(tl.maximum(141 - (a >> 23), 1), 31)
    significand = (a & 0x7FFFFF) | 0x800000
    quotient = significand >> shift
    remainder = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    round_up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
    subnormal = tl.where(a == 0, 0, quotient + round_up.to(tl.int32))
    return sign | tl.where(a >= (121 << 23), tl.minimum(normal, 0x7E), subnormal)


@triton.jit
def mxfp8_encode_blocks(v, col, HW_CVT: tl.constexpr):
    """MXFP8 of a [G, 32] fp32 tile of bf16/fp16 values (one row of 32 per scale block).

    ``col`` is the column within the block ([1, 32] or [G, 32]). Returns ``(codes, scale)``:
    e4m3 codes uint8 [G, 32] and UE8M0 scale bytes int32 [G], FlashInfer's cuda backend. The
    block maxima are ``tl.max`` along the 32 values of a block, which the tile layout keeps
    inside one warp (register shuffles, no shared memory). ``HW_CVT``: round with the GPU's
    ``cvt.rn.satfinite.e4m3x2.f32`` (the instruction FlashInfer uses) instead of the integer
    emulation; both give the same bytes on the clamped, NaN-free input.
    """
    bits = v.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # Non-negative fp32 bits order like their values; NaN becomes -1 so max ignores it.
    ordered = tl.where(magnitude > 0x7F800000, -1, magnitude)
    is_odd = (col % 2) == 1
    even_max = tl.max(tl.where(is_odd, -1, ordered), axis=1)
    odd_max = tl.max(tl.where(is_odd, ordered, -1), axis=1)
    # cuda's (mx > my) ? mx : my is NaN iff the odd maximum is NaN (handled as scale 255 below).
    vmax = tl.maximum(even_max, odd_max).to(tl.float32, bitcast=True)
    rcp_448 = tl.full([], 0x3B124925, tl.int32).to(tl.float32, bitcast=True)
    s = (vmax * rcp_448).to(tl.int32, bitcast=True)
    s_exp = (s >> 23) & 0xFF
    # A subnormal S (exponent field 0) is flushed: scale 0.
    scale = tl.where(s_exp == 0, 0, tl.minimum(s_exp + ((s & 0x7FFFFF) != 0).to(tl.int32), 254))
    scale = tl.where(odd_max < 0, 255, scale)
    # 2^(127 - e) from its bits; e = 0 and e = 254 flush to 0, e = 255 is NaN.
    osc = tl.where((scale == 0) | (scale >= 254), 0, (254 - scale) << 23)
    osc = tl.where(scale == 255, 0x7FC00000, osc).to(tl.float32, bitcast=True)
    # Inputs flush to zero; a subnormal product need not be flushed: e4m3 rounds it to ±0 anyway.
    if HW_CVT:
        # Fewer instructions for the same bytes (the epilogue is issue-bound): mul.ftz flushes a
        # subnormal input to a zero of its sign, and the satfinite conversion clamps finite
        # values and ±Inf to ±448 itself, so only NaN (-> +448) needs a select.
        p = tl.inline_asm_elementwise(
            "mul.ftz.f32 $0, $1, $2;",
            "=f,f,f",
            [v, tl.broadcast_to(osc[:, None], v.shape)],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
        codes = tl.where(p != p, 448.0, p).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        x = tl.where((bits & 0x7F800000) == 0, bits ^ magnitude, bits).to(tl.float32, bitcast=True)
        # ±Inf · 0 is NaN (+448 below): selected rather than multiplied, so numpy, which runs
        # the interpreter's arithmetic, has no invalid product to warn about.
        inf_times_zero = (magnitude == 0x7F800000) & (osc == 0.0)[:, None]
        p = tl.where(inf_times_zero, 0.0, x) * osc[:, None]
        p = tl.where((p != p) | inf_times_zero, 448.0, tl.minimum(tl.maximum(p, -448.0), 448.0))
        codes = e4m3_rne_satfinite(p).to(tl.uint8)
    return codes, scale
