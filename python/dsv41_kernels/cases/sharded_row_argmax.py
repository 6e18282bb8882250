"""Check cases of :mod:`dsv41_kernels.ops.speculative.sharded_row_argmax` and its accept form.

The ranks are emulated in one process: each shard's keys are made as its rank would make them
(:func:`shard_keys`), stacked as the all-gather would lay them out, and merged. The
collective itself is exercised by the tests (gloo on CPU, NCCL on several GPUs).
"""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches, verify_inputs
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy_torch
from dsv41_kernels.ops.speculative.sharded_accept_greedy import accept_from_keys
from dsv41_kernels.ops.speculative.sharded_row_argmax import (
    admit_keys,
    merge_keys,
    shard_keys,
)
from dsv41_kernels.reference.sharded_row_argmax import sharded_accept_greedy, sharded_row_argmax

OPS = ("sharded_row_argmax", "sharded_accept_greedy")


def even_widths(vocab: int, world: int) -> tuple[int, ...]:
    """The shard widths of a vocabulary-parallel ``lm_head`` without padding: equal shards,
    the remainder on the first ranks."""
    return tuple(vocab // world + (rank < vocab % world) for rank in range(world))


def shards(logits: torch.Tensor, widths) -> list[tuple[int, torch.Tensor]]:
    """``(vocab_start, column view)`` per rank for shards of ``widths`` (summing to the row)."""
    if sum(widths) != logits.shape[1]:
        raise ValueError(f"widths {widths} do not add up to {logits.shape[1]} columns")
    starts = [sum(widths[:rank]) for rank in range(len(widths))]
    return [(start, logits[:, start : start + w]) for start, w in zip(starts, widths)]


def gathered_keys(logits: torch.Tensor, widths) -> torch.Tensor:
    """Every rank's keys, ``[world, rows]``, as the all-gather lays them out."""
    return torch.stack([shard_keys(s, vocab_start=start) for start, s in shards(logits, widths)])


def emulated_argmax(logits: torch.Tensor, widths) -> torch.Tensor:
    """:func:`sharded_row_argmax` with its ranks emulated in one process."""
    return merge_keys(gathered_keys(logits, widths))


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    vocab = 9000 if small else 129280
    splits = (
        [(18, (2500, 6500)), (18, (1, 4095, 0, 4904))]
        if small
        else [(6, even_widths(vocab, 2)), (6, even_widths(vocab, 4)), (384, even_widths(vocab, 4))]
    )
    cases = []
    for rows, widths in splits:
        gen = torch.Generator(device="cpu").manual_seed(rows * len(widths))
        logits = torch.randn(rows, vocab, generator=gen).to(device)
        cut = widths[0]
        logits[0, cut - 1] = logits[0, cut] = float("nan")  # the first NaN, left of a boundary
        logits[-1, cut] = logits[-1, vocab - 1] = logits[-1].max() + 1  # a tie across shards
        parts = [s for _, s in shards(logits, widths)]
        cases.append(
            CheckCase(
                op="sharded_row_argmax",
                shape=f"[{rows}, {vocab}] fp32 in shards {'/'.join(map(str, widths))}",
                admission=admit_keys(logits, rows),
                run=lambda x=logits, w=widths: emulated_argmax(x, w),
                reference=lambda p=parts: sharded_row_argmax(p).to(device),
                mismatches=bit_mismatches,
                baseline=lambda x=logits: torch.argmax(x, dim=-1),
            )
        )
    bs, n = (3, 6) if small else (1, 6)
    widths = (2500, 6500) if small else even_widths(vocab, 4)
    logits, candidates = verify_inputs(bs, n, vocab, device, seed=19)
    parts = [s for _, s in shards(logits, widths)]
    cases.append(
        CheckCase(
            op="sharded_accept_greedy",
            shape=f"bs {bs} x n {n} x {vocab} fp32 in shards {'/'.join(map(str, widths))}",
            admission=admit_keys(logits, bs * n),
            run=lambda: accept_from_keys(candidates, gathered_keys(logits, widths)),
            reference=lambda: tuple(t.to(device) for t in sharded_accept_greedy(candidates, parts)),
            mismatches=bit_mismatches,
            baseline=lambda: accept_greedy_torch(candidates, logits),
        )
    )
    return cases
