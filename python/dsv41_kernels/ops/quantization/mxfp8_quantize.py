"""MXFP8 quantization (e4m3 data, one UE8M0 scale per 32 values) in FlashInfer's byte format.

FlashInfer's ``mxfp8_quantize`` CUDA kernel is compiled only for SM100+: on Hopper it launches,
does nothing and returns uninitialised memory. This Triton kernel produces the same bytes on
any GPU Triton runs on, in the 128x4 swizzled scale layout the MXFP8 GEMMs read (or linear).

Contract: ``mxfp8_quantize(x)`` is **bitwise equal** to
:func:`dsv41_kernels.reference.mxfp8.mxfp8_quantize` (FlashInfer's ``cuda`` backend, specs.md
section B): the asymmetric even/odd NaN amax, ``S = ftz(amax · 0x3B124925)``, UE8M0 round-up,
flush to zero of inputs and products, the ±448 clamp with NaN -> +448 and e4m3
round-to-nearest-even with the sign of zero kept. Every byte of the scale buffer is written
(padding rows and columns 0). The block maximum is an integer max over the fp32 bits, the
scale is integer bit arithmetic, the flushes are explicit, and the e4m3 rounding is the GPU's
``cvt.rn.satfinite.e4m3x2.f32`` (an integer emulation of it under the Triton interpreter), so
the interpreter and every GPU give the same bytes. One program quantizes 1024 values of one
row (8 per thread, a 32-value block within 4 lanes of a warp); a few extra programs zero the
padding rows of the last 128-row scale tile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import Admission, admit, check_tensor, refuse, triton_device
from dsv41_kernels.reference.mxfp8 import SF_VEC_SIZE, scale_buffer_size
from dsv41_kernels.reference.mxfp8 import mxfp8_quantize as reference_mxfp8_quantize

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
BLOCKS_PER_PROGRAM = 32  # 32-value blocks per program: 1024 values, 8 per thread
PAD_WORDS = 1024  # 4-byte words of swizzled scale padding zeroed per extra program
_PAD_WORDS = tl.constexpr(PAD_WORDS)  # kernels see module constants only as constexpr


class Mxfp8SwizzledInput(NamedTuple):
    """E4M3 activations and UE8M0 scales in FlashInfer's 128x4 layout, as an MXFP8 linear reads
    them (the explicit marker SGLang's ``mxfp8_input`` uses, so block-FP8 pairs are not mistaken
    for it)."""

    data: torch.Tensor
    """float8_e4m3fn [m, K]."""
    scales: torch.Tensor
    """uint8 1-D, ``rup(m, 128) * rup(K/32, 4)`` bytes, 128x4 swizzled."""


def check_mxfp8_input(x: torch.Tensor) -> None:
    """Raise ValueError unless ``x`` is a 2-D bf16/fp16 tensor with ``K % 32 == 0``."""
    check_tensor("x", x, dtypes=SUPPORTED_DTYPES, ndim=2)
    if x.shape[1] % SF_VEC_SIZE:
        raise ValueError(f"x.shape[1] must be a multiple of {SF_VEC_SIZE}, got {x.shape[1]}")


def mxfp8_quantize_admission(x: torch.Tensor, *, swizzled: bool = True) -> Admission:
    """Whether ``x`` may take the Triton kernel; pure (shapes, strides, device only)."""
    check_mxfp8_input(x)
    where = triton_device(x)
    if not where:
        return where
    if x.shape[1] > 1 and x.stride(1) != 1:
        return refuse("x's last-dim stride != 1")
    layout = "128x4 swizzled" if swizzled else "linear"
    return admit(f"{where.reason}, {x.shape[0]} x {x.shape[1]}, {layout} scales")


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
def _e4m3_rne_satfinite(v):
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
        p = x * osc[:, None]
        p = tl.where(p != p, 448.0, tl.minimum(tl.maximum(p, -448.0), 448.0))
        codes = _e4m3_rne_satfinite(p).to(tl.uint8)
    return codes, scale


@triton.jit(do_not_specialize=["rows"])
def mxfp8_quantize_kernel(
    x_ptr,  # int16 view of bf16 x (BF16_BITS), or fp16 x
    q_ptr,  # uint8 view of the e4m3 output [rows, K]
    sf_ptr,  # uint8 [scale_buffer_size]
    rows,
    stride_xm,
    stride_qm,
    COLS: tl.constexpr,  # K / 32
    PADDED_COLS: tl.constexpr,  # scale columns in the buffer (rup(COLS, 4) when swizzled)
    SWIZZLED: tl.constexpr,
    BF16_BITS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,  # scale blocks per program (power of two)
    COL_PROGRAMS: tl.constexpr,  # programs per row: cdiv(PADDED_COLS, BLOCK_COLS)
    HW_CVT: tl.constexpr,
):
    """Programs [0, rows * COL_PROGRAMS) quantize BLOCK_COLS scale blocks of one row, the padding
    columns included (they read zeros, so scale 0); the programs after them zero the padding
    rows of the last 128-row scale tile (swizzled only)."""
    pid = tl.program_id(0)
    if pid < rows * COL_PROGRAMS:
        row = (pid // COL_PROGRAMS).to(tl.int64)
        col = (pid % COL_PROGRAMS) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        j = tl.arange(0, 32)[None, :]
        element = col[:, None] * 32 + j
        data = element < COLS * 32
        x = tl.load(x_ptr + row * stride_xm + element, mask=data, other=0)
        x = bf16_bits_to_f32(x) if BF16_BITS else x.to(tl.float32)
        codes, scale = mxfp8_encode_blocks(x, j, HW_CVT)
        tl.store(q_ptr + row * stride_qm + element, codes, mask=data)
        offset = swizzled_scale_offset(row, col, PADDED_COLS) if SWIZZLED else row * COLS + col
        tl.store(sf_ptr + offset, scale.to(tl.uint8), mask=col < PADDED_COLS)
    elif SWIZZLED:
        zero_padding_scale_words(sf_ptr, pid - rows * COL_PROGRAMS, rows, PADDED_COLS)


def quantize_into(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, *, swizzled: bool):
    """Quantize ``x`` into the caller's ``q`` (e4m3 ``[M, K]``) and ``scales`` (1-D, the
    layout's size): by the kernel when admitted and the outputs suit it (last-dim stride 1,
    contiguous 4-byte aligned scales: padding is written as words), else the reference."""
    kernel_outputs = q.stride(1) == 1 and scales.is_contiguous() and scales.data_ptr() % 4 == 0
    if mxfp8_quantize_admission(x, swizzled=swizzled) and kernel_outputs:
        if x.shape[0]:
            launch(x, q, scales, swizzled=swizzled)
        return
    data, sf = reference_mxfp8_quantize(x, swizzled=swizzled)
    q.copy_(data)
    scales.copy_(sf)


def launch(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, *, swizzled: bool) -> None:
    rows, k = x.shape
    cols = k // SF_VEC_SIZE
    padded_cols = -(-cols // 4) * 4 if swizzled else cols
    block_cols = min(BLOCKS_PER_PROGRAM, triton.next_power_of_2(padded_cols))
    col_programs = triton.cdiv(padded_cols, block_cols)
    grid = rows * col_programs
    if swizzled:
        grid += padding_programs(rows, padded_cols)
    bf16 = x.dtype == torch.bfloat16
    mxfp8_quantize_kernel[(grid,)](
        x.view(torch.int16) if bf16 else x,
        q.view(torch.uint8),
        scales,
        rows,
        x.stride(0),
        q.stride(0),
        COLS=cols,
        PADDED_COLS=padded_cols,
        SWIZZLED=swizzled,
        BF16_BITS=bf16,
        BLOCK_COLS=block_cols,
        COL_PROGRAMS=col_programs,
        HW_CVT=x.is_cuda,
        num_warps=4,
        enable_fp_fusion=False,  # no multiply-add pairs here; kept off as in every exact kernel
    )


def mxfp8_quantize(x: torch.Tensor, *, swizzled: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize ``x`` [M, K] (bf16 or fp16, ``K % 32 == 0``) along K.

    Returns ``(q, scales)``: ``q`` float8_e4m3fn [M, K], ``scales`` uint8 1-D in the 128x4
    swizzled layout (``rup(M, 128) * rup(K/32, 4)`` bytes) or, with ``swizzled=False``, the
    linear layout (``M * K/32`` bytes). Bitwise equal to the reference on every path.
    """
    if not mxfp8_quantize_admission(x, swizzled=swizzled):
        return reference_mxfp8_quantize(x, swizzled=swizzled)
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(
        scale_buffer_size(rows, k, swizzled=swizzled), dtype=torch.uint8, device=x.device
    )
    if rows:  # fresh contiguous outputs suit the kernel (quantize_into's check is for callers')
        launch(x, q, scales, swizzled=swizzled)
    return q, scales


def special_values_bf16(k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rows of hand-picked blocks covering specs.md B.3: zeros of both signs, 448, the largest
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


def check_cases(device: torch.device, small: bool) -> list:
    from dsv41_kernels.check import CheckCase, bit_mismatches

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
