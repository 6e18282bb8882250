"""The derived weights of the mHC projection: the TF32 split and its holder."""

import pytest
import torch

from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32


def bits(t):
    return t.view(torch.int32)


# ---- split_tf32 ----------------------------------------------------------------------------

SPECIAL = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    1.0000001,
    -3.1415927,
    2.0**-126,
    -(2.0**-126),
    1e-45,
    -1e-45,
    2.0**-149 * 8191,
    2.0**-149 * 8193,
    1.1754942e-38,
    3.4028235e38,
    -3.4028235e38,
    float("inf"),
    float("-inf"),
    float("nan"),
]


def assert_split_exact(w):
    hi, lo = split_tf32(w)
    finite = torch.isfinite(w)
    assert torch.equal(bits(hi + lo)[finite], bits(w)[finite])  # -0.0 included
    assert (bits(hi)[finite] & 0x1FFF == 0).all()
    assert (hi.abs() <= w.abs())[finite].all()  # truncation: toward zero
    assert torch.equal(torch.signbit(lo)[finite], torch.signbit(w)[finite])
    assert torch.equal(hi.double()[finite] + lo.double()[finite], w.double()[finite])
    assert torch.equal(bits(hi)[~finite], bits(w)[~finite])  # non-finite: not split
    assert (lo[~finite] == 0).all()


def test_split_tf32_special_values():
    w = torch.tensor(SPECIAL, dtype=torch.float32)
    assert_split_exact(w)
    hi, lo = split_tf32(w)
    assert bits(hi)[1] == bits(lo)[1] == bits(torch.tensor(-0.0))  # -0 -> (-0, -0)
    one_ulp = torch.tensor([1.0000001])
    assert split_tf32(one_ulp)[0].item() == 1.0 and split_tf32(one_ulp)[1].item() == 2.0**-23
    # what the tensor core reads (C.7): 0x3F801FFF -> 0x3F800000, 0x3FFFFFFF -> 0x3FFFE000
    raw = torch.tensor([0x3F801FFF, 0x3FFFFFFF], dtype=torch.int32).view(torch.float32)
    assert bits(split_tf32(raw)[0]).tolist() == [0x3F800000, 0x3FFFE000]


def test_split_tf32_random_bit_patterns():
    gen = torch.Generator().manual_seed(5)
    patterns = torch.randint(-(2**31), 2**31 - 1, (20000,), generator=gen, dtype=torch.int64)
    assert_split_exact(patterns.to(torch.int32).view(torch.float32))
    assert_split_exact(torch.randn(24, 1024, generator=gen))


def test_split_tf32_rejects_other_dtypes():
    with pytest.raises(ValueError, match="w"):
        split_tf32(torch.ones(3, dtype=torch.float64))


# ---- the holder ------------------------------------------------------------------------------


def test_holder_refusal_names_the_weight_and_the_fix():
    fn = torch.randn(24, 64)
    original = fn.clone()
    released = []
    holder = HcDerivedWeights(fn, name="layers.0.hc_attn_fn", on_release=lambda: released.append(1))
    hi, lo = split_tf32(fn)
    assert torch.equal(holder.lo, lo) and holder.lo.is_contiguous() and holder.active
    assert torch.equal(hi + holder.lo, fn)
    reason = holder.update_refusal()
    assert reason is not None and "layers.0.hc_attn_fn" in reason and "release()" in reason
    assert torch.equal(fn, original) and torch.equal(holder.fn, original)  # nothing written

    holder.release()
    assert not holder.active and holder.update_refusal() is None and released == [1]
    with pytest.raises(ValueError, match="released"):
        _ = holder.lo


def test_holder_rejects_other_shapes():
    with pytest.raises(ValueError, match="fn"):
        HcDerivedWeights(torch.randn(8, 64))
    with pytest.raises(ValueError, match="fn"):
        HcDerivedWeights(torch.randn(24, 64, dtype=torch.float64))
