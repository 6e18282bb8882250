"""Row argmax for few, very wide rows: DSpark's greedy accept over ``[6, 129280]`` verify logits.

``torch.argmax`` reduces each row in a single thread block, so six rows keep six of the
H200's 132 SMs busy while 3 MB of logits wait to be read. Here every row is cut into
chunks spread over the whole machine, and the last block to finish (an atomic ticket)
combines the per-row winners, all in one launch.

Contract: the result is **bitwise identical to** ``torch.argmax(logits, dim=-1)`` for every
input: ties resolve to the lowest index, ``-0.0 == +0.0``, ``+Inf`` wins over every finite
value, an all ``-Inf`` row gives 0, and a row holding NaN gives the index of its first NaN
(torch's rule, which a plain ``max`` reduction misses).

Two kernels, one contract. On Hopper and Blackwell, for up to ``CLUSTER_MAX_ROWS`` (8) rows,
a CUDA kernel (``sgl-kernel/csrc/row_argmax.cu``) gives each row a thread-block cluster of up
to 16 CTAs whose warps send their winners into the leader CTA's shared memory: one launch, no
global atomics (the greedy accept has a CUDA form there too). Elsewhere (more rows, other GPUs,
the Triton interpreter) the Triton kernel below runs; which wins where is in
docs/performance.md.

How the Triton kernel works: each lane keeps the first maximum of its columns (a NaN once
it sees one). A lane's winner becomes one int64 key ``order(x) << 32 | (2**32 - 1 - index)``,
where ``order`` maps fp32 to int32 monotonically (NaN above +Inf, -0 folded onto +0), so an
integer max over lanes, then an ``atomic_max`` into a per-row slot, keeps the winner and,
among equals, the lowest index. The last block to draw the ticket swaps the slots back to
their empty value, decodes the indices and re-arms the ticket, so the kernel is reentrant on
a stream and safe to capture in a CUDA graph. The accept epilogue
(:mod:`dsv41_kernels.ops.speculative.accept_greedy`) runs in that last block too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import Admission, admit, check_tensor, refuse, triton_device
from dsv41_kernels.jit import load_module, sm_major, toolchain_available
from dsv41_kernels.workspace import device_workspace

MIN_VOCAB = 4096
MAX_ROWS = 1024  # rows one launch may reduce: the size of the per-device slot workspace
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_EMPTY_SLOT = -(2**63)


def row_argmax_admission(logits: torch.Tensor) -> Admission:
    """Whether ``logits`` may take the multi-block kernel; pure, reads no values."""
    where = triton_device(logits)
    if not where:
        return where
    if logits.dim() != 2:
        return refuse(f"logits is {logits.dim()}-D, the kernel takes 2-D rows")
    if logits.dtype not in SUPPORTED_DTYPES:
        return refuse(f"dtype {logits.dtype} (kernel: fp32, bf16, fp16)")
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        return refuse("last-dim stride != 1")
    if vocab < MIN_VOCAB:
        return refuse(f"vocab {vocab} < {MIN_VOCAB}: one block per row is as fast")
    if not 1 <= rows <= max_rows(vocab):
        return refuse(f"{rows} rows: torch.argmax's block per row already fills the machine")
    kernel = "cuda cluster" if uses_cluster_kernel(logits) else "triton"
    return admit(f"{where.reason}, {kernel}, {rows} rows x {vocab}")


CLUSTER_MAX_ROW_BYTES = 16 * 256 * 16 * 16  # 16 CTAs x 256 threads x 16 items of 16 bytes
CLUSTER_MAX_ROWS = 8  # past this the Triton kernel wins on the H200 (bench_row_argmax.py)


def uses_cluster_kernel(logits: torch.Tensor) -> bool:
    """The CUDA cluster kernel: sm_90+, a CUDA toolchain, 16-byte aligned rows, few rows."""
    return (
        logits.is_cuda
        and logits.shape[0] <= CLUSTER_MAX_ROWS
        and sm_major(logits.device.index) >= 9
        and logits.shape[1] * logits.element_size() <= CLUSTER_MAX_ROW_BYTES
        and logits.data_ptr() % 16 == 0
        and (logits.stride(0) * logits.element_size()) % 16 == 0
        and toolchain_available()
    )


def max_rows(vocab: int) -> int:
    """Rows up to which spreading rows over the machine beats a block per row (H200)."""
    return 64 if vocab < 65536 else 256


@triton.jit
def _order_key(x):
    """fp32 -> int32 increasing with x, -0 folded onto +0, every NaN above +Inf."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def _decode_index(packed):
    return 4294967295 - (packed & 4294967295)


@triton.jit
def row_argmax_kernel(
    logits_ptr,
    row_stride,
    vocab,
    rows,
    slots_ptr,  # int64 [rows]: best key per row; _EMPTY_SLOT between launches
    ticket_ptr,  # int32 [1]: blocks done; 0 between launches
    out_ptr,  # int64 [rows] argmax (row mode)
    cand_ptr,  # accept mode: candidates [bs, n]
    cand_stride,
    cutoff_ptr,  # accept mode: verify lens [bs] (HAS_CUTOFF)
    correct_ptr,  # accept mode: int32 [bs]
    bonus_ptr,  # accept mode: int64 [bs]
    trim_ptr,  # accept mode: int32 [bs]
    n,  # accept mode: verify rows per request
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS_BLOCK: tl.constexpr,
    BS_BLOCK: tl.constexpr,
    N_BLOCK: tl.constexpr,
    ACCEPT: tl.constexpr,
    HAS_CUTOFF: tl.constexpr,
):
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
    # acq_rel), so the block drawing the last ticket sees all slots.
    tl.debug_barrier()
    done = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if done == tl.num_programs(0) * tl.num_programs(1) - 1:
        if ACCEPT:
            b = tl.arange(0, BS_BLOCK)[:, None]
            k = tl.arange(0, N_BLOCK)[None, :]
            bs = rows // n
            here = (b < bs) & (k < n)
            empty = tl.full([BS_BLOCK, N_BLOCK], -(2**63), tl.int64)
            predict = _decode_index(
                tl.atomic_xchg(slots_ptr + b * n + k, empty, mask=here, sem="relaxed")
            )
            # candidates[b, k + 1] must equal predict[b, k]; position n - 1 always stops.
            draft = tl.load(cand_ptr + b * cand_stride + k + 1, mask=here & (k < n - 1), other=0)
            stop = (k >= n - 1) | (draft.to(tl.int64) != predict)
            correct = tl.min(tl.where(stop, k, N_BLOCK), axis=1)
            req = tl.arange(0, BS_BLOCK)
            live = req < bs
            capped = correct
            if HAS_CUTOFF:
                limit = tl.load(cutoff_ptr + req, mask=live, other=1).to(tl.int32) - 1
                capped = tl.minimum(correct, limit)
            tl.store(correct_ptr + req, capped.to(tl.int32), mask=live)
            tl.store(trim_ptr + req, (correct - capped).to(tl.int32), mask=live)
            # SGLang reads the bonus with Python indexing: a negative index wraps.
            take = tl.where(capped < 0, capped + n, capped)
            bonus = tl.sum(tl.where(k == take[:, None], predict, 0), axis=1)
            tl.store(bonus_ptr + req, bonus, mask=live)
        else:
            r = tl.arange(0, ROWS_BLOCK)
            here = r < rows
            empty = tl.full([ROWS_BLOCK], -(2**63), tl.int64)
            winners = tl.atomic_xchg(slots_ptr + r, empty, mask=here, sem="relaxed")
            tl.store(out_ptr + r, _decode_index(winners), mask=here)
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed")


def workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel's per-device slots and ticket (8 KiB): see
    :func:`dsv41_kernels.workspace.device_workspace` (made before capture, stream-ordered)."""
    return device_workspace(
        "row_argmax",
        device,
        lambda d: (
            torch.full((MAX_ROWS,), _EMPTY_SLOT, dtype=torch.int64, device=d),
            torch.zeros(1, dtype=torch.int32, device=d),
        ),
    )


def launch_config(rows: int, vocab: int) -> tuple[int, int, int]:
    """(CHUNK, BLOCK, num_warps) for the Triton kernel: about 192 blocks over all rows, 2K-16K
    columns each, in 1024-column tiles (the best of a sweep on the H200 at 1, 6 and 64 rows)."""
    chunk = triton.next_power_of_2(triton.cdiv(rows * vocab, 192))
    chunk = min(max(chunk, 2048), 16384)
    return chunk, 1024, 4 if chunk <= 2048 else 8


def launch(logits, out=None, *, candidates=None, cutoff=None, accept_out=None, n=1):
    """Launch the kernel in row mode (``out``) or accept mode (``candidates``, ``accept_out``)."""
    rows, vocab = logits.shape
    slots, ticket = workspace(logits.device)
    chunk, block, warps = launch_config(rows, vocab)
    accept = candidates is not None
    correct, bonus, trim = accept_out if accept else (out, out, out)
    bs = rows // n
    row_argmax_kernel[(triton.cdiv(vocab, chunk), rows)](
        logits,
        logits.stride(0),
        vocab,
        rows,
        slots,
        ticket,
        out if out is not None else correct,
        candidates if accept else logits,
        candidates.stride(0) if accept else 0,
        cutoff if cutoff is not None else slots,
        correct,
        bonus,
        trim,
        n,
        CHUNK=chunk,
        BLOCK=block,
        ROWS_BLOCK=triton.next_power_of_2(rows),
        BS_BLOCK=triton.next_power_of_2(bs),
        N_BLOCK=max(2, triton.next_power_of_2(n)),
        ACCEPT=accept,
        HAS_CUTOFF=cutoff is not None,
        num_warps=warps,
    )


def row_argmax(logits: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)`` for 2-D ``logits``, bitwise; int64 ``[rows]``.

    ``out`` (int64, ``[rows]``, contiguous, on the logits' device) is written in place, which
    keeps the call allocation-free inside CUDA-graph capture.
    """
    check_tensor("logits", logits, ndim=2)
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    rows, vocab = logits.shape
    if vocab == 0:
        raise ValueError("logits has empty rows (0 columns): argmax is undefined")
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    else:
        check_tensor("out", out, dtypes=(torch.int64,), ndim=1)
        if out.shape[0] != rows or out.device != logits.device or not out.is_contiguous():
            raise ValueError(
                f"out must be a contiguous int64 [{rows}] tensor on {logits.device}, "
                f"got {tuple(out.shape)} on {out.device}"
            )
    if rows == 0:
        return out
    if not row_argmax_admission(logits):
        torch.argmax(logits, dim=-1, out=out)
    elif uses_cluster_kernel(logits):
        load_module("row_argmax", logits.device.index or 0).row_argmax_cluster(logits, out)
    else:
        launch(logits, out)
    return out


def check_cases(device: torch.device, small: bool) -> list:
    from dsv41_kernels.check import CheckCase, bit_mismatches

    shapes = [(6, 5003), (2, 8192 + 17)] if small else [(1, 129280), (6, 129280), (64, 129280)]
    cases = []
    for rows, vocab in shapes:
        gen = torch.Generator(device="cpu").manual_seed(rows * vocab)
        logits = torch.randn(rows, vocab, generator=gen).to(device)
        logits[0, vocab // 3] = float("nan")  # torch picks the first NaN
        logits[-1, vocab // 2] = logits[-1, vocab - 1] = logits[-1].max() + 1  # a tie
        cases.append(
            CheckCase(
                op="row_argmax",
                shape=f"[{rows}, {vocab}] fp32",
                admission=row_argmax_admission(logits),
                run=lambda x=logits: row_argmax(x),
                reference=lambda x=logits: torch.argmax(x, dim=-1),
                mismatches=bit_mismatches,
                baseline=lambda x=logits: torch.argmax(x, dim=-1),
            )
        )
    return cases
