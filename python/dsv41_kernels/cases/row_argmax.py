"""Check cases of :func:`dsv41_kernels.ops.speculative.row_argmax.row_argmax`."""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission

OPS = ("row_argmax",)
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    shapes = [(6, 5003), (2, 8192 + 17)] if small else [(1, 129280), (6, 129280), (64, 129280)]
    cases = []
    for rows, vocab in shapes:
        gen = torch.Generator(device="cpu").manual_seed(rows * vocab)
        logits = torch.randn(rows, vocab, generator=gen).to(device)
        logits[0, vocab // 3] = float("nan")  # torch picks the first NaN
        logits[-1, vocab // 2] = logits[-1, vocab - 1] = logits[-1].max() + 1  # a tie
        cases.append(
            CheckCase(
                op="row_argmax",
                shape=f"[{rows}, {vocab}] fp32",
                admission=row_argmax_admission(logits),
                run=lambda x=logits: row_argmax(x),
                reference=lambda x=logits: torch.argmax(x, dim=-1),
                mismatches=bit_mismatches,
                baseline=lambda x=logits: torch.argmax(x, dim=-1),
            )
        )
    return cases
