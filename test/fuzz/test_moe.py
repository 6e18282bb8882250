"""Fuzz: moe_fused_gate and pack_topk against the reference router and packer, bit for bit.

The reference's scores come from the interpreter's own arithmetic (exp and log1p in float64,
as :func:`test.ops.moe.test_moe_fused_gate.numpy_sqrt_softplus`), so every later step, the
selection included, must match exactly (the module's contract under the interpreter)."""

from unittest import mock

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import dsv41_kernels.reference.moe_fused_gate as reference
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, moe_fused_gate_admission
from dsv41_kernels.ops.moe.pack_topk import pack_topk, pack_topk_admission
from dsv41_kernels.reference import pack_topk as pack_reference
from dsv41_kernels.reference import vision_topk
from test.ops.moe.test_moe_fused_gate import numpy_sqrt_softplus

from .values import FUZZ, laid_out, tensors

pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),  # inf / inf
]

IMAGE = 129264
FLOATS = st.sampled_from((torch.float32, torch.bfloat16, torch.float16))


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_moe_fused_gate_is_the_reference_router(data):
    num_tokens = data.draw(st.integers(0, 5))
    num_experts = data.draw(st.integers(8, 70) if data.draw(st.integers(0, 5)) else st.just(300))
    logits = data.draw(laid_out(data.draw(tensors(num_tokens, num_experts, data.draw(FLOATS)))))
    bias = data.draw(tensors(1, num_experts, data.draw(FLOATS), log2_scale=(-6, -2)))[0]
    num_shared_slots = data.draw(st.integers(0, 2))
    top_k = data.draw(st.integers(num_shared_slots + 1, num_shared_slots + 8))
    bias_alt = input_ids = None
    if data.draw(st.booleans()):
        bias_alt = data.draw(tensors(1, num_experts, bias.dtype, log2_scale=(-6, -2)))[0]
        ids = data.draw(
            st.lists(st.sampled_from((IMAGE, 0, 7)), min_size=num_tokens, max_size=num_tokens)
        )
        input_ids = torch.tensor(ids, dtype=data.draw(st.sampled_from((torch.int32, torch.int64))))
    padded = data.draw(st.none() | st.integers(0, num_tokens))
    if padded is not None and data.draw(st.booleans()):
        padded = torch.tensor([padded], dtype=torch.int32)
    routing = dict(
        top_k=top_k,
        num_shared_slots=num_shared_slots,
        renormalize=data.draw(st.booleans()),
        renormalize_eps=data.draw(st.sampled_from((1e-20, 0.0, 1e-3))),
        routed_scaling_factor=data.draw(st.sampled_from((1.0, 1.5, 2.5))),
        scale_on_output=data.draw(st.booleans()),
        num_token_non_padded=padded,
    )
    vision = dict(bias_alt=bias_alt, input_ids=input_ids, image_token_id=IMAGE)
    event(moe_fused_gate_admission(logits, bias, **vision, top_k=top_k).path)
    packed = torch.empty(num_tokens, top_k, dtype=torch.int32)
    with mock.patch.object(reference, "sqrt_softplus", numpy_sqrt_softplus):
        weights, ids = moe_fused_gate(logits, bias, **vision, **routing, packed_out=packed)
        ref_weights, ref_ids = vision_topk(
            logits, bias, bias_alt, input_ids, **routing, image_token_id=IMAGE
        )
    assert torch.equal(ids, ref_ids)
    assert torch.equal(weights.view(torch.int32), ref_weights.view(torch.int32))
    assert torch.equal(packed, pack_reference(ids, weights))


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_pack_topk_is_the_reference_packer(data):
    rows, cols = data.draw(st.integers(0, 70)), data.draw(st.integers(1, 9))
    ids = torch.tensor(
        data.draw(st.lists(st.integers(-1, 4095), min_size=rows * cols, max_size=rows * cols)),
        dtype=data.draw(st.sampled_from((torch.int32, torch.int32, torch.int64))),
    ).view(rows, cols)
    weights = data.draw(
        laid_out(data.draw(tensors(rows, cols, data.draw(FLOATS), max_specials=12)))
    )
    event(pack_topk_admission(ids, weights).path)
    assert torch.equal(pack_topk(ids, weights), pack_reference(ids, weights))
