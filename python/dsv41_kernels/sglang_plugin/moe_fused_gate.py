"""Call site ``moe_fused_gate``: DeepSeek-V4.1 vision routing ->
:func:`dsv41_kernels.moe_fused_gate`.

``sglang.srt.multimodal.dsv41.vl_routing.vision_topk`` routes every MoE layer of a V4.1
checkpoint with a vision tower (``deepseek_v2`` and ``mega_moe`` import it by name; SGLang's
hook registry rewrites those bindings). Ours computes the same ids and weights in one launch
and, when :func:`emits_packed_ids` admits (FlashInfer MXFP4 runner, no fused
shared slots, no expert-location remapping, no MegaMoE all-to-all, no routing simulation),
writes the packed ids the runner consumes in that same launch. SGLang's own post-processing
(``_finish_vision_topk``: routed-experts capture, the expert-distribution recorder) still runs
on the result. Anything else (expert-location dispatch, routing simulation, ROCm, a device
without Triton) goes to SGLang's original function.

SGLang 0.5.23's own ``vision_topk`` already routes and packs in one Triton launch on CUDA
(``moe_fused_gate(..., packed_out=)``). Where ours runs is the GPU's policy's (:mod:`.policy`;
the H200's takes every token count measured); ``DSV41_KERNELS_FORCE=moe_fused_gate`` takes ours
anyway.
It is reached from ``DeepseekV2MoE.forward`` (normal and dual-stream) and MegaMoE, not from
``forward_deepep``. Every rank routes the same tokens, so the hook is ``replicated``
(:mod:`.dispatch`): on one of several ranks an error of ours is raised, not answered with
SGLang's routing on that rank alone.
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

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, moe_fused_gate_admission
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_TARGET = "sglang.srt.multimodal.dsv41.vl_routing.vision_topk"
PACKED_RUNNER = "flashinfer_mxfp4"
"""The only MoE runner in SGLang 0.5.23 that consumes packed ids."""
MEGAMOE_A2A = "megamoe"
"""SGLang's ``MoeA2ABackend.MEGAMOE`` value: its all-to-all takes unpacked ids."""


def emits_packed_ids(
    *,
    num_fused_shared_experts: int,
    expert_location_remapped: bool,
    a2a_backend: str,
    simulating_routing: bool,
    moe_runner_backend: str | None,
) -> Admission:
    """Whether the router should also write packed ids: only when nothing rewrites its outputs.

    The packed ids are taken from the router's final ids and weights, so every later rewrite
    of either (shared-expert rescaling, expert-location remapping, routing simulation) rules
    them out, as do a MegaMoE all-to-all and a runner that does not read them.
    """
    if num_fused_shared_experts:
        return refuse("fused shared-expert slots are rescaled after the router")
    if expert_location_remapped:
        return refuse("expert-location remapping rewrites ids after the router")
    if a2a_backend == MEGAMOE_A2A:
        return refuse("MegaMoE all-to-all takes unpacked ids")
    if simulating_routing:
        return refuse("routing simulation rewrites ids and weights after the router")
    if moe_runner_backend != PACKED_RUNNER:
        return refuse(f"MoE runner {moe_runner_backend!r} does not consume packed ids")
    return admit("packed ids", f"{PACKED_RUNNER} consumes packed ids")


def _enum_value(member) -> str | None:
    return None if member is None else getattr(member, "value", str(member))


def vision_topk_admission(
    logits, bias, bias_alt, input_ids, image_token_id, rows, config, dispatch_info
) -> Admission:
    """Our router for these arguments, or SGLang's (pure: no values read)."""
    if dispatch_info is not None:
        return refuse("expert-location dispatch remaps ids inside SGLang's router")
    if routing_simulation_enabled():
        return refuse("routing simulation is on")
    if torch.version.hip is not None:
        return refuse("ROCm: SGLang routes in torch there")
    slower = policy_refusal("moe_fused_gate", logits)
    if slower is not None:
        return slower
    return moe_fused_gate_admission(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        image_token_id=image_token_id,
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
    admission = vision_topk_admission(
        logits, bias, bias_alt, input_ids, moe.config.image_token_id, rows, config, dispatch_info
    )
    return dispatch.run(
        "moe_fused_gate.vision_topk",
        admission,
        lambda: _route(moe, logits, input_ids, rows, config, dispatch_info, bias_alt, admission),
        lambda: original(
            moe, logits, input_ids, num_token_non_padded, expert_location_dispatch_info
        ),
        # Every rank routes the same tokens and their experts' outputs are summed across
        # ranks: one rank routing with SGLang's function would silently mix two routings.
        replicated=True,
    )


def _route(moe, logits, input_ids, rows, config, dispatch_info, bias_alt, admission):
    packed = None
    if packed_ids_admission(config, dispatch_info):
        packed = torch.empty(
            (logits.shape[0], config.top_k), dtype=torch.int32, device=logits.device
        )
    weights, ids = moe_fused_gate(
        logits,
        moe.gate.e_score_correction_bias,
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
        admission=admission,
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
