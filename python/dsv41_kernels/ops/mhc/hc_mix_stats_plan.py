"""What :func:`~dsv41_kernels.ops.mhc.hc_mix_stats.hc_mix_stats` runs: its path, its projection
kernel and the split-K launch shape, as one typed :class:`MixStatsPlan`.

The admission makes the plan once (:func:`default_plan`); the launcher reads it and decides
nothing. Every choice here is pure: shapes, strides, alignment and the GPU's architecture and SM
count, never the toolchain (the projections differ in the last bits and the statistics feed the
residual streams every rank of a tensor-parallel group holds a copy of).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import torch
import triton

from dsv41_kernels.devices import cuda_index, multiprocessors, sm_major


class Path(enum.Enum):
    """The op's paths (:mod:`.hc_mix_stats` says what each computes)."""

    COMPENSATED = "compensated"
    SMALL_ROW = "small_row"
    BATCH_INVARIANT = "batch_invariant"


class Projection(enum.Enum):
    """The split-K projection's kernel: CUDA (``sgl-kernel/csrc/hc_mix_stats.cu``), TF32
    ``wgmma`` fed by TMA on Hopper or ``mma.sync`` fed by cp.async elsewhere; or Triton."""

    CUDA_WGMMA = "cuda wgmma"
    CUDA_MMA = "cuda mma.sync"
    CUDA_FP32 = "cuda fp32"  # the small-row kernel: projection and statistics in one launch
    TRITON = "triton"


class Numerics(enum.Enum):
    """How the projection treats ``fn``: ``COMPENSATED``, two TF32 passes over ``hi`` and the
    stored residual ``lo``; ``TF32X3``, one ``tl.dot`` that splits ``fn`` in registers;
    ``TF32``, one pass over the raw ``fn`` (upstream's numerics, a baseline only); ``FP32``,
    fp32 fmas on CUDA cores over the raw ``fn`` (each product rounded once)."""

    COMPENSATED = "compensated"
    TF32X3 = "tf32x3"
    TF32 = "tf32"
    FP32 = "fp32"


MAX_SPLITS = 256
FUSED_MAX_SPLITS = 2
"""The fused wgmma kernel is taken at up to this many K slices (it takes up to 8, the portable
cluster size): a row tile's slices are one cluster, and the H200 cannot hold every cluster of 4
or 8 of the default shapes at once, so the two launches were faster there."""
WGMMA_ONE_WAVE_ROWS = (256, 1024)
"""In this range of rows the wgmma projection takes 128 rows a CTA, one CTA an SM (fewer, longer
K slices), measured faster on the H200 than 256 rows a CTA (above) or two CTAs an SM (below)."""
GATE_COLUMNS = 32  # fn padded from 24 rows to the tl.dot N tile: a partial's columns
COMPENSATED_COLUMNS = 64  # Triton's compensated partials [hi (24) | 0 (8) | lo (24) | 0 (8)]
FINISH_PAIRS = 128
"""(slice, row) pairs per finisher step: 4096 fp32 columns (twice that compensated), 32 a thread
at 4 warps, so a step's loads are all in flight at once without spilling."""
FINISH_PAIRS_FEW_ROWS = 256
"""The same with 32-column partials at up to 8 rows a program, so one step takes every slice of
the one-wave shapes (faster on the H200; at 16 and 32 rows a program it was slower)."""
_INTERPRETER_SMS = 8  # a small "machine" under the Triton interpreter keeps CPU runs short
ROWS_KERNEL_SLICES = 128
"""K slices of the small-row kernel (``sgl-kernel/csrc/hc_boundary.cu``): one CTA each, all
resident at once in its cooperative launch, so it runs on GPUs of at least this many SMs."""
ROWS_KERNEL_DEPENDENT = False
"""How the small-row kernel's two phases launch: a dependent pair (the slices grid, then the
rows grid, each a programmatic dependent launch), else one cooperative grid with a grid-wide
barrier between them; the bits are the same. The pair: its slices pull their fn lines into L2
while the previous kernel finishes, and neither grid needs the GPU to itself, so it shares the
SMs with a sublayer on a side stream. It has not run on a GPU yet, so the measured cooperative
grid stays the default until ``benchmark/kernels/bench_hc_boundary.py --cycle`` (both launches
over a verify cycle's 80 boundaries) and the GPU tests that hold the two side by side have
run; :func:`launched_as` picks either for one call."""
ROWS_KERNEL_K = 20480  # 4 x 5120: the kernel's one width (V4's hidden size)
ROWS_KERNEL_MAX_ROWS = 64
"""Rows the small-row kernel takes (CTAs r and 127 - r finish row r; above, its fp32 CUDA-core
projection is slower than the compensated tensor-core one on the H200)."""


@dataclass(frozen=True)
class SplitKConfig:
    """Launch shape of the split-K projection and of its finisher."""

    block_m: int  # rows per projection program (tl.dot M tile; the CUDA kernel's rows a CTA)
    block_k: int  # K elements per pipelined step
    splits: int  # K slices (grid axis 1), each with its own partial
    num_warps: int
    num_stages: int
    finish_rows: int  # rows per finisher program


@dataclass(frozen=True)
class MixStatsPlan:
    """What runs: ``path``, the projection's kernel and ``numerics``, its launch shape
    ``config``, and whether the CUDA projection ``fused`` the statistics into its own launch
    (the small-row kernel does, as one cooperative grid) or the small-row kernel runs them as
    its ``dependent`` pair's second grid.
    Made by :func:`make_plan` (which checks the shape) and carried as ``Admission.plan``."""

    path: Path
    projection: Projection
    numerics: Numerics
    config: SplitKConfig
    fused: bool
    dependent: bool = False  # the small-row kernel as its dependent pair (ROWS_KERNEL_DEPENDENT)

    @property
    def partial_columns(self) -> int:
        """Columns of a slice's partial: the CUDA kernels add each slice's x·lo to its x·hi
        themselves; Triton's compensated partials keep them apart."""
        if self.numerics is Numerics.COMPENSATED and self.projection is Projection.TRITON:
            return COMPENSATED_COLUMNS
        return GATE_COLUMNS

    @property
    def finish_slices(self) -> int:
        """Slices the finisher adds a step (its ``BLOCK_S``)."""
        cfg = self.config
        few_rows = self.partial_columns == GATE_COLUMNS and cfg.finish_rows <= 8
        pairs = FINISH_PAIRS_FEW_ROWS if few_rows else FINISH_PAIRS
        return min(triton.next_power_of_2(cfg.splits), max(1, pairs // cfg.finish_rows))

    @property
    def kernel(self) -> str:
        """The admission's name for it, e.g. ``"compensated/cuda wgmma fused"``."""
        name = f"{self.path.value}/{self.projection.value}"
        if self.dependent:
            return f"{name} dependent pair"
        return f"{name} fused" if self.fused else name


def uses_wgmma(device: torch.device) -> bool:
    """The CUDA projection's Hopper kernel (wgmma) runs on sm_90; mma.sync elsewhere."""
    return sm_major(cuda_index(device)) == 9


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return _INTERPRETER_SMS
    return multiprocessors(cuda_index(device))


def cuda_kernel_fits(x2d: torch.Tensor, fn: torch.Tensor) -> bool:
    """The compensated projection is the CUDA kernel's (pipelined copies, TF32 tensor cores)
    rather than the Triton one's: sm_80+, ``K % 64 == 0``, 16-byte aligned rows of stride 1
    that do not overlap, and ``fn`` contiguous and 16-byte aligned."""
    return (
        x2d.is_cuda
        and fn.is_contiguous()
        and fn.data_ptr() % 16 == 0
        and x2d.dtype == torch.bfloat16
        and x2d.shape[1] % 64 == 0
        and x2d.stride(1) == 1
        and x2d.data_ptr() % 16 == 0
        and (x2d.stride(0) * 2) % 16 == 0
        and (x2d.shape[0] <= 1 or x2d.stride(0) >= x2d.shape[1])  # rows that do not overlap
        and sm_major(x2d.device.index or 0) >= 8
    )


def rows_kernel_shape(x2d: torch.Tensor, fn: torch.Tensor) -> bool:
    """The small-row kernel's layout and GPU, whatever the row count: bf16 ``[*, 20480]`` with
    16-byte aligned unit-stride rows that do not overlap, ``fn`` contiguous and 16-byte
    aligned, on sm_90+ with at least :data:`ROWS_KERNEL_SLICES` SMs."""
    return (
        x2d.is_cuda
        and x2d.shape[1] == ROWS_KERNEL_K
        and cuda_kernel_fits(x2d, fn)
        and sm_major(cuda_index(x2d.device)) >= 9
        and multiprocessors(cuda_index(x2d.device)) >= ROWS_KERNEL_SLICES
    )


def rows_kernel_fits(x2d: torch.Tensor, fn: torch.Tensor) -> bool:
    """The small-row kernel (``sgl-kernel/csrc/hc_boundary.cu``) takes ``x2d``: its shape
    (:func:`rows_kernel_shape`) with 1-64 rows."""
    return 1 <= x2d.shape[0] <= ROWS_KERNEL_MAX_ROWS and rows_kernel_shape(x2d, fn)


def rows_kernel_tile(m: int) -> int:
    """The small-row kernel's rows a pass for ``m`` rows: 8, 16 or 32 (its 8 row slots hold 1, 2
    or 4 rows each). A row's bits do not depend on it."""
    return 8 if m <= 8 else (16 if m <= 16 else 32)


def projection_for(x2d: torch.Tensor, fn: torch.Tensor, path: Path) -> Projection:
    """The projection's kernel: CUDA on the compensated paths where it fits, the small-row
    CUDA kernel on the small-row path where it fits, else Triton."""
    if path is Path.SMALL_ROW:
        return Projection.CUDA_FP32 if rows_kernel_fits(x2d, fn) else Projection.TRITON
    if not cuda_kernel_fits(x2d, fn):
        return Projection.TRITON
    return Projection.CUDA_WGMMA if uses_wgmma(x2d.device) else Projection.CUDA_MMA


def split_k_config(
    path: Path, m: int, k: int, num_sms: int, *, cuda: bool = False, wgmma: bool = False
) -> SplitKConfig:
    """Default launch shapes: enough (row tile, K slice) programs to fill ``num_sms`` SMs.

    ``cuda``: the compensated projection runs the CUDA kernel, 128 rows a CTA and two CTAs
    an SM, so the slices fill ``2 * num_sms`` CTAs (K = 20480 on 132 SMs: 128 rows -> 1 tile x
    128 slices); with ``wgmma`` one CTA an SM from 256 rows (:data:`WGMMA_ONE_WAVE_ROWS`: 128
    rows a CTA to 1024 rows, 512 -> 4 tiles x 33 slices, at most the slices of one finisher
    step; 256 rows above, 4096 -> 16 x 8, 16384 -> 64 x 2). Only ``block_m`` (the rows a CTA),
    ``splits`` and ``finish_rows`` apply to it.

    The TF32 projection needs ~220 registers a thread at 64 x 64 x 64 with 8 warps (the fp32
    copy of x feeds the MMA from registers), so one program per SM. K = 20480 on 132 SMs:
    ``compensated`` 4096 rows -> 64 tiles x 2 slices; 1024 -> 16 x 8; 128 -> 2 x 66;
    ``small_row`` 6 rows -> 1 tile of 16 x 128 slices of 160. Slice length does not bound
    the error (each MMA chain is one K step). ``BATCH_INVARIANT`` ignores ``m`` entirely.
    """
    if path is Path.BATCH_INVARIANT:
        return SplitKConfig(128 if cuda else 64, 64, min(40, triton.cdiv(k, 64)), 8, 3, 8)
    if path is Path.SMALL_ROW and cuda:  # the small-row kernel: a row tile, 128 K slices
        tile = rows_kernel_tile(m)
        return SplitKConfig(tile, k // ROWS_KERNEL_SLICES, ROWS_KERNEL_SLICES, 20, 1, 1)
    # About a row a program per SM, half that below 1024 rows (the finisher's dependent chain,
    # not its loads, sets its time there), at most 32: the fastest of the H200 sweep.
    rows_an_sm = triton.next_power_of_2(triton.cdiv(m, num_sms))
    finish_rows = max(1, min(32, rows_an_sm if m >= 1024 else rows_an_sm // 2))
    if cuda and path is Path.COMPENSATED:
        low, high = WGMMA_ONE_WAVE_ROWS
        if wgmma and low <= m <= high:  # every slice in one finisher step, >= 4 rows a program
            finish_rows = max(4, rows_an_sm)
            # One finisher step where it has <= 8 rows a program (132 SMs: every m here). With
            # fewer SMs (16+ rows a program) the step is smaller, but a cap from it would idle SMs.
            fill = min(num_sms // triton.cdiv(m, 128), FINISH_PAIRS_FEW_ROWS // finish_rows)
            return SplitKConfig(128, 64, max(1, min(fill, k // 64)), 8, 4, finish_rows)
        rows, per_sm = (256, 1) if wgmma and m > high else (128, 2)
        fill = per_sm * num_sms // max(1, triton.cdiv(m, rows))
        splits = max(1, min(fill, 128, k // 64))
        return SplitKConfig(rows, 64, splits, 8, 4, finish_rows)
    block_k = 64
    if path is Path.SMALL_ROW:  # small tiles, two programs per SM
        block_m = min(max(triton.next_power_of_2(m), 16), 64)
        fill = 2 * num_sms // max(1, triton.cdiv(m, block_m))
        splits = max(1, min(fill, 128, triton.cdiv(k, block_k)))
        return SplitKConfig(block_m, block_k, splits, 4, 3, finish_rows)
    fill = num_sms // max(1, triton.cdiv(m, 64))  # slices that fill the machine
    splits = max(1, min(fill, 128, triton.cdiv(k, block_k)))
    return SplitKConfig(64, block_k, splits, 8, 3, finish_rows)


def check_config(
    cfg: SplitKConfig, *, cuda: bool = False, wgmma: bool = False, rows: bool = False
) -> None:
    """Raise ValueError unless ``cfg`` is a launch shape the kernels take (``cuda``: the CUDA
    projection's, ``wgmma`` its Hopper kernel's, ``rows`` the small-row kernel's)."""
    pow2 = lambda v, lo: v >= lo and v & (v - 1) == 0
    if rows:
        if cfg.block_m not in (8, 16, 32) or cfg.splits != ROWS_KERNEL_SLICES:
            raise ValueError(f"config: the small-row kernel takes a row tile of 8, 16 or 32, {cfg}")
        return
    if cuda and cfg.block_m not in ((128, 256) if wgmma else (128,)):
        raise ValueError(f"config: block_m must be 128 (or 256 with wgmma) on CUDA, got {cfg}")
    if not ((cuda or cfg.block_m in (16, 32, 64, 128)) and pow2(cfg.block_k, 16)):
        raise ValueError(
            f"config: block_m must be 16..128 and block_k a power of 2 >= 16, got {cfg}"
        )
    if not (1 <= cfg.splits <= MAX_SPLITS and pow2(cfg.finish_rows, 1)):
        raise ValueError(f"config: splits must be 1..{MAX_SPLITS}, finish_rows a power of 2")


def fuses(cfg: SplitKConfig, *, wgmma: bool) -> bool:
    """Whether the CUDA projection runs fused with the statistics (one launch, no partials in
    global memory): the wgmma kernel at 256 rows a CTA with at most :data:`FUSED_MAX_SPLITS`
    K slices, whose CTAs (one cluster a row tile) add their partials in distributed shared
    memory."""
    return wgmma and cfg.block_m == 256 and cfg.splits <= FUSED_MAX_SPLITS


def make_plan(
    path: Path, projection: Projection, config: SplitKConfig, numerics: Numerics | None = None
) -> MixStatsPlan:
    """The plan for ``config`` (checked: ValueError if the kernels do not take it); ``numerics``
    defaults to the path's (TF32X3 on the small-row path, else COMPENSATED); the small-row
    kernel launches as :data:`ROWS_KERNEL_DEPENDENT` says."""
    cuda = projection is not Projection.TRITON
    wgmma = projection is Projection.CUDA_WGMMA
    rows = projection is Projection.CUDA_FP32
    if rows and path is not Path.SMALL_ROW:
        raise ValueError(f"the small-row kernel runs the small-row path only, not {path.value}")
    check_config(config, cuda=cuda, wgmma=wgmma, rows=rows)
    if numerics is None:
        numerics = Numerics.COMPENSATED
        if path is Path.SMALL_ROW:
            numerics = Numerics.FP32 if rows else Numerics.TF32X3
    dependent = rows and ROWS_KERNEL_DEPENDENT
    fused = (rows and not dependent) or fuses(config, wgmma=wgmma)
    return MixStatsPlan(path, projection, numerics, config, fused, dependent)


def launched_as(admission, dependent: bool):
    """``admission`` (of ``hc_mix_stats`` or ``hc_boundary`` on the small-row kernel) with that
    kernel launched as its dependent pair or as its cooperative grid: the same bits, for tests
    and benchmarks that hold the two side by side."""
    if isinstance(admission.plan, MixStatsPlan):
        if admission.plan.projection is not Projection.CUDA_FP32:
            raise ValueError(f"not the small-row kernel: {admission.plan.kernel}")
        plan = dataclasses.replace(admission.plan, dependent=dependent, fused=not dependent)
        return dataclasses.replace(admission, plan=plan, kernel=plan.kernel)
    plan = dataclasses.replace(admission.plan, dependent=dependent)
    return dataclasses.replace(admission, plan=plan)


def default_plan(path: Path, projection: Projection, m: int, k: int, device) -> MixStatsPlan:
    """The plan with the default launch shape for ``m`` rows of ``k`` on ``device``."""
    cuda = projection is not Projection.TRITON
    wgmma = projection is Projection.CUDA_WGMMA
    config = split_k_config(path, m, k, num_sms(device), cuda=cuda, wgmma=wgmma)
    return make_plan(path, projection, config)
