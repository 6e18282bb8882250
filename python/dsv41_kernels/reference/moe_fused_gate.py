"""DeepSeek-V4.1's vision-aware MoE routing and the packed id form, stated in torch.

SGLang 0.5.23 routes every MoE layer of a V4.1 checkpoint with a vision tower through
``vl_routing.vision_topk``; this is that rule, with its two orderings made explicit:

- **Ties:** among equal biased scores the lowest expert id is chosen first.
- **NaN:** a NaN biased score ranks above every number, +inf included (as ``torch.topk``
  and ``torch.sort`` rank it, and as upstream's V4.1 router does); NaNs among themselves go
  by the lowest expert id. ``-0.0`` and ``+0.0`` are equal.

Every step runs in fp32 with torch's own elementwise ops (IEEE division, no fused multiply-add),
so on a GPU the scores are the ones the upstream torch path computes. The routed sum is added
left to right in selection order, a stated order the kernel repeats.
"""

from __future__ import annotations

import torch

SOFTPLUS_THRESHOLD = 20.0
"""Above this, softplus(x) is x in fp32 (torch's ``F.softplus`` default)."""

_EXPERT_ID_BITS = 16
"""Rank keys and packed ids both keep the expert id in 16 bits."""


def sqrt_softplus(logits: torch.Tensor) -> torch.Tensor:
    """``sqrt(softplus(x))`` in fp32, softplus through ``log1p`` (V4.1) and identity above 20."""
    x = logits.float()
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))
    return torch.sqrt(softplus)


def rank_keys(biased: torch.Tensor) -> torch.Tensor:
    """int64 keys, distinct within a row, whose descending order is the selection order.

    The fp32 bits become an integer that grows with the value (sign-magnitude to two's
    complement, so -0.0 meets +0.0), every NaN becomes the largest such integer, and the low
    16 bits hold ``65535 - expert``, so equal scores rank the lowest expert id first.
    """
    bits = biased.contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    ordered = torch.where(torch.isnan(biased), 0x7FFFFFFF, ordered)
    experts = torch.arange(biased.shape[-1], device=biased.device, dtype=torch.int64)
    id_mask = (1 << _EXPERT_ID_BITS) - 1
    return ordered * (1 << _EXPERT_ID_BITS) + (id_mask - experts)


def vision_topk(
    logits: torch.Tensor,
    bias: torch.Tensor,
    bias_alt: torch.Tensor | None,
    input_ids: torch.Tensor | None,
    *,
    image_token_id: int | None,
    top_k: int,
    renormalize: bool = True,
    renormalize_eps: float = 1e-20,
    routed_scaling_factor: float = 1.0,
    scale_on_output: bool = False,
    num_shared_slots: int = 0,
    num_token_non_padded: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route ``T`` tokens over ``E`` experts: ``(topk_weights fp32, topk_ids int32)``, [T, top_k].

    ``logits [T, E]`` are the gate's raw outputs; ``bias``/``bias_alt [E]`` the score-correction
    biases, ``bias_alt`` taken by tokens whose ``input_ids`` equal ``image_token_id`` (none when
    ``bias_alt`` is None). ``top_k`` counts every slot: the first ``top_k - num_shared_slots``
    are routed experts in selection order, the last ``num_shared_slots`` are the fused shared
    experts ``E .. E + n - 1``, weighted ``routed_sum / routed_scaling_factor``. Then, when
    ``renormalize``, every weight is divided by ``routed_sum + renormalize_eps``, and when
    ``scale_on_output`` multiplied by ``routed_scaling_factor``. Rows at or past
    ``num_token_non_padded`` get weight 0 and id -1 in every slot.
    """
    num_tokens, num_experts = logits.shape
    routed = top_k - num_shared_slots
    scores = sqrt_softplus(logits)
    bias_row = bias.float().expand(num_tokens, num_experts)
    if bias_alt is not None:
        is_image = (input_ids == image_token_id)[:, None]
        bias_row = torch.where(is_image, bias_alt.float(), bias_row)
    biased = scores + bias_row

    ids = torch.topk(rank_keys(biased), routed, dim=-1).indices  # keys are distinct: no ties
    weights = scores.gather(-1, ids)
    routed_sum = torch.zeros(num_tokens, 1, dtype=torch.float32, device=logits.device)
    for slot in range(routed):
        routed_sum = routed_sum + weights[:, slot : slot + 1]

    if num_shared_slots:
        shared_ids = num_experts + torch.arange(num_shared_slots, device=logits.device)
        ids = torch.cat([ids, shared_ids.expand(num_tokens, -1)], dim=-1)
        # A true division: torch on CUDA multiplies by the reciprocal of a Python scalar divisor.
        scaling = torch.full((), routed_scaling_factor, dtype=torch.float32, device=logits.device)
        shared_weight = (routed_sum / scaling).expand(-1, num_shared_slots)
        weights = torch.cat([weights, shared_weight], dim=-1)
    if renormalize:
        weights = weights / (routed_sum + renormalize_eps)
    if scale_on_output:
        weights = weights * routed_scaling_factor

    if num_token_non_padded is not None:
        limit = torch.as_tensor(num_token_non_padded, device=logits.device).reshape(())
        padded = (torch.arange(num_tokens, device=logits.device) >= limit)[:, None]
        weights = torch.where(padded, 0.0, weights)
        ids = torch.where(padded, -1, ids)
    return weights.float(), ids.to(torch.int32)


def bf16_bits(weights: torch.Tensor) -> torch.Tensor:
    """The bf16 (round to nearest even) bit pattern of fp32 ``weights``, as int32 in [0, 0xFFFF].

    Rounded on the integer bits so every device agrees; every NaN becomes the quiet NaN 0x7FC0.
    """
    bits = weights.float().contiguous().view(torch.int32)
    lowest_kept = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lowest_kept) >> 16) & 0xFFFF
    return torch.where(torch.isnan(weights), 0x7FC0, rounded).to(torch.int32)


def pack_topk(ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """FlashInfer's routed-MoE form: ``(id << 16) | bf16_bits(weight)``, int32 ``[T, k]``."""
    return (ids.to(torch.int32) << _EXPERT_ID_BITS) | bf16_bits(weights)
