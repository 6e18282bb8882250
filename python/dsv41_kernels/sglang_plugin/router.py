"""Call site 2: DeepSeek-V4.1 vision routing -> :func:`dsv41_kernels.moe_fused_gate`.

``sglang.srt.multimodal.dsv41.vl_routing.vision_topk`` routes every MoE layer of a V4.1
checkpoint with a vision tower (``deepseek_v2`` and ``mega_moe`` import it by name; SGLang's
hook registry rewrites those bindings). Ours computes the same ids and weights in one launch
and, when :func:`dsv41_kernels.emits_packed_ids` admits (FlashInfer MXFP4 runner, no fused
shared slots, no expert-location remapping, no MegaMoE all-to-all, no routing simulation),
writes the packed ids the runner consumes in that same launch. SGLang's own post-processing
(``_finish_vision_topk``: routed-experts capture, the expert-distribution recorder) still runs
on the result. Anything else (expert-location dispatch, routing simulation, ROCm, a device
without Triton) goes to SGLang's original function.

SGLang 0.5.23's own ``vision_topk`` already routes and packs in one Triton launch on CUDA
(``moe_fused_gate(..., packed_out=)``) and measured faster than ours, so this hook declines by
default (:mod:`.measured`); ``DSV41_KERNELS_FORCE=router`` takes ours anyway. It is reached from
``DeepseekV2MoE.forward`` (normal and dual-stream) and MegaMoE, not from ``forward_deepep``.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.moe.topk import (
    _RENORMALIZE_SUM_EPSILON,
    StandardTopKOutput,
    StandardTopKOutputPacked,
    routing_simulation_enabled,
)
from sglang.srt.layers.moe.utils import get_moe_a2a_backend
from sglang.srt.multimodal.dsv41 import vl_routing
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.jit import sm_major
from dsv41_kernels.ops.moe.moe_fused_gate import (
    emits_packed_ids,
    moe_fused_gate,
    moe_fused_gate_admission,
)
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.measured import against_sglang

_TARGET = "sglang.srt.multimodal.dsv41.vl_routing.vision_topk"


def _enum_value(member) -> str | None:
    return None if member is None else getattr(member, "value", str(member))


def router_admission(logits, bias, bias_alt, input_ids, rows, config, dispatch_info) -> Admission:
    """Our router for these arguments, or SGLang's (pure: no values read)."""
    if dispatch_info is not None:
        return refuse("expert-location dispatch remaps ids inside SGLang's router")
    if routing_simulation_enabled():
        return refuse("routing simulation is on")
    if torch.version.hip is not None:
        return refuse("ROCm: SGLang routes in torch there")
    arch = sm_major(logits.device.index) if logits.is_cuda else None
    measured = against_sglang("router", arch, logits.shape[0])
    if not measured:
        return measured
    return moe_fused_gate_admission(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        top_k=config.top_k,
        num_token_non_padded=rows,
    )


def packed_ids_admission(config, dispatch_info) -> Admission:
    return emits_packed_ids(
        num_fused_shared_experts=config.num_shared_topk_slots,
        expert_location_remapped=dispatch_info is not None,
        a2a_backend=_enum_value(get_moe_a2a_backend()),
        simulating_routing=routing_simulation_enabled(),
        moe_runner_backend=_enum_value(config.runner_backend),
    )


def vision_topk_hook(
    original,
    moe,
    logits,
    input_ids,
    num_token_non_padded=None,
    expert_location_dispatch_info=None,
):
    bound, dispatch_info = moe.topk.routing_inputs()
    rows = bound if num_token_non_padded is None else num_token_non_padded
    if expert_location_dispatch_info is not None:
        dispatch_info = expert_location_dispatch_info
    config = moe.topk.topk_config
    bias, bias_alt = moe.gate.e_score_correction_bias, moe.gate.e_score_correction_bias_vl
    if input_ids is None:
        bias_alt = None
    return dispatch.run(
        "router.vision_topk",
        router_admission(logits, bias, bias_alt, input_ids, rows, config, dispatch_info),
        lambda: _route(moe, logits, input_ids, rows, config, dispatch_info, bias, bias_alt),
        lambda: original(
            moe, logits, input_ids, num_token_non_padded, expert_location_dispatch_info
        ),
    )


def _route(moe, logits, input_ids, rows, config, dispatch_info, bias, bias_alt):
    packed = None
    if packed_ids_admission(config, dispatch_info):
        packed = torch.empty(
            (logits.shape[0], config.top_k), dtype=torch.int32, device=logits.device
        )
    weights, ids = moe_fused_gate(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        image_token_id=moe.config.image_token_id,
        top_k=config.top_k,
        renormalize=config.renormalize and config.top_k > 1,
        renormalize_eps=_RENORMALIZE_SUM_EPSILON,
        routed_scaling_factor=config.routed_scaling_factor or 1.0,
        scale_on_output=config.apply_routed_scaling_factor_on_output,
        num_shared_slots=config.num_shared_topk_slots,
        num_token_non_padded=rows,
        packed_out=packed,
    )
    # Padded rows are already id -1 / weight 0, as SGLang's own fused router leaves them.
    weights, ids = vl_routing._finish_vision_topk(
        moe, logits, weights, ids, rows, None, padded_rows_masked=True
    )
    if packed is not None:
        return StandardTopKOutputPacked(weights, ids, logits, packed)
    return StandardTopKOutput(weights, ids, logits)


HOOKS = ((_TARGET, vision_topk_hook, HookType.AROUND),)
REQUIRES = ("sglang.srt.multimodal.dsv41.vl_routing._finish_vision_topk",)
