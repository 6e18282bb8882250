"""The Triton kernel of :func:`dsv41_kernels.ops.moe.moe_fused_gate.moe_fused_gate` and its launch.

One program a token (one warp for rows up to 512 experts, so each slot's two reductions stay in
the warp), any dtypes and widths up to :data:`dsv41_kernels.ops.moe.moe_fused_gate.MAX_EXPERTS`;
the op's admission chooses it and its :class:`TritonLaunch`, which the launcher runs as given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv41_kernels.devices import dependent_launch, one_wave
from dsv41_kernels.interpreter import serialized, triton_interpreter
from dsv41_kernels.ops.moe.pack_topk import packed_ids
from dsv41_kernels.reference.moe_fused_gate import SOFTPLUS_THRESHOLD

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
def _moe_fused_gate_kernel(
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
        packed = packed_ids(slot_ids, slot_weights)
        tl.store(
            packed_ptr + row * packed_row_stride + slots * packed_col_stride, packed, mask=in_top_k
        )


EXACT_OPTIONS = {"enable_fp_fusion": False, "enable_reflect_ftz": False}
"""No FMA contraction, and libdevice keeps subnormals (torch's build does; exp of a logit below
about -87 is a subnormal that sqrt turns into a normal score)."""


@dataclass(frozen=True)
class TritonLaunch:
    """The Triton kernel's launch: a program of ``num_warps`` warps a token."""

    num_warps: int
    block_experts: int
    """``BLOCK_E``: the row's experts rounded up to a power of two."""
    block_slots: int
    """``BLOCK_K``: ``top_k`` rounded up to a power of two."""
    dependent_launch: bool
    """``PDL``: a programmatic dependent launch (:func:`dsv41_kernels.devices.dependent_launch`)."""
    one_wave: bool
    """``ONE_WAVE``: the grid is resident at once, so the next dependent launch may start."""


def triton_launch(
    num_tokens: int, num_experts: int, top_k: int, device: torch.device
) -> TritonLaunch:
    """The launch shape for ``num_tokens`` rows of ``num_experts`` on ``device``."""
    block_experts = triton.next_power_of_2(num_experts)
    # One warp keeps each slot's reductions inside the warp (redux.sync); wider rows spread over
    # more warps.
    num_warps = max(1, min(8, block_experts // 512))
    pdl = dependent_launch(device)
    return TritonLaunch(
        num_warps=num_warps,
        block_experts=block_experts,
        block_slots=triton.next_power_of_2(top_k),
        dependent_launch=pdl,
        one_wave=pdl and one_wave(num_tokens, num_warps, device),
    )


def launch_triton(
    launch: TritonLaunch,
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
    """The Triton kernel over every row of ``logits`` (arguments as the op's, validated;
    ``options``: its :class:`~dsv41_kernels.ops.moe.moe_fused_gate.MoeFusedGateOptions`;
    ``valid_rows``: rows past it get weight 0 and id -1, an int or a one-element tensor)."""
    num_tokens, num_experts = logits.shape
    valid_from_ptr = isinstance(valid_rows, torch.Tensor)
    has_alt, has_packed = bias_alt is not None, packed is not None
    # Pointers a constexpr switches off get a placeholder tensor: never read or written.
    placeholder = ids
    packed = packed if has_packed else placeholder
    with serialized():
        _moe_fused_gate_kernel[(num_tokens,)](
            logits,
            logits.stride(0),
            logits.stride(1),
            bias,
            bias.stride(0),
            bias_alt if has_alt else bias,
            bias_alt.stride(0) if has_alt else 0,
            input_ids if has_alt else placeholder,
            input_ids.stride(0) if has_alt else 0,
            image_token_id if has_alt else 0,
            valid_rows if valid_from_ptr else placeholder,
            0 if valid_from_ptr else valid_rows,
            weights,
            weights.stride(0),
            weights.stride(1),
            ids,
            ids.stride(0),
            ids.stride(1),
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
            WRITE_PACKED=has_packed,
            BLOCK_E=launch.block_experts,
            BLOCK_K=launch.block_slots,
            PDL=launch.dependent_launch,
            ONE_WAVE=launch.one_wave,
            num_warps=launch.num_warps,
            launch_pdl=launch.dependent_launch,
            **EXACT_OPTIONS,
        )
