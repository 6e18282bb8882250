"""DSpark greedy accept: row argmax over the verify logits and the accept rule, in one launch.

At BS=1 DSpark verifies ``n = 6`` rows of ``[129280]`` fp32 logits per step; SGLang computes
``torch.argmax`` (one block per row) and then the accept rule in further small launches. Here
the multi-block row argmax also applies the rule, so the whole greedy accept is one launch
with no host sync, and with ``out`` given it allocates nothing, which makes it safe inside a
captured CUDA graph. The admission's plan (:mod:`.argmax_plan`, the argmax's own choice made
for the accept's kernels) names the kernel: where the argmax takes its CUDA kernels (sm_90+,
up to 384 rows, n <= 16) the accept does too (``accept_greedy_cuda`` in
``sgl-kernel/csrc/row_argmax.cu``, a cluster a row or one CTA a row: each row's leader CTA adds
its match bit to a per-request ticket and the last one applies the rule, with one ticket round
trip and one read of the bonus row's slot); elsewhere the last program of the Triton
reduction (:mod:`.argmax_reduction`) applies it.

Contract (SGLang 0.5.23 ``dspark_accept.accept_greedy``), bitwise:
``predict = torch.argmax(logits, -1).view(bs, n)``; ``correct_len[b]`` counts the leading
``k`` with ``candidates[b, k + 1] == predict[b, k]``; ``bonus[b] = predict[b, correct_len[b]]``.
With ``cutoff_verify_lens``: ``correct_len`` is capped at ``verify_lens - 1``,
``cap_trim_lens`` is what the cap removed and the bonus is read at the capped index;
without it ``cap_trim_lens`` is zeros. Outputs: int32, int64, int32, each ``[bs]``.
Every int32/int64 verify length is taken exactly, on every path (:data:`VERIFY_LENS_RULE`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import Admission, check_admission, check_tensor, invalid, refuse
from dsv41_kernels.ops.speculative.argmax_plan import (
    MAX_ADMITTED_ROWS,
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
from dsv41_kernels.workspace import Buffer, StreamWorkspace

MAX_DRAFT_ROWS = 64  # n: the Triton epilogue holds [bs, n] in one program's registers
CLUSTER_MAX_DRAFT_ROWS = 16  # n: the CUDA kernel keeps 16 match bits and slots a request
INDEX_DTYPES = (torch.int32, torch.int64)
VERIFY_LENS_RULE = (
    "cutoff_verify_lens[b] is read as clamp(value, 1 - n, n), in int64: SGLang passes 1..n; a "
    "length past n never caps; 0 down to 1 - n give a negative capped length whose bonus index "
    "wraps as Python indexing does; below 1 - n that index would leave the request's rows"
)
"""How a verify length outside SGLang's 1..n is read: values are never checked (that would
sync the host), so every value has a result, the same on the kernels and the fallback."""


OUTPUTS = (
    ("out[0] (correct_len)", torch.int32),
    ("out[1] (bonus)", torch.int64),
    ("out[2] (cap_trim_lens)", torch.int32),
)


def validate_accept_arguments(
    candidates, rows: int, cutoff_verify_lens, out, device, on: str = "logits"
) -> None:
    """Raise ValueError naming the argument unless ``candidates``, ``cutoff_verify_lens`` and
    ``out`` fit ``rows`` verify rows (one per candidate) on ``device``, the device of ``on``
    (the tensor the rows are read from)."""
    check_tensor("candidates", candidates, dtypes=INDEX_DTYPES, ndim=2)
    bs, n = candidates.shape
    if n == 0:
        raise ValueError(f"candidates has empty rows: {tuple(candidates.shape)}")
    if rows != bs * n:
        raise ValueError(
            f"{on} must have bs * n = {bs} * {n} = {bs * n} rows (one per candidate), got {rows}"
        )
    check_on("candidates", candidates, device, on)
    if cutoff_verify_lens is not None:
        check_tensor("cutoff_verify_lens", cutoff_verify_lens, dtypes=INDEX_DTYPES, ndim=1)
        if cutoff_verify_lens.shape[0] != bs:
            raise ValueError(
                f"cutoff_verify_lens must have shape [{bs}], got {tuple(cutoff_verify_lens.shape)}"
            )
        check_on("cutoff_verify_lens", cutoff_verify_lens, device, on)
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != len(OUTPUTS):
            raise ValueError("out must be a tuple (correct_len, bonus, cap_trim_lens)")
        for (name, dtype), t in zip(OUTPUTS, out):
            check_tensor(name, t, dtypes=(dtype,), ndim=1)
            if t.shape[0] != bs or t.device != device or not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous [{bs}] on {device}")


def check_on(name: str, t: torch.Tensor, device, on: str) -> None:
    """ValueError naming ``name`` unless ``t`` is on ``device``, ``on``'s: the kernels read
    every tensor there, and the torch path would fail or answer on another device."""
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, the device of {on}, got {t.device}")


def refuse_accept_layout(candidates, device, cutoff_verify_lens) -> Admission | None:
    """Why the accept kernels cannot read validated ``candidates`` and ``cutoff_verify_lens``
    (on ``device``), or None."""
    if candidates.stride(1) != 1:
        return refuse("candidates last-dim stride != 1")
    if candidates.shape[1] > MAX_DRAFT_ROWS:
        return refuse(f"{candidates.shape[1]} verify rows per request > {MAX_DRAFT_ROWS}")
    if cutoff_verify_lens is not None and not cutoff_verify_lens.is_contiguous():
        return refuse("cutoff_verify_lens not contiguous")
    return None


def _validate(candidates, logits, cutoff_verify_lens, out) -> None:
    validate_logits(logits)
    validate_accept_arguments(candidates, logits.shape[0], cutoff_verify_lens, out, logits.device)


def plan_accept(candidates, logits, cutoff_verify_lens) -> Admission:
    """The accept kernels' admission of validated arguments: the argmax's plan for them."""
    bs, n = candidates.shape
    argmax = admit_logits(logits, accept=True, cuda=n <= CLUSTER_MAX_DRAFT_ROWS)
    if not argmax:
        return argmax
    refusal = refuse_accept_layout(candidates, logits.device, cutoff_verify_lens)
    if refusal is not None:
        return refusal
    return replace(argmax, reason=f"one launch, bs {bs} x n {n}: {argmax.reason}")


def accept_greedy_admission(
    candidates: torch.Tensor,
    logits: torch.Tensor,
    cutoff_verify_lens: torch.Tensor | None = None,
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> Admission:
    """Whether the one-launch kernel runs, which, and in which shape (the plan); never raises,
    reads no values."""
    try:
        _validate(candidates, logits, cutoff_verify_lens, out)
    except ValueError as e:
        return invalid(e)
    return plan_accept(candidates, logits, cutoff_verify_lens)


@triton.jit
def apply_accept_rule(
    predict,  # int64 [BS_BLOCK, N_BLOCK]: the argmax of row b * n + k
    cand_ptr,
    cand_stride,
    cutoff_ptr,
    correct_ptr,
    bonus_ptr,
    trim_ptr,
    bs,
    n,
    BS_BLOCK: tl.constexpr,
    N_BLOCK: tl.constexpr,
    HAS_CUTOFF: tl.constexpr,
):
    """The accept rule over every request's predictions, stored into the three outputs (each
    value converted to its output's type); returns the capped lengths and the bonuses."""
    b = tl.arange(0, BS_BLOCK)[:, None]
    k = tl.arange(0, N_BLOCK)[None, :]
    # candidates[b, k + 1] must equal predict[b, k]; position n - 1 always stops.
    here = (b < bs) & (k < n - 1)
    draft = tl.load(cand_ptr + b * cand_stride + k + 1, mask=here, other=0)
    stop = (k >= n - 1) | (draft.to(tl.int64) != predict)
    correct = tl.min(tl.where(stop, k, N_BLOCK), axis=1)
    req = tl.arange(0, BS_BLOCK)
    live = req < bs
    capped = correct
    if HAS_CUTOFF:
        verify = tl.load(cutoff_ptr + req, mask=live, other=1).to(tl.int64)
        limit = tl.minimum(tl.maximum(verify, 1 - n), n) - 1  # see VERIFY_LENS_RULE
        capped = tl.minimum(correct, limit.to(tl.int32))
    tl.store(correct_ptr + req, capped.to(tl.int32), mask=live)
    tl.store(trim_ptr + req, (correct - capped).to(tl.int32), mask=live)
    # SGLang reads the bonus with Python indexing: a negative index wraps.
    take = tl.where(capped < 0, capped + n, capped)
    bonus = tl.sum(tl.where(k == take[:, None], predict, 0), axis=1)
    tl.store(bonus_ptr + req, bonus, mask=live)
    return capped, bonus


@triton.jit
def store_accept_tail(
    capped,  # int32 [BS_BLOCK]: the accepted lengths
    bonus,  # int64 [BS_BLOCK]
    cand_ptr,
    cand_stride,
    seq_ptr,  # prefix lengths [bs]
    verify_ptr,  # verify lengths [bs] (GATED)
    gate_ptr,  # int32 [1] (GATED)
    commit_ptr,  # int32 [bs]
    new_seq_ptr,  # [bs], seq_ptr's type
    tokens_ptr,  # int64 [bs, n]
    tokens_stride,
    gated_ptr,  # int32 [bs] (GATED)
    bs,
    n,
    BS_BLOCK: tl.constexpr,
    N_BLOCK: tl.constexpr,
    GATED: tl.constexpr,
):
    """The static verify epilogue's outputs from the accept's (``accept_greedy_epilogue``)."""
    b = tl.arange(0, BS_BLOCK)[:, None]
    k = tl.arange(0, N_BLOCK)[None, :]
    req = tl.arange(0, BS_BLOCK)
    live = req < bs
    commit = capped + 1
    tl.store(commit_ptr + req, commit, mask=live)
    seq = tl.load(seq_ptr + req, mask=live, other=0)
    tl.store(new_seq_ptr + req, seq + commit.to(seq.dtype), mask=live)
    draft = tl.load(cand_ptr + b * cand_stride + k + 1, mask=(b < bs) & (k < n - 1), other=0)
    token = tl.where(k == capped[:, None], bonus[:, None], draft.to(tl.int64))
    tl.store(tokens_ptr + b * tokens_stride + k, token, mask=(b < bs) & (k < n))
    if GATED:
        verify = tl.load(verify_ptr + req, mask=live, other=0).to(tl.int32)
        gate = tl.load(gate_ptr)
        tl.store(gated_ptr + req, tl.minimum(commit, verify) * gate, mask=live)


@triton.jit
def accept_greedy_kernel(
    logits_ptr,
    row_stride,
    vocab,
    rows,
    slots_ptr,
    ticket_ptr,
    cand_ptr,  # candidates [bs, n]
    cand_stride,
    cutoff_ptr,  # verify lens [bs] (HAS_CUTOFF)
    correct_ptr,  # int32 [bs]
    bonus_ptr,  # int64 [bs]
    trim_ptr,  # int32 [bs]
    n,  # verify rows per request
    seq_ptr,  # the epilogue's (TAIL): see store_accept_tail
    verify_ptr,
    gate_ptr,
    commit_ptr,
    new_seq_ptr,
    tokens_ptr,
    tokens_stride,
    gated_ptr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    BS_BLOCK: tl.constexpr,
    N_BLOCK: tl.constexpr,
    HAS_CUTOFF: tl.constexpr,
    TAIL: tl.constexpr,
    GATED: tl.constexpr,
):
    """The reduction of :func:`reduce_row_chunk`; the last program applies the accept rule
    (and with ``TAIL`` stores the verify epilogue's outputs)."""
    if reduce_row_chunk(logits_ptr, row_stride, vocab, slots_ptr, ticket_ptr, CHUNK, BLOCK):
        b = tl.arange(0, BS_BLOCK)[:, None]
        k = tl.arange(0, N_BLOCK)[None, :]
        bs = rows // n
        here = (b < bs) & (k < n)
        empty = tl.full([BS_BLOCK, N_BLOCK], -(2**63), tl.int64)
        predict = decode_index(
            tl.atomic_xchg(slots_ptr + b * n + k, empty, mask=here, sem="relaxed")
        )
        capped, bonus = apply_accept_rule(
            predict, cand_ptr, cand_stride, cutoff_ptr, correct_ptr, bonus_ptr, trim_ptr, bs, n,
            BS_BLOCK, N_BLOCK, HAS_CUTOFF,
        )  # fmt: skip
        if TAIL:
            store_accept_tail(
                capped, bonus, cand_ptr, cand_stride, seq_ptr, verify_ptr, gate_ptr, commit_ptr,
                new_seq_ptr, tokens_ptr, tokens_stride, gated_ptr, bs, n, BS_BLOCK, N_BLOCK, GATED,
            )  # fmt: skip
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed")


@dataclass(frozen=True)
class AcceptTail:
    """The static verify epilogue's tensors (``accept_greedy_epilogue`` checks them): its
    inputs ``seq_lens``, ``verify_lens`` and ``gate`` (the last two None without ``gated``)
    and its outputs ``commit_lens``, ``new_seq_lens``, ``out_tokens``, ``gated``."""

    seq_lens: torch.Tensor
    verify_lens: torch.Tensor | None
    gate: torch.Tensor | None
    commit_lens: torch.Tensor
    new_seq_lens: torch.Tensor
    out_tokens: torch.Tensor
    gated: torch.Tensor | None

    def triton_arguments(self) -> tuple:
        """The kernel's tail arguments (an unread output stands in for each absent tensor)."""
        gated = self.gated is not None
        return (
            self.seq_lens,
            self.verify_lens if gated else self.commit_lens,
            self.gate if gated else self.commit_lens,
            self.commit_lens,
            self.new_seq_lens,
            self.out_tokens,
            self.out_tokens.stride(0),
            self.gated if gated else self.commit_lens,
        )


def launch_triton(
    candidates, logits, cutoff_verify_lens, out, launch: TritonLaunch, tail: AcceptTail = None
) -> None:
    """The Triton kernel into ``out`` (and ``tail``'s outputs), in the shape ``launch``."""
    rows, vocab = logits.shape
    bs, n = candidates.shape
    correct, bonus, trim = out
    has_cutoff = cutoff_verify_lens is not None
    # Without a tail, the kernel never reads these: any tensor stands in.
    tail_arguments = (correct,) * 6 + (0, correct) if tail is None else tail.triton_arguments()
    with TRITON_WORKSPACE.launch(logits.device) as (slots, ticket):
        accept_greedy_kernel[launch.grid(rows, vocab)](
            logits,
            logits.stride(0),
            vocab,
            rows,
            slots,
            ticket,
            candidates,
            candidates.stride(0),
            cutoff_verify_lens if has_cutoff else correct,  # never read without a cutoff
            correct,
            bonus,
            trim,
            n,
            *tail_arguments,
            CHUNK=launch.chunk,
            BLOCK=launch.block,
            BS_BLOCK=triton.next_power_of_2(bs),
            N_BLOCK=max(2, triton.next_power_of_2(n)),
            HAS_CUTOFF=has_cutoff,
            TAIL=tail is not None,
            GATED=tail is not None and tail.gated is not None,
            num_warps=launch.num_warps,
        )


CLUSTER_WORKSPACE = StreamWorkspace(
    "accept_greedy",
    # slots [16 * bs]: -1 is never current
    Buffer(CLUSTER_MAX_DRAFT_ROWS * MAX_ADMITTED_ROWS, torch.int64, -1),
    Buffer(MAX_ADMITTED_ROWS, torch.int64, 0),  # request tickets [bs]: generation 0, none counted
)
"""The CUDA accept's slots and tickets, for bs up to every admitted row (51 KiB a stream;
:mod:`dsv41_kernels.workspace`)."""


def launch_cuda(candidates, logits, cutoff_verify_lens, out, plan: ArgmaxPlan) -> None:
    """The CUDA kernel ``plan`` names into ``out``, in its shape."""
    slots, tickets = CLUSTER_WORKSPACE.get(logits.device)
    no_cutoff = tickets[:0]
    cuda_module(logits.device).accept_greedy_cuda(
        candidates,
        logits,
        no_cutoff if cutoff_verify_lens is None else cutoff_verify_lens,
        *out,
        slots,
        tickets,
        *plan.cuda_shape(),
    )


def accept_from_predictions_torch(candidates, predict, cutoff_verify_lens=None, out=None):
    """The accept rule over ``predict`` (int64 ``[bs, n]``, each row's argmax) in torch ops."""
    n = candidates.shape[1]
    matches = candidates[:, 1:].to(torch.int64) == predict[:, :-1]
    correct = matches.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32)
    capped = correct
    if cutoff_verify_lens is not None:
        limit = cutoff_verify_lens.to(torch.int64).clamp(1 - n, n) - 1  # see VERIFY_LENS_RULE
        capped = torch.minimum(correct, limit.to(torch.int32))
    trim = correct - capped
    take = torch.where(capped < 0, capped + n, capped).to(torch.int64)
    bonus = predict.gather(1, take[:, None]).squeeze(1)
    if out is None:
        return capped, bonus, trim
    for dst, src in zip(out, (capped, bonus, trim)):
        dst.copy_(src)
    return tuple(out)


def accept_greedy_torch(candidates, logits, cutoff_verify_lens=None, out=None):
    """The same rule in torch ops: the fallback, and the baseline the benchmark times."""
    predict = torch.argmax(logits, dim=-1).view(candidates.shape)
    return accept_from_predictions_torch(candidates, predict, cutoff_verify_lens, out)


def new_outputs(bs: int, device, out=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``out``, or fresh ``(int32 [bs], int64 [bs], int32 [bs])`` tensors on ``device``."""
    if out is None:
        return tuple(torch.empty(bs, dtype=dtype, device=device) for _, dtype in OUTPUTS)
    return tuple(out)


def accept_greedy(
    candidates: torch.Tensor,
    logits: torch.Tensor,
    *,
    cutoff_verify_lens: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(correct_len, bonus, cap_trim_lens)`` for ``candidates [bs, n]`` and ``logits [bs*n, V]``.

    ``cutoff_verify_lens`` (int ``[bs]``, optional) caps the accepted length per request
    (SGLang's are ``1..n``; any other value as :data:`VERIFY_LENS_RULE` says). ``out``, a
    preallocated ``(int32 [bs], int64 [bs], int32 [bs])``, is written in place.
    ``admission``: this call's :func:`accept_greedy_admission`, when the caller already made it.
    """
    check_admission(admission)
    if admission is None or not admission:
        # An admitted admission has validated these very arguments (``out`` included).
        _validate(candidates, logits, cutoff_verify_lens, out)
    if admission is None:
        admission = plan_accept(candidates, logits, cutoff_verify_lens)
    if not admission:
        return accept_greedy_torch(candidates, logits, cutoff_verify_lens, out)
    out = new_outputs(candidates.shape[0], logits.device, out)
    plan = admission.plan
    if plan.cuda is not None:
        launch_cuda(candidates, logits, cutoff_verify_lens, out, plan)
    else:
        launch_triton(candidates, logits, cutoff_verify_lens, out, plan.triton)
    return tuple(out)
