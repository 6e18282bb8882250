"""Call site ``hc_combine_norm``: the mHC combine+norm -> :func:`dsv41_kernels.hc_combine_norm`
(and ``_mxfp8``).

``sglang.srt.models.deepseek_v4_mhc._combine(hc, state, quantized)`` collapses the four
residual streams with ``pre``, rounds to bf16 and RMS-normalises. SGLang passes a list as
``quantized`` exactly when the consuming projection accepts FlashInfer's swizzled MXFP8
(``accepts_mxfp8_swizzled_input``); then ours writes the e4m3 data and the 128x4-swizzled
scales in the same launch and appends them as SGLang's ``Mxfp8SwizzledInput``, and the
consumer skips its own quantizer. Without a list, ours is the one-launch combine+norm on every
device generation (SGLang fuses it only on Blackwell, and on Hopper for some row counts).

Our combine+norm is batch-invariant with a fixed reduction order; it equals SGLang's within
one bf16 ulp per element (the sum of squares is ordered differently), and the fused MXFP8
outputs equal our quantizer applied to our ``y`` bit for bit.

On SM90 the consumer's first block-FP8 linear (the attention's ``wqkv_a``, the FFN's
shared-expert ``gate_up_proj``) quantizes ``y`` in a launch of its own
(``sglang_per_token_group_quant_fp8(y, 32, scale_ue8m0=True)``). Where the policy measured it
faster (site ``hc_combine_norm_quant_fp8``, under this switch), ours writes those groups in the
combine's launch and pins them to ``y`` (:mod:`.group_quant`, as the boundary hooks do at the
seams they fuse); the linear's quantizer call returns them, and the next post drops them
(:mod:`.posts`).
"""

from __future__ import annotations

import torch
from sglang.srt.layers.quantization.mxfp8_input import Mxfp8SwizzledInput
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.ops.mhc.hc_combine_norm import (
    hc_combine_norm,
    hc_combine_norm_admission,
    hc_combine_norm_mxfp8,
)
from dsv41_kernels.sglang_plugin import dispatch, group_quant, posts
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_TARGET = "sglang.srt.models.deepseek_v4_mhc._combine"
QUANT_SITE = "hc_combine_norm_quant_fp8"
MAX_QUANTIZED_ROWS = 128
"""Rows up to which SGLang 0.5.23 hands a pre-quantized input to the projection; above it the
consumer quantizes for itself, and we keep that contract."""


def combine_admission(hc, state, quantize: bool) -> Admission:
    """Ours for this combine, or SGLang's (pure: shapes, dtypes, module flags)."""
    x, pre, norm = state.streams, state.pre, hc.norm
    if not isinstance(x, torch.Tensor) or pre is None:
        return refuse("no materialised residual or no pre (first sublayer)")
    if x.dim() != 3 or x.shape[1] != hc.cfg.mult or hc.cfg.mult != 4:
        return refuse("residual is not [m, 4, H]")
    if x.dtype != torch.bfloat16 or norm.weight.dtype != torch.bfloat16:
        return refuse("residual or norm weight not bf16")
    if norm.cast_x_before_out_mul or norm.variance_size_override is not None:
        return refuse("RMSNorm variant our kernel does not compute")
    slower = policy_refusal("hc_combine_norm", x)
    if slower is not None:
        return slower
    return hc_combine_norm_admission(x.flatten(1), pre, norm.weight, quantize=quantize)


def combine_hook(original, hc, state, quantized):
    x = state.streams
    quantize = (
        quantized is not None and isinstance(x, torch.Tensor) and x.shape[0] <= MAX_QUANTIZED_ROWS
    )
    admission = combine_admission(hc, state, quantize)
    return dispatch.run(
        "hc_combine_norm._combine",
        admission,
        lambda: _combine(hc, state, quantized if quantize else None, admission),
        lambda: original(hc, state, quantized),
        replicated=True,  # y feeds the residual streams every rank holds a copy of
    )


def _combine(hc, state, quantized, admission):
    x_flat = state.streams.flatten(1)
    weight, eps = hc.norm.weight, hc.norm.variance_epsilon
    if quantized is None:
        quant_out = group_quant.quant_out_for(x_flat, weight.shape[0], QUANT_SITE)
        y = hc_combine_norm(x_flat, state.pre, weight, eps, admission=admission,
                            quant_out=quant_out)  # fmt: skip
        group_quant.pin(y, quant_out, QUANT_SITE)
        return y
    y, q = hc_combine_norm_mxfp8(x_flat, state.pre, weight, eps, admission=admission)
    quantized.append(Mxfp8SwizzledInput(q.data, q.scales))  # only once the op has succeeded
    return y


HOOKS = ((_TARGET, combine_hook, HookType.AROUND), *posts.HOOKS, group_quant.HOOK)
REQUIRES = ("sglang.srt.models.deepseek_v4_mhc.HcState",)
