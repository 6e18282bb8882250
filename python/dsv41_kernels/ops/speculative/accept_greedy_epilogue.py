"""DSpark's static greedy verify epilogue in one launch: the accept and the tail after it.

SGLang 0.5.23 runs the epilogue inside the verify CUDA graph
(``DsparkVerifyEpilogue._accept_static_greedy``): the greedy accept, then
``FinalizeAcceptLens``, ``BuildOutTokens``, six copies into its static buffers and the gate, 14
to 17 launches of a few integers each. Here the accept's last arrival of a request (the CUDA
kernels' leader warp, or the Triton reduction's last program: :mod:`.accept_greedy`) writes
every output too, so the epilogue is the accept's one launch, with no host sync and no
allocation (CUDA-graph safe).

Contract (SGLang 0.5.23's outputs, bitwise, over ``torch.argmax``; its own fused argmax differs
on rows holding NaN): with ``correct_len`` and ``bonus`` the greedy accept's without a cap,
- ``correct_len`` widened to int64 (the static buffer's type); ``cap_trim_lens`` zeros (int32);
- ``commit_lens[b] = correct_len[b] + 1`` (int32);
- ``new_seq_lens[b] = seq_lens[b] + commit_lens[b]`` (``seq_lens``' type);
- ``out_tokens[b, k]`` (int64 ``[bs, n]``): the bonus at ``k == correct_len[b]``, else the draft
  ``candidates[b, k + 1]`` for ``k < n - 1``, else 0;
- with ``verify_lens`` and ``gate``: ``gated[b] = min(commit_lens[b], int32(verify_lens[b])) *
  gate[0]`` in int32 arithmetic (torch's ``.to(torch.int32)`` keeps the low 32 bits).

Under SGLang's accept-site TP broadcast (``broadcast``), rank 0's ``(correct_len, bonus,
cap_trim_lens)`` must replace every rank's between the accept and the tail, so the epilogue is
two launches around SGLang's three broadcasts: the accept into a per-stream workspace, then the
tail from the broadcast values (:func:`accept_tail_kernel`, Triton), still against SGLang's 17
launches and its broadcasts. The outputs are then functions of the broadcast values (any
``cap_trim_lens``, passed through; ``commit_lens`` from ``correct_len`` alone), as SGLang's are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    check_admission,
    check_inputs_apart,
    check_tensor,
    invalid,
)
from dsv41_kernels.ops.speculative.accept_greedy import (
    CLUSTER_WORKSPACE,
    INDEX_DTYPES,
    AcceptTail,
    accept_greedy,
    accept_greedy_torch,
    check_on,
    launch_triton,
    plan_accept,
    store_accept_tail,
    validate_accept_arguments,
)
from dsv41_kernels.ops.speculative.argmax_plan import (
    MAX_ADMITTED_ROWS,
    cuda_module,
    validate_logits,
)
from dsv41_kernels.workspace import Buffer, StreamWorkspace


class EpilogueOuts(NamedTuple):
    """The epilogue's outputs, each ``[bs]`` but ``out_tokens`` ``[bs, n]``: SGLang's static
    buffers' rows (``read_accept(bs)``) and the gated lengths (None: not computed)."""

    correct_len: torch.Tensor  # int64
    bonus: torch.Tensor  # int64
    cap_trim_lens: torch.Tensor  # int32
    commit_lens: torch.Tensor  # int32
    new_seq_lens: torch.Tensor  # seq_lens' dtype
    out_tokens: torch.Tensor  # int64 [bs, n], last-dim stride 1
    gated: torch.Tensor | None  # int32


def new_outputs(
    bs: int, n: int, device, *, seq_dtype: torch.dtype = torch.int64, gated: bool = True
) -> EpilogueOuts:
    """Empty outputs of ``bs`` requests of ``n`` verify rows (the gated lengths' only with
    ``gated``), for callers without SGLang's static buffers."""
    empty = lambda *shape, dtype: torch.empty(*shape, dtype=dtype, device=device)
    i32, i64 = torch.int32, torch.int64
    return EpilogueOuts(
        empty(bs, dtype=i64),
        empty(bs, dtype=i64),
        empty(bs, dtype=i32),
        empty(bs, dtype=i32),
        empty(bs, dtype=seq_dtype),
        empty(bs, n, dtype=i64),
        empty(bs, dtype=i32) if gated else None,
    )


def _validate(candidates, logits, seq_lens, verify_lens, gate, out: EpilogueOuts) -> None:
    validate_logits(logits)
    validate_accept_arguments(candidates, logits.shape[0], None, None, logits.device)
    bs, n = candidates.shape
    device = logits.device
    check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES, ndim=1)
    if (verify_lens is None) != (gate is None):
        raise ValueError("verify_lens and gate come together (the gated lengths), or neither")
    inputs = {"candidates": candidates, "seq_lens": seq_lens}
    if verify_lens is not None:
        check_tensor("verify_lens", verify_lens, dtypes=INDEX_DTYPES, ndim=1)
        check_tensor("gate", gate, dtypes=(torch.int32,), ndim=1)
        if gate.shape[0] != 1:
            raise ValueError(f"gate must have shape [1], got {tuple(gate.shape)}")
        inputs.update(verify_lens=verify_lens, gate=gate)
    for name, t in inputs.items():
        if name != "candidates":
            if name != "gate" and t.shape[0] != bs:
                raise ValueError(f"{name} must have shape [{bs}], got {tuple(t.shape)}")
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
            check_on(name, t, device, "logits")
    if not isinstance(out, EpilogueOuts):
        raise ValueError(f"out must be an EpilogueOuts, got {type(out).__name__}")
    if (out.gated is None) != (verify_lens is None):
        raise ValueError("out.gated is given exactly when verify_lens and gate are")
    want = dict(
        correct_len=((bs,), torch.int64),
        bonus=((bs,), torch.int64),
        cap_trim_lens=((bs,), torch.int32),
        commit_lens=((bs,), torch.int32),
        new_seq_lens=((bs,), seq_lens.dtype),
        out_tokens=((bs, n), torch.int64),
        gated=((bs,), torch.int32),
    )
    outputs = {name: t for name, t in out._asdict().items() if t is not None}
    for name, t in outputs.items():
        shape, dtype = want[name]
        check_tensor(f"out.{name}", t, dtypes=(dtype,), ndim=len(shape))
        rows = t.stride(-1) == 1 if name == "out_tokens" else t.is_contiguous()
        if tuple(t.shape) != shape or t.device != device or not rows:
            layout = "last-dim stride 1" if name == "out_tokens" else "contiguous"
            raise ValueError(f"out.{name} must be {layout} {list(shape)} on {device}")
    check_inputs_apart({f"out.{k}": v for k, v in outputs.items()}, {**inputs, "logits": logits})


def accept_greedy_epilogue_admission(
    candidates, logits, seq_lens, verify_lens=None, gate=None, *, out: EpilogueOuts
) -> Admission:
    """Whether the one-launch kernel runs, which, and in which shape (the accept's plan); never
    raises, reads no values."""
    try:
        _validate(candidates, logits, seq_lens, verify_lens, gate, out)
    except ValueError as e:
        return invalid(e)
    return plan_accept(candidates, logits, None)


def epilogue_torch(
    candidates, logits, seq_lens, verify_lens, gate, out: EpilogueOuts, broadcast=None
):
    """The contract in torch ops, into ``out``: the fallback."""
    accepted = accept_greedy_torch(candidates, logits)
    if broadcast is not None:
        accepted = tuple(broadcast(t) for t in accepted)
    return tail_torch(candidates, *accepted, seq_lens, verify_lens, gate, out)


def tail_torch(candidates, correct, bonus, trim, seq_lens, verify_lens, gate, out: EpilogueOuts):
    """The outputs from the accept's ``(correct int32, bonus int64, cap_trim int32)``, in torch
    ops (SGLang's ``build_accept_outs`` and the gate)."""
    n = candidates.shape[1]
    commit = correct + 1
    k = torch.arange(n, device=candidates.device)
    drafts = torch.zeros_like(out.out_tokens)
    drafts[:, : n - 1] = candidates[:, 1:]
    tokens = torch.where(k == correct[:, None].to(torch.int64), bonus[:, None], drafts)
    results = [correct, bonus, trim, commit, seq_lens + commit, tokens]
    if out.gated is not None:
        results.append(torch.minimum(commit, verify_lens.to(torch.int32)) * gate)
    for dst, src in zip(out, results):
        dst.copy_(src)
    return out


BROADCAST_WORKSPACE = StreamWorkspace(
    "accept_greedy_epilogue",
    Buffer(MAX_ADMITTED_ROWS, torch.int32, 0),  # correct_len
    Buffer(MAX_ADMITTED_ROWS, torch.int64, 0),  # bonus
    Buffer(MAX_ADMITTED_ROWS, torch.int32, 0),  # cap_trim_lens
)
"""The accept's results between the two launches of a broadcast epilogue, as SGLang's
broadcast carries them (int32, int64, int32 ``[bs]``); 4.5 KiB a stream."""


@triton.jit
def accept_tail_kernel(
    correct_in,  # int32 [bs]: the accept's, as broadcast
    bonus_in,  # int64 [bs]
    trim_in,  # int32 [bs]
    cand_ptr,
    cand_stride,
    correct_ptr,  # the outputs, as store_accept_tail's
    bonus_ptr,
    trim_ptr,
    seq_ptr,
    verify_ptr,
    gate_ptr,
    commit_ptr,
    new_seq_ptr,
    tokens_ptr,
    tokens_stride,
    gated_ptr,
    bs,
    n,
    BS_BLOCK: tl.constexpr,
    N_BLOCK: tl.constexpr,
    GATED: tl.constexpr,
):
    """The tail from given accept results, in one program (the second launch under a TP
    broadcast)."""
    req = tl.arange(0, BS_BLOCK)
    live = req < bs
    correct = tl.load(correct_in + req, mask=live, other=0)
    bonus = tl.load(bonus_in + req, mask=live, other=0)
    tl.store(correct_ptr + req, correct, mask=live)
    tl.store(bonus_ptr + req, bonus, mask=live)
    tl.store(trim_ptr + req, tl.load(trim_in + req, mask=live, other=0), mask=live)
    store_accept_tail(
        correct, bonus, cand_ptr, cand_stride, seq_ptr, verify_ptr, gate_ptr, commit_ptr,
        new_seq_ptr, tokens_ptr, tokens_stride, gated_ptr, bs, n, BS_BLOCK, N_BLOCK, GATED,
    )  # fmt: skip


def broadcast_epilogue(candidates, logits, seq_lens, verify_lens, gate, out, broadcast, admission):
    """Two launches around SGLang's broadcasts: the accept into the workspace, each of its three
    results broadcast in SGLang's order, then the tail (:func:`accept_tail_kernel`)."""
    bs, n = candidates.shape
    accepted = tuple(t[:bs] for t in BROADCAST_WORKSPACE.get(logits.device))
    accept_greedy(candidates, logits, out=accepted, admission=admission)
    for t in accepted:
        broadcast(t)
    tail = AcceptTail(seq_lens, verify_lens, gate, *out[3:])
    accept_tail_kernel[(1,)](
        *accepted,
        candidates,
        candidates.stride(0),
        *out[:3],
        *tail.triton_arguments(),
        bs,
        n,
        BS_BLOCK=triton.next_power_of_2(bs),
        N_BLOCK=max(2, triton.next_power_of_2(n)),
        GATED=out.gated is not None,
    )
    return out


def launch_cuda(candidates, logits, seq_lens, verify_lens, gate, out: EpilogueOuts, plan):
    slots, tickets = CLUSTER_WORKSPACE.get(logits.device)
    none = tickets[:0]
    gated = out.gated is not None
    cuda_module(logits.device).accept_greedy_epilogue_cuda(
        candidates,
        logits,
        seq_lens,
        verify_lens if gated else none,
        gate if gated else none,
        *out[:6],
        out.gated if gated else none,
        slots,
        tickets,
        *plan.cuda_shape(),
    )


def accept_greedy_epilogue(
    candidates: torch.Tensor,
    logits: torch.Tensor,
    seq_lens: torch.Tensor,
    verify_lens: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    *,
    out: EpilogueOuts,
    broadcast: Callable[[torch.Tensor], torch.Tensor] | None = None,
    admission: Admission | None = None,
) -> EpilogueOuts:
    """The static verify epilogue of ``bs`` requests into ``out``, returned.

    - ``candidates``: int32/int64 ``[bs, n]``, last-dim stride 1: each request's anchor, then
      its ``n - 1`` drafts.
    - ``logits``: ``[bs * n, V]`` fp32/bf16/fp16, last-dim stride 1: the verify logits.
    - ``seq_lens``: int32/int64 ``[bs]`` contiguous, the prefix lengths.
    - ``verify_lens`` (int32/int64 ``[bs]`` contiguous) and ``gate`` (int32 ``[1]``): the gated
      lengths' inputs, given exactly when ``out.gated`` is.
    - ``out``: :class:`EpilogueOuts`, written in place (never overlapping an input).
    - ``broadcast``: SGLang's accept-site TP broadcast (rank 0's values, in place), applied to
      the accept's ``correct_len`` (int32), ``bonus`` (int64) and ``cap_trim_lens`` (int32) in
      that order before the tail reads them: the epilogue is then two launches around it.
    - ``admission``: this call's :func:`accept_greedy_epilogue_admission`, when the caller
      already made it.
    """
    check_admission(admission)
    if admission is None or not admission:
        # An admitted admission has validated these very arguments (``out`` included).
        _validate(candidates, logits, seq_lens, verify_lens, gate, out)
    if admission is None:
        admission = plan_accept(candidates, logits, None)
    if not admission:
        return epilogue_torch(candidates, logits, seq_lens, verify_lens, gate, out, broadcast)
    if broadcast is not None:
        return broadcast_epilogue(candidates, logits, seq_lens, verify_lens, gate, out, broadcast,
                                  admission)  # fmt: skip
    plan = admission.plan
    if plan.cuda is not None:
        launch_cuda(candidates, logits, seq_lens, verify_lens, gate, out, plan)
        return out
    tail = AcceptTail(seq_lens, verify_lens, gate, *out[3:])
    launch_triton(candidates, logits, None, out[:3], plan.triton, tail)
    return out
