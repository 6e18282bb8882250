"""MXFP8 quantization (e4m3 data, one UE8M0 scale per 32 values) in FlashInfer's byte format.

FlashInfer's ``mxfp8_quantize`` CUDA kernel is compiled only for SM100+: on Hopper it launches,
does nothing and returns uninitialised memory. This Triton kernel produces the same bytes on
any GPU Triton runs on, in the 128x4 swizzled scale layout the MXFP8 GEMMs read (or linear).

Contract: ``mxfp8_quantize(x)`` is **bitwise equal** to
:func:`dsv41_kernels.reference.mxfp8_quantize.mxfp8_quantize` (FlashInfer's ``cuda`` backend,
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

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
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
from dsv41_kernels.reference.mxfp8_quantize import SF_VEC_SIZE, scale_buffer_size
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize as reference_mxfp8_quantize

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
BLOCKS_PER_PROGRAM = 32  # 32-value blocks per program: 1024 values, 8 per thread
NUM_WARPS = 4  # with 32 blocks a program: 8 values a thread, a block within 4 lanes of a warp
TRITON = "triton"  # the one kernel: Admission.kernel of every admitted call


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


@dataclass(frozen=True)
class Mxfp8QuantizePlan:
    """The Triton kernel's launch for one ``[rows, K]`` input, chosen by :func:`_plan`."""

    swizzled: bool  # scales in the 128x4 swizzled layout, else linear
    cols: int  # scale blocks a row: K / 32
    padded_cols: int  # scale columns in the buffer: rup(cols, 4) when swizzled, else cols
    block_cols: int  # scale blocks a program (a power of two)
    col_programs: int  # programs a row: cdiv(padded_cols, block_cols)
    programs: int  # the grid: rows * col_programs, then the padding-row programs; 0: no launch


def _launch_shape(rows: int, k: int, swizzled: bool) -> Mxfp8QuantizePlan:
    cols = k // SF_VEC_SIZE
    padded_cols = -(-cols // 4) * 4 if swizzled else cols
    if rows == 0 or k == 0:  # no bytes to write: the scale buffer is empty too
        return Mxfp8QuantizePlan(swizzled, cols, padded_cols, 0, 0, 0)
    block_cols = min(BLOCKS_PER_PROGRAM, triton.next_power_of_2(padded_cols))
    col_programs = triton.cdiv(padded_cols, block_cols)
    programs = rows * col_programs
    if swizzled:
        programs += padding_programs(rows, padded_cols)
    return Mxfp8QuantizePlan(swizzled, cols, padded_cols, block_cols, col_programs, programs)


def _plan(x: torch.Tensor, swizzled: bool) -> Admission:
    """The admission of valid arguments, with its :class:`Mxfp8QuantizePlan`."""
    where = triton_device(x)
    if not where:
        return where
    if x.shape[1] > 1 and x.stride(1) != 1:
        return refuse("x's last-dim stride != 1")
    layout = "128x4 swizzled" if swizzled else "linear"
    return admit(
        TRITON,
        f"{where.reason}, {x.shape[0]} x {x.shape[1]}, {layout} scales",
        plan=_launch_shape(x.shape[0], x.shape[1], swizzled),
    )


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


def launch(plan: Mxfp8QuantizePlan, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor):
    """The kernel on admitted ``x`` as ``plan`` says, into ``q`` (e4m3 ``[M, K]``, last-dim
    stride 1) and ``scales`` (1-D, contiguous, 4-byte aligned: padding is written as words)."""
    if plan.programs == 0:
        return
    bf16 = x.dtype == torch.bfloat16
    with serialized():
        mxfp8_quantize_kernel[(plan.programs,)](
            x.view(torch.int16) if bf16 else x,
            q.view(torch.uint8),
            scales,
            x.shape[0],
            x.stride(0),
            q.stride(0),
            COLS=plan.cols,
            PADDED_COLS=plan.padded_cols,
            SWIZZLED=plan.swizzled,
            BF16_BITS=bf16,
            BLOCK_COLS=plan.block_cols,
            COL_PROGRAMS=plan.col_programs,
            HW_CVT=x.is_cuda,
            num_warps=NUM_WARPS,
            enable_fp_fusion=False,  # no multiply-add pairs here; kept off as in every exact kernel
        )


def quantize_into(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, *, swizzled: bool):
    """Quantize ``x`` (already valid) into the caller's ``q`` (e4m3 ``[M, K]``) and ``scales``
    (1-D, the layout's size): by the kernel when admitted and the outputs suit it (last-dim
    stride 1, contiguous 4-byte aligned scales: padding is written as words), else the
    reference."""
    kernel_outputs = q.stride(1) == 1 and scales.is_contiguous() and scales.data_ptr() % 4 == 0
    admission = _plan(x, swizzled) if kernel_outputs else None
    if admission:
        launch(admission.plan, x, q, scales)
        return
    data, sf = reference_mxfp8_quantize(x, swizzled=swizzled)
    q.copy_(data)
    scales.copy_(sf)


def mxfp8_quantize(
    x: torch.Tensor, *, swizzled: bool = True, admission: Admission | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize ``x`` along K.

    Args:
        x: bf16 or fp16 ``[M, K]``, ``K % 32 == 0``, last-dim stride 1 for the kernel (any
            other layout takes the reference).
        swizzled: scales in FlashInfer's 128x4 swizzled layout (``rup(M, 128) * rup(K/32, 4)``
            bytes, padding 0), else the linear one (``M * K/32`` bytes).
        admission: this call's :func:`mxfp8_quantize_admission`, when the caller already made
            it; an admitted one spares the check of ``x`` (``swizzled`` must be a bool and
            match it).

    Returns ``(q, scales)``: ``q`` float8_e4m3fn ``[M, K]``, ``scales`` uint8 1-D. Bitwise
    equal to the reference on every path.
    """
    check_admission(admission)
    if admission is None or not admission:
        swizzled = _validate(x, swizzled)
        admission = _plan(x, swizzled) if admission is None else admission
    if not admission:
        return reference_mxfp8_quantize(x, swizzled=swizzled)
    plan: Mxfp8QuantizePlan = admission.plan
    if check_flag("swizzled", swizzled) != plan.swizzled:  # the tensors are the admission's
        raise ValueError(f"swizzled must match the admission's {plan.swizzled}, got {swizzled}")
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(
        scale_buffer_size(rows, k, swizzled=plan.swizzled), dtype=torch.uint8, device=x.device
    )
    launch(plan, x, q, scales)  # fresh contiguous outputs suit the kernel
    return q, scales
