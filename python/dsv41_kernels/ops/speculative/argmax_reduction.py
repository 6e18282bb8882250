"""The multi-block Triton row argmax that :mod:`.row_argmax` and :mod:`.accept_greedy` run where
their CUDA kernels do not (:mod:`.argmax_plan` chooses): the device functions their kernels are
built from, and the per-stream workspace.

The rows are cut into chunks, each program folds its chunk into a per-row slot with an atomic
max, and the program drawing the last ticket runs the op's epilogue (the argmax's decode, or
the greedy accept rule). Each lane keeps the first maximum of its columns (a NaN once it sees
one). A lane's winner becomes one int64 key ``order(x) << 32 | (2**32 - 1 - index)``, where
``order`` maps fp32 to int32 monotonically (NaN above +Inf, -0 folded onto +0), so an integer
max over lanes, then an ``atomic_max`` into the row's slot, keeps the winner and, among equals,
the lowest index: ``torch.argmax``'s rule, NaN included. The epilogue swaps the slots back to
:data:`EMPTY_SLOT` as it reads them and re-arms the ticket, so the kernels are reentrant on a
stream and safe to capture in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.workspace import Buffer, StreamWorkspace

MAX_ROWS = 1024  # rows one launch may reduce: the size of the slot workspace
EMPTY_SLOT = -(2**63)


@triton.jit
def order_key(x):
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
    keyed = (order_key(best).to(tl.int64) << 32) | (4294967295 - best_col.to(tl.int64))
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
