import math

import pytest
import torch

import dsv41_kernels.reference.moe_fused_gate as reference
from dsv41_kernels.ops.moe.pack_topk import PackTopkPlan, pack_topk, pack_topk_admission
from test.machine import needs_kernel


def unpack(packed):
    ids = packed >> 16
    weights = (packed & 0xFFFF).to(torch.int16).view(torch.bfloat16).float()
    return ids, weights


def packing_weights(gen, n):
    """Random weights plus values on bf16 rounding ties (odd and even kept bit) and specials."""
    random = torch.rand(n, generator=gen) * torch.exp2(torch.randint(-20, 4, (n,), generator=gen))
    tie_bits = torch.tensor(
        [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x00008000, 0x00018000],
        dtype=torch.int32,
    )
    specials = torch.tensor([0.0, -0.0, 1.0, math.inf, -math.inf, math.nan, -math.nan, 1e-40])
    return torch.cat([random, tie_bits.view(torch.float32), specials])


def test_pack_topk_round_trip():
    gen = torch.Generator().manual_seed(3)
    weights = packing_weights(gen, 200)
    ids = torch.randint(-1, 512, weights.shape, generator=gen, dtype=torch.int32)
    ids, weights = ids.view(-1, 2), weights.view(-1, 2)
    packed = reference.pack_topk(ids, weights)
    assert packed.dtype == torch.int32 and packed.shape == ids.shape
    got_ids, got_weights = unpack(packed)
    assert torch.equal(got_ids, ids)
    expected = weights.to(torch.bfloat16).float()  # torch's CPU cast rounds to nearest even
    assert torch.equal(torch.isnan(got_weights), torch.isnan(expected))
    finite = ~torch.isnan(expected)
    assert torch.equal(got_weights[finite].view(torch.int32), expected[finite].view(torch.int32))
    assert ((packed[~finite] & 0xFFFF) == 0x7FC0).all()


@needs_kernel
def test_pack_topk_kernel_matches_reference():
    gen = torch.Generator().manual_seed(4)
    weights = packing_weights(gen, 50).view(-1, 2)
    ids = torch.randint(-1, 400, weights.shape, generator=gen, dtype=torch.int32)
    admission = pack_topk_admission(ids, weights)
    assert admission.kernel == "triton" and admission.plan == PackTopkPlan(programs=1)
    ours = pack_topk(ids, weights)
    assert torch.equal(ours, reference.pack_topk(ids, weights))
    assert pack_topk(ids[:0], weights[:0]).shape == (0, 2)


def test_pack_topk_falls_back_where_the_kernel_does_not_pack():
    ids = torch.arange(12, dtype=torch.int64).view(3, 4)
    weights = torch.rand(3, 4, dtype=torch.float64)
    assert not pack_topk_admission(ids, weights)
    assert torch.equal(pack_topk(ids, weights), reference.pack_topk(ids, weights))


def test_pack_topk_bad_input():
    with pytest.raises(ValueError, match="^weights shape"):
        pack_topk(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="^ids"):
        pack_topk(torch.zeros(2, 3), torch.zeros(2, 3))


@pytest.mark.parametrize("on_meta", ["ids", "weights"])
def test_ids_and_weights_on_two_devices_are_refused_on_every_path(on_meta, path):
    """A ValueError naming both, never torch's device error from inside."""
    args = dict(ids=torch.zeros(2, 3, dtype=torch.int32), weights=torch.rand(2, 3))
    args[on_meta] = args[on_meta].to("meta")
    with pytest.raises(ValueError, match="^weights must be on ids' device"):
        pack_topk(**args)
    verdict = pack_topk_admission(**args)
    assert not verdict and "weights must be on ids' device" in verdict.reason


def test_admission_must_be_an_admission():
    ids, weights = torch.zeros(2, 3, dtype=torch.int32), torch.rand(2, 3)
    with pytest.raises(TypeError, match="^admission must be an Admission"):
        pack_topk(ids, weights, admission="kernel")


@pytest.mark.gpu
def test_gpu_pack_kernel_matches_reference():
    gen = torch.Generator().manual_seed(9)
    weights = packing_weights(gen, 6000).view(-1, 2).cuda()
    ids = torch.randint(-1, 400, weights.shape, generator=gen, dtype=torch.int32).cuda()
    assert pack_topk_admission(ids, weights).plan == PackTopkPlan(programs=6)
    assert torch.equal(pack_topk(ids, weights), reference.pack_topk(ids, weights))
