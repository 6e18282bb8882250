"""Call site ``rmsnorm_quant_fp8``: the attention's Q-side norm on Hopper ->
:func:`dsv41_kernels.ops.quantization.rmsnorm_quant_fp8.rmsnorm_quant_fp8`.

``MQALayer._normalize_q_lora(self, q)`` (``srt/models/deepseek_v4.py``) returns the bf16 rows
the indexer reads and the input of ``wq_b``. SGLang 0.5.23 pre-quantizes that input only on
Blackwell; on SM90 it returns ``(q_norm(q), q_norm(q))`` and ``wq_b``'s block-FP8 linear
quantizes it again (``deepgemm_w8a8_block_fp8_linear_with_fallback(act_scale_ue8m0=True)``:
``sglang_per_token_group_quant_fp8(y, 32, scale_ue8m0=True)``, then DeepGEMM). Ours returns
``(y, (q, scales))`` from one launch, which that linear takes as it is (``Fp8LinearMethod.apply``
hands a tuple to the same DeepGEMM call as its ``input_scale``): the same GEMM on the same
operands, and ``y`` FlashInfer's bits (the op's contract). The compressed layers' indexer
(``C4Indexer.compute_q``) quantizes the same rows again for its own ``wq_b``; it takes the pair
instead through the parameter SGLang gives it for that (``q_lora_quant``, filled on ROCm only),
where its ``wq_b`` groups as the attention's does.

Declined, reason counted, wherever SGLang would not run exactly that pair and GEMM:
- off SM90 (Blackwell fuses its own; ROCm has its own path);
- a ``q`` or ``q_norm`` the plain ``sgl_kernel.rmsnorm`` branch would not take (not bf16 2-D,
  variance override, HF cast, a fused static FP8 quant, batch-invariant mode, a dispatch to
  anything but ``forward_cuda``: torch.compile, a forced fused-op backend);
- a ``wq_b`` that is not the SM90 block-FP8 DeepGEMM linear with ue8m0 activations and
  ``[32, 32]`` blocks (Marlin, MXFP8, the Triton fallback, packed UE8M0 scales), or under
  sequence parallelism (its all-gather takes a tensor);
- the policy, and the op's admission.
"""

from __future__ import annotations

import functools

import torch
from sglang.kernels.fused_op import get_fused_op_backend
from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.quantization import fp8_utils
from sglang.srt.plugins.hook_registry import HookType
from sglang.srt.runtime_context import get_forward, get_platform
from sglang.srt.utils import use_intel_amx_backend

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.ops.quantization.rmsnorm_quant_fp8 import (
    rmsnorm_quant_fp8,
    rmsnorm_quant_fp8_admission,
)
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_TARGET = "sglang.srt.models.deepseek_v4.MQALayer._normalize_q_lora"
_INDEXER = "sglang.srt.layers.attention.dsv4.indexer.C4Indexer.compute_q"
HOOK = "rmsnorm_quant_fp8._normalize_q_lora"
INDEXER_HOOK = "rmsnorm_quant_fp8.C4Indexer.compute_q"
PAIR = "_dsv41_kernels_wq_b_input"
"""The attribute of our normed rows that holds their ``(q, scales, group_size)``, for the
indexer's ``wq_b`` (the same rows, quantized the same way)."""
OFF_SM90 = refuse("not SM90: SGLang pre-quantizes q itself on Blackwell")


def norm_refusal(norm, q) -> Admission | None:
    """Why ``q_norm(q)`` would not be ``sgl_kernel.rmsnorm`` on SGLang's CUDA path, or None."""
    if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.dtype != torch.bfloat16:
        return refuse("q is not a bf16 [T, d] tensor")
    if q.shape[0] == 0:
        return refuse("no rows")
    weight = norm.weight
    if weight.dtype != torch.bfloat16 or tuple(weight.shape) != (q.shape[1],):
        return refuse("q_norm's weight is not bf16 [d]")
    if norm.variance_size_override is not None or norm.cast_x_before_out_mul:
        return refuse("an RMSNorm variant sgl_kernel.rmsnorm does not compute")
    if getattr(norm, "_quant_linear", None) is not None:
        return refuse("q_norm fuses a static FP8 quantization of its own")
    if is_batch_invariant_mode_enabled():
        return refuse("batch-invariant mode (SGLang's own norm kernel)")
    if norm.is_torch_compile or torch.compiler.is_compiling() or get_fused_op_backend() is not None:
        return refuse("q_norm runs its torch reference (torch.compile or a forced op backend)")
    method = norm._forward_method or norm._resolve_forward_method()  # as its first call resolves
    if getattr(method, "__func__", None) is not RMSNorm.forward_cuda:
        return refuse("q_norm does not dispatch to its CUDA forward")
    return None


def block_group(linear) -> tuple[int | None, str]:
    """The group size ``linear`` quantizes its bf16 input with, where it is the SM90 block-FP8
    DeepGEMM linear with power-of-two activation scales and would take a ``(q, scales)`` pair
    to the same GEMM; else ``(None, why not)``."""
    method = getattr(linear, "quant_method", None)
    dispatch_fn = getattr(method, "w8a8_block_fp8_linear", None)
    if not (
        isinstance(dispatch_fn, functools.partial)
        and dispatch_fn.func is fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback
        and dispatch_fn.keywords.get("act_scale_ue8m0")
    ):
        return None, "wq_b is not the block-FP8 DeepGEMM linear with ue8m0 activations"
    if getattr(method, "use_marlin", False) or getattr(method, "use_mxfp8", False):
        return None, "wq_b runs Marlin or MXFP8"
    if getattr(method, "block_fp8_as_mxfp8", False) and getattr(
        linear, "block_fp8_mxfp8_ready", False
    ):
        return None, "wq_b serves its block-FP8 weight as MXFP8"
    block = list(getattr(method, "weight_block_size", None) or ())
    if not getattr(method, "block_quant", False) or block != [32, 32]:
        return None, f"wq_b's blocks {block} are not [32, 32]"
    if use_intel_amx_backend(linear):
        return None, "wq_b runs on Intel AMX"
    weight, scales = linear.weight, linear.weight_scale_inv
    if not fp8_utils._deepgemm_block_fp8_supported(weight.shape, block, torch.bfloat16):
        return None, "DeepGEMM does not take wq_b here (SGLang's Triton fallback)"
    if fp8_utils._ue8m0_deepgemm_skips_block32(block, scales, scales):
        return None, "UE8M0 DeepGEMM takes no pre-quantized block-32 input"
    try:
        sequence_parallel = get_forward().sp_active
    except Exception:  # no forward context published: not a server step
        sequence_parallel = False
    if sequence_parallel:
        return None, "sequence parallelism (wq_b all-gathers a tensor input)"
    return block[1], ""


def q_side_admission(layer, q) -> tuple[Admission, int | None]:
    """Ours for this ``_normalize_q_lora`` call, or SGLang's, and the group size."""
    if not get_platform().is_sm90:
        return OFF_SM90, None
    refusal = norm_refusal(layer.q_norm, q)
    if refusal is not None:
        return refusal, None
    group, why = block_group(layer.wq_b)
    if group is None:
        return refuse(why), None
    slower = policy_refusal("rmsnorm_quant_fp8", q)
    if slower is not None:
        return slower, None
    norm = layer.q_norm
    return rmsnorm_quant_fp8_admission(
        q, norm.weight, norm.variance_epsilon, group_size=group
    ), group


def normalize_q_lora_hook(original, self, q):
    admission, group = q_side_admission(self, q)

    def ours():
        norm = self.q_norm
        y, codes, scales = rmsnorm_quant_fp8(
            q, norm.weight, norm.variance_epsilon, group_size=group, admission=admission
        )
        setattr(y, PAIR, (codes, scales, group))
        return y, (codes, scales)

    return dispatch.run(
        HOOK,
        admission,
        ours,
        lambda: original(self, q),
        # The rows feed every attention-TP rank's heads: a rank falling back alone would give
        # SGLang's bits where the others give ours if the two ever differed.
        replicated=True,
    )


def indexer_admission(indexer, q_lora, q_lora_quant) -> Admission:
    """Whether the compressed-attention indexer's ``wq_b`` takes our pair of ``q_lora``: the
    rows are ours, SGLang passes no pair of its own, and that ``wq_b`` quantizes its bf16 input
    with the same group (then the pair is what it would make: the same quantizer of the same
    rows)."""
    pair = getattr(q_lora, PAIR, None)
    if q_lora_quant is not None:
        return refuse("SGLang hands the indexer a quantized q_lora of its own")
    if pair is None:
        return refuse("q_lora is not rows our Q-side launch normed")
    group, why = block_group(indexer.wq_b)
    if group is None:
        return refuse(f"indexer {why}")
    if group != pair[2]:
        return refuse(f"the indexer's wq_b groups {group} columns, the pair {pair[2]}")
    return admit("reuse", "the pair our Q-side launch made of these rows")


def compute_q_hook(original, self, q_lora, positions, weight, q_lora_quant=None):
    admission = indexer_admission(self, q_lora, q_lora_quant)
    return dispatch.run(
        INDEXER_HOOK,
        admission,
        lambda: original(self, q_lora, positions, weight, getattr(q_lora, PAIR)[:2]),
        lambda: original(self, q_lora, positions, weight, q_lora_quant),
        replicated=True,
    )


HOOKS = (
    (_TARGET, normalize_q_lora_hook, HookType.AROUND),
    (_INDEXER, compute_q_hook, HookType.AROUND),
)
REQUIRES = (
    "sglang.srt.layers.quantization.fp8_utils._deepgemm_block_fp8_supported",
    "sglang.srt.layers.quantization.fp8_utils._ue8m0_deepgemm_skips_block32",
    "sglang.srt.layers.quantization.fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback",
)
