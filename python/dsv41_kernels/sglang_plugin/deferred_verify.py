"""The verify shards of deferred logits gathers (:mod:`.sharded_accept_greedy`), and the accept
on them.

Kept apart from :mod:`.sharded_accept_greedy`, which imports SGLang's verify path, so that the
``accept_greedy`` call site (:mod:`.accept_greedy`) can recognise a shard without depending on
it.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import torch

from dsv41_kernels.admission import Admission
from dsv41_kernels.ops.speculative.sharded_accept_greedy import (
    sharded_accept_greedy,
    sharded_accept_greedy_admission,
)
from dsv41_kernels.sglang_plugin import dispatch


@dataclass
class DeferredVerify:
    """The target's ``LogitsProcessor`` whose verify gather is deferred, and its TP group."""

    processor: object  # SGLang's LogitsProcessor
    group: torch.distributed.ProcessGroup  # the TP group's device_group (NCCL)
    rank: int  # this process's rank in the TP group
    shard_width: int | None = None  # the lm_head's columns per rank, seen at the first skip
    shard_dtype: torch.dtype | None = None  # the lm_head output's dtype, before SGLang's cast

    def holds(self, logits) -> bool:
        """``logits`` is this processor's verify shard (the test SGLang's ``is_deferred_shard``
        makes: narrower than the vocabulary, at the shard's width)."""
        return (
            isinstance(logits, torch.Tensor)
            and logits.dim() == 2
            and logits.shape[1] == self.shard_width
            and self.shard_width < self.processor.vocab_size
        )

    @property
    def vocab_start(self) -> int:
        return self.rank * self.shard_width

    def own_columns(self, shard: torch.Tensor) -> torch.Tensor:
        """The shard's columns inside the vocabulary: a vocabulary-parallel lm_head pads only
        after the last real row, so rank r holds ``[r * width, (r + 1) * width)`` (the layout
        ``deferred_argmax`` in logits_processor.py assumes too)."""
        vocab = self.processor.vocab_size
        return shard[:, : max(0, min(self.shard_width, vocab - self.vocab_start))]

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The full fp32 logits SGLang's ``_get_logits`` returns, from the shard: SGLang's own
        gatherer and cast, on the shard in the lm_head's own dtype (fp32 holds it exactly)."""
        full = self.processor._logits_gatherer(shard.to(self.shard_dtype))
        return self.processor._copy_logits_to_buffer(full, None, use_buffer=False)


_armed: dict[int, DeferredVerify] = {}  # id(processor) -> its deferral, one per target model
in_deferred_forward: contextvars.ContextVar[DeferredVerify | None] = contextvars.ContextVar(
    "dsv41_kernels_in_deferred_forward", default=None
)
"""The deferral whose verify forward is running (set around ``_get_logits``)."""


def arm(deferred: DeferredVerify) -> None:
    _armed[id(deferred.processor)] = deferred


def deferral_of(processor) -> DeferredVerify | None:
    return _armed.get(id(processor))


def deferred_shard(logits) -> DeferredVerify | None:
    """The deferral ``logits`` is the verify shard of, if any."""
    for deferred in _armed.values():
        if deferred.holds(logits):
            return deferred
    return None


def accept_on_shard(deferred: DeferredVerify, original, kwargs, refusal: Admission | None):
    """SGLang's greedy accept called on the verify shard: ours over every rank's keys, or,
    where ours cannot take the arguments (``refusal``, decided alike on every rank), SGLang's
    accept of the gathered logits (what it would have run without the deferral). An error of
    ours is raised, not fallen back from (``replicated``)."""
    shard = kwargs["target_logits"]
    local = deferred.own_columns(shard)
    arguments = dict(
        vocab_start=deferred.vocab_start,
        group=deferred.group,
        cutoff_verify_lens=kwargs.get("cutoff_verify_lens"),
    )
    if refusal is None:  # a refusal is falsy: test for None, never for truth
        refusal = sharded_accept_greedy_admission(kwargs["candidates"], local, **arguments)
    admission = refusal
    return dispatch.run(
        "sharded_accept_greedy.accept",
        admission,
        lambda: sharded_accept_greedy(
            kwargs["candidates"], local, **arguments, admission=admission
        ),
        lambda: original(**{**kwargs, "target_logits": deferred.gather(shard)}),
        # A rank falling back alone would gather logits while the others gather keys: the
        # collectives would not match, so an error of ours is raised on every rank instead.
        replicated=True,
    )
