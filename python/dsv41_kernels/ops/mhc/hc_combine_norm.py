"""mHC combine + RMSNorm, optionally with the MXFP8 quantization of its output, in one launch.

On DeepSeek-V4.1's hyper-connection path the four residual streams are collapsed with the
``pre`` gates, rounded to bf16 and RMS-normalised before the attention's first projection,
which (with an MXFP8 GEMM) then quantizes the result again in a second launch that only
re-reads what the first wrote. ``hc_combine_norm_mxfp8`` writes y, its e4m3 data and the
swizzled UE8M0 scales from the registers that hold the row.

Contract (``x [m, 4*H]`` bf16, ``pre [m, 4]`` fp32, ``weight [H]`` bf16, ``H % 32 == 0``):

- ``hc_combine_norm``: ``x_in = bf16(((p0·x0 + p1·x1) + p2·x2) + p3·x3)`` in fp32 without
  fused multiply-adds (each product and sum rounded), then ``y = bf16((x_in · inv) · weight)``
  with ``inv = 1/sqrt(Σx_in²/H + eps)``: fp32 throughout, the division ``ss/H``, the square
  root and ``1/sqrt`` each one IEEE fp32 rounding (``div.rn``/``sqrt.rn``, not rsqrt).
- Two kernels, each with a fixed order for Σx_in² (fp32; each square is exact), so a row's
  bits depend only on the row, H and the kernel, never on ``m`` or the row's position
  (batch-invariant), and ``hc_combine_norm`` and the fused form, which always take the same
  kernel for the same shapes, give the same y:

  - on sm_90+ (aligned rows, :func:`cuda_kernel_fits`) the CUDA
    kernel ``sgl-kernel/csrc/hc_combine_norm.cu``: a row is split over a thread-block cluster
    of C CTAs (C = 4 for H = 5120 and 4096), each holding H/C columns, and the sum is per
    thread in column order, a butterfly over each warp, then the warp sums of the whole
    cluster (exchanged through distributed shared memory) by a fixed butterfly, identical
    in every CTA (the order is spelled out in the source's header);
  - elsewhere (and under the interpreter) the Triton kernel below: the row is two tiles of
    32-value blocks, head ``[HEAD, 32]`` and tail ``[TAIL, 32]`` (128 + 32 blocks for H =
    5120, 64 + 64 for 4096; blocks past H are zeros), each summed by ``tl.sum`` along the 32
    values of a block and then across blocks, under a layout fixed by H and the launch shape
    (:data:`DEFAULT_VARIANT`: 8 warps); then ``head + tail``.

  The two orders differ, so the kernels' y may differ by one bf16 ulp; each is within one bf16
  ulp of the same norm in float64 (away from fp32 overflow of Σx_in²). y feeds the residual
  streams every rank of a tensor-parallel group holds a copy of, so the choice is a function of
  shapes, strides and the GPU's architecture only, never of the toolchain: a machine that
  cannot build or load the CUDA module gets that error from the op, not the other kernel's bits.
- The torch fallback (and :func:`dsv41_kernels.reference.mhc.hc_combine_norm`) computes Σx_in²
  order-free and rounded once, so it is within one bf16 ulp of float64 too but **not bitwise
  equal** to the kernel; the Triton interpreter's sum order is numpy's, not the GPU's.
- ``hc_combine_norm_mxfp8`` returns ``(y, Mxfp8SwizzledInput(data, scales))`` **bitwise equal**
  to ``hc_combine_norm`` followed by
  :func:`dsv41_kernels.ops.quantization.mxfp8_quantize.mxfp8_quantize` (FlashInfer's cuda
  backend bytes, 128x4 swizzled scales); the scale buffer is written in full, padding rows up
  to the 128-row tile and padding columns 0, for any ``m`` (on the kernel path both forms run
  the kernel; with the fallback, both the reference).

Why two kernels: at decode sizes one CTA per row is bound by instruction issue (~1300
instructions a thread in the fused Triton kernel); the cluster spreads a row over 4 SMs, which
takes the fused op at m = 6 from ~3.0 to ~2.5 µs on the H200 (docs/performance.md). The Triton
kernel stays for other GPUs and the interpreter: one program per row holds the whole row in
registers (20 values a lane for H = 5120), issues all its loads, the weight's included, makes
one reduction (Σx_in²) across warps and the MXFP8 block maxima within warps (a 32-value block
spans 4 lanes); a few extra programs zero the padding rows of the last scale tile.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_flag,
    check_float,
    check_tensor,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import sm_major
from dsv41_kernels.interpreter import serialized
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.quantization.mxfp8_encode import (
    bf16_bits_to_f32,
    mxfp8_encode_blocks,
    padding_programs,
    swizzled_scale_offset,
    zero_padding_scale_words,
)
from dsv41_kernels.ops.quantization.mxfp8_quantize import Mxfp8SwizzledInput, quantize_into
from dsv41_kernels.reference.mhc import HC_MULT
from dsv41_kernels.reference.mhc import hc_combine_norm as reference_hc_combine_norm
from dsv41_kernels.reference.mxfp8 import SF_VEC_SIZE, scale_buffer_size

MAX_ROW_BLOCK = 16384  # values of one row held in registers (both tiles)
CUDA_CLUSTER = "cuda cluster"
TRITON = "triton"
MODULE = "hc_combine_norm"  # sgl-kernel/csrc/hc_combine_norm.cu


class KernelVariant(NamedTuple):
    """Launch shape of the Triton kernel (:func:`run_kernel`; the benchmark's ``--sweep`` times
    others). The sum of squares' order follows the tile layout, which ``num_warps`` sets, so
    y's bits depend on the variant (never on ``m`` or the row's position); both forms given the
    same variant give the same y."""

    num_warps: int = 4  # H = 5120: 40 values a lane with 4 warps
    hw_round: bool = False  # fp32 -> bf16 by cvt.rn.bf16x2.f32 (GPU only; the same bits)


# 8 warps with the hardware bf16 conversion: the fastest variant of the H200 sweep
# (bench_hc_combine_norm_mxfp8.py --sweep, docs/performance.md), all checks passing.
DEFAULT_VARIANT = KernelVariant(num_warps=8, hw_round=True)


def _validate(x, pre, weight, eps, *, quantize: bool, out=None) -> tuple[int, int, float]:
    """Raise ValueError naming the argument unless the shapes and dtypes are the contract's;
    returns ``(m, H, eps)``, ``eps`` a Python float. ``out``: y, or ``(y, (data, scales))`` with
    ``quantize``."""
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    m, width = x.shape
    if width % HC_MULT or width == 0:
        raise ValueError(f"x must be [m, {HC_MULT}*H] with H > 0, got {tuple(x.shape)}")
    h = width // HC_MULT
    if quantize and h % SF_VEC_SIZE:
        raise ValueError(f"x: H = {h} must be a multiple of {SF_VEC_SIZE} for MXFP8")
    check_tensor("pre", pre, dtypes=(torch.float32,), ndim=2)
    if tuple(pre.shape) != (m, HC_MULT):
        raise ValueError(f"pre must be [{m}, {HC_MULT}], got {tuple(pre.shape)}")
    check_tensor("weight", weight, dtypes=(torch.bfloat16,), ndim=1)
    if weight.shape[0] != h:
        raise ValueError(f"weight must be [{h}], got {tuple(weight.shape)}")
    for name, t in (("pre", pre), ("weight", weight)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    eps = check_float("eps", eps, low=0.0)
    if out is None:
        return m, h, eps
    if not quantize:
        _check_out("out", out, (m, h), torch.bfloat16, x.device)
        return m, h, eps
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ValueError(f"out must be (y, (data, scales)), got {_structure(out)}")
    y, quantized = out
    if not (isinstance(quantized, (tuple, list)) and len(quantized) == 2):
        raise ValueError(f"out[1] must be (data, scales), got {_structure(quantized)}")
    data, scales = quantized
    _check_out("out y", y, (m, h), torch.bfloat16, x.device)
    _check_out("out data", data, (m, h), torch.float8_e4m3fn, x.device)
    size = scale_buffer_size(m, h, swizzled=True)
    _check_out("out scales", scales, (size,), torch.uint8, x.device)
    return m, h, eps


def _structure(value) -> str:
    """What ``value`` is, for a message: a type, or a tuple's length."""
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def _check_out(name: str, t, shape, dtype, device) -> None:
    check_tensor(name, t, dtypes=(dtype,), ndim=len(shape))
    if tuple(t.shape) != tuple(shape) or t.device != device:
        raise ValueError(
            f"{name} must be {list(shape)} on {device}, got {tuple(t.shape)} on {t.device}"
        )


def _plan(x, weight, y, *, quantize: bool) -> Admission:
    """The kernel for valid arguments; ``y`` is the caller's y (or None), whose strides matter."""
    where = triton_device(x)
    if not where:
        return where
    h = x.shape[1] // HC_MULT
    if h % SF_VEC_SIZE:
        return refuse(f"H = {h} is not a multiple of {SF_VEC_SIZE}")
    if sum(_row_tiles(h)) * SF_VEC_SIZE > MAX_ROW_BLOCK:
        return refuse(f"H = {h}: a row does not fit one program's registers")
    if x.stride(1) != 1:
        return refuse("x's last-dim stride != 1")
    if y is not None and y.stride(1) != 1:
        return refuse("out y's last-dim stride != 1")
    form = "combine+norm+mxfp8" if quantize else "combine+norm"
    if not cuda_kernel_fits(x, weight, y):
        return admit(TRITON, f"{where.reason}, {TRITON}, {form}, H = {h}")
    return admit(CUDA_CLUSTER, f"{where.reason}, {CUDA_CLUSTER}, {form}, H = {h}", MODULE)


def hc_combine_norm_admission(
    x: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, *, quantize: bool = False, out=None
) -> Admission:
    """Whether a kernel runs, and which (``quantize``: the fused MXFP8 form); pure: shapes,
    dtypes, strides, alignment and the device, never values. ``out`` is the caller's output
    (y, or ``(y, Mxfp8SwizzledInput)`` with ``quantize``), whose y strides matter too; e4m3
    data or scales that the epilogue cannot write in place (strided, unaligned) are filled by
    the quantizer after the kernel, so the bits stay those of the unfused pair."""
    try:
        quantize = check_flag("quantize", quantize)
        _validate(x, pre, weight, 0.0, quantize=quantize, out=out)
    except ValueError as e:
        return invalid(e)
    y = out[0] if quantize and out is not None else out
    return _plan(x, weight, y, quantize=quantize)


CUDA_MAX_CTA_COLUMNS = 10240
"""Columns one CTA of the CUDA kernel holds (5 vectors of 8 a thread, 256 threads)."""


def _cuda_cluster(h: int) -> int:
    """CTAs per row of the CUDA kernel: the largest of 4, 2, 1 giving each whole 32-value
    blocks (as ``hc_combine_norm_cuda`` picks it)."""
    return next(c for c in (4, 2, 1) if h % (SF_VEC_SIZE * c) == 0)


def cuda_kernel_fits(x, weight, y=None) -> bool:
    """The CUDA cluster kernel (``sgl-kernel/csrc/hc_combine_norm.cu``) is the one for these
    arguments, for both forms alike: sm_90+ (thread-block clusters), 16-byte aligned rows of x
    and of y (the caller's ``out``, if any) and a contiguous 16-byte aligned weight. Pure:
    shapes, strides, alignment and the GPU's architecture, never the machine's toolchain or
    its module files (see the module docstring: every rank of a tensor-parallel group takes
    the same kernel; a rank that cannot load the module raises instead)."""
    h = x.shape[1] // HC_MULT
    aligned = lambda t: t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) * 2 % 16 == 0
    return (
        x.is_cuda
        and h % SF_VEC_SIZE == 0
        and h // _cuda_cluster(h) <= CUDA_MAX_CTA_COLUMNS
        and x.shape[0] < 2**24
        and aligned(x)
        and (y is None or aligned(y))
        and weight.is_contiguous()
        and weight.data_ptr() % 16 == 0
        and sm_major(x.device.index or 0) >= 9
    )


def _epilogue_writes(quantized: Mxfp8SwizzledInput, cuda: bool) -> bool:
    """Whether the kernel's MXFP8 epilogue can write these outputs in place: contiguous,
    4-byte aligned scales (padding is written as words) and unit-stride data rows, 8-byte
    aligned for the CUDA kernel. Otherwise the combine runs alone, then the quantizer."""
    data, scales = quantized.data, quantized.scales
    rows_ok = data.stride(1) == 1 and (
        not cuda or (data.data_ptr() % 8 == 0 and data.stride(0) % 8 == 0)
    )
    return rows_ok and scales.is_contiguous() and scales.data_ptr() % 4 == 0


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


def _row_tiles(h: int) -> tuple[int, int]:
    """(head, tail) 32-value blocks of the row's two tiles: the head is the largest power of
    two below the padded scale columns rup(H/32, 4), the tail the rest rounded up to a power of
    two (128 + 32 for H = 5120, 64 + 64 for H = 4096). Together they cover rup(H/32, 4)."""
    padded_cols = -(-(h // SF_VEC_SIZE) // 4) * 4
    head = triton.next_power_of_2(padded_cols) // 2
    return head, triton.next_power_of_2(padded_cols - head)


def launch(
    x,
    pre,
    weight,
    eps: float,
    y: torch.Tensor,
    quantized: Mxfp8SwizzledInput | None,
    variant: KernelVariant = DEFAULT_VARIANT,
):
    rows, width = x.shape
    h = width // HC_MULT
    head, tail = _row_tiles(h)
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


def run_kernel(
    x,
    pre,
    weight,
    eps: float,
    y: torch.Tensor,
    quantized: Mxfp8SwizzledInput | None,
    kernel: str,
    variant: KernelVariant = DEFAULT_VARIANT,
) -> None:
    """Run ``kernel`` (:data:`CUDA_CLUSTER` or :data:`TRITON`, at ``variant``'s launch shape)
    into ``y`` and, given, ``quantized``. An epilogue that cannot write the caller's MXFP8
    outputs in place leaves them to the quantizer, after the combine alone: the same bits."""
    cuda = kernel == CUDA_CLUSTER
    fused = quantized is not None and _epilogue_writes(quantized, cuda)
    if cuda:
        data, scales = (quantized.data.view(torch.uint8), quantized.scales) if fused else (y, y)
        module = load_module(MODULE, x.device.index or 0)
        module.hc_combine_norm_cuda(x, pre, weight, y, data, scales, eps, fused)
    else:
        launch(x, pre, weight, eps, y, quantized if fused else None, variant)
    if quantized is not None and not fused:
        quantize_into(y, quantized.data, quantized.scales, swizzled=True)


def hc_combine_norm(
    x: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    admission: Admission | None = None,
) -> torch.Tensor:
    """Combine the 4 streams of ``x [m, 4*H]`` bf16 with ``pre [m, 4]`` fp32, round to bf16 and
    RMS-normalise with ``weight [H]`` bf16: ``y [m, H]`` bf16 (see the module contract).

    ``out`` (bf16 ``[m, H]``) is written in place, keeping the call allocation-free inside
    CUDA-graph capture. ``admission``: this call's :func:`hc_combine_norm_admission`, when the
    caller already made it.
    """
    m, h, eps = _validate(x, pre, weight, eps, quantize=False, out=out)
    if admission is None:
        admission = _plan(x, weight, out, quantize=False)
    if out is None:
        out = torch.empty((m, h), dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return out
    if admission:
        run_kernel(x, pre, weight, eps, out, None, admission.kernel)
    else:
        out.copy_(reference_hc_combine_norm(x, pre, weight, eps))
    return out


def hc_combine_norm_mxfp8(
    x: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: tuple[torch.Tensor, Mxfp8SwizzledInput] | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, Mxfp8SwizzledInput]:
    """:func:`hc_combine_norm` and its MXFP8 quantization in one launch (``H % 32 == 0``).

    Returns ``(y, Mxfp8SwizzledInput(data, scales))``: y bf16 [m, H], data float8_e4m3fn
    [m, H], scales uint8 ``rup(m, 128) * rup(H/32, 4)`` bytes in the 128x4 layout, bitwise
    equal to ``hc_combine_norm`` then ``mxfp8_quantize``. ``out`` (the same structure) is
    written in place. ``admission``: this call's ``hc_combine_norm_admission(...,
    quantize=True)``, when the caller already made it.
    """
    m, h, eps = _validate(x, pre, weight, eps, quantize=True, out=out)
    if out is None:
        y = torch.empty((m, h), dtype=torch.bfloat16, device=x.device)
        quantized = Mxfp8SwizzledInput(
            torch.empty((m, h), dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(scale_buffer_size(m, h, swizzled=True), dtype=torch.uint8, device=x.device),
        )
    else:
        y, quantized = out[0], Mxfp8SwizzledInput(*out[1])
    if admission is None:
        admission = _plan(x, weight, y if out is not None else None, quantize=True)
    if m == 0:
        return y, quantized
    if admission:
        run_kernel(x, pre, weight, eps, y, quantized, admission.kernel)
    else:
        y.copy_(reference_hc_combine_norm(x, pre, weight, eps))
        quantize_into(y, quantized.data, quantized.scales, swizzled=True)
    return y, quantized
