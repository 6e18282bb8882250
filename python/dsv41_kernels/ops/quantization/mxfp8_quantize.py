"""MXFP8 quantization (e4m3 data, one UE8M0 scale per 32 values) in FlashInfer's byte format.

FlashInfer's ``mxfp8_quantize`` CUDA kernel is compiled only for SM100+: on Hopper it launches,
does nothing and returns uninitialised memory. This Triton kernel produces the same bytes on
any GPU Triton runs on, in the 128x4 swizzled scale layout the MXFP8 GEMMs read (or linear).

Contract: ``mxfp8_quantize(x)`` is **bitwise equal** to
:func:`dsv41_kernels.reference.mxfp8.mxfp8_quantize` (FlashInfer's ``cuda`` backend,
docs/specs.md section B): the asymmetric even/odd NaN amax, ``S = ftz(amax · 0x3B124925)``,
UE8M0 round-up, flush to zero of inputs and products, the ±448 clamp with NaN -> +448 and e4m3
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

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_flag,
    check_tensor,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.interpreter import serialized
from dsv41_kernels.ops.quantization.mxfp8_encode import (
    bf16_bits_to_f32,
    mxfp8_encode_blocks,
    padding_programs,
    swizzled_scale_offset,
    zero_padding_scale_words,
)
from dsv41_kernels.reference.mxfp8 import SF_VEC_SIZE, scale_buffer_size
from dsv41_kernels.reference.mxfp8 import mxfp8_quantize as reference_mxfp8_quantize

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
BLOCKS_PER_PROGRAM = 32  # 32-value blocks per program: 1024 values, 8 per thread
TRITON = "triton"


class Mxfp8SwizzledInput(NamedTuple):
    """E4M3 activations and UE8M0 scales in FlashInfer's 128x4 layout, as an MXFP8 linear reads
    them (the explicit marker SGLang's ``mxfp8_input`` uses, so block-FP8 pairs are not mistaken
    for it)."""

    data: torch.Tensor
    """float8_e4m3fn [m, K]."""
    scales: torch.Tensor
    """uint8 1-D, ``rup(m, 128) * rup(K/32, 4)`` bytes, 128x4 swizzled."""


def _validate(x, swizzled) -> bool:
    """Raise ValueError unless ``x`` is a 2-D bf16/fp16 tensor with ``K % 32 == 0`` and
    ``swizzled`` a bool; returns ``swizzled``."""
    check_tensor("x", x, dtypes=SUPPORTED_DTYPES, ndim=2)
    if x.shape[1] % SF_VEC_SIZE:
        raise ValueError(f"x.shape[1] must be a multiple of {SF_VEC_SIZE}, got {x.shape[1]}")
    return check_flag("swizzled", swizzled)


def _plan(x: torch.Tensor, swizzled: bool) -> Admission:
    where = triton_device(x)
    if not where:
        return where
    if x.shape[1] > 1 and x.stride(1) != 1:
        return refuse("x's last-dim stride != 1")
    layout = "128x4 swizzled" if swizzled else "linear"
    return admit(TRITON, f"{where.reason}, {x.shape[0]} x {x.shape[1]}, {layout} scales")


def mxfp8_quantize_admission(x: torch.Tensor, *, swizzled: bool = True) -> Admission:
    """Whether ``x`` takes the Triton kernel; pure (shapes, strides, device only)."""
    try:
        swizzled = _validate(x, swizzled)
    except ValueError as e:
        return invalid(e)
    return _plan(x, swizzled)


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
    """Quantize ``x`` (already valid) into the caller's ``q`` (e4m3 ``[M, K]``) and ``scales``
    (1-D, the layout's size): by the kernel when admitted and the outputs suit it (last-dim
    stride 1, contiguous 4-byte aligned scales: padding is written as words), else the
    reference."""
    kernel_outputs = q.stride(1) == 1 and scales.is_contiguous() and scales.data_ptr() % 4 == 0
    if kernel_outputs and _plan(x, swizzled):
        launch(x, q, scales, swizzled=swizzled)
        return
    data, sf = reference_mxfp8_quantize(x, swizzled=swizzled)
    q.copy_(data)
    scales.copy_(sf)


def launch(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, *, swizzled: bool) -> None:
    """The kernel on admitted ``x``; an empty ``x`` (``[0, K]`` or ``[M, 0]``) has no bytes to
    write (its scale buffer is empty too)."""
    rows, k = x.shape
    if rows == 0 or k == 0:
        return
    cols = k // SF_VEC_SIZE
    padded_cols = -(-cols // 4) * 4 if swizzled else cols
    block_cols = min(BLOCKS_PER_PROGRAM, triton.next_power_of_2(padded_cols))
    col_programs = triton.cdiv(padded_cols, block_cols)
    grid = rows * col_programs
    if swizzled:
        grid += padding_programs(rows, padded_cols)
    bf16 = x.dtype == torch.bfloat16
    with serialized():
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


def mxfp8_quantize(
    x: torch.Tensor, *, swizzled: bool = True, admission: Admission | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize ``x`` [M, K] (bf16 or fp16, ``K % 32 == 0``) along K.

    Returns ``(q, scales)``: ``q`` float8_e4m3fn [M, K], ``scales`` uint8 1-D in the 128x4
    swizzled layout (``rup(M, 128) * rup(K/32, 4)`` bytes) or, with ``swizzled=False``, the
    linear layout (``M * K/32`` bytes). Bitwise equal to the reference on every path.
    ``admission``: this call's :func:`mxfp8_quantize_admission`, when the caller already made it.
    """
    swizzled = _validate(x, swizzled)
    if admission is None:
        admission = _plan(x, swizzled)
    if not admission:
        return reference_mxfp8_quantize(x, swizzled=swizzled)
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(
        scale_buffer_size(rows, k, swizzled=swizzled), dtype=torch.uint8, device=x.device
    )
    launch(x, q, scales, swizzled=swizzled)  # fresh contiguous outputs suit the kernel
    return q, scales
