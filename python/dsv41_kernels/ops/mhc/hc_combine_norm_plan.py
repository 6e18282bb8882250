"""What :func:`~dsv41_kernels.ops.mhc.hc_combine_norm.hc_combine_norm` (and its MXFP8 form) runs:
the kernel and its launch shape, as one typed :class:`CombineNormPlan`.

The admission makes the plan once (:func:`make_plan`); the launchers read it and decide nothing.
Every choice is pure: shapes, strides, alignment and the GPU's architecture, never the
toolchain (y feeds the residual streams every rank of a tensor-parallel group holds a copy of).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from dsv41_kernels.devices import sm_major
from dsv41_kernels.reference.hc_mix_stats import HC_MULT
from dsv41_kernels.reference.mxfp8_quantize import SF_VEC_SIZE


class Kernel(enum.Enum):
    """The kernel that runs; its value is the admission's ``kernel``. Both CUDA shapes are
    ``sgl-kernel/csrc/hc_combine_norm.cu``'s one kernel, and give the same bits."""

    CUDA_CLUSTER = "cuda cluster"  # a row over a cluster of 1, 2 or 4 CTAs
    CUDA_ONE_CTA = "cuda one CTA a row"  # the cluster's threads and vectors in one CTA
    TRITON = "triton"


class KernelVariant(NamedTuple):
    """Launch shape of the Triton kernel. The sum of squares' order follows the tile layout,
    which ``num_warps`` sets, so y's bits depend on the variant (never on ``m`` or the row's
    position); both forms given the same variant give the same y."""

    num_warps: int = 4  # H = 5120: 40 values a lane with 4 warps
    hw_round: bool = False  # fp32 -> bf16 by cvt.rn.bf16x2.f32 (GPU only; the same bits)


DEFAULT_VARIANT = KernelVariant(num_warps=8, hw_round=True)
"""8 warps with the hardware bf16 conversion: the fastest variant of the H200 sweep."""


class CudaShape(NamedTuple):
    """Launch shape of the CUDA kernel: ``cluster`` CTAs a row (1, 2 or 4) of ``threads``
    threads (a multiple of 32); y's bits depend on it, never on ``m``."""

    cluster: int
    threads: int


@dataclass(frozen=True)
class CombineNormPlan:
    """What runs: ``kernel``, its launch shape (``cuda`` for the CUDA kernel, ``variant`` for
    Triton's) and, for the MXFP8 form, whether its ``epilogue`` writes the e4m3 data and the
    scales in place (else the combine runs alone and the quantizer after it: the same bits)."""

    kernel: Kernel
    cuda: CudaShape | None = None
    variant: KernelVariant = DEFAULT_VARIANT
    epilogue: bool = True


MAX_ROW_BLOCK = 16384  # values of one row the Triton kernel holds in registers (both tiles)
CUDA_MAX_CTA_COLUMNS = 10240
"""Columns one CTA of the CUDA kernel holds (5 vectors of 8 a thread, 256 threads)."""
CUDA_VECTOR = 8  # bf16 values per 16-byte vector, a thread's unit of a row
CUDA_MAX_CLUSTER = 4
"""The largest cluster a row takes: 4 SMs share the row's instruction issue at decode sizes."""
CUDA_MAX_THREADS = 256
"""Threads of a CTA in the cluster shape: the fewest vectors a thread that keep within it."""
CUDA_ONE_CTA_ROWS = (64, 192)
"""Rows that take one CTA a row where the cluster shape has one vector a thread in whole warps
(the same threads own the same vectors, so the same bits): the cluster's launch and exchange
cost more than they save there (H200 sweep)."""
CUDA_ONE_CTA_MAX_THREADS = 1024  # a CTA's limit


def row_tiles(h: int) -> tuple[int, int]:
    """(head, tail) 32-value blocks of the Triton kernel's two tiles of a row: the head is the
    largest power of two below the padded scale columns rup(H/32, 4), the tail the rest rounded
    up to a power of two (128 + 32 for H = 5120, 64 + 64 for H = 4096). Together they cover
    rup(H/32, 4)."""
    padded_cols = -(-(h // SF_VEC_SIZE) // 4) * 4
    head = triton.next_power_of_2(padded_cols) // 2
    return head, triton.next_power_of_2(padded_cols - head)


def cuda_cluster(h: int) -> int:
    """CTAs per row of the CUDA kernel: the largest of 4, 2, 1 giving each whole 32-value
    blocks."""
    return next(c for c in (CUDA_MAX_CLUSTER, 2, 1) if h % (SF_VEC_SIZE * c) == 0)


def cuda_kernel_fits(x, weight, y=None) -> bool:
    """The CUDA kernel (``sgl-kernel/csrc/hc_combine_norm.cu``) is the one for these arguments,
    for both forms alike: sm_90+ (thread-block clusters), 16-byte aligned rows of x and of y
    (the caller's ``out``, if any) and a contiguous 16-byte aligned weight."""
    h = x.shape[1] // HC_MULT
    aligned = lambda t: t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) * 2 % 16 == 0
    return (
        x.is_cuda
        and h % SF_VEC_SIZE == 0
        and h // cuda_cluster(h) <= CUDA_MAX_CTA_COLUMNS
        and x.shape[0] < 2**24
        and aligned(x)
        and (y is None or aligned(y))
        and weight.is_contiguous()
        and weight.data_ptr() % 16 == 0
        and sm_major(x.device.index or 0) >= 9
    )


def cuda_shape(m: int, h: int) -> tuple[Kernel, CudaShape]:
    """The CUDA kernel's shape for ``m`` rows of width ``h``: a cluster of
    :func:`cuda_cluster` CTAs, each with the fewest vectors a thread that keep it within
    :data:`CUDA_MAX_THREADS` threads (H = 5120: 4 CTAs of 160 threads), or in
    :data:`CUDA_ONE_CTA_ROWS` one CTA of all the cluster's threads where that has the same bits."""
    cluster = cuda_cluster(h)
    cta_vecs = h // cluster // CUDA_VECTOR
    low, high = CUDA_ONE_CTA_ROWS
    if (
        cluster > 1
        and low <= m <= high
        and cta_vecs <= CUDA_MAX_THREADS
        and cta_vecs % 32 == 0
        and h // CUDA_VECTOR <= CUDA_ONE_CTA_MAX_THREADS
    ):
        return Kernel.CUDA_ONE_CTA, CudaShape(1, h // CUDA_VECTOR)
    items = -(-cta_vecs // CUDA_MAX_THREADS)  # vectors a thread
    busy = -(-cta_vecs // items)  # threads that hold a vector, rounded up to whole warps below
    return Kernel.CUDA_CLUSTER, CudaShape(cluster, -(-busy // 32) * 32)


def epilogue_writes(data: torch.Tensor, scales: torch.Tensor, cuda: bool) -> bool:
    """Whether the kernel's MXFP8 epilogue can write these outputs in place: contiguous,
    4-byte aligned scales (padding is written as words) and unit-stride data rows, 8-byte
    aligned for the CUDA kernel. Otherwise the combine runs alone, then the quantizer."""
    rows_ok = data.stride(1) == 1 and (
        not cuda or (data.data_ptr() % 8 == 0 and data.stride(0) % 8 == 0)
    )
    return rows_ok and scales.is_contiguous() and scales.data_ptr() % 4 == 0


def make_plan(x, weight, y=None, quantized=None) -> CombineNormPlan:
    """The plan for valid arguments the kernels take: ``y`` is the caller's y and
    ``quantized`` its ``(data, scales)`` (None: fresh outputs, which every kernel writes)."""
    m, h = x.shape[0], x.shape[1] // HC_MULT
    if cuda_kernel_fits(x, weight, y):
        kernel, shape = cuda_shape(m, h)
    else:
        kernel, shape = Kernel.TRITON, None
    epilogue = quantized is None or epilogue_writes(*quantized, kernel is not Kernel.TRITON)
    return CombineNormPlan(kernel, shape, DEFAULT_VARIANT, epilogue)
