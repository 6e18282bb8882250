"""The multi-block row argmax shared by :mod:`.row_argmax` and :mod:`.accept_greedy`.

``torch.argmax`` reduces each row in a single thread block, so six rows keep six of the
H200's 132 SMs busy while 3 MB of logits wait to be read. Both ops spread every row over the
whole machine instead, with one of two kernels:

- on Hopper and Blackwell, the CUDA kernels of ``sgl-kernel/csrc/row_argmax.cu``: a
  thread-block cluster of up to 16 CTAs per row whose warps send their winners into the leader
  CTA's shared memory (one launch, no global atomics), and from 96 rows, while the rows fit
  the GPU at once, one CTA a row;
- elsewhere (more rows, other GPUs, the Triton interpreter) a Triton kernel built from
  :func:`reduce_row_chunk`: the rows are cut into chunks, each program folds its chunk into a
  per-row slot with an atomic max, and the program drawing the last ticket runs the op's
  epilogue (the argmax's decode, or the greedy accept rule).

This module holds what the two ops share: the admission of the logits and the choice between
the kernels (:func:`admit_logits`), the Triton reduction, its per-stream workspace and its
launch configuration. Which kernel wins where is in docs/performance.md.

How the Triton reduction works: each lane keeps the first maximum of its columns (a NaN once
it sees one). A lane's winner becomes one int64 key ``order(x) << 32 | (2**32 - 1 - index)``,
where ``order`` maps fp32 to int32 monotonically (NaN above +Inf, -0 folded onto +0), so an
integer max over lanes, then an ``atomic_max`` into the row's slot, keeps the winner and,
among equals, the lowest index: ``torch.argmax``'s rule, NaN included. The epilogue swaps the
slots back to :data:`EMPTY_SLOT` as it reads them and re-arms the ticket, so the kernels are
reentrant on a stream and safe to capture in a CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_tensor,
    cuda_kernel_runs,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import sm_major
from dsv41_kernels.jit import load_module
from dsv41_kernels.workspace import Buffer, StreamWorkspace

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_VOCAB = 4096
MAX_ROWS = 1024  # rows one launch may reduce: the size of the slot workspace
EMPTY_SLOT = -(2**63)
CLUSTER_MAX_ROW_BYTES = 16 * 256 * 16 * 16  # 16 CTAs x 256 threads x 16 items of 16 bytes
MODULE = "row_argmax"  # sgl-kernel/csrc/row_argmax.cu: both ops' CUDA kernels

CUDA_CLUSTER = "cuda cluster"
TRITON = "triton"
"""The kernel names an admission carries."""


MAX_ADMITTED_ROWS = 384  # DSpark's verify at bs 64 (6 rows a request), SGLang's own bound there


def max_rows(vocab: int) -> int:
    """Rows up to which spreading rows over the machine beats a block per row (H200);
    :data:`MAX_ADMITTED_ROWS` at wide vocabularies."""
    return 64 if vocab < 65536 else MAX_ADMITTED_ROWS


def cuda_kernel(logits: torch.Tensor) -> tuple[bool, str]:
    """Whether the CUDA kernels take these logits (sm_90+, 16-byte aligned rows, its module at
    hand), with the note for the admission's reason: see
    :func:`~dsv41_kernels.admission.cuda_kernel_runs`. Pure: shapes, strides, alignment, the
    device and the module's files."""
    return cuda_kernel_runs(
        MODULE,
        logits,
        logits.is_cuda
        and sm_major(logits.device.index) >= 9
        and logits.shape[1] * logits.element_size() <= CLUSTER_MAX_ROW_BYTES
        and logits.data_ptr() % 16 == 0
        and (logits.stride(0) * logits.element_size()) % 16 == 0,
    )


def validate_logits(logits) -> None:
    """Raise ValueError naming ``logits`` unless it is 2-D floating point with columns."""
    check_tensor("logits", logits, ndim=2)
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if logits.shape[1] == 0:
        raise ValueError("logits has empty rows (0 columns): argmax is undefined")


def admit_logits(logits: torch.Tensor) -> Admission:
    """Whether 2-D floating-point ``logits`` take a multi-block kernel, and which one
    (:data:`CUDA_CLUSTER` or :data:`TRITON`); pure, reads no values."""
    where = triton_device(logits)
    if not where:
        return where
    if logits.dtype not in SUPPORTED_DTYPES:
        return refuse(f"dtype {logits.dtype} (kernel: fp32, bf16, fp16)")
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        return refuse("last-dim stride != 1")
    if vocab < MIN_VOCAB:
        return refuse(f"vocab {vocab} < {MIN_VOCAB}: one block per row is as fast")
    if not 1 <= rows <= max_rows(vocab):
        return refuse(f"{rows} rows: torch.argmax's block per row already fills the machine")
    cuda, note = cuda_kernel(logits)
    kernel = CUDA_CLUSTER if cuda else TRITON
    reason = f"{where.reason}, {kernel}{note}, {rows} rows x {vocab}"
    return admit(kernel, reason, MODULE if cuda else None)


def cuda_module(device: torch.device):
    """The ``row_argmax.cu`` module for ``device`` (both ops' CUDA kernels), prebuilt, cached
    or built (:func:`dsv41_kernels.jit.load_module`)."""
    return load_module(MODULE, device.index or 0)


@triton.jit
def _order_key(x):
    """fp32 -> int32 increasing with x, -0 folded onto +0, every NaN above +Inf."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def decode_index(packed):
    """The column index held in a slot's low 32 bits."""
    return 4294967295 - (packed & 4294967295)


@triton.jit
def reduce_row_chunk(
    logits_ptr,
    row_stride,
    vocab,
    slots_ptr,  # int64 [rows]: best key per row; EMPTY_SLOT between launches
    ticket_ptr,  # int32 [1]: programs done; 0 between launches
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Fold chunk ``program_id(0)`` of row ``program_id(1)`` into the row's slot; True in the
    one program that draws the last ticket, which then sees every slot final."""
    chunk = tl.program_id(0)
    row = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride

    # Each lane keeps its first maximum (strict >), a NaN once it has seen one, so columns
    # are visited in increasing order per lane; lanes are merged through their int64 keys.
    cols = chunk * CHUNK + tl.arange(0, BLOCK)
    best = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    best_col = cols
    for t in tl.static_range(1, CHUNK // BLOCK):
        cols = chunk * CHUNK + t * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        better = (x > best) | ((x != x) & (best == best))
        best = tl.where(better, x, best)
        best_col = tl.where(better, cols, best_col)
    keyed = (_order_key(best).to(tl.int64) << 32) | (4294967295 - best_col.to(tl.int64))
    tl.atomic_max(slots_ptr + row, tl.max(keyed, axis=0), sem="relaxed")

    # Every thread's slot update happens before the release of the ticket (barrier +
    # acq_rel), so the program drawing the last ticket sees all slots.
    tl.debug_barrier()
    done = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    return done == tl.num_programs(0) * tl.num_programs(1) - 1


TRITON_WORKSPACE = StreamWorkspace(
    "row_argmax",
    Buffer(MAX_ROWS, torch.int64, EMPTY_SLOT),  # slots: the best key per row
    Buffer(1, torch.int32, 0),  # ticket: programs done
)
"""The Triton kernels' slots and ticket (8 KiB a stream; :mod:`dsv41_kernels.workspace`)."""


class LaunchConfig(NamedTuple):
    """Launch shape of the Triton kernels: columns per program, per tile, and warps."""

    chunk: int
    block: int
    num_warps: int

    def grid(self, rows: int, vocab: int) -> tuple[int, int]:
        return triton.cdiv(vocab, self.chunk), rows


def launch_config(rows: int, vocab: int) -> LaunchConfig:
    """About 192 programs over all rows, 2K-16K columns each, in 1024-column tiles (the best
    of a sweep on the H200 at 1, 6 and 64 rows)."""
    chunk = triton.next_power_of_2(triton.cdiv(rows * vocab, 192))
    chunk = min(max(chunk, 2048), 16384)
    return LaunchConfig(chunk, 1024, 4 if chunk <= 2048 else 8)
