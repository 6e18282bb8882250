"""Check cases of :func:`dsv41_kernels.ops.attention.decoding_sched_meta.decoding_sched_meta`, and
the baseline it replaces: the same schedule from a kernel with FlashMLA's structure."""

from __future__ import annotations

import dataclasses

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.attention.decoding_sched_meta import (
    FIXED_OVERHEAD_NUM_BLOCKS,
    MODULE,
    DecodingSchedConfig,
    decoding_sched_meta,
    decoding_sched_meta_admission,
    device_sched_config,
    kernel_arguments,
)
from dsv41_kernels.reference.decoding_sched_meta import decoding_sched_meta as reference_sched_meta

OPS = ("decoding_sched_meta",)
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""


def baseline_decoding_sched_meta(
    tile_scheduler_metadata: torch.Tensor,
    num_splits: torch.Tensor,
    config: DecodingSchedConfig,
    **lengths: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The schedule from a kernel with FlashMLA's structure (one warp, lane 0 walks and stores
    every record): what the block-parallel kernel replaces, and a second oracle. Takes the
    op's arguments; needs its kernel path (CUDA tensors, contiguous) and ``4 * (5 *
    batch_size + 1)`` bytes of shared memory. Raises ValueError otherwise."""
    admission = decoding_sched_meta_admission(
        tile_scheduler_metadata, num_splits, config, **lengths
    )
    if not admission:
        raise ValueError(f"baseline_decoding_sched_meta needs the kernel path: {admission.reason}")
    given = {name: t for name, t in lengths.items() if t is not None}
    module = load_module(MODULE, tile_scheduler_metadata.device.index)
    module.baseline_decoding_sched_meta(
        *kernel_arguments(tile_scheduler_metadata, num_splits, admission.plan.config, given)
    )
    return tile_scheduler_metadata, num_splits


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    on_gpu = device.type == "cuda"
    # (batch, s_q, topk, extra_topk); dense decode has topk -1.
    shapes = [
        (1, 1, 2048, 512),
        (1, 6, 2048, 512),
        (64, 1, 2048, 512),
        (8, 6, 512, 0),
        (4, 1, -1, 0),
    ]
    if small:
        shapes = [(1, 1, 2048, 512), (5, 6, 512, 0), (3, 1, -1, 0)]
    cases = []
    for b, s_q, topk, extra_topk in shapes:
        if on_gpu:
            parts, overhead = device_sched_config(device, s_q=s_q, h_q=64)
        else:
            parts, overhead = 132 // s_q, FIXED_OVERHEAD_NUM_BLOCKS
        gen = torch.Generator().manual_seed(b * 1000 + s_q)
        dense = topk == -1
        config = DecodingSchedConfig(
            topk=topk, extra_topk=0 if dense else extra_topk, fixed_overhead_num_blocks=overhead
        )
        if dense:
            lengths = {"seqlens_k": torch.randint(0, 9000, (b,), generator=gen, dtype=torch.int32)}
        else:
            lengths = {
                "topk_length": torch.randint(0, topk + 1, (b,), generator=gen, dtype=torch.int32)
            }
            if extra_topk:
                lengths["extra_topk_length"] = torch.randint(
                    0, extra_topk + 1, (b,), generator=gen, dtype=torch.int32
                )
        on_device = {name: t.to(device) for name, t in lengths.items()}

        def buffers(b=b, parts=parts):
            return (
                torch.full((parts, 8), -7, dtype=torch.int32, device=device),
                torch.full((b + 1,), -7, dtype=torch.int32, device=device),
            )

        ours, before = buffers(), buffers()
        mode = "dense" if dense else f"topk {topk}" + (f"+{extra_topk}" if extra_topk else "")
        cases.append(
            CheckCase(
                op="decoding_sched_meta",
                shape=f"b={b} s_q={s_q} parts={parts} {mode}",
                admission=decoding_sched_meta_admission(*ours, config, **on_device),
                run=lambda out=ours, c=config, kw=on_device: decoding_sched_meta(*out, c, **kw),
                reference=lambda b=b, parts=parts, c=config, kw=lengths: tuple(
                    t.to(device)
                    for t in reference_sched_meta(
                        batch_size=b, num_sm_parts=parts, **dataclasses.asdict(c), **kw
                    )
                ),
                mismatches=bit_mismatches,
                baseline=(
                    (
                        lambda out=before, c=config, kw=on_device: baseline_decoding_sched_meta(
                            *out, c, **kw
                        )
                    )
                    if on_gpu
                    else None
                ),
            )
        )
    return cases
