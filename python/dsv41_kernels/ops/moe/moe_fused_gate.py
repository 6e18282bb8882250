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

Two kernels, the same bits: on sm_90+ with fp32 logits and biases and E = 32 M experts (M <=
16) up to :data:`CUDA_MAX_TOKENS` tokens, the CUDA kernel of ``sgl-kernel/csrc/moe_fused_gate.cu``
(:func:`cuda_layout`: up to one token an SM a CTA a token, a thread an expert, the experts
ranked into 32 sorted lists in shared memory, then one warp takes each slot from the lists'
heads with two warp reductions and a shuffle; beyond, 4 warps or one warp a token, one warp
taking the slots from the lists in its registers);
elsewhere (other dtypes and widths, more tokens, the Triton interpreter) the Triton kernel
below, one warp a token.

Exactness: on a GPU the kernels take exp and log1p from libdevice (the CUDA math library torch
uses, subnormals kept; the CUDA kernel writes log1p and sqrt as that library computes them,
without its branches: its score equals the library's for all 2^32 fp32 logits on the H200),
sqrt and division with IEEE rounding, no FMA contraction, and sum the routed weights in
selection order as the reference does, so they are built to equal the torch reference bit for
bit. The stated bound: ids equal except where two biased scores lie within one fp32 ulp at the
selection boundary, weights within 2 fp32 ulp. Under the Triton interpreter
exp and log1p come from numpy (float64, then rounded) and the scores may sit 1 ulp from torch's
CPU ones (whose sqrt is not always correctly rounded either); given equal scores every later
step is bit-exact, which the CPU tests check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_flag,
    check_float,
    check_int,
    check_tensor,
    cuda_kernel_runs,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import cuda_index, dependent_launch, multiprocessors, one_wave, sm_major
from dsv41_kernels.interpreter import serialized, triton_interpreter
from dsv41_kernels.jit import load_module
from dsv41_kernels.reference.moe_router import SOFTPLUS_THRESHOLD, vision_topk
from dsv41_kernels.reference.moe_router import pack_topk as pack_topk_reference

MAX_TOP_K = 16
"""Slots per token the kernel keeps in registers (V4.1 uses 6, +1 with a fused shared slot)."""
MAX_EXPERTS = 4096
"""Widest expert row the one-program-per-token kernel takes (rank keys allow 65535)."""
TRITON = "triton"
CUDA = "cuda"
"""The kernel names an admission carries."""
MODULE = "moe_fused_gate"  # sgl-kernel/csrc/moe_fused_gate.cu
CUDA_MAX_EXPERTS = 512
"""The CUDA kernel's widest row (a thread an expert, 32 lists of at most 16), E % 32 == 0."""
CUDA_MAX_TOKENS = 65536
"""The CUDA kernel's most tokens, the most measured; past it the Triton kernel. On the H200 the
CUDA kernel's warp layout took 6.07 / 8.35 / 26.12 / 96.88 us at 2560 / 4096 / 16384 / 65536
tokens against the Triton kernel's 6.97 / 10.08 / 33.89 / 127.71 and SGLang's 7.76 / 11.10 /
37.35 / 141.41 (session 13, ``docs/results/h200/session13/call2/logs/router_probe2.log``)."""
CTA_LAYOUT_TOKENS_PER_SM = 1
LIST_LAYOUT_TOKENS_PER_SM = 5
"""The CUDA kernel's layouts, by tokens per SM (:func:`cuda_layout`): a CTA a token (a thread an
expert) up to one token an SM, 4 warps a token up to five, a warp a token beyond. On the H200
(132 SMs; session 12, ``docs/results/h200/session12/call3/logs/list_sweep.log``) the CTA layout
took 2.16 against 2.43 us at 128 tokens, the list layout 2.51 against 2.60 at 256 and 3.27
against 3.65 (the warp layout) at 640, the warp layout 3.78 against 4.45 at 1024."""
WARP_LAYOUT_TOKENS_PER_CTA = (4, 8)
"""The warp layout's CTA sizes, tokens a CTA (:func:`warp_layout_tokens_per_cta`)."""
CTA_LAYOUT, LIST_LAYOUT, WARP_LAYOUT = 0, 4, 1
"""The CUDA kernel's ``warps`` argument: 0 for a CTA a token, else warps a token."""

_LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class RouterOptions:
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
    """Raise ValueError naming the argument; returns ``image_token_id`` and
    ``num_token_non_padded`` with NumPy integers made Python ints."""
    check_tensor("logits", logits, ndim=2)
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    num_tokens, num_experts = logits.shape
    biases = [("bias", bias)] + ([("bias_alt", bias_alt)] if bias_alt is not None else [])
    for name, b in biases:
        check_tensor(name, b, dtypes=_BIAS_DTYPES, ndim=1)
        if b.shape[0] != num_experts:
            raise ValueError(f"{name} has {b.shape[0]} experts, logits {num_experts}")
    if bias_alt is not None:
        check_tensor("input_ids", input_ids, dtypes=_INDEX_DTYPES, ndim=1)
        if input_ids.shape[0] != num_tokens:
            raise ValueError(f"input_ids has {input_ids.shape[0]} tokens, logits {num_tokens}")
    if image_token_id is not None:
        # An id outside input_ids' integer range matches no token in the reference; the
        # kernel would compare it in that range, so it is refused rather than wrapped.
        info = torch.iinfo(input_ids.dtype if bias_alt is not None else torch.int64)
        image_token_id = check_int("image_token_id", image_token_id, low=info.min, high=info.max)
    if isinstance(num_token_non_padded, torch.Tensor):
        check_tensor("num_token_non_padded", num_token_non_padded, dtypes=_INDEX_DTYPES)
        if num_token_non_padded.numel() != 1:
            raise ValueError(
                f"num_token_non_padded must hold one count, got shape "
                f"{tuple(num_token_non_padded.shape)}"
            )
    elif num_token_non_padded is not None:
        num_token_non_padded = check_int("num_token_non_padded", num_token_non_padded)
    return image_token_id, num_token_non_padded


def _router_options(
    top_k, renormalize, renormalize_eps, routed_scaling_factor, scale_on_output, num_shared_slots
) -> RouterOptions:
    """The routing options, checked (ValueError naming the argument), as Python scalars."""
    top_k = check_int("top_k", top_k, low=1)
    num_shared_slots = check_int("num_shared_slots", num_shared_slots, low=0)
    if num_shared_slots >= top_k:
        raise ValueError(f"num_shared_slots must be in [0, top_k), got {num_shared_slots}")
    return RouterOptions(
        top_k=top_k,
        renormalize=check_flag("renormalize", renormalize),
        renormalize_eps=check_float("renormalize_eps", renormalize_eps),
        routed_scaling_factor=check_float("routed_scaling_factor", routed_scaling_factor),
        scale_on_output=check_flag("scale_on_output", scale_on_output),
        num_shared_slots=num_shared_slots,
    )


def _check_output(name, t, dtype, shape):
    check_tensor(name, t, dtypes=(dtype,), ndim=2)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def _validate(logits, bias, options: RouterOptions, vision: dict, outputs) -> None:
    """Raise ValueError naming the argument (the inputs already checked). ``vision``:
    ``bias_alt``, ``input_ids`` and ``image_token_id``; ``outputs``: ``packed_out``,
    ``out_weights``, ``out_ids`` (or None)."""
    num_tokens, num_experts = logits.shape
    if vision["bias_alt"] is not None and vision["image_token_id"] is None:
        raise ValueError("image_token_id is required with bias_alt")
    top_k, num_shared_slots = options.top_k, options.num_shared_slots
    if top_k - num_shared_slots > num_experts:
        raise ValueError(
            f"top_k {top_k} routes {top_k - num_shared_slots} experts, more than {num_experts}"
        )
    for (name, t), dtype in zip(outputs.items(), (torch.int32, torch.float32, torch.int32)):
        if t is not None:
            _check_output(name, t, dtype, (num_tokens, top_k))


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
        and top_k <= MAX_TOP_K
    )


def warp_layout_tokens_per_cta(num_tokens: int, multiprocessors: int) -> int:
    """Tokens a CTA of the CUDA kernel's warp layout: the fewest warps on the busiest SM (its
    time follows them), then the larger CTA. On the H200 (132 SMs, session 12,
    ``docs/results/h200/session12/call1/logs/warp_sweep.log``) this picks 4 at 320 / 512 / 1536
    tokens and 8 at 640 / 768 / 1024 / 2048, the faster of the two at each (3.07 against 3.63 us
    at 512, 3.70 against 3.80 at 640, 4.78 against 5.62 at 1536)."""

    def busiest(tokens_per_cta: int) -> tuple[int, int]:
        ctas = -(-num_tokens // tokens_per_cta)
        return tokens_per_cta * -(-ctas // multiprocessors), -tokens_per_cta

    return min(WARP_LAYOUT_TOKENS_PER_CTA, key=busiest)


def _plan(logits, bias, bias_alt, input_ids, top_k, num_token_non_padded) -> Admission:
    device = triton_device(logits)
    if not device:
        return device
    tensors = {"bias": bias, "bias_alt": bias_alt, "input_ids": input_ids}
    if isinstance(num_token_non_padded, torch.Tensor):
        tensors["num_token_non_padded"] = num_token_non_padded
    for name, t in tensors.items():
        if t is not None and t.device != logits.device:
            return refuse(f"{name} is on {t.device}, logits on {logits.device}")
    if logits.dtype not in _LOGIT_DTYPES:
        return refuse(f"logits dtype {logits.dtype} not in bf16/fp16/fp32")
    if logits.shape[1] > MAX_EXPERTS:
        return refuse(f"{logits.shape[1]} experts > {MAX_EXPERTS}")
    if top_k > MAX_TOP_K:
        return refuse(f"top_k {top_k} > {MAX_TOP_K}")
    cuda, note = cuda_kernel_runs(MODULE, logits, cuda_kernel_fits(logits, bias, bias_alt, top_k))
    if cuda:
        return admit(CUDA, f"{device.reason}, {CUDA}{note}", MODULE)
    return admit(TRITON, device.reason)


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
    options other than ``top_k`` do not change the choice."""
    try:
        _validate_inputs(logits, bias, bias_alt, input_ids, image_token_id, num_token_non_padded)
        top_k = check_int("top_k", top_k, low=1)
    except ValueError as e:
        return invalid(e)
    return _plan(logits, bias, bias_alt, input_ids, top_k, num_token_non_padded)


_RANK_NONE = tl.constexpr(-(1 << 31))  # below every ordered score: lanes past E, chosen experts
_NAN_RANK = tl.constexpr(0x7FFFFFFF)  # above +inf's bits: NaN ranks first
_THRESHOLD = tl.constexpr(SOFTPLUS_THRESHOLD)


if triton_interpreter():

    @triton.jit
    def _softplus(x):
        """softplus(x) in fp32; the interpreter has no libdevice, so log1p runs in float64."""
        big = x > _THRESHOLD
        e = tl.exp(tl.where(big, 0.0, x).to(tl.float64))
        u = 1.0 + e
        # log(u) * e / (u - 1) is log1p(e) to float64 precision; where 1 + e rounds to 1 it is e.
        rounded_away = u == 1.0
        log1p = tl.log(u) * (e / tl.where(rounded_away, 1.0, u - 1.0))
        return tl.where(big, x, tl.where(rounded_away, e, log1p).to(tl.float32))

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _softplus(x):
        """softplus(x) in fp32 with the CUDA math library's expf and log1pf, as torch uses."""
        return tl.where(x > _THRESHOLD, x, libdevice.log1p(libdevice.exp(x)))


@triton.jit
def _packed_ids(ids, weights):
    """``(id << 16) | bf16_bits(weight)``, bf16 rounded to nearest even on the integer bits."""
    bits = weights.to(tl.int32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    bf16 = tl.where(weights != weights, 0x7FC0, rounded)
    return (ids << 16) | bf16


@triton.jit
def _vision_router_kernel(
    logits_ptr,
    logits_row_stride,
    logits_col_stride,
    bias_ptr,
    bias_stride,
    bias_alt_ptr,
    bias_alt_stride,
    input_ids_ptr,
    input_ids_stride,
    image_token_id,
    valid_rows_ptr,
    valid_rows,
    weights_ptr,
    weights_row_stride,
    weights_col_stride,
    ids_ptr,
    ids_row_stride,
    ids_col_stride,
    packed_ptr,
    packed_row_stride,
    packed_col_stride,
    renormalize_eps,
    routed_scaling_factor,
    NUM_EXPERTS: tl.constexpr,
    TOP_K: tl.constexpr,
    NUM_SHARED: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    SCALE_ON_OUTPUT: tl.constexpr,
    HAS_BIAS_ALT: tl.constexpr,
    VALID_ROWS_FROM_PTR: tl.constexpr,
    WRITE_PACKED: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    ONE_WAVE: tl.constexpr,
):
    """One token per program: ``score = sqrt(softplus(x))``, ``biased = score + bias``; the
    ``TOP_K - NUM_SHARED`` largest rank keys of ``biased`` (see ``reference.rank_keys``) are
    taken one at a time, each carrying its unbiased score as the weight. With ``PDL`` (a
    programmatic dependent launch) nothing is read before the previous grid has finished, and
    with ``ONE_WAVE`` (the grid is resident at once) the next dependent launch may start at
    once (it waits for this grid the same way)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        if ONE_WAVE:
            tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    is_expert = experts < NUM_EXPERTS
    x = tl.load(
        logits_ptr + row * logits_row_stride + experts * logits_col_stride,
        mask=is_expert,
        other=0.0,
    )
    score = tl.sqrt_rn(_softplus(x.to(tl.float32)))
    bias = tl.load(bias_ptr + experts * bias_stride, mask=is_expert, other=0.0).to(tl.float32)
    if HAS_BIAS_ALT:
        is_image = tl.load(input_ids_ptr + row * input_ids_stride) == image_token_id
        bias_alt = tl.load(bias_alt_ptr + experts * bias_alt_stride, mask=is_expert, other=0.0)
        bias = tl.where(is_image, bias_alt.to(tl.float32), bias)
    biased = score + bias

    bits = biased.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    ordered = tl.where(biased != biased, _NAN_RANK, ordered)
    ordered = tl.where(is_expert, ordered, _RANK_NONE)
    score_bits = score.to(tl.int32, bitcast=True)

    slots = tl.arange(0, BLOCK_K)
    slot_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    slot_weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    routed_sum = tl.full([], 0.0, tl.float32)
    # Each slot is the reference's largest rank key taken as two int32 reductions (the largest
    # ordered score, then the lowest expert holding it), which a warp does in one redux.sync each
    # where the (int64 key, score) pair took shuffles; the weight's bits are summed out of the
    # one lane holding them.
    for slot in tl.static_range(TOP_K - NUM_SHARED):
        best = tl.max(ordered, 0)
        expert = tl.min(tl.where(ordered == best, experts, BLOCK_E), 0)
        chosen = experts == expert
        weight = tl.sum(tl.where(chosen, score_bits, 0), 0).to(tl.float32, bitcast=True)
        ordered = tl.where(chosen, _RANK_NONE, ordered)
        slot_ids = tl.where(slots == slot, expert, slot_ids)
        slot_weights = tl.where(slots == slot, weight, slot_weights)
        routed_sum = routed_sum + weight  # left to right in selection order, as the reference

    if NUM_SHARED > 0:
        is_shared = (slots >= TOP_K - NUM_SHARED) & (slots < TOP_K)
        shared_ids = NUM_EXPERTS + slots - (TOP_K - NUM_SHARED)
        shared_weight = tl.div_rn(routed_sum, routed_scaling_factor)
        slot_ids = tl.where(is_shared, shared_ids, slot_ids)
        slot_weights = tl.where(is_shared, shared_weight, slot_weights)
    if RENORMALIZE:
        denominator = tl.zeros([BLOCK_K], dtype=tl.float32) + (routed_sum + renormalize_eps)
        slot_weights = tl.div_rn(slot_weights, denominator)
    if SCALE_ON_OUTPUT:
        slot_weights = slot_weights * routed_scaling_factor

    limit = tl.load(valid_rows_ptr) if VALID_ROWS_FROM_PTR else valid_rows
    is_valid = row < limit
    slot_weights = tl.where(is_valid, slot_weights, 0.0)
    slot_ids = tl.where(is_valid, slot_ids, -1)

    in_top_k = slots < TOP_K
    tl.store(
        weights_ptr + row * weights_row_stride + slots * weights_col_stride,
        slot_weights,
        mask=in_top_k,
    )
    tl.store(ids_ptr + row * ids_row_stride + slots * ids_col_stride, slot_ids, mask=in_top_k)
    if WRITE_PACKED:
        packed = _packed_ids(slot_ids, slot_weights)
        tl.store(
            packed_ptr + row * packed_row_stride + slots * packed_col_stride, packed, mask=in_top_k
        )


@triton.jit
def _pack_topk_kernel(ids_ptr, weights_ptr, packed_ptr, numel, BLOCK: tl.constexpr):
    """The separate pack launch the fused router replaces (contiguous ``[T, k]`` inputs)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < numel
    ids = tl.load(ids_ptr + offs, mask=inside)
    weights = tl.load(weights_ptr + offs, mask=inside)
    tl.store(packed_ptr + offs, _packed_ids(ids, weights), mask=inside)


# Kernel options: no FMA contraction, and libdevice keeps subnormals (torch's build does;
# exp of a logit below about -87 is a subnormal that sqrt turns into a normal score).
_EXACT_OPTIONS = {"enable_fp_fusion": False, "enable_reflect_ftz": False}
_PACK_BLOCK = 1024


def _num_warps(block_experts: int) -> int:
    # One warp keeps each slot's reductions inside the warp (redux.sync); wider rows spread over
    # more warps.
    return max(1, min(8, block_experts // 512))


def _launch(logits, bias, options: RouterOptions, vision: dict, valid_rows, outputs: dict):
    num_tokens, num_experts = logits.shape
    bias_alt, input_ids = vision["bias_alt"], vision["input_ids"]
    packed_out, out_weights, out_ids = outputs.values()
    valid_from_ptr = isinstance(valid_rows, torch.Tensor)
    block_experts = triton.next_power_of_2(num_experts)
    has_alt = bias_alt is not None
    # Pointers a constexpr switches off get a placeholder tensor: never read or written.
    packed = packed_out if packed_out is not None else out_ids
    pdl = dependent_launch(logits.device)
    num_warps = _num_warps(block_experts)
    with serialized():
        _vision_router_kernel[(num_tokens,)](
            logits,
            logits.stride(0),
            logits.stride(1),
            bias,
            bias.stride(0),
            bias_alt if has_alt else bias,
            bias_alt.stride(0) if has_alt else 0,
            input_ids if has_alt else out_ids,
            input_ids.stride(0) if has_alt else 0,
            vision["image_token_id"] if has_alt else 0,
            valid_rows if valid_from_ptr else out_ids,
            0 if valid_from_ptr else valid_rows,
            out_weights,
            out_weights.stride(0),
            out_weights.stride(1),
            out_ids,
            out_ids.stride(0),
            out_ids.stride(1),
            packed,
            packed.stride(0),
            packed.stride(1),
            options.renormalize_eps,
            options.routed_scaling_factor,
            NUM_EXPERTS=num_experts,
            TOP_K=options.top_k,
            NUM_SHARED=options.num_shared_slots,
            RENORMALIZE=options.renormalize,
            SCALE_ON_OUTPUT=options.scale_on_output,
            HAS_BIAS_ALT=has_alt,
            VALID_ROWS_FROM_PTR=valid_from_ptr,
            WRITE_PACKED=packed_out is not None,
            BLOCK_E=block_experts,
            BLOCK_K=triton.next_power_of_2(options.top_k),
            PDL=pdl,
            ONE_WAVE=pdl and one_wave(num_tokens, num_warps, logits.device),
            num_warps=num_warps,
            launch_pdl=pdl,
            **_EXACT_OPTIONS,
        )


def cuda_layout(num_tokens: int, multiprocessors: int) -> tuple[int, int]:
    """The CUDA kernel's ``(warps, tokens_per_cta)`` for ``num_tokens`` on a GPU of
    ``multiprocessors`` SMs (:data:`LIST_LAYOUT_TOKENS_PER_SM`)."""
    if num_tokens <= CTA_LAYOUT_TOKENS_PER_SM * multiprocessors:
        return CTA_LAYOUT, 1
    if num_tokens <= LIST_LAYOUT_TOKENS_PER_SM * multiprocessors:
        return LIST_LAYOUT, 1
    return WARP_LAYOUT, warp_layout_tokens_per_cta(num_tokens, multiprocessors)


def _launch_cuda(logits, bias, options: RouterOptions, vision: dict, valid_rows, outputs: dict):
    bias_alt, input_ids = vision["bias_alt"], vision["input_ids"]
    packed_out, out_weights, out_ids = outputs.values()
    none = logits.new_empty(0)  # an argument the kernel does not read
    valid_from_tensor = isinstance(valid_rows, torch.Tensor)
    device_index = cuda_index(logits.device)
    load_module(MODULE, device_index).moe_fused_gate_cuda(
        logits,
        bias,
        none if bias_alt is None else bias_alt,
        none if bias_alt is None else input_ids,
        vision["image_token_id"] if bias_alt is not None else 0,
        valid_rows.reshape(1) if valid_from_tensor else none,
        0 if valid_from_tensor else valid_rows,
        out_weights,
        out_ids,
        none if packed_out is None else packed_out,
        options.num_shared_slots,
        options.renormalize,
        options.renormalize_eps,
        options.routed_scaling_factor,
        options.scale_on_output,
        *cuda_layout(logits.shape[0], multiprocessors(device_index)),
    )


def _validate_pack(ids, weights) -> None:
    check_tensor("ids", ids, dtypes=_INDEX_DTYPES, ndim=2)
    check_tensor("weights", weights, ndim=2)
    if not weights.dtype.is_floating_point:
        raise ValueError(f"weights must be floating point, got {weights.dtype}")
    if weights.shape != ids.shape:
        raise ValueError(f"weights shape {tuple(weights.shape)} != ids shape {tuple(ids.shape)}")


def pack_topk_admission(ids: torch.Tensor, weights: torch.Tensor) -> Admission:
    """Whether :func:`pack_topk` takes its Triton launch; pure (dtypes, layouts, devices)."""
    try:
        _validate_pack(ids, weights)
    except ValueError as e:
        return invalid(e)
    device = triton_device(ids)
    if not device:
        return device
    if weights.device != ids.device:
        return refuse(f"weights on {weights.device}, ids on {ids.device}")
    if ids.dtype != torch.int32 or weights.dtype != torch.float32:
        return refuse("the kernel packs int32 ids and fp32 weights")
    if not (ids.is_contiguous() and weights.is_contiguous()):
        return refuse("ids or weights not contiguous")
    return admit(TRITON, device.reason)


def pack_topk(
    ids: torch.Tensor, weights: torch.Tensor, *, admission: Admission | None = None
) -> torch.Tensor:
    """``(id << 16) | bf16_bits(weight)`` as int32 ``[T, k]`` (bf16 rounded to nearest even).

    One Triton launch for contiguous int32 ids and fp32 weights on a Triton device
    (:func:`pack_topk_admission`), the torch statement otherwise; both give the same bits
    (every NaN weight packs as 0x7FC0).
    """
    _validate_pack(ids, weights)
    if admission is None:
        admission = pack_topk_admission(ids, weights)
    if not admission:
        return pack_topk_reference(ids, weights)
    packed = torch.empty_like(ids)
    if ids.numel():
        grid = (triton.cdiv(ids.numel(), _PACK_BLOCK),)
        with serialized():
            _pack_topk_kernel[grid](ids, weights, packed, ids.numel(), BLOCK=_PACK_BLOCK)
    return packed


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
        top_k: slots per token, fused shared slots included (at most 16 on the kernel).
        renormalize, renormalize_eps, routed_scaling_factor, scale_on_output,
            num_shared_slots: as in :func:`dsv41_kernels.reference.vision_topk`.
        num_token_non_padded: rows at or past it get weight 0 and id -1; a Python int or a
            one-element int tensor on the logits' device, read by the kernel (no host sync).
        packed_out: ``[T, top_k]`` int32; when given, the same launch writes
            ``pack_topk(topk_ids, topk_weights)`` into it.
        out_weights, out_ids: ``[T, top_k]`` fp32 / int32 outputs to write (allocated if None).
        admission: this call's :func:`moe_fused_gate_admission`, when the caller already made it.
    """
    image_token_id, num_token_non_padded = _validate_inputs(
        logits, bias, bias_alt, input_ids, image_token_id, num_token_non_padded
    )
    options = _router_options(
        top_k,
        renormalize,
        renormalize_eps,
        routed_scaling_factor,
        scale_on_output,
        num_shared_slots,
    )
    top_k = options.top_k
    vision = {"bias_alt": bias_alt, "input_ids": input_ids, "image_token_id": image_token_id}
    outputs = {"packed_out": packed_out, "out_weights": out_weights, "out_ids": out_ids}
    _validate(logits, bias, options, vision, outputs)
    if admission is None:
        admission = _plan(logits, bias, bias_alt, input_ids, top_k, num_token_non_padded)
    num_tokens = logits.shape[0]
    if out_weights is None:
        out_weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=logits.device)
    if out_ids is None:
        out_ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=logits.device)
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
        valid_rows = num_tokens if num_token_non_padded is None else num_token_non_padded
        outputs = {"packed_out": packed_out, "out_weights": out_weights, "out_ids": out_ids}
        launch = _launch_cuda if admission.kernel == CUDA else _launch
        launch(logits, bias, options, vision, valid_rows, outputs)
    return out_weights, out_ids
