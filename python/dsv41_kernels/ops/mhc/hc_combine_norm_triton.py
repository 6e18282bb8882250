"""The Triton kernel of the mHC combine + RMSNorm (:mod:`.hc_combine_norm`), with its MXFP8
epilogue, and its launch.

One program per row holds the whole row in registers (20 values a lane for H = 5120) as two
tiles of 32-value blocks, issues all its loads, the weight's included, makes one reduction
(Σx_in²) across warps and the MXFP8 block maxima within warps (a 32-value block spans 4 lanes);
a few extra programs zero the padding rows of the last scale tile. The sum of squares' order
is fixed by H and the launch shape (:class:`~.hc_combine_norm_plan.KernelVariant`).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from dsv41_kernels.interpreter import serialized
from dsv41_kernels.ops.mhc.hc_combine_norm_plan import KernelVariant, row_tiles
from dsv41_kernels.ops.quantization.mxfp8_encode import (
    bf16_bits_to_f32,
    mxfp8_encode_blocks,
    padding_programs,
    swizzled_scale_offset,
    zero_padding_scale_words,
)
from dsv41_kernels.ops.quantization.mxfp8_quantize import Mxfp8SwizzledInput
from dsv41_kernels.reference.hc_mix_stats import HC_MULT
from dsv41_kernels.reference.mxfp8_quantize import SF_VEC_SIZE


@triton.jit
def _bf16_round(v, HW_ROUND: tl.constexpr):
    """fp32 -> the fp32 holding its bf16 rounding (to nearest even; NaN -> 0x7FC0 bits).
    ``HW_ROUND``: the GPU's cvt.rn.bf16x2.f32 (two values an instruction, canonical NaN
    replaced) instead of the integer rounding, which the interpreter needs."""
    if HW_ROUND:
        rounded = v.to(tl.bfloat16).to(tl.float32).to(tl.int32, bitcast=True)
    else:
        bits = v.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(v != v, 0x7FC00000, rounded).to(tl.float32, bitcast=True)


@triton.jit
def _load_part(x_row, FIRST: tl.constexpr, BLOCKS: tl.constexpr, H: tl.constexpr):
    """The four streams' bf16 bits at blocks [FIRST, FIRST + BLOCKS) of the row, as [BLOCKS, 32]
    tiles (zeros past H), and the tile's column indices."""
    h = FIRST * 32 + tl.arange(0, BLOCKS)[:, None] * 32 + tl.arange(0, 32)[None, :]
    inside = h < H
    s0 = tl.load(x_row + h, mask=inside, other=0)
    s1 = tl.load(x_row + H + h, mask=inside, other=0)
    s2 = tl.load(x_row + 2 * H + h, mask=inside, other=0)
    s3 = tl.load(x_row + 3 * H + h, mask=inside, other=0)
    return s0, s1, s2, s3, h


@triton.jit
def _combine(s0, s1, s2, s3, p0, p1, p2, p3, HW_ROUND: tl.constexpr):
    """bf16(((p0·x0 + p1·x1) + p2·x2) + p3·x3), each product and sum rounded (no FMA)."""
    acc = bf16_bits_to_f32(s0) * p0
    acc = acc + bf16_bits_to_f32(s1) * p1
    acc = acc + bf16_bits_to_f32(s2) * p2
    acc = acc + bf16_bits_to_f32(s3) * p3
    return _bf16_round(acc, HW_ROUND)


@triton.jit
def _sum_of_squares(v):
    """fp32 Σ v² of a [blocks, 32] tile: along each block's 32 values, then across blocks."""
    return tl.sum(tl.sum(v * v, axis=1), axis=0)


@triton.jit
def _normalize_store(
    x_in,
    h,
    inv,
    w,
    y_row,
    q_row,
    sf_row_ptr,
    row,
    FIRST: tl.constexpr,
    H: tl.constexpr,
    PADDED_COLS: tl.constexpr,
    QUANTIZE: tl.constexpr,
    HW_CVT: tl.constexpr,
    HW_ROUND: tl.constexpr,
):
    """y = bf16((x_in · inv) · w) for one part of the row (``w`` the weight's bf16 bits), stored;
    with QUANTIZE its e4m3 codes and the part's scale bytes (blocks past H/32 hold zeros)."""
    inside = h < H
    y = _bf16_round((x_in * inv) * bf16_bits_to_f32(w), HW_ROUND)
    y = tl.where(inside, y, 0.0)  # lanes past H are padding blocks: scale 0 even if inv is NaN
    tl.store(y_row + h, (y.to(tl.int32, bitcast=True) >> 16).to(tl.int16), mask=inside)
    if QUANTIZE:
        codes, scale = mxfp8_encode_blocks(y, tl.arange(0, 32)[None, :], HW_CVT)
        # Offsets written so the compiler sees runs of only 8 contiguous bytes: the e4m3 store
        # then keeps the bf16 tiles' layout ([1, 8] per thread), so y, and above all the sum of
        # squares, have the same layout (hence the same bits) as without QUANTIZE.
        tl.store(q_row + (h // 8) * 8 + h % 8, codes, mask=inside)
        col = FIRST + tl.arange(0, x_in.shape[0])
        offset = swizzled_scale_offset(row, col, PADDED_COLS)
        tl.store(sf_row_ptr + offset, scale.to(tl.uint8), mask=col < PADDED_COLS)


@triton.jit(do_not_specialize=["rows"])
def hc_combine_norm_kernel(
    x_ptr,  # int16 view of bf16 x [rows, 4*H], last-dim stride 1
    pre_ptr,  # fp32 [rows, 4]
    w_ptr,  # int16 view of bf16 weight [H]
    y_ptr,  # int16 view of y [rows, H], last-dim stride 1
    q_ptr,  # uint8 view of the e4m3 data [rows, H] (QUANTIZE)
    sf_ptr,  # uint8 swizzled scales (QUANTIZE)
    rows,
    stride_xm,
    stride_pm,
    stride_pc,
    stride_w,
    stride_ym,
    stride_qm,
    H: tl.constexpr,
    EPS: tl.constexpr,  # an fp32 value
    HEAD_BLOCKS: tl.constexpr,  # 32-value blocks in the row's first tile (power of two)
    TAIL_BLOCKS: tl.constexpr,  # blocks in its second tile (power of two, <= HEAD_BLOCKS)
    PADDED_COLS: tl.constexpr,  # scale columns of the swizzled buffer, rup(H/32, 4)
    QUANTIZE: tl.constexpr,
    HW_CVT: tl.constexpr,
    HW_ROUND: tl.constexpr,
):
    """Program r < rows normalises row r, held in registers as two [blocks, 32] tiles (head and
    tail) so that H = 5120 = 128 + 32 blocks wastes no lanes; later programs zero scale
    padding rows (QUANTIZE)."""
    pid = tl.program_id(0)
    if pid < rows:
        row = pid.to(tl.int64)
        x_row = x_ptr + row * stride_xm
        pre_row = pre_ptr + row * stride_pm
        p0 = tl.load(pre_row)
        p1 = tl.load(pre_row + stride_pc)
        p2 = tl.load(pre_row + 2 * stride_pc)
        p3 = tl.load(pre_row + 3 * stride_pc)
        # Every load, the weight's too, is issued before the reduction: after it (a barrier)
        # a load would add a memory round trip to the row's critical path.
        a0, a1, a2, a3, h_head = _load_part(x_row, 0, HEAD_BLOCKS, H)
        b0, b1, b2, b3, h_tail = _load_part(x_row, HEAD_BLOCKS, TAIL_BLOCKS, H)
        w_head = tl.load(w_ptr + h_head * stride_w, mask=h_head < H, other=0)
        w_tail = tl.load(w_ptr + h_tail * stride_w, mask=h_tail < H, other=0)
        head = _combine(a0, a1, a2, a3, p0, p1, p2, p3, HW_ROUND)
        tail = _combine(b0, b1, b2, b3, p0, p1, p2, p3, HW_ROUND)
        # The fixed reduction order (see the module docstring): head tile, tail tile, their sum.
        ss = _sum_of_squares(head) + _sum_of_squares(tail)
        # IEEE fp32 division and square root (div.rn / sqrt.rn), as in the reference.
        one = tl.full([], 1.0, tl.float32)
        r = tl.div_rn(ss, tl.full([], H, tl.float32)) + EPS
        inv = tl.div_rn(one, tl.sqrt_rn(r))
        y_row = y_ptr + row * stride_ym
        q_row = q_ptr + row * stride_qm
        _normalize_store(
            head,
            h_head,
            inv,
            w_head,
            y_row,
            q_row,
            sf_ptr,
            row,
            0,
            H,
            PADDED_COLS,
            QUANTIZE,
            HW_CVT,
            HW_ROUND,
        )
        _normalize_store(
            tail,
            h_tail,
            inv,
            w_tail,
            y_row,
            q_row,
            sf_ptr,
            row,
            HEAD_BLOCKS,
            H,
            PADDED_COLS,
            QUANTIZE,
            HW_CVT,
            HW_ROUND,
        )
    elif QUANTIZE:
        zero_padding_scale_words(sf_ptr, pid - rows, rows, PADDED_COLS)


def launch(
    x,
    pre,
    weight,
    eps: float,
    y: torch.Tensor,
    quantized: Mxfp8SwizzledInput | None,
    variant: KernelVariant,
) -> None:
    """The Triton kernel at ``variant``'s launch shape into ``y`` and, given, ``quantized``
    (whose data and scales its epilogue writes in place)."""
    rows, width = x.shape
    h = width // HC_MULT
    head, tail = row_tiles(h)
    padded_cols = -(-(h // SF_VEC_SIZE) // 4) * 4
    grid = rows
    if quantized is not None:
        grid += padding_programs(rows, padded_cols)
        q, scales = quantized.data.view(torch.uint8), quantized.scales
    else:
        q, scales = y.view(torch.uint8), y.view(torch.uint8)  # unused
    with serialized():
        hc_combine_norm_kernel[(grid,)](
            x.view(torch.int16),
            pre,
            weight.view(torch.int16),
            y.view(torch.int16),
            q,
            scales,
            rows,
            x.stride(0),
            pre.stride(0),
            pre.stride(1),
            weight.stride(0),
            y.stride(0),
            q.stride(0),
            H=h,
            EPS=float(np.float32(eps)),  # eps as the fp32 the kernel uses
            HEAD_BLOCKS=head,
            TAIL_BLOCKS=tail,
            PADDED_COLS=padded_cols,
            QUANTIZE=quantized is not None,
            HW_CVT=x.is_cuda,
            HW_ROUND=variant.hw_round and x.is_cuda,
            num_warps=variant.num_warps,
            enable_fp_fusion=False,
        )
