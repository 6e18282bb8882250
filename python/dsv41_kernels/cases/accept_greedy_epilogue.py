"""Check cases of
:func:`dsv41_kernels.ops.speculative.accept_greedy_epilogue.accept_greedy_epilogue`."""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches, verify_inputs
from dsv41_kernels.ops.speculative.accept_greedy_epilogue import (
    accept_greedy_epilogue,
    accept_greedy_epilogue_admission,
    epilogue_torch,
    new_outputs,
)
from dsv41_kernels.reference.accept_greedy_epilogue import accept_greedy_epilogue as reference

OPS = ("accept_greedy_epilogue",)
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    bs, n, vocab = (2, 3, 4099) if small else (1, 6, 129280)
    logits, candidates = verify_inputs(bs, n, vocab, device, seed=8)
    seq_lens = torch.arange(4096, 4096 + bs, device=device)
    verify_lens = torch.full((bs,), n, dtype=torch.int64, device=device)
    gate = torch.ones(1, dtype=torch.int32, device=device)
    inputs = (candidates, logits, seq_lens, verify_lens, gate)

    out, baseline_out = new_outputs(bs, n, device), new_outputs(bs, n, device)
    return [
        CheckCase(
            op="accept_greedy_epilogue",
            shape=f"bs {bs} x n {n} x {vocab} fp32, gated",
            admission=accept_greedy_epilogue_admission(*inputs, out=out),
            run=lambda: tuple(accept_greedy_epilogue(*inputs, out=out)),
            reference=lambda: tuple(t.to(device) for t in reference(*inputs)),
            mismatches=bit_mismatches,
            baseline=lambda: epilogue_torch(*inputs, baseline_out),
        )
    ]
