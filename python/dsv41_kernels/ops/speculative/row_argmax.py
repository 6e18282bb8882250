"""Row argmax for few, very wide rows: DSpark's greedy accept over ``[6, 129280]`` verify logits.

``torch.argmax`` reduces each row in a single thread block, so six rows leave most of the
machine idle; here every row is spread over the whole GPU in one launch. The admission's plan
(:mod:`.argmax_plan`) names the kernel and its launch shape: on sm_90+ CUDA kernels up to 384
rows, a cluster of CTAs a row or from 96 rows one CTA a row; elsewhere the multi-block Triton
kernel of :mod:`.argmax_reduction`.

Contract: the result is **bitwise identical to** ``torch.argmax(logits, dim=-1)`` for every
input: ties resolve to the lowest index, ``-0.0 == +0.0``, ``+Inf`` wins over every finite
value, an all ``-Inf`` row gives 0, and a row holding NaN gives the index of its first NaN
(torch's rule, which a plain ``max`` reduction misses).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import Admission, check_admission, check_tensor, invalid
from dsv41_kernels.ops.speculative.argmax_plan import (
    ArgmaxPlan,
    TritonLaunch,
    admit_logits,
    cuda_module,
    validate_logits,
)
from dsv41_kernels.ops.speculative.argmax_reduction import (
    TRITON_WORKSPACE,
    decode_index,
    reduce_row_chunk,
)


def _validate(logits, out) -> None:
    validate_logits(logits)
    rows = logits.shape[0]
    if out is not None:
        check_tensor("out", out, dtypes=(torch.int64,), ndim=1)
        if out.shape[0] != rows or out.device != logits.device or not out.is_contiguous():
            raise ValueError(
                f"out must be a contiguous int64 [{rows}] tensor on {logits.device}, "
                f"got {tuple(out.shape)} on {out.device}"
            )


def row_argmax_admission(logits: torch.Tensor, *, out: torch.Tensor | None = None) -> Admission:
    """Whether a multi-block kernel runs, which, and in which shape (the plan); never raises,
    reads no values (:func:`.argmax_plan.admit_logits`)."""
    try:
        _validate(logits, out)
    except ValueError as e:
        return invalid(e)
    return admit_logits(logits)


@triton.jit
def row_argmax_kernel(
    logits_ptr,
    row_stride,
    vocab,
    rows,
    slots_ptr,
    ticket_ptr,
    out_ptr,  # int64 [rows]
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS_BLOCK: tl.constexpr,
):
    """The reduction of :func:`reduce_row_chunk`; the last program decodes every row's winner."""
    if reduce_row_chunk(logits_ptr, row_stride, vocab, slots_ptr, ticket_ptr, CHUNK, BLOCK):
        r = tl.arange(0, ROWS_BLOCK)
        here = r < rows
        empty = tl.full([ROWS_BLOCK], -(2**63), tl.int64)
        winners = tl.atomic_xchg(slots_ptr + r, empty, mask=here, sem="relaxed")
        tl.store(out_ptr + r, decode_index(winners), mask=here)
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed")


def launch_triton(logits: torch.Tensor, out: torch.Tensor, launch: TritonLaunch) -> None:
    """The Triton kernel into ``out``, in the shape ``launch``."""
    rows, vocab = logits.shape
    with TRITON_WORKSPACE.launch(logits.device) as (slots, ticket):
        row_argmax_kernel[launch.grid(rows, vocab)](
            logits,
            logits.stride(0),
            vocab,
            rows,
            slots,
            ticket,
            out,
            CHUNK=launch.chunk,
            BLOCK=launch.block,
            ROWS_BLOCK=triton.next_power_of_2(rows),
            num_warps=launch.num_warps,
        )


def launch_cuda(logits: torch.Tensor, out: torch.Tensor, plan: ArgmaxPlan) -> None:
    """The CUDA kernel ``plan`` names into ``out``, in its shape."""
    cuda_module(logits.device).row_argmax_cuda(logits, out, *plan.cuda_shape())


def run_row_argmax(logits: torch.Tensor, out: torch.Tensor, admission: Admission) -> torch.Tensor:
    """The argmax of validated ``logits`` into ``out`` as ``admission`` says: its plan, or
    ``torch.argmax`` when it refuses."""
    if out.shape[0] == 0:
        return out
    if not admission:
        torch.argmax(logits, dim=-1, out=out)
    elif admission.plan.cuda is not None:
        launch_cuda(logits, out, admission.plan)
    else:
        launch_triton(logits, out, admission.plan.triton)
    return out


def row_argmax(
    logits: torch.Tensor, *, out: torch.Tensor | None = None, admission: Admission | None = None
) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)`` for 2-D ``logits``, bitwise; int64 ``[rows]``.

    ``out`` (int64, ``[rows]``, contiguous, on the logits' device) is written in place, which
    keeps the call allocation-free inside CUDA-graph capture. ``admission``: this call's
    :func:`row_argmax_admission`, when the caller already made it.
    """
    check_admission(admission)
    _validate(logits, out)
    if admission is None:
        admission = admit_logits(logits)
    if out is None:
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    return run_row_argmax(logits, out, admission)
