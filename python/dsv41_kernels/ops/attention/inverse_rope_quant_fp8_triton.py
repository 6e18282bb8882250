"""The Triton kernel of :mod:`dsv41_kernels.ops.attention.inverse_rope_quant_fp8`, and its launch.

It takes every admitted call the CUDA kernel does not (any group size, any even strides, the
interpreter on CPU, no CUDA module). A program quantizes ``BLOCK_GROUPS`` groups of one token.
On a GPU the instructions that decide the bits are SGLang's (one ``fma.rn.f32`` per rotated
value, ``div.approx.ftz.f32`` and ``cvt.rn.satfinite.e4m3x2.f32``, as inline PTX); under the
interpreter the e4m3 conversion is emulated with integers and the reciprocal is the
reference's model of ``MUFU.RCP``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.interpreter import serialized
from dsv41_kernels.ops.quantization.mxfp8_encode import e4m3_rne_satfinite
from dsv41_kernels.reference.inverse_rope_quant_fp8 import (
    AMAX_FLOOR_BITS,
    BF16_CANONICAL_NAN,
    RCP_448_BITS,
    RCP_APPROX_STEPS,
    RCP_FLUSH_ABOVE,
)

# Kernels see module constants only as constexpr.
_AMAX_FLOOR_BITS = tl.constexpr(AMAX_FLOOR_BITS)
_RCP_448_BITS = tl.constexpr(RCP_448_BITS)
_RCP_FLUSH_ABOVE = tl.constexpr(RCP_FLUSH_ABOVE)
_NAN_BITS = tl.constexpr(BF16_CANONICAL_NAN << 16)
_SIGN_BIT = tl.constexpr(-(1 << 31))
_RCP_STEP_FIELDS = tl.constexpr(tuple(RCP_APPROX_STEPS))
_RCP_STEPS = tl.constexpr(tuple(RCP_APPROX_STEPS.values()))
_RCP_STEP_COUNT = tl.constexpr(len(RCP_APPROX_STEPS))


@triton.jit
def _bf16_bits(v):
    """fp32 -> bf16 bits in the low half of an int32, to nearest even, NaN -> 0x7FFF: what the
    GPU's ``cvt.rn.bf16x2.f32`` gives, in integers on every device (Triton 3.6 emits the scalar
    ``F2F.BF16.F32`` instead, and the interpreter's cast does not round to even)."""
    bits = tl.where(v != v, _NAN_BITS, v.to(tl.int32, bitcast=True))
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


@triton.jit
def _e4m3_emulated(v):
    """fp32 -> e4m3 code (int32 0..255) as ``cvt.rn.satfinite`` gives it, in integers."""
    finite = e4m3_rne_satfinite(tl.minimum(tl.maximum(v, -448.0), 448.0))
    return tl.where(v != v, 0x7F, finite)


@triton.jit
def _e4m3_pair_codes(high, low, HW: tl.constexpr):
    """``(e4m3(high) << 8) | e4m3(low)`` as int32: one ``cvt.rn.satfinite.e4m3x2.f32``, or its
    emulation. The pair is converted into one 32-bit register because Triton 3.6's float8 cast,
    whose bytes are then taken apart with 16-bit moves, is miscompiled by its ptxas for sm_90a:
    every odd pair's low code (x_r's) was read from the stack pointer's register (0xFC, -384),
    a quarter of all bytes."""
    if HW:
        codes = tl.inline_asm_elementwise(
            "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $1, $2; cvt.u32.u16 $0, t; }",
            "=r,f,f",
            [high, low],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
    else:
        codes = (_e4m3_emulated(high) << 8) | _e4m3_emulated(low)
    return codes


@triton.jit
def _rcp_approx_model(amax):
    """The reference's model of ``rcp.approx.ftz.f32`` on what ``amax`` holds (bf16 values and
    fp32(1e-10)): the correctly rounded reciprocal, stepped on the significands it misses."""
    bits = amax.to(tl.int32, bitcast=True)
    field = tl.where((bits & 0xFFFF) == 0, (bits >> 16) & 0x7F, -1)
    step = tl.zeros_like(bits)
    for k in tl.static_range(_RCP_STEP_COUNT):
        step = tl.where(field == _RCP_STEP_FIELDS[k], _RCP_STEPS[k], step)
    rcp = ((1.0 / amax).to(tl.int32, bitcast=True) + step).to(tl.float32, bitcast=True)
    return tl.where(amax > _RCP_FLUSH_ABOVE, 0.0, rcp)


@triton.jit
def inverse_rope_quant_fp8_kernel(
    o_ptr,  # int32 view of bf16 o [T, H, HEAD_DIM / 2]: one (even, odd) pair per word
    freqs_ptr,  # int64 view of complex64 freqs_cis [rows, ROPE_DIM / 2]: (cos, sin) per word
    positions_ptr,  # int32 / int64 [T]
    codes_ptr,  # int16 view of e4m3 [T, GROUPS_PER_TOKEN * GROUP_SIZE / 2], contiguous
    scales_ptr,  # fp32 [T, GROUPS_PER_TOKEN], contiguous
    table_rows,
    stride_ot,  # o's strides in pairs
    stride_oh,
    stride_pos,
    stride_fs,
    stride_fp,
    HEAD_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_TOKEN: tl.constexpr,
    BLOCK_GROUPS: tl.constexpr,
    ROTATE_O: tl.constexpr,
    HW: tl.constexpr,  # GPU instructions; False: their emulation (the interpreter)
):
    """Program p quantizes groups [BLOCK_GROUPS * (p % programs per token), ...) of token
    p // (programs per token), each [GROUP_SIZE] values of one head held as GROUP_SIZE / 2
    pairs (x_r, x_i) = (x[2j], x[2j + 1]), the layout of the rotation."""
    PROGRAMS_PER_TOKEN: tl.constexpr = (GROUPS_PER_TOKEN + BLOCK_GROUPS - 1) // BLOCK_GROUPS
    GROUPS_PER_HEAD: tl.constexpr = HEAD_DIM // GROUP_SIZE
    PAIRS: tl.constexpr = GROUP_SIZE // 2
    pid = tl.program_id(0)
    token = (pid // PROGRAMS_PER_TOKEN).to(tl.int64)
    group = (pid % PROGRAMS_PER_TOKEN) * BLOCK_GROUPS + tl.arange(0, BLOCK_GROUPS)
    live = (group < GROUPS_PER_TOKEN)[:, None]
    head = group // GROUPS_PER_HEAD
    j = tl.arange(0, PAIRS)[None, :]
    pair = (group % GROUPS_PER_HEAD)[:, None] * PAIRS + j  # the pair's index within its head
    word_ptr = o_ptr + token * stride_ot + head[:, None] * stride_oh + pair
    words = tl.load(word_ptr, mask=live, other=0)
    x_r = (words << 16).to(tl.float32, bitcast=True)
    x_i = (words & -65536).to(tl.float32, bitcast=True)  # the high half, 0xFFFF0000

    # Rope pairs are the head's last ROPE_DIM / 2; pair k of them is row k of the table.
    rope_pair = pair - (HEAD_DIM - ROPE_DIM) // 2
    rope = live & (rope_pair >= 0)
    position = tl.load(positions_ptr + token * stride_pos).to(tl.int64)
    inside = (position >= 0) & (position < table_rows)  # else NaN, and row 0 is read instead
    f_ptr = freqs_ptr + tl.where(inside, position, 0) * stride_fs + rope_pair * stride_fp
    rotation = tl.load(f_ptr, mask=rope, other=0)  # (cosine, sine) as one word, like o's pairs
    cos = tl.where(inside, rotation.to(tl.int32).to(tl.float32, bitcast=True), float("nan"))
    sin = (rotation >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    sin = tl.where(inside, sin, float("nan"))
    rotated_r = _bf16_bits(tl.fma(cos, x_r, sin * x_i))
    # The sign flipped in its bit: Triton lowers -v to 0 - v, which turns -0 into +0.
    minus_sin_x_r = ((sin * x_r).to(tl.int32, bitcast=True) ^ _SIGN_BIT).to(
        tl.float32, bitcast=True
    )
    rotated_i = _bf16_bits(tl.fma(cos, x_i, minus_sin_x_r))
    y_r = tl.where(rope, (rotated_r << 16).to(tl.float32, bitcast=True), x_r)
    y_i = tl.where(rope, (rotated_i << 16).to(tl.float32, bitcast=True), x_i)
    if ROTATE_O:
        tl.store(word_ptr, (rotated_i << 16) | rotated_r, mask=rope)

    # Quantization: NaN-ignoring maximum of the magnitudes as integers (non-negative fp32 bits
    # order like their values), floored, then the scale and the multiplier.
    magnitude_r = y_r.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    magnitude_i = y_i.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    magnitude = tl.maximum(
        tl.where(magnitude_r > 0x7F800000, 0, magnitude_r),
        tl.where(magnitude_i > 0x7F800000, 0, magnitude_i),
    )
    amax = tl.max(magnitude, axis=1).to(tl.float32, bitcast=True)
    amax = tl.maximum(amax, tl.full([], _AMAX_FLOOR_BITS, tl.int32).to(tl.float32, bitcast=True))
    scale = amax * tl.full([], _RCP_448_BITS, tl.int32).to(tl.float32, bitcast=True)
    if HW:
        multiplier = tl.inline_asm_elementwise(
            "div.approx.ftz.f32 $0, $1, $2;",
            "=f,f,f",
            [tl.full(amax.shape, 448.0, tl.float32), amax],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        multiplier = _rcp_approx_model(amax) * 448.0
    codes = _e4m3_pair_codes(y_i * multiplier[:, None], y_r * multiplier[:, None], HW)
    out_pair = group[:, None] * PAIRS + j
    codes = codes.to(tl.int16)
    tl.store(codes_ptr + token * (GROUPS_PER_TOKEN * PAIRS) + out_pair, codes, mask=live)
    tl.store(scales_ptr + token * GROUPS_PER_TOKEN + group, scale, mask=group < GROUPS_PER_TOKEN)


def launch_triton(
    o, freqs_cis, positions, codes, scales, *, group_size: int, rotate_o: bool, block_groups: int,
    num_warps: int,
) -> None:  # fmt: skip
    """The kernel on valid, admitted arguments with at least one token, into ``codes`` /
    ``scales`` (contiguous), ``block_groups`` groups a program (a power of two) on
    ``num_warps`` warps: the plan's launch shape (every shape gives the same bits)."""
    tokens, heads, head_dim = o.shape
    groups_per_token = heads * head_dim // group_size
    words = o.view(torch.int32)
    table = freqs_cis.view(torch.int64)
    with serialized():
        inverse_rope_quant_fp8_kernel[(tokens * triton.cdiv(groups_per_token, block_groups),)](
            words,
            table,
            positions,
            codes.view(torch.int16),
            scales,
            table.shape[0],
            words.stride(0),
            words.stride(1),
            positions.stride(0),
            table.stride(0),
            table.stride(1),
            HEAD_DIM=head_dim,
            ROPE_DIM=2 * freqs_cis.shape[1],
            GROUP_SIZE=group_size,
            GROUPS_PER_TOKEN=groups_per_token,
            BLOCK_GROUPS=block_groups,
            ROTATE_O=rotate_o,
            HW=o.is_cuda,
            num_warps=num_warps,
            enable_fp_fusion=False,  # the one fused multiply-add per rotated value is explicit
        )
