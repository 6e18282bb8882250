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
"""

from __future__ import annotations

from typing import NamedTuple

import torch

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
    accept_greedy_torch,
    check_on,
    launch_triton,
    plan_accept,
    validate_accept_arguments,
)
from dsv41_kernels.ops.speculative.argmax_plan import CUDA_KERNEL_IDS, cuda_module, validate_logits


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


def epilogue_torch(candidates, logits, seq_lens, verify_lens, gate, out: EpilogueOuts):
    """The contract in torch ops, into ``out``: the fallback."""
    correct, bonus, _ = accept_greedy_torch(candidates, logits)
    n = candidates.shape[1]
    commit = correct + 1
    k = torch.arange(n, device=candidates.device)
    drafts = torch.zeros_like(out.out_tokens)
    drafts[:, : n - 1] = candidates[:, 1:]
    tokens = torch.where(k == correct[:, None].to(torch.int64), bonus[:, None], drafts)
    results = [correct, bonus, torch.zeros_like(correct), commit, seq_lens + commit, tokens]
    if out.gated is not None:
        results.append(torch.minimum(commit, verify_lens.to(torch.int32)) * gate)
    for dst, src in zip(out, results):
        dst.copy_(src)
    return out


def launch_cuda(candidates, logits, seq_lens, verify_lens, gate, out: EpilogueOuts, plan):
    slots, tickets = CLUSTER_WORKSPACE.get(logits.device)
    none = tickets[:0]
    c = plan.cuda
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
        CUDA_KERNEL_IDS[plan.kernel],
        c.threads,
        c.vectors,
        c.cluster,
        c.early_start,
    )


def accept_greedy_epilogue(
    candidates: torch.Tensor,
    logits: torch.Tensor,
    seq_lens: torch.Tensor,
    verify_lens: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    *,
    out: EpilogueOuts,
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
        return epilogue_torch(candidates, logits, seq_lens, verify_lens, gate, out)
    plan = admission.plan
    if plan.cuda is not None:
        launch_cuda(candidates, logits, seq_lens, verify_lens, gate, out, plan)
        return out
    tail = AcceptTail(seq_lens, verify_lens, gate, *out[3:])
    launch_triton(candidates, logits, None, out[:3], plan.triton, tail)
    return out
