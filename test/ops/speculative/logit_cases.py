"""Logits with the values that decide an argmax: ties, NaN anywhere, +-Inf, signed zeros."""

from __future__ import annotations

import torch

NAN, INF = float("nan"), float("inf")


def special_rows(vocab: int) -> list[torch.Tensor]:
    """One row per special case, each on top of random data (never zeros alone)."""
    gen = torch.Generator().manual_seed(vocab)
    rows = []

    def base():
        return torch.randn(vocab, generator=gen)

    for pos in (0, vocab // 2, vocab - 1):  # NaN first, middle, last
        r = base()
        r[pos] = NAN
        rows.append(r)
    r = base()
    r[[5, vocab // 3, vocab - 2]] = NAN  # several NaN: the first wins
    rows.append(r)
    r = base()
    r[vocab - 1] = NAN
    r[3] = INF  # +Inf does not beat a NaN
    rows.append(r)
    r = base()
    r[[7, vocab - 7]] = INF  # tied +Inf
    rows.append(r)
    rows.append(torch.full((vocab,), -INF))  # all -Inf: index 0
    r = torch.full((vocab,), -INF)
    r[vocab - 3] = -1e30
    rows.append(r)
    r = torch.zeros(vocab)
    r[: vocab // 2] = -0.0  # -0 == +0: the first zero
    rows.append(r)
    r = -torch.rand(vocab, generator=gen)
    r[vocab // 5] = r[vocab // 4] = 0.0
    r[vocab // 6] = -0.0  # -0 ties +0 and comes first
    rows.append(r)
    r = base()
    top = r.max() + 1
    r[[11, vocab // 2, vocab - 1]] = top  # a three-way tie
    rows.append(r)
    r = torch.full((vocab,), 2.5)  # all equal
    rows.append(r)
    return rows


def random_logits(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Random rows, each with a planted tie, and NaN/+-Inf sprinkled into some rows."""
    x = torch.randn(rows, vocab, generator=gen) * 4
    for r in range(rows):
        kind = int(torch.randint(0, 6, (1,), generator=gen))
        pos = torch.randint(0, vocab, (3,), generator=gen)
        if kind == 0:
            x[r, pos] = NAN
        elif kind == 1:
            x[r, pos[:2]] = INF
            x[r, pos[2]] = -INF
        elif kind == 2:
            x[r, pos] = x[r].max()  # tie with the existing maximum
        elif kind == 3:
            x[r] = x[r].round()  # many ties
        elif kind == 4:
            x[r, pos[0]] = -INF
    return x


def boundary_rows(vocab: int, cuts, gen: torch.Generator) -> list[torch.Tensor]:
    """For every shard boundary ``c`` in ``cuts`` (the first column of a later shard), rows
    whose deciding values sit at ``c - 1`` and ``c``: on both sides of the boundary, or on one
    side with a rival in the other shard."""
    rows = []

    def base():
        return torch.randn(vocab, generator=gen)

    for c in cuts:
        r = base()
        r[[c - 1, c]] = NAN  # NaN on both sides: the left one is first
        rows.append(r)
        r = base()
        r[c - 1] = INF
        r[[c, vocab - 1]] = NAN  # +Inf left, NaN right: the NaN wins
        rows.append(r)
        r = base()
        r[c] = NAN
        r[0] = INF  # a NaN in a later shard beats +Inf in the first
        rows.append(r)
        r = base()
        r[[c - 1, c]] = r.max() + 1  # a tie across the boundary: the left one
        rows.append(r)
        r = base()
        r[[c, vocab - 1]] = r.max() + 1  # a tie starting right of the boundary
        rows.append(r)
        r = base()
        r[[c - 1, c]] = INF  # tied +Inf across the boundary
        rows.append(r)
        r = -torch.rand(vocab, generator=gen) - 1
        r[c - 1], r[c] = -0.0, 0.0  # -0 left ties +0 right
        rows.append(r)
        r = -torch.rand(vocab, generator=gen) - 1
        r[c - 1], r[c] = 0.0, -0.0  # +0 left ties -0 right
        rows.append(r)
        r = torch.full((vocab,), -INF)
        r[c] = -1e30  # -Inf up to the boundary, the only finite value right of it
        rows.append(r)
        r = torch.full((vocab,), -INF)
        r[c - 1] = r[c] = NAN  # -Inf everywhere else
        rows.append(r)
    rows.append(torch.full((vocab,), -INF))  # all -Inf: index 0
    rows.append(torch.full((vocab,), 1.5))  # all equal: index 0
    return rows
