"""Check cases of :func:`dsv41_kernels.ops.moe.moe_fused_gate.moe_fused_gate`, and its accuracy
measure: ids equal, weights within a stated fp32 ulp bound, packed words those of its outputs."""

from __future__ import annotations

import functools

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, moe_fused_gate_admission
from dsv41_kernels.ops.moe.pack_topk import pack_topk, pack_topk_admission
from dsv41_kernels.reference.moe_fused_gate import pack_topk as pack_topk_reference
from dsv41_kernels.reference.moe_fused_gate import vision_topk

OPS = ("moe_fused_gate", "pack_topk")
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""

WEIGHT_ULP_BOUND = 2
"""Stated distance of the kernel's weights from the reference on a GPU, in fp32 ulp."""
INTERPRETER_WEIGHT_ULP_BOUND = 8
"""The same under the Triton interpreter, whose scores may be 1 ulp from torch's CPU ones: a
score ulp moves the renormalised weights by up to 6 ulp."""


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    """V4.1 (E 384) and V4 (E 256) routing, top-6, image tokens mixed in, packed output."""
    image_token_id = 129264
    shapes = [(6, 64), (3, 384)] if small else [(1, 384), (6, 384), (64, 384), (6, 256)]
    ulp_bound = WEIGHT_ULP_BOUND if device.type == "cuda" else INTERPRETER_WEIGHT_ULP_BOUND
    found = []
    for num_tokens, num_experts in shapes:
        gen = torch.Generator(device="cpu").manual_seed(num_tokens * 1000 + num_experts)
        logits = torch.randn(num_tokens, num_experts, generator=gen).to(device, torch.bfloat16)
        bias = (0.1 * torch.randn(num_experts, generator=gen)).to(device)
        bias_alt = (0.1 * torch.randn(num_experts, generator=gen)).to(device)
        input_ids = torch.randint(0, 1000, (num_tokens,), generator=gen)
        input_ids[::2] = image_token_id
        input_ids = input_ids.to(device)
        routing = dict(
            bias_alt=bias_alt, input_ids=input_ids, image_token_id=image_token_id, top_k=6
        )
        outputs = tuple(
            torch.empty(num_tokens, 6, dtype=dtype, device=device)
            for dtype in (torch.float32, torch.int32, torch.int32)
        )

        def run(logits=logits, bias=bias, routing=routing, outputs=outputs):
            weights, ids, packed = outputs
            moe_fused_gate(
                logits, bias, packed_out=packed, out_weights=weights, out_ids=ids, **routing
            )
            return outputs

        def reference(logits=logits, bias=bias, routing=routing):
            weights, ids = vision_topk(
                logits,
                bias,
                routing["bias_alt"],
                routing["input_ids"],
                image_token_id=image_token_id,
                top_k=6,
            )
            return weights, ids, pack_topk_reference(ids, weights)

        def baseline(logits=logits, bias=bias, routing=routing, outputs=outputs):
            weights, ids, _ = outputs
            moe_fused_gate(logits, bias, out_weights=weights, out_ids=ids, **routing)
            return pack_topk(ids, weights)

        found.append(
            CheckCase(
                op="moe_fused_gate",
                shape=f"[{num_tokens}, {num_experts}] bf16 top-6 packed",
                admission=moe_fused_gate_admission(
                    logits, bias, bias_alt=bias_alt, input_ids=input_ids, top_k=6
                ),
                run=run,
                reference=reference,
                mismatches=functools.partial(routing_mismatches, ulp_bound=ulp_bound),
                baseline=baseline,
            )
        )
    return found + pack_topk_cases(device, small)


def pack_topk_cases(device: torch.device, small: bool) -> list[CheckCase]:
    """The separate packing launch: weights with NaN, ±Inf, ±0, subnormals and bf16 ties."""
    num_tokens = 6 if small else 64
    gen = torch.Generator(device="cpu").manual_seed(61)
    ids = torch.randint(0, 384, (num_tokens, 6), generator=gen, dtype=torch.int32)
    weights = torch.rand(num_tokens, 6, generator=gen)
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, 1.0 + 2**-8]
    weights.view(-1)[: len(specials)] = torch.tensor(specials)  # 1 + 2^-8: a tie to even
    ids, weights = ids.to(device), weights.to(device)
    return [
        CheckCase(
            op="pack_topk",
            shape=f"[{num_tokens}, 6] int32 ids, fp32 weights",
            admission=pack_topk_admission(ids, weights),
            run=lambda: pack_topk(ids, weights),
            reference=lambda: pack_topk_reference(ids, weights),
            mismatches=bit_mismatches,
            baseline=lambda: pack_topk_reference(ids, weights),
        )
    ]


def fp32_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in fp32 ulp (int64), counted on ordered bit patterns; 0 where both are NaN."""

    def ordered(t):
        bits = t.float().contiguous().view(torch.int32).to(torch.int64)
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    distance = (ordered(a) - ordered(b)).abs()
    return torch.where(torch.isnan(a) & torch.isnan(b), 0, distance)


def routing_mismatches(ours, ref, *, ulp_bound: int = WEIGHT_ULP_BOUND) -> int:
    """Slots whose id differs, whose weight is more than ``ulp_bound`` ulp off, or whose packed
    word is not ``pack_topk`` of our own outputs; ``ours``/``ref`` are (weights, ids, packed)."""
    weights, ids, packed = ours
    ref_weights, ref_ids, _ = ref
    bad = (ids != ref_ids) | (fp32_ulp_distance(weights, ref_weights) > ulp_bound)
    bad |= packed != pack_topk_reference(ids, weights)
    return int(bad.sum().item())
