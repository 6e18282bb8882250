"""Shards, planted logits and accept cases shared by the sharded_row_argmax tests."""

from __future__ import annotations

import random

import torch

from .logit_cases import NAN, boundary_rows, random_logits, special_rows


def cuts(widths) -> list[int]:
    """The shard boundaries inside the row: the first column of every later non-empty shard."""
    starts = [sum(widths[:rank]) for rank in range(1, len(widths))]
    return sorted({c for c in starts if 0 < c < sum(widths)})


def planted_logits(rows: int, widths, gen) -> torch.Tensor:
    """Random rows (ties, NaN, +-Inf sprinkled), then the special rows and the values that
    decide an argmax placed on both sides of every shard boundary."""
    vocab = sum(widths)
    planted = special_rows(vocab) + boundary_rows(vocab, cuts(widths), gen)
    return torch.cat([random_logits(rows, vocab, gen), torch.stack(planted)])


def random_widths(vocab: int, world: int, rng: random.Random) -> tuple[int, ...]:
    """``world`` shard widths adding up to ``vocab``, uneven, some possibly empty."""
    marks = sorted(rng.randint(0, vocab) for _ in range(world - 1))
    edges = [0, *marks, vocab]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def accept_case(bs: int, n: int, widths, gen):
    """Candidates following the argmax for a random prefix, then diverging, and a cutoff."""
    logits = random_logits(bs * n, sum(widths), gen)
    logits[:, cuts(widths)] = NAN  # every row's first NaN sits at a boundary
    predict = torch.argmax(logits, dim=-1).view(bs, n)
    candidates = torch.randint(0, sum(widths), (bs, n), generator=gen)
    for b in range(bs):
        keep = int(torch.randint(0, n, (1,), generator=gen))
        candidates[b, 1 : keep + 1] = predict[b, :keep]
    cutoff = torch.randint(1, n + 2, (bs,), generator=gen, dtype=torch.int32)
    return candidates, logits, cutoff


def assert_accept_equal(ours, ref):
    for o, r, dtype in zip(ours, ref, (torch.int32, torch.int64, torch.int32), strict=True):
        assert o.dtype == dtype and torch.equal(o.cpu(), r.cpu()), (ours, ref)
