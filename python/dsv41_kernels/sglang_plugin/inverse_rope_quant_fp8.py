"""Call site ``inverse_rope_quant_fp8``: the attention output on the way to the FP8 ``wo_a``
(Hopper) -> :func:`dsv41_kernels.inverse_rope_quant_fp8`.

On SM90 with the FP8 ``wo_a``, ``MQALayer.forward`` (``sglang/srt/models/deepseek_v4.py``)
rotates the attention output back in place with ``fused_rope_inplace(o[..., -64:], None,
self.freqs_cis, positions=positions, inverse=True)`` (:2954), views it as ``[T, G, D]``, copies
it when the heads are a slice (:3011) and quantizes it with
``sglang_per_token_group_quant_fp8(..., group_size=128, scale_ue8m0=False)`` (:3010) for
``_fp8_wo_a_einsum``. Both are module-level names of ``deepseek_v4``, and nothing runs between
them but views, the copy and branch tests, so the site is hooked in three places:

- ``MQALayer.forward`` (AROUND) records which layer is running, so the other two hooks know
  the call is this layer's and what follows it (the layer's ``wo_a_fp8``, SGLang's module flags);
- ``fused_rope_inplace``: for the output's inverse RoPE of a layer whose FP8 quantizer follows,
  ours rotates ``o`` in place (so everything after sees what SGLang's RoPE leaves) and quantizes
  it in the same launch, keeping the result for the next call. It reads ``positions`` and
  ``freqs_cis`` before waiting for the attention kernel (``tables_ready``), as SGLang's RoPE
  kernel there does: neither is written by the kernel before it;
- ``sglang_per_token_group_quant_fp8`` (the hook of :mod:`.group_quant`, which ``hc_boundary``
  shares): that next call returns the kept result when its arguments are the ones the
  attention output passes (``x`` of ``[T * G, D]`` bf16, 128, fp32 scales), else SGLang's
  quantizer runs on ``x`` (rotated by then, so still exact).

SGLang's registry rewrites every binding of the two functions, so both hooks also see calls
from elsewhere (the query's RoPE, every FP8 linear's activations, DSpark's draft attention):
those go straight to SGLang's function and are not counted. The layer's ``o`` is rebuilt from
the ``q`` SGLang passes (its rope tail, ``o[..., -rope_dim:]``: same strides, the offset of the
nope values before it). The ``inverse_rope_quant_fp8`` switch turns the three hooks off
together; the GPU's policy (:mod:`.policy`) declines the site where SGLang's chain measured
faster, per token count and local heads (the TP-local second dimension of ``o``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from sglang.kernels.ops.attention.dsv4.norm_rope import fused_rope_inplace
from sglang.srt.models import deepseek_v4
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import (
    inverse_rope_quant_fp8,
    inverse_rope_quant_fp8_admission,
)
from dsv41_kernels.sglang_plugin import dispatch, group_quant
from dsv41_kernels.sglang_plugin.policy import policy_refusal

GROUP_SIZE = 128
"""What ``MQALayer.forward`` passes its quantizer on SM90 (deepseek_v4.py:3012)."""
ROPE_HOOK = "inverse_rope_quant_fp8.fused_rope_inplace"
QUANT_HOOK = "inverse_rope_quant_fp8.sglang_per_token_group_quant_fp8"
_ROPE_SIGNATURE = inspect.signature(fused_rope_inplace)


@dataclass
class Quantized:
    """What ours wrote for one attention output, for the quantizer call that follows."""

    codes: torch.Tensor  # e4m3 [T * G, D]
    scales: torch.Tensor  # fp32 [T * G, D / 128]

    def serves(self, arguments: dict[str, Any]) -> Admission:
        """Whether the quantizer call with these (bound, defaulted) arguments is the one the
        attention output makes, so our result is its result."""
        x = arguments["x"]
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
            return refuse("x is not a bf16 tensor")
        if x.shape != self.codes.shape or x.device != self.codes.device:
            return refuse(f"x is {tuple(x.shape)}, the attention output {tuple(self.codes.shape)}")
        differ = group_quant.differing(arguments, group_size=GROUP_SIZE, scale_ue8m0=False)
        if differ:
            return refuse(f"not the attention output's quantizer call ({', '.join(differ)})")
        return admit("fused", "quantized with the inverse RoPE")


@dataclass
class Site:
    layer: Any = None
    """The ``MQALayer`` whose forward is running, else None."""


_site = Site()


def forward_hook(original, layer, *args, **kwargs):
    outer = _site.layer
    _site.layer = layer
    try:
        return original(layer, *args, **kwargs)
    finally:
        _site.layer = outer
        group_quant.keep_for_next(None)  # ours for this layer's output, if its call never came


def attention_output(layer, q: torch.Tensor) -> torch.Tensor | None:
    """``o [T, H, head_dim]`` whose rope tail ``q`` is, or None when ``q`` is not such a tail."""
    heads, head_dim, rope_dim = layer.n_local_heads, layer.head_dim, layer.qk_rope_head_dim
    nope = head_dim - rope_dim
    if q.dim() != 3 or q.shape[1:] != (heads, rope_dim) or q.stride(2) != 1:
        return None
    if q.storage_offset() < nope or (heads > 1 and q.stride(1) < head_dim):
        return None
    return q.as_strided((q.shape[0], heads, head_dim), q.stride(), q.storage_offset() - nope)


def rope_admission(layer, q, freqs_cis, positions) -> tuple[Admission, torch.Tensor | None]:
    """Ours for this layer's attention-output RoPE, or SGLang's (pure: layer flags, SGLang's
    module flags, shapes, strides, device), with the rebuilt ``o`` when ours."""
    if not layer.wo_a_fp8:
        return refuse("bf16 wo_a: SGLang's RoPE, then its bf16 contraction"), None
    if getattr(layer, "use_npu_arch35_mxfp8_wo_a", False) or deepseek_v4._wo_a_fp8_mxscale:
        return refuse("an NPU / ROCm FP8 wo_a that quantizes for itself"), None
    if deepseek_v4._FP8_WO_A_UE8M0:
        return refuse("UE8M0 scales (SM100/SM120): SGLang's group-major quantizer follows"), None
    o = attention_output(layer, q)
    if o is None:
        return refuse("q is not the rope tail of [T, H, head_dim] heads"), None
    slower = policy_refusal("inverse_rope_quant_fp8", o, columns=True)
    if slower is not None:
        return slower, None
    admission = inverse_rope_quant_fp8_admission(
        o, freqs_cis, positions, o_groups=layer.n_local_groups, group_size=GROUP_SIZE
    )
    return admission, o if admission else None


def rope_hook(original, *args, **kwargs):
    layer = _site.layer
    if layer is None:
        return original(*args, **kwargs)
    call = _ROPE_SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    q, k, freqs_cis, positions, inverse = (
        call.arguments[name] for name in _ROPE_SIGNATURE.parameters
    )
    if not inverse or k is not None or freqs_cis is not layer.freqs_cis:
        return original(*args, **kwargs)  # the query's RoPE, not the attention output's
    admission, o = rope_admission(layer, q, freqs_cis, positions)
    return dispatch.run(
        ROPE_HOOK,
        admission,
        lambda: _rotate_and_quantize(layer, o, freqs_cis, positions, admission),
        lambda: original(*args, **kwargs),
    )


def _rotate_and_quantize(layer, o, freqs_cis, positions, admission) -> None:
    codes, scales = inverse_rope_quant_fp8(
        o, freqs_cis, positions, o_groups=layer.n_local_groups, group_size=GROUP_SIZE,
        rotate_o=True, tables_ready=True, admission=admission,
    )  # fmt: skip
    tokens, groups, width = codes.shape
    rows = tokens * groups  # SGLang's [T * G, D] and [T * G, D / 128] (T = 0 included)
    quantized = Quantized(codes.view(rows, width), scales.view(rows, scales.shape[2]))
    group_quant.keep_for_next(
        group_quant.Kept(QUANT_HOOK, quantized.serves, (quantized.codes, quantized.scales))
    )


HOOKS = (
    ("sglang.srt.models.deepseek_v4.MQALayer.forward", forward_hook, HookType.AROUND),
    ("sglang.srt.models.deepseek_v4.fused_rope_inplace", rope_hook, HookType.AROUND),
    group_quant.HOOK,
)
REQUIRES = (
    "sglang.srt.models.deepseek_v4._FP8_WO_A_UE8M0",
    "sglang.srt.models.deepseek_v4._wo_a_fp8_mxscale",
)
