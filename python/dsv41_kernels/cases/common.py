"""The check case type and the bitwise comparison every exact op is held to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dsv41_kernels.admission import Admission


@dataclass
class CheckCase:
    op: str
    shape: str
    admission: Admission
    run: Callable[[], Any]
    reference: Callable[[], Any]
    mismatches: Callable[[Any, Any], int]
    """Elements of ours that differ from the reference (bits, or past the op's stated tolerance)."""
    baseline: Callable[[], Any] | None = None
    """What the op replaces (torch or upstream), timed beside ours on a GPU."""


def bit_mismatches(ours: Any, ref: Any) -> int:
    """Elements whose raw bits differ (NaN payloads included); tuples are summed per element."""
    if isinstance(ours, (tuple, list)):
        if len(ours) != len(ref):
            raise ValueError(f"ours has {len(ours)} outputs, the reference {len(ref)}")
        return sum(bit_mismatches(a, b) for a, b in zip(ours, ref))
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return max(ours.numel(), ref.numel(), 1)
    if ours.dtype.is_floating_point:
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[ours.element_size()]
        ours, ref = ours.view(view), ref.view(view)
    return int((ours != ref).sum().item())


def verify_inputs(bs: int, n: int, vocab: int, device, seed: int):
    """Greedy-verify check inputs: random ``[bs * n, vocab]`` fp32 logits and ``[bs, n]``
    candidates whose drafts follow their argmax, one request rejecting at ``n // 2``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(bs * n, vocab, generator=gen).to(device)
    predict = torch.argmax(logits, dim=-1).view(bs, n)
    candidates = torch.zeros(bs, n, dtype=torch.int64, device=device)
    candidates[:, 1:] = predict[:, :-1]  # accept everything, then reject one position
    candidates[-1, n // 2] += 1
    return logits, candidates
