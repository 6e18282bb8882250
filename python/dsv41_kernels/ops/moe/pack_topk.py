"""FlashInfer's routed-MoE id form, ``(id << 16) | bf16_bits(weight)``, in one Triton launch.

The MXFP4 MoE runner takes the routing as packed ids. :func:`moe_fused_gate` writes them from
the values it already holds (its ``packed_out``); :func:`pack_topk` is the separate launch that
saves, for routings made elsewhere. Both pack with :func:`packed_ids`, so both give the bits of
:func:`dsv41_kernels.reference.pack_topk` (bf16 rounded to nearest even on the integer bits,
every NaN weight 0x7FC0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_tensor,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.interpreter import serialized
from dsv41_kernels.reference.moe_fused_gate import pack_topk as pack_topk_reference

TRITON = "triton"
"""The kernel an admission names (the only one)."""
INDEX_DTYPES = (torch.int32, torch.int64)
"""Expert id dtypes the ops take (the router's ``input_ids`` too)."""
BLOCK = 1024
"""Words a program: a decode batch's ``[T, top_k]`` in one program, 8 a thread of 4 warps."""


@dataclass(frozen=True)
class PackTopkPlan:
    """The launch :func:`pack_topk` runs: ``programs`` programs of ``block`` words each."""

    programs: int
    block: int = BLOCK


@triton.jit
def packed_ids(ids, weights):
    """``(id << 16) | bf16_bits(weight)``, bf16 rounded to nearest even on the integer bits."""
    bits = weights.to(tl.int32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    bf16 = tl.where(weights != weights, 0x7FC0, rounded)
    return (ids << 16) | bf16


@triton.jit
def _pack_topk_kernel(ids_ptr, weights_ptr, packed_ptr, numel, BLOCK: tl.constexpr):
    """Contiguous int32 ``ids`` and fp32 ``weights`` of ``numel`` words into ``packed``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < numel
    ids = tl.load(ids_ptr + offs, mask=inside)
    weights = tl.load(weights_ptr + offs, mask=inside)
    tl.store(packed_ptr + offs, packed_ids(ids, weights), mask=inside)


def _validate(ids, weights) -> None:
    """Raise ValueError naming the argument."""
    check_tensor("ids", ids, dtypes=INDEX_DTYPES, ndim=2)
    check_tensor("weights", weights, ndim=2)
    if not weights.dtype.is_floating_point:
        raise ValueError(f"weights must be floating point, got {weights.dtype}")
    if weights.shape != ids.shape:
        raise ValueError(f"weights shape {tuple(weights.shape)} != ids shape {tuple(ids.shape)}")
    if weights.device != ids.device:
        raise ValueError(f"weights must be on ids' device {ids.device}, got {weights.device}")


def _plan(ids: torch.Tensor, weights: torch.Tensor) -> Admission:
    """The Triton launch, or the refusal (arguments already validated)."""
    device = triton_device(ids)
    if not device:
        return device
    if ids.dtype != torch.int32 or weights.dtype != torch.float32:
        return refuse("the kernel packs int32 ids and fp32 weights")
    if not (ids.is_contiguous() and weights.is_contiguous()):
        return refuse("ids or weights not contiguous")
    plan = PackTopkPlan(programs=triton.cdiv(ids.numel(), BLOCK))
    return admit(TRITON, device.reason, plan=plan)


def pack_topk_admission(ids: torch.Tensor, weights: torch.Tensor) -> Admission:
    """Whether :func:`pack_topk` takes its Triton launch; pure (dtypes, layouts, devices)."""
    try:
        _validate(ids, weights)
    except ValueError as e:
        return invalid(e)
    return _plan(ids, weights)


def pack_topk(
    ids: torch.Tensor, weights: torch.Tensor, *, admission: Admission | None = None
) -> torch.Tensor:
    """``(id << 16) | bf16_bits(weight)`` as int32 ``[T, k]`` (bf16 rounded to nearest even).

    Args:
        ids: ``[T, k]`` int32/int64 expert ids.
        weights: ``[T, k]`` floating-point routing weights.
        admission: this call's :func:`pack_topk_admission`, when the caller already made it.

    One Triton launch for contiguous int32 ids and fp32 weights on a Triton device, the torch
    statement otherwise; both give the same bits (every NaN weight packs as 0x7FC0).
    """
    check_admission(admission)
    _validate(ids, weights)
    if admission is None:
        admission = _plan(ids, weights)
    if not admission:
        return pack_topk_reference(ids, weights)
    plan: PackTopkPlan = admission.plan
    packed = torch.empty_like(ids)
    if plan.programs:
        with serialized():
            _pack_topk_kernel[(plan.programs,)](ids, weights, packed, ids.numel(), BLOCK=plan.block)
    return packed
