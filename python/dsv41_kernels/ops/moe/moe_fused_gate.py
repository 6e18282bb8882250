"""Fused MoE router for DeepSeek-V4.1's vision routing that can write packed expert ids.

A V4.1 checkpoint with a vision tower routes every MoE layer through the vision-aware router
(image tokens take an alternate score-correction bias), and FlashInfer's MXFP4 MoE runner
takes the routing as packed ids. Packing in a second launch costs one launch per layer; here
the router writes ``(id << 16) | bf16_bits(weight)`` from the values it already holds.

Contract: :func:`moe_fused_gate` computes :func:`dsv41_kernels.reference.vision_topk` in one
launch, a CTA, a warp or a program a token (scores ``sqrt(softplus(logit))`` in fp32, selection
by the biased score with the lowest expert id first on ties and NaN above every number, weights
from the unbiased scores). With ``packed_out`` the same launch also writes :func:`pack_topk` of its
own outputs, and the ids and weights are bit-identical with and without it. On sm_90+ it is a
programmatic dependent launch, as SGLang's own router is there.

Two kernels, the same bits, chosen once by the admission (:class:`MoeFusedGatePlan`): on sm_90+
with fp32 logits and biases and E = 32 M experts (M <= 16) up to
:data:`~dsv41_kernels.ops.moe.moe_fused_gate_cuda.CUDA_MAX_TOKENS` tokens, the CUDA kernel
(:mod:`.moe_fused_gate_cuda`, in one of its three layouts by tokens an SM); elsewhere (other
dtypes and widths, more tokens, the Triton interpreter) the Triton kernel
(:mod:`.moe_fused_gate_triton`), a program a token.

Exactness: on a GPU the kernels take exp and log1p from libdevice (the CUDA math library torch
uses, subnormals kept; the CUDA kernel writes log1p and sqrt as that library computes them,
without its branches: its score equals the library's for every fp32 logit), sqrt and division
with IEEE rounding, no FMA contraction, and sum the routed weights in selection order as the
reference does, so they are built to equal the torch reference bit for bit. The stated bound:
ids equal except where two biased scores lie within one fp32 ulp at the selection boundary,
weights within 2 fp32 ulp. Under the Triton interpreter exp and log1p come from numpy (float64,
then rounded) and the scores may sit 1 ulp from torch's CPU ones (whose sqrt is not always
correctly rounded either); given equal scores every later step is bit-exact, which the CPU
tests check.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import torch

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_flag,
    check_float,
    check_int,
    check_outputs,
    check_tensor,
    cuda_kernel_runs,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import cuda_index, multiprocessors
from dsv41_kernels.ops.moe.moe_fused_gate_cuda import (
    CTA_LAYOUT,
    LIST_LAYOUT,
    MODULE,
    WARP_LAYOUT,
    CudaLaunch,
    cuda_kernel_fits,
    cuda_layout,
    launch_cuda,
)
from dsv41_kernels.ops.moe.moe_fused_gate_triton import TritonLaunch, launch_triton, triton_launch
from dsv41_kernels.ops.moe.pack_topk import INDEX_DTYPES, pack_topk
from dsv41_kernels.reference.moe_fused_gate import vision_topk

MAX_TOP_K = 16
"""Slots per token the kernels keep in registers (V4.1 uses 6, +1 with a fused shared slot)."""
MAX_EXPERTS = 4096
"""Widest expert row the Triton kernel takes (rank keys allow 65535)."""

_LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT64 = torch.iinfo(torch.int64)


class Kernel(enum.Enum):
    """The kernel that runs; :attr:`Admission.kernel` is its value."""

    CUDA_CTA_LAYOUT = "cuda cta layout"
    """The CUDA kernel, a CTA a token (a thread an expert)."""
    CUDA_LIST_LAYOUT = "cuda list layout"
    """The CUDA kernel, 4 warps a token."""
    CUDA_WARP_LAYOUT = "cuda warp layout"
    """The CUDA kernel, a warp a token, 4 or 8 tokens a CTA."""
    TRITON = "triton"
    """The Triton kernel, a program a token."""


_CUDA_KERNELS = {
    CTA_LAYOUT: Kernel.CUDA_CTA_LAYOUT,
    LIST_LAYOUT: Kernel.CUDA_LIST_LAYOUT,
    WARP_LAYOUT: Kernel.CUDA_WARP_LAYOUT,
}


@dataclass(frozen=True)
class MoeFusedGatePlan:
    """What :func:`moe_fused_gate` launches: the kernel and its launch shape."""

    kernel: Kernel
    launch: CudaLaunch | TritonLaunch

    @property
    def module(self) -> str | None:
        """The CUDA module the kernel loads, None for the Triton kernel."""
        return None if self.kernel is Kernel.TRITON else MODULE


@dataclass(frozen=True)
class MoeFusedGateOptions:
    """How the selected scores become the routing weights (the reference's keywords)."""

    top_k: int
    renormalize: bool = True
    renormalize_eps: float = 1e-20
    routed_scaling_factor: float = 1.0
    scale_on_output: bool = False
    num_shared_slots: int = 0


def _validate_inputs(
    logits, bias, bias_alt, input_ids, image_token_id, num_token_non_padded
) -> tuple[int | None, int | torch.Tensor | None]:
    """Raise ValueError naming the argument; returns :func:`_scalars`."""
    check_tensor("logits", logits, ndim=2)
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    num_tokens, num_experts = logits.shape
    biases = [("bias", bias)] + ([("bias_alt", bias_alt)] if bias_alt is not None else [])
    for name, b in biases:
        check_tensor(name, b, dtypes=_BIAS_DTYPES, ndim=1)
        if b.shape[0] != num_experts:
            raise ValueError(f"{name} has {b.shape[0]} experts, logits {num_experts}")
    tensors = dict(biases)
    if bias_alt is not None:
        check_tensor("input_ids", input_ids, dtypes=INDEX_DTYPES, ndim=1)
        if input_ids.shape[0] != num_tokens:
            raise ValueError(f"input_ids has {input_ids.shape[0]} tokens, logits {num_tokens}")
        tensors["input_ids"] = input_ids
    if isinstance(num_token_non_padded, torch.Tensor):
        check_tensor("num_token_non_padded", num_token_non_padded, dtypes=INDEX_DTYPES)
        if num_token_non_padded.numel() != 1:
            raise ValueError(
                f"num_token_non_padded must hold one count, got shape "
                f"{tuple(num_token_non_padded.shape)}"
            )
        tensors["num_token_non_padded"] = num_token_non_padded
    _on_logits_device(logits, tensors)
    return _scalars(bias_alt, input_ids, image_token_id, num_token_non_padded)


def _on_logits_device(logits, tensors: dict[str, torch.Tensor | None]) -> None:
    """Raise ValueError naming the first tensor not on ``logits``' device (None: absent)."""
    for name, t in tensors.items():
        if t is not None and t.device != logits.device:
            raise ValueError(f"{name} must be on logits' device {logits.device}, got {t.device}")


def _scalars(
    bias_alt, input_ids, image_token_id, num_token_non_padded
) -> tuple[int | None, int | torch.Tensor | None]:
    """``image_token_id`` and an integer ``num_token_non_padded`` as Python ints (ValueError
    naming the argument otherwise); checked on every call, a caller's admission or not."""
    if image_token_id is not None:
        # An id outside input_ids' integer range matches no token in the reference; the
        # kernel would compare it in that range, so it is refused rather than wrapped.
        ids_dtype = getattr(input_ids, "dtype", None) if bias_alt is not None else None
        info = torch.iinfo(ids_dtype if ids_dtype in INDEX_DTYPES else torch.int64)
        image_token_id = check_int("image_token_id", image_token_id, low=info.min, high=info.max)
    if num_token_non_padded is not None and not isinstance(num_token_non_padded, torch.Tensor):
        num_token_non_padded = check_int(
            "num_token_non_padded", num_token_non_padded, low=_INT64.min, high=_INT64.max
        )
    return image_token_id, num_token_non_padded


def _options(
    top_k, renormalize, renormalize_eps, routed_scaling_factor, scale_on_output, num_shared_slots
) -> MoeFusedGateOptions:
    """The routing options, checked (ValueError naming the argument), as Python scalars."""
    top_k = check_int("top_k", top_k, low=1)
    num_shared_slots = check_int("num_shared_slots", num_shared_slots, low=0)
    if num_shared_slots >= top_k:
        raise ValueError(f"num_shared_slots must be in [0, top_k), got {num_shared_slots}")
    return MoeFusedGateOptions(
        top_k=top_k,
        renormalize=check_flag("renormalize", renormalize),
        renormalize_eps=check_float("renormalize_eps", renormalize_eps),
        routed_scaling_factor=check_float("routed_scaling_factor", routed_scaling_factor),
        scale_on_output=check_flag("scale_on_output", scale_on_output),
        num_shared_slots=num_shared_slots,
    )


def _validate_call(
    logits, options: MoeFusedGateOptions, bias_alt, image_token_id, packed_out, out_weights, out_ids
) -> None:
    """Raise ValueError naming the argument (inputs and options already checked)."""
    num_tokens, num_experts = logits.shape
    if bias_alt is not None and image_token_id is None:
        raise ValueError("image_token_id is required with bias_alt")
    top_k, num_shared_slots = options.top_k, options.num_shared_slots
    if top_k - num_shared_slots > num_experts:
        raise ValueError(
            f"top_k {top_k} routes {top_k - num_shared_slots} experts, more than {num_experts}"
        )
    outputs = (
        ("packed_out", packed_out, torch.int32),
        ("out_weights", out_weights, torch.float32),
        ("out_ids", out_ids, torch.int32),
    )
    for name, t, dtype in outputs:
        if t is None:
            continue
        check_tensor(name, t, dtypes=(dtype,), ndim=2)
        if tuple(t.shape) != (num_tokens, top_k):
            raise ValueError(f"{name} must have shape {(num_tokens, top_k)}, got {tuple(t.shape)}")
    given = {name: t for name, t, _ in outputs}
    _on_logits_device(logits, given)
    check_outputs(given)


def cuda_plan(logits: torch.Tensor) -> MoeFusedGatePlan:
    """The CUDA kernel in its layout for ``logits``' tokens on their GPU."""
    sms = multiprocessors(cuda_index(logits.device))
    launch = cuda_layout(logits.shape[0], sms)
    return MoeFusedGatePlan(_CUDA_KERNELS[launch.warps], launch)


def triton_plan(logits: torch.Tensor, top_k: int) -> MoeFusedGatePlan:
    """The Triton kernel's launch for ``logits`` and ``top_k`` slots."""
    num_tokens, num_experts = logits.shape
    launch = triton_launch(num_tokens, num_experts, top_k, logits.device)
    return MoeFusedGatePlan(Kernel.TRITON, launch)


def _plan(logits, bias, bias_alt, top_k) -> Admission:
    """The one choice of kernel and launch (arguments already validated)."""
    device = triton_device(logits)
    if not device:
        return device
    if logits.dtype not in _LOGIT_DTYPES:
        return refuse(f"logits dtype {logits.dtype} not in bf16/fp16/fp32")
    if logits.shape[1] > MAX_EXPERTS:
        return refuse(f"{logits.shape[1]} experts > {MAX_EXPERTS}")
    if top_k > MAX_TOP_K:
        return refuse(f"top_k {top_k} > {MAX_TOP_K}")
    cuda, note = cuda_kernel_runs(MODULE, logits, cuda_kernel_fits(logits, bias, bias_alt, top_k))
    if cuda:
        plan = cuda_plan(logits)
        reason = f"{device.reason}, {plan.kernel.value}{note}"
        return admit(plan.kernel.value, reason, plan.module, plan)
    plan = triton_plan(logits, top_k)
    return admit(plan.kernel.value, device.reason, plan=plan)


def moe_fused_gate_admission(
    logits: torch.Tensor,
    bias: torch.Tensor,
    *,
    bias_alt: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    image_token_id: int | None = None,
    top_k: int,
    num_token_non_padded: int | torch.Tensor | None = None,
) -> Admission:
    """Kernel or fallback, from devices, dtypes and sizes only (never values); the routing
    options other than ``top_k`` do not change the choice. Its ``plan`` is a
    :class:`MoeFusedGatePlan`."""
    try:
        _validate_inputs(logits, bias, bias_alt, input_ids, image_token_id, num_token_non_padded)
        top_k = check_int("top_k", top_k, low=1)
    except ValueError as e:
        return invalid(e)
    return _plan(logits, bias, bias_alt, top_k)


def moe_fused_gate(
    logits: torch.Tensor,
    bias: torch.Tensor,
    *,
    bias_alt: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    image_token_id: int | None = None,
    top_k: int,
    renormalize: bool = True,
    renormalize_eps: float = 1e-20,
    routed_scaling_factor: float = 1.0,
    scale_on_output: bool = False,
    num_shared_slots: int = 0,
    num_token_non_padded: int | torch.Tensor | None = None,
    packed_out: torch.Tensor | None = None,
    out_weights: torch.Tensor | None = None,
    out_ids: torch.Tensor | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vision-aware top-k routing in one launch; returns ``(topk_weights fp32, topk_ids int32)``.

    Args:
        logits: ``[T, E]`` bf16/fp16/fp32 gate outputs (any strides).
        bias: ``[E]`` score-correction bias (fp32, bf16 or fp16).
        bias_alt: ``[E]`` bias for image tokens, or None (every token takes ``bias``).
        input_ids: ``[T]`` int32/int64 token ids; required with ``bias_alt``.
        image_token_id: the id whose tokens take ``bias_alt`` (129264 for V4.1).
        top_k: slots per token, fused shared slots included (at most 16 on the kernels).
        renormalize: divide every weight by the routed weights' sum plus ``renormalize_eps``.
        renormalize_eps: added to that sum.
        routed_scaling_factor: the shared slots' weight is the routed sum divided by it; with
            ``scale_on_output`` every weight is multiplied by it last.
        scale_on_output: see ``routed_scaling_factor``.
        num_shared_slots: the last slots, fused shared experts ``E .. E + n - 1``.
        num_token_non_padded: rows at or past it get weight 0 and id -1; a Python int or a
            one-element int tensor on the logits' device, read by the kernel (no host sync).
        packed_out: ``[T, top_k]`` int32; when given, the same launch writes
            ``pack_topk(topk_ids, topk_weights)`` into it.
        out_weights: ``[T, top_k]`` fp32 output to write (allocated if None).
        out_ids: ``[T, top_k]`` int32 output to write (allocated if None). Every output given
            is on the logits' device and owns its elements, none shared with another.
        admission: this call's :func:`moe_fused_gate_admission`, when the caller already made it
            (an admitted one spares the input tensors' checks; the scalars and the outputs
            are checked on every call).
    """
    check_admission(admission)
    if admission is None or not admission:
        image_token_id, num_token_non_padded = _validate_inputs(
            logits, bias, bias_alt, input_ids, image_token_id, num_token_non_padded
        )
    else:  # an admitted admission has validated the input tensors: the scalars remain
        image_token_id, num_token_non_padded = _scalars(
            bias_alt, input_ids, image_token_id, num_token_non_padded
        )
    options = _options(
        top_k,
        renormalize,
        renormalize_eps,
        routed_scaling_factor,
        scale_on_output,
        num_shared_slots,
    )
    _validate_call(logits, options, bias_alt, image_token_id, packed_out, out_weights, out_ids)
    if admission is None:
        admission = _plan(logits, bias, bias_alt, options.top_k)
    num_tokens = logits.shape[0]
    shape = (num_tokens, options.top_k)
    if out_weights is None:
        out_weights = torch.empty(shape, dtype=torch.float32, device=logits.device)
    if out_ids is None:
        out_ids = torch.empty(shape, dtype=torch.int32, device=logits.device)
    if not admission:
        weights, ids = vision_topk(
            logits,
            bias,
            bias_alt,
            input_ids,
            image_token_id=image_token_id,
            num_token_non_padded=num_token_non_padded,
            **dataclasses.asdict(options),
        )
        out_weights.copy_(weights)
        out_ids.copy_(ids)
        if packed_out is not None:
            packed_out.copy_(pack_topk(out_ids, out_weights))
        return out_weights, out_ids
    if num_tokens:
        plan: MoeFusedGatePlan = admission.plan
        launch = launch_triton if plan.kernel is Kernel.TRITON else launch_cuda
        launch(
            plan.launch,
            logits,
            bias,
            options,
            bias_alt=bias_alt,
            input_ids=input_ids,
            image_token_id=image_token_id,
            valid_rows=num_tokens if num_token_non_padded is None else num_token_non_padded,
            weights=out_weights,
            ids=out_ids,
            packed=packed_out,
        )
    return out_weights, out_ids
