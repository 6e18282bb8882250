"""Check cases of :func:`dsv41_kernels.ops.quantization.rmsnorm_quant_fp8.rmsnorm_quant_fp8`."""

from __future__ import annotations

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.ops.quantization.rmsnorm_quant_fp8 import (
    rmsnorm_quant_fp8,
    rmsnorm_quant_fp8_admission,
    rmsnorm_quant_fp8_torch,
)
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0, rmsnorm

OPS = ("rmsnorm_quant_fp8",)
"""The op names this module's cases check (``dsv41-kernels check --ops``)."""
Q_LORA_RANK, QKV_A_WIDTH = 1280, 1792  # DeepSeek-V4.1-Flash: q_lora inside wqkv_a's output


def mismatches(ours, reference) -> int:
    """``y`` elements more than one bf16 ulp from the IEEE statement's (the kernel's norm is
    FlashInfer's, with hardware approximations), plus ``(q, scales)`` elements that differ from
    SGLang's quantizer of ours' ``y`` (exact)."""
    y, q, scales = ours
    ref_y = reference[0].float()
    ulp = torch.ldexp(torch.ones_like(ref_y), torch.frexp(ref_y)[1] - 8).clamp(min=2.0**-133)
    off = int(((y.float() - ref_y).abs() > ulp).sum().item())
    return off + bit_mismatches((q, scales), group_quant_ue8m0(y, q.shape[1] // scales.shape[1]))


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    rows = 2 if small else 6
    gen = torch.Generator().manual_seed(11)
    qkv_a = (torch.randn(rows, QKV_A_WIDTH, generator=gen) * 3).bfloat16().to(device)
    x = qkv_a[:, :Q_LORA_RANK]
    weight = (1 + 0.1 * torch.randn(Q_LORA_RANK, generator=gen)).bfloat16().to(device)
    return [
        CheckCase(
            op="rmsnorm_quant_fp8",
            shape=f"[{rows}, {Q_LORA_RANK}] bf16 of [{rows}, {QKV_A_WIDTH}], group 32",
            admission=rmsnorm_quant_fp8_admission(x, weight, 1e-6),
            run=lambda: rmsnorm_quant_fp8(x, weight, 1e-6),
            reference=lambda: (rmsnorm(x, weight, 1e-6),),
            mismatches=mismatches,
            baseline=lambda: rmsnorm_quant_fp8_torch(x, weight, 1e-6, 32),
        )
    ]
