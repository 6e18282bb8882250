"""Fused MoE router for DeepSeek-V4.1's vision routing that can write packed expert ids.

A V4.1 checkpoint with a vision tower routes every MoE layer through the vision-aware router
(image tokens take an alternate score-correction bias), and FlashInfer's MXFP4 MoE runner
takes the routing as packed ids. Packing in a second launch costs one launch per layer; here
the router writes ``(id << 16) | bf16_bits(weight)`` from the values it already holds.

Contract: :func:`moe_fused_gate` computes :func:`dsv41_kernels.reference.vision_topk` in one
Triton launch (scores ``sqrt(softplus(logit))`` in fp32, selection by the biased score with the
lowest expert id first on ties and NaN above every number, weights from the unbiased scores).
With ``packed_out`` the same launch also writes :func:`pack_topk` of its own outputs, and the
ids and weights are bit-identical with and without it.

Exactness: on a GPU the kernel takes exp and log1p from libdevice (the CUDA math library torch
uses, subnormals kept), sqrt and division with IEEE rounding, no FMA contraction, and sums the
routed weights in selection order as the reference does, so it is built to equal the torch
reference bit for bit. The stated bound: ids equal except where two biased scores lie within
one fp32 ulp at the selection boundary, weights within 2 fp32 ulp. Under the Triton interpreter
exp and log1p come from numpy (float64, then rounded) and the scores may sit 1 ulp from torch's
CPU ones (whose sqrt is not always correctly rounded either); given equal scores every later
step is bit-exact, which the CPU tests check.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_tensor,
    refuse,
    triton_device,
    triton_interpreter,
)
from dsv41_kernels.check import CheckCase
from dsv41_kernels.reference.moe_router import SOFTPLUS_THRESHOLD, vision_topk
from dsv41_kernels.reference.moe_router import pack_topk as pack_topk_reference

MAX_TOP_K = 16
"""Slots per token the kernel keeps in registers (V4.1 uses 6, +1 with a fused shared slot)."""
MAX_EXPERTS = 4096
"""Widest expert row the one-program-per-token kernel takes (rank keys allow 65535)."""
PACKED_RUNNER = "flashinfer_mxfp4"
"""The only MoE runner in SGLang 0.5.23 that consumes packed ids."""
MEGAMOE_A2A = "megamoe"
"""SGLang's ``MoeA2ABackend.MEGAMOE`` value: its all-to-all takes unpacked ids."""
WEIGHT_ULP_BOUND = 2
"""Stated distance of the kernel's weights from the reference on a GPU, in fp32 ulp."""
INTERPRETER_WEIGHT_ULP_BOUND = 8
"""The same under the Triton interpreter, whose scores may be 1 ulp from torch's CPU ones; a
score ulp moves the renormalised weights by up to 6 ulp (measured over 1.2 M weights)."""

_LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


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
    return admit(f"{PACKED_RUNNER} consumes packed ids")


def moe_fused_gate_admission(
    logits: torch.Tensor,
    bias: torch.Tensor,
    *,
    bias_alt: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    top_k: int,
    num_token_non_padded: int | torch.Tensor | None = None,
) -> Admission:
    """Kernel or fallback, from devices, dtypes and sizes only (arguments already validated)."""
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
    return admit(device.reason)


_KEY_NONE = tl.constexpr(-(1 << 62))  # below every rank key: lanes past E, chosen experts
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
def _larger_key(key_a, score_a, key_b, score_b):
    a_wins = key_a > key_b
    return tl.where(a_wins, key_a, key_b), tl.where(a_wins, score_a, score_b)


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
):
    """One token per program: ``score = sqrt(softplus(x))``, ``biased = score + bias``; the
    ``TOP_K - NUM_SHARED`` largest rank keys of ``biased`` (see ``reference.rank_keys``) are
    taken one ``max`` at a time, each carrying its unbiased score as the weight."""
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
    key = ordered.to(tl.int64) * 65536 + (0xFFFF - experts)  # low 16 bits: 65535 - expert
    key = tl.where(is_expert, key, _KEY_NONE)

    slots = tl.arange(0, BLOCK_K)
    slot_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    slot_weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    routed_sum = tl.full([], 0.0, tl.float32)
    for slot in tl.static_range(TOP_K - NUM_SHARED):
        best_key, best_score = tl.reduce((key, score), 0, _larger_key)
        key = tl.where(key == best_key, _KEY_NONE, key)
        slot_ids = tl.where(slots == slot, (0xFFFF - (best_key & 0xFFFF)).to(tl.int32), slot_ids)
        slot_weights = tl.where(slots == slot, best_score, slot_weights)
        routed_sum = routed_sum + best_score  # left to right in selection order, as the reference

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
    # One warp keeps the per-slot max on warp shuffles; wider rows spread over more warps.
    return max(1, min(8, block_experts // 512))


def _launch(
    logits,
    bias,
    bias_alt,
    input_ids,
    image_token_id,
    valid_rows,
    out_weights,
    out_ids,
    packed_out,
    *,
    top_k,
    num_shared_slots,
    renormalize,
    renormalize_eps,
    routed_scaling_factor,
    scale_on_output,
):
    num_tokens, num_experts = logits.shape
    valid_from_ptr = isinstance(valid_rows, torch.Tensor)
    block_experts = triton.next_power_of_2(num_experts)
    has_alt = bias_alt is not None
    # Pointers a constexpr switches off get a placeholder tensor: never read or written.
    packed = packed_out if packed_out is not None else out_ids
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
        int(image_token_id) if has_alt else 0,
        valid_rows if valid_from_ptr else out_ids,
        0 if valid_from_ptr else int(valid_rows),
        out_weights,
        out_weights.stride(0),
        out_weights.stride(1),
        out_ids,
        out_ids.stride(0),
        out_ids.stride(1),
        packed,
        packed.stride(0),
        packed.stride(1),
        float(renormalize_eps),
        float(routed_scaling_factor),
        NUM_EXPERTS=num_experts,
        TOP_K=top_k,
        NUM_SHARED=num_shared_slots,
        RENORMALIZE=bool(renormalize),
        SCALE_ON_OUTPUT=bool(scale_on_output),
        HAS_BIAS_ALT=has_alt,
        VALID_ROWS_FROM_PTR=valid_from_ptr,
        WRITE_PACKED=packed_out is not None,
        BLOCK_E=block_experts,
        BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=_num_warps(block_experts),
        **_EXACT_OPTIONS,
    )


def pack_topk(ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(id << 16) | bf16_bits(weight)`` as int32 ``[T, k]`` (bf16 rounded to nearest even).

    One Triton launch for contiguous int32 ids and fp32 weights on a Triton device, the torch
    statement otherwise; both give the same bits (every NaN weight packs as 0x7FC0).
    """
    check_tensor("ids", ids, dtypes=_INDEX_DTYPES, ndim=2)
    check_tensor("weights", weights, ndim=2)
    if weights.shape != ids.shape:
        raise ValueError(f"weights shape {tuple(weights.shape)} != ids shape {tuple(ids.shape)}")
    kernel_ready = (
        triton_device(ids)
        and weights.device == ids.device
        and ids.dtype == torch.int32
        and weights.dtype == torch.float32
        and ids.is_contiguous()
        and weights.is_contiguous()
    )
    if not kernel_ready:
        return pack_topk_reference(ids, weights)
    packed = torch.empty_like(ids)
    if ids.numel():
        grid = (triton.cdiv(ids.numel(), _PACK_BLOCK),)
        _pack_topk_kernel[grid](ids, weights, packed, ids.numel(), BLOCK=_PACK_BLOCK)
    return packed


def _check_output(name, t, dtype, shape):
    check_tensor(name, t, dtypes=(dtype,), ndim=2)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def _validate(
    logits,
    bias,
    bias_alt,
    input_ids,
    image_token_id,
    top_k,
    num_shared_slots,
    num_token_non_padded,
    packed_out,
    out_weights,
    out_ids,
):
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
        if image_token_id is None:
            raise ValueError("image_token_id is required with bias_alt")
    if not 0 <= num_shared_slots < top_k:
        raise ValueError(f"num_shared_slots must be in [0, top_k), got {num_shared_slots}")
    if top_k - num_shared_slots > num_experts:
        raise ValueError(
            f"top_k {top_k} routes {top_k - num_shared_slots} experts, more than {num_experts}"
        )
    if isinstance(num_token_non_padded, torch.Tensor):
        check_tensor("num_token_non_padded", num_token_non_padded, dtypes=_INDEX_DTYPES)
        if num_token_non_padded.numel() != 1:
            raise ValueError(
                f"num_token_non_padded must hold one count, got shape "
                f"{tuple(num_token_non_padded.shape)}"
            )
    elif num_token_non_padded is not None and not isinstance(num_token_non_padded, int):
        raise ValueError(
            f"num_token_non_padded must be an int or a tensor, got "
            f"{type(num_token_non_padded).__name__}"
        )
    shape = (num_tokens, top_k)
    for name, t, dtype in (
        ("packed_out", packed_out, torch.int32),
        ("out_weights", out_weights, torch.float32),
        ("out_ids", out_ids, torch.int32),
    ):
        if t is not None:
            _check_output(name, t, dtype, shape)


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
    """
    _validate(
        logits,
        bias,
        bias_alt,
        input_ids,
        image_token_id,
        top_k,
        num_shared_slots,
        num_token_non_padded,
        packed_out,
        out_weights,
        out_ids,
    )
    num_tokens = logits.shape[0]
    shape = (num_tokens, top_k)
    if out_weights is None:
        out_weights = torch.empty(shape, dtype=torch.float32, device=logits.device)
    if out_ids is None:
        out_ids = torch.empty(shape, dtype=torch.int32, device=logits.device)
    routing = {
        "top_k": top_k,
        "renormalize": renormalize,
        "renormalize_eps": renormalize_eps,
        "routed_scaling_factor": routed_scaling_factor,
        "scale_on_output": scale_on_output,
        "num_shared_slots": num_shared_slots,
    }
    admission = moe_fused_gate_admission(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        top_k=top_k,
        num_token_non_padded=num_token_non_padded,
    )
    if not admission:
        weights, ids = vision_topk(
            logits,
            bias,
            bias_alt,
            input_ids,
            image_token_id=image_token_id,
            num_token_non_padded=num_token_non_padded,
            **routing,
        )
        out_weights.copy_(weights)
        out_ids.copy_(ids)
        if packed_out is not None:
            packed_out.copy_(pack_topk(out_ids, out_weights))
        return out_weights, out_ids
    if num_tokens:
        valid_rows = num_tokens if num_token_non_padded is None else num_token_non_padded
        _launch(
            logits,
            bias,
            bias_alt,
            input_ids,
            image_token_id,
            valid_rows,
            out_weights,
            out_ids,
            packed_out,
            **routing,
        )
    return out_weights, out_ids


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
    return found


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
