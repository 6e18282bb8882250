"""The vocabulary-parallel argmax and greedy accept, stated over the concatenated shards."""

from __future__ import annotations

import torch

from dsv41_kernels.reference.accept_greedy import accept_greedy


def concatenated(shards) -> torch.Tensor:
    """The full rows: every rank's shard in vocabulary order, on the CPU."""
    return torch.cat([shard.cpu() for shard in shards], dim=1)


def sharded_row_argmax(shards) -> torch.Tensor:
    """``torch.argmax`` of each full row (first NaN, else first maximum; -0 == +0)."""
    return torch.argmax(concatenated(shards), dim=-1)


def sharded_accept_greedy(candidates, shards, *, cutoff_verify_lens=None):
    """DSpark's greedy accept (:func:`dsv41_kernels.reference.accept_greedy.accept_greedy`)
    over the full rows."""
    return accept_greedy(candidates, concatenated(shards), cutoff_verify_lens=cutoff_verify_lens)
