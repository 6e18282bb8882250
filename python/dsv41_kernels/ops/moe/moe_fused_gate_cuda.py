"""The CUDA kernel of :func:`dsv41_kernels.ops.moe.moe_fused_gate.moe_fused_gate`: where it
fits, its layout by tokens an SM, and its launch (``sgl-kernel/csrc/moe_fused_gate.cu``).

Three layouts of the same arithmetic: a CTA a token (a thread an expert, the experts ranked into
32 sorted lists in shared memory, one warp taking the slots from the lists' heads) up to one
token an SM; the list layout (4 warps a token) up to :data:`LIST_LAYOUT_TOKENS_PER_SM`; the warp
layout (a warp a token, 4 or 8 tokens a CTA, one warp taking the slots from the lists in its
registers) beyond. The op's admission chooses the layout (:func:`cuda_layout`); the launcher
runs it as given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv41_kernels.devices import cuda_index, sm_major
from dsv41_kernels.jit import load_module

MODULE = "moe_fused_gate"
"""The CUDA module (``sgl-kernel/csrc/moe_fused_gate.cu``)."""
CUDA_MAX_EXPERTS = 512
"""The widest row (a thread an expert, 32 lists of at most 16), E % 32 == 0."""
CUDA_MAX_TOP_K = 16
"""Slots a token (the kernel's ``kMaxTopK``)."""
CUDA_MAX_TOKENS = 65536
"""The most tokens it takes: the most measured faster than the Triton kernel; past it, Triton."""
CTA_LAYOUT_TOKENS_PER_SM = 1
"""A CTA a token up to one token an SM: beyond, its idle warps (all but one while the slots are
taken) cost SM slots that the list layout's 4 warps a token keep."""
LIST_LAYOUT_TOKENS_PER_SM = 5
"""4 warps a token up to five tokens an SM: beyond, a CTA of each token crowds the SMs and a warp
a token is faster."""
WARP_LAYOUT_TOKENS_PER_CTA = (4, 8)
"""The warp layout's CTA sizes, tokens a CTA (:func:`warp_layout_tokens_per_cta`)."""
CTA_LAYOUT, LIST_LAYOUT, WARP_LAYOUT = 0, 4, 1
"""The kernel's ``warps`` argument: 0 for a CTA a token, else warps a token."""


@dataclass(frozen=True)
class CudaLaunch:
    """The CUDA kernel's launch: its ``warps`` and ``tokens_per_cta`` arguments."""

    warps: int
    """:data:`CTA_LAYOUT`, :data:`LIST_LAYOUT` or :data:`WARP_LAYOUT`."""
    tokens_per_cta: int
    """Tokens a CTA: 1, or one of :data:`WARP_LAYOUT_TOKENS_PER_CTA` in the warp layout."""


def _contiguous_fp32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.is_contiguous()


def cuda_kernel_fits(logits, bias, bias_alt, top_k) -> bool:
    """The CUDA kernel is the one for these arguments (inputs already validated): sm_90+, fp32
    logits with unit-stride rows, up to :data:`CUDA_MAX_TOKENS` tokens of 32 M experts up to
    :data:`CUDA_MAX_EXPERTS`, fp32 contiguous biases, at most 16 slots. Pure: dtypes, shapes
    and strides."""
    num_tokens, num_experts = logits.shape
    return (
        logits.is_cuda
        and sm_major(logits.device.index) >= 9
        and logits.dtype == torch.float32
        and num_experts % 32 == 0
        and 32 <= num_experts <= CUDA_MAX_EXPERTS
        and logits.stride(1) == 1
        and num_tokens <= CUDA_MAX_TOKENS
        and _contiguous_fp32(bias)
        and (bias_alt is None or _contiguous_fp32(bias_alt))
        and top_k <= CUDA_MAX_TOP_K
    )


def warp_layout_tokens_per_cta(num_tokens: int, multiprocessors: int) -> int:
    """Tokens a CTA of the warp layout: the fewest warps on the busiest SM (its time follows
    them), then the larger CTA."""

    def busiest(tokens_per_cta: int) -> tuple[int, int]:
        ctas = -(-num_tokens // tokens_per_cta)
        return tokens_per_cta * -(-ctas // multiprocessors), -tokens_per_cta

    return min(WARP_LAYOUT_TOKENS_PER_CTA, key=busiest)


def cuda_layout(num_tokens: int, multiprocessors: int) -> CudaLaunch:
    """The layout for ``num_tokens`` on a GPU of ``multiprocessors`` SMs, by tokens an SM
    (:data:`CTA_LAYOUT_TOKENS_PER_SM`, :data:`LIST_LAYOUT_TOKENS_PER_SM`)."""
    if num_tokens <= CTA_LAYOUT_TOKENS_PER_SM * multiprocessors:
        return CudaLaunch(CTA_LAYOUT, 1)
    if num_tokens <= LIST_LAYOUT_TOKENS_PER_SM * multiprocessors:
        return CudaLaunch(LIST_LAYOUT, 1)
    return CudaLaunch(WARP_LAYOUT, warp_layout_tokens_per_cta(num_tokens, multiprocessors))


def launch_cuda(
    launch: CudaLaunch,
    logits: torch.Tensor,
    bias: torch.Tensor,
    options,
    *,
    bias_alt: torch.Tensor | None,
    input_ids: torch.Tensor | None,
    image_token_id: int | None,
    valid_rows: int | torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    packed: torch.Tensor | None,
) -> None:
    """The CUDA kernel over every row of ``logits`` in ``launch``'s layout (arguments as
    :func:`dsv41_kernels.ops.moe.moe_fused_gate_triton.launch_triton`'s)."""
    none = logits.new_empty(0)  # an argument the kernel does not read
    valid_from_tensor = isinstance(valid_rows, torch.Tensor)
    load_module(MODULE, cuda_index(logits.device)).moe_fused_gate_cuda(
        logits,
        bias,
        none if bias_alt is None else bias_alt,
        none if bias_alt is None else input_ids,
        image_token_id if bias_alt is not None else 0,
        valid_rows.reshape(1) if valid_from_tensor else none,
        0 if valid_from_tensor else valid_rows,
        weights,
        ids,
        none if packed is None else packed,
        options.num_shared_slots,
        options.renormalize,
        options.renormalize_eps,
        options.routed_scaling_factor,
        options.scale_on_output,
        launch.warps,
        launch.tokens_per_cta,
    )
