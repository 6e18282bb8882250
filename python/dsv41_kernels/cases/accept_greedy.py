"""Check cases of :func:`dsv41_kernels.ops.speculative.accept_greedy.accept_greedy`."""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches, verify_inputs
from dsv41_kernels.ops.speculative.accept_greedy import (
    accept_greedy,
    accept_greedy_admission,
    accept_greedy_torch,
)
from dsv41_kernels.reference.accept_greedy import accept_greedy as reference

OPS = ("accept_greedy",)
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    bs, n, vocab = (2, 3, 4099) if small else (1, 6, 129280)
    logits, candidates = verify_inputs(bs, n, vocab, device, seed=7)
    cutoff = torch.full((bs,), max(1, n - 2), dtype=torch.int32, device=device)
    cases = []
    for label, cut in (("", None), (" cutoff", cutoff)):
        cases.append(
            CheckCase(
                op="accept_greedy",
                shape=f"bs {bs} x n {n} x {vocab} fp32{label}",
                admission=accept_greedy_admission(candidates, logits, cut),
                run=lambda c=cut: accept_greedy(candidates, logits, cutoff_verify_lens=c),
                reference=lambda c=cut: tuple(
                    t.to(device) for t in reference(candidates, logits, cutoff_verify_lens=c)
                ),
                mismatches=bit_mismatches,
                baseline=lambda c=cut: accept_greedy_torch(candidates, logits, c),
            )
        )
    return cases
