"""Fuzz: the mHC combine+norm (and its fused MXFP8 form), the mixing statistics and split_tf32
against their references."""

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dsv41_kernels.cases.hc_combine_norm import beyond_one_bf16_ulp, unfused
from dsv41_kernels.cases.hc_mix_stats import reference_with_mix, stats_mismatches
from dsv41_kernels.ops.mhc.hc_combine_norm import (
    hc_combine_norm,
    hc_combine_norm_admission,
    hc_combine_norm_mxfp8,
)
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32
from dsv41_kernels.ops.mhc.hc_mix_stats import MODES, hc_mix_stats, hc_mix_stats_admission
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as reference_combine_norm
from dsv41_kernels.reference.hc_mix_stats import HC_MIX, HC_MULT
from dsv41_kernels.reference.hc_mix_stats import split_tf32 as reference_split

from .values import FUZZ, laid_out, tensors

pytestmark = pytest.mark.fuzz
NAN, INF = float("nan"), float("inf")


@settings(FUZZ, max_examples=30)
@given(data=st.data())
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on Inf · 0 and overflow: NaN, Inf
def test_combine_norm_within_its_contract_and_the_fused_form_is_the_pair(data):
    """Each row within one bf16 ulp of float64 (NaN for NaN, Inf for Inf), or, where fp32's
    Σx² is 0, Inf or NaN in every order, the reference's bits; the fused form's bytes are
    those of ``hc_combine_norm`` then ``mxfp8_quantize``."""
    m, h = data.draw(st.integers(0, 6)), 32 * data.draw(st.integers(1, 5))
    x = data.draw(laid_out(data.draw(tensors(m, HC_MULT * h, torch.bfloat16, max_specials=8))))
    pre = data.draw(
        tensors(m, HC_MULT, torch.float32, kinds=("zero", "-zero", "tie"), log2_scale=(-2, 2))
    ).abs()
    weight = data.draw(tensors(1, h, torch.bfloat16, kinds=("zero", "tie"), log2_scale=(-1, 1)))[0]
    eps = data.draw(st.sampled_from((1e-6, 0.0, 1e-2)))
    event(hc_combine_norm_admission(x, pre, weight).path)
    y = hc_combine_norm(x, pre, weight, eps)
    y_ref = reference_combine_norm(x, pre, weight, eps)
    y64 = reference_combine_norm(x, pre, weight, eps, dtype=torch.float64)
    for row in range(m):
        same_bits = torch.equal(y[row].view(torch.int16), y_ref[row].view(torch.int16))
        assert same_bits or beyond_one_bf16_ulp(y[row], y64[row]) == 0, row
    fused_y, quantized = hc_combine_norm_mxfp8(x, pre, weight, eps)
    pair_y, (data_ref, scales_ref) = unfused(x, pre, weight, eps)
    assert torch.equal(fused_y.view(torch.int16), pair_y.view(torch.int16))
    assert torch.equal(quantized.data.view(torch.uint8), data_ref.view(torch.uint8))
    assert torch.equal(quantized.scales, scales_ref)


@settings(FUZZ, max_examples=10)
@given(data=st.data())
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN and Inf rows
def test_mix_stats_within_their_tolerances(data):
    """Every path within MIX_RTOL of float64 (and the gates within what that implies), over
    magnitudes from 2**-30 to 2**30 per row, signed zeros, subnormals and ties in x and fn; a
    row holding NaN or ±Inf gets non-finite statistics and leaves the other rows alone."""
    m = data.draw(st.integers(1, 7) if data.draw(st.integers(0, 3)) else st.integers(128, 130))
    hidden = 16 * data.draw(st.integers(1, 4))
    rows = [
        data.draw(
            tensors(
                1,
                HC_MULT * hidden,
                torch.bfloat16,
                log2_scale=(-30, 30),
                kinds=("zero", "-zero", "subnormal", "tie"),
            )
        )
        for _ in range(m)
    ]
    for row in data.draw(st.lists(st.integers(0, m - 1), max_size=2)):
        column = data.draw(st.integers(0, HC_MULT * hidden - 1))
        rows[row][0, column] = data.draw(st.sampled_from((NAN, INF, -INF)))
    x = data.draw(laid_out(torch.cat(rows), transposed=False))
    fn = data.draw(
        tensors(
            HC_MIX,
            HC_MULT * hidden,
            torch.float32,
            kinds=("zero", "-zero", "tie"),
            log2_scale=(-8, -4),
        )
    )
    scale = data.draw(tensors(1, 3, torch.float32, kinds=(), log2_scale=(-1, 0)))[0].abs() + 0.5
    base = data.draw(tensors(1, HC_MIX, torch.float32, kinds=(), log2_scale=(-2, 0)))[0]
    mode = data.draw(st.sampled_from(MODES))
    weights = HcDerivedWeights(fn) if data.draw(st.booleans()) else fn
    event(hc_mix_stats_admission(x, weights, mode).kernel or "fallback")
    ours = hc_mix_stats(x, weights, scale, base, mode=mode, return_mix=True)
    finite = torch.isfinite(x).all(1)
    for stat in ours:
        assert torch.equal(torch.isfinite(stat.reshape(m, -1)).all(1), finite)
    if finite.any():
        ref = reference_with_mix(x[finite], fn, scale, base)
        assert stats_mismatches([t[finite] for t in ours], ref, scale) == 0


@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_split_tf32_is_the_reference_split(data):
    """Any fp32 bit pattern: NaN payloads, ±0, subnormals, ±Inf, the extremes."""
    bits = data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=64))
    w = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    hi, lo = split_tf32(w)
    ref_hi, ref_lo = reference_split(w)
    assert torch.equal(hi.view(torch.int32), ref_hi.view(torch.int32))
    assert torch.equal(lo.view(torch.int32), ref_lo.view(torch.int32))
    finite = torch.isfinite(w)
    assert torch.equal((hi + lo)[finite].view(torch.int32), w[finite].view(torch.int32))
