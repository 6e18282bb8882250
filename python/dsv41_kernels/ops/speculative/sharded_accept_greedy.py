"""DSpark's greedy accept over vocabulary-parallel verify logits, without gathering them.

The accept needs only each verify row's argmax, so at tensor parallelism each rank reduces its
vocabulary slice to one key per row and the keys are all-gathered
(:mod:`.sharded_row_argmax`); one small launch then takes the max over ranks and applies the
accept rule. Every rank computes the same result, so no broadcast of rank 0's accept is needed
for it.

Contract: bitwise :func:`.accept_greedy.accept_greedy` of ``candidates`` and the concatenated
logits (SGLang 0.5.23 ``dspark_accept.accept_greedy``'s rule over ``torch.argmax``, NaN
included): ``correct_len[b]`` counts the leading ``k`` with ``candidates[b, k + 1] ==
predict[b, k]``; with ``cutoff_verify_lens`` it is capped at ``verify_lens - 1``,
``cap_trim_lens`` is what the cap removed and the bonus ``predict[b, correct_len[b]]`` is read
at the capped index (a negative one wraps, as Python indexing does); out-of-range verify
lengths as :data:`.accept_greedy.VERIFY_LENS_RULE` says. The rule is the one-GPU accept's
(:func:`.accept_greedy.apply_accept_rule` and its torch twin). Outputs: int32, int64, int32,
each ``[bs]``. Concurrency, graph capture and scratch as in :mod:`.sharded_row_argmax`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import Admission, check_admission, invalid
from dsv41_kernels.interpreter import serialized
from dsv41_kernels.ops.speculative.accept_greedy import (
    accept_from_predictions_torch,
    apply_accept_rule,
    new_outputs,
    refuse_accept_layout,
    validate_accept_arguments,
)
from dsv41_kernels.ops.speculative.argmax_reduction import decode_index
from dsv41_kernels.ops.speculative.sharded_row_argmax import (
    admit_keys,
    decode_keys_torch,
    gather_keys,
    validate_gathered,
    validate_group,
    validate_shard,
    validate_vocab,
)


def _validate(candidates, local_logits, vocab_start, group, cutoff_verify_lens, out):
    """``(vocab_start, world)``, validated."""
    vocab_start = validate_shard(local_logits, vocab_start)
    world = validate_group(group)
    validate_vocab(local_logits, world)
    rows, device = local_logits.shape[0], local_logits.device
    validate_accept_arguments(candidates, rows, cutoff_verify_lens, out, device, "local_logits")
    return vocab_start, world


def _plan(candidates, device_tensor: torch.Tensor, cutoff_verify_lens, shard=None) -> Admission:
    """The kernels' admission; ``device_tensor`` (the logits or the gathered keys) gives the
    device, ``shard`` (the logits, or None) is planned for its own argmax."""
    bs, n = candidates.shape
    keys = admit_keys(device_tensor, bs * n, shard)
    if not keys:
        return keys
    refusal = refuse_accept_layout(candidates, device_tensor.device, cutoff_verify_lens)
    return keys if refusal is None else refusal


def sharded_accept_greedy_admission(
    candidates: torch.Tensor,
    local_logits: torch.Tensor,
    *,
    vocab_start: int,
    group,
    cutoff_verify_lens: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> Admission:
    """Whether the Triton key and accept kernels run; pure (shapes, dtypes, strides, devices),
    never raises."""
    try:
        _validate(candidates, local_logits, vocab_start, group, cutoff_verify_lens, out)
    except (TypeError, ValueError) as e:
        return invalid(e)
    return _plan(candidates, local_logits, cutoff_verify_lens, local_logits)


@triton.jit
def accept_from_keys_kernel(
    gathered_ptr,  # int64 [world, bs * n]: every rank's keys
    world,
    cand_ptr,  # candidates [bs, n]
    cand_stride,
    cutoff_ptr,  # verify lens [bs] (HAS_CUTOFF)
    correct_ptr,  # int32 [bs]
    bonus_ptr,  # int64 [bs]
    trim_ptr,  # int32 [bs]
    bs,
    n,
    BS_BLOCK: tl.constexpr,
    N_BLOCK: tl.constexpr,
    HAS_CUTOFF: tl.constexpr,
):
    """predict = the largest key over ranks, decoded; then the accept rule, in one program."""
    b = tl.arange(0, BS_BLOCK)[:, None]
    k = tl.arange(0, N_BLOCK)[None, :]
    rows = bs * n
    here = (b < bs) & (k < n)
    best = tl.full([BS_BLOCK, N_BLOCK], -(2**63), tl.int64)
    for rank in range(world):
        keys = tl.load(gathered_ptr + rank * rows + b * n + k, mask=here, other=-(2**63))
        best = tl.maximum(best, keys)
    apply_accept_rule(
        decode_index(best), cand_ptr, cand_stride, cutoff_ptr, correct_ptr, bonus_ptr, trim_ptr,
        bs, n, BS_BLOCK, N_BLOCK, HAS_CUTOFF,
    )  # fmt: skip


def accept_from_keys_into(candidates, gathered, cutoff_verify_lens, out, admission: Admission):
    """The accept from every rank's keys ``gathered`` (int64 ``[world, bs * n]``) into ``out``
    (None: fresh tensors)."""
    bs, n = candidates.shape
    if not admission:
        predict = decode_keys_torch(gathered.amax(dim=0)).view(bs, n)
        return accept_from_predictions_torch(candidates, predict, cutoff_verify_lens, out)
    correct, bonus, trim = out = new_outputs(bs, gathered.device, out)
    has_cutoff = cutoff_verify_lens is not None
    with serialized():
        accept_from_keys_kernel[(1,)](
            gathered,
            gathered.shape[0],
            candidates,
            candidates.stride(0),
            cutoff_verify_lens if has_cutoff else correct,  # never read without a cutoff
            correct,
            bonus,
            trim,
            bs,
            n,
            BS_BLOCK=triton.next_power_of_2(bs),
            N_BLOCK=max(2, triton.next_power_of_2(n)),
            HAS_CUTOFF=has_cutoff,
        )
    return tuple(out)


def accept_from_keys(
    candidates: torch.Tensor,
    gathered_keys: torch.Tensor,
    *,
    cutoff_verify_lens: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The accept from every rank's :func:`.sharded_row_argmax.shard_keys`, ``gathered_keys``
    (int64 ``[world, bs * n]``, contiguous): the second half of :func:`sharded_accept_greedy`,
    for callers that gather the keys themselves."""
    check_admission(admission)
    validate_gathered(gathered_keys)
    rows, device = gathered_keys.shape[1], gathered_keys.device
    validate_accept_arguments(candidates, rows, cutoff_verify_lens, out, device, "gathered_keys")
    if admission is None:
        admission = _plan(candidates, gathered_keys, cutoff_verify_lens)
    if candidates.shape[0] == 0:
        return new_outputs(0, device, out)
    return accept_from_keys_into(candidates, gathered_keys, cutoff_verify_lens, out, admission)


def sharded_accept_greedy(
    candidates: torch.Tensor,
    local_logits: torch.Tensor,
    *,
    vocab_start: int,
    group,
    cutoff_verify_lens: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(correct_len, bonus, cap_trim_lens)`` for ``candidates [bs, n]`` and this rank's
    columns ``vocab_start .. vocab_start + w - 1`` of the verify logits, ``local_logits
    [bs * n, w]``; the same on every rank of ``group`` (a ``torch.distributed`` ProcessGroup).

    ``cutoff_verify_lens`` (int ``[bs]``, optional) caps the accepted length per request
    (SGLang's are ``1..n``; any other value as :data:`.accept_greedy.VERIFY_LENS_RULE` says).
    ``out``, a preallocated ``(int32 [bs], int64 [bs], int32 [bs])``, is written in place.
    ``admission``: this call's :func:`sharded_accept_greedy_admission`, when the caller already
    made it.
    """
    check_admission(admission)
    vocab_start, world = _validate(
        candidates, local_logits, vocab_start, group, cutoff_verify_lens, out
    )
    if admission is None:
        admission = _plan(candidates, local_logits, cutoff_verify_lens, local_logits)
    if candidates.shape[0] == 0:
        return new_outputs(0, local_logits.device, out)
    with gather_keys(local_logits, vocab_start, group, world, admission) as gathered:
        return accept_from_keys_into(candidates, gathered, cutoff_verify_lens, out, admission)
