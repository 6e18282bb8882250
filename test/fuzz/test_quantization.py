"""Fuzz: mxfp8_quantize against the reference quantizer (FlashInfer's cuda backend), bytewise."""

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dsv41_kernels.ops.quantization.mxfp8_quantize import mxfp8_quantize, mxfp8_quantize_admission
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize as reference

from .values import FUZZ, laid_out, tensors

pytestmark = pytest.mark.fuzz

E4M3_TIE = 1.0625  # halfway between e4m3's 1.0 and 1.125 at a block scale of 1


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_mxfp8_quantize_is_the_reference_bytewise(data):
    tiled = data.draw(st.integers(0, 7)) == 0  # one in eight pads a partial 128-row scale tile
    rows = data.draw(st.integers(127, 130) if tiled else st.integers(0, 6))
    cols = 32 * data.draw(st.integers(0, 6 if rows < 100 else 1))
    dtype = data.draw(st.sampled_from((torch.bfloat16, torch.float16)))
    x = data.draw(tensors(rows, cols, dtype, max_specials=16, log2_scale=(-30, 30)))
    if x.numel() and data.draw(st.booleans()):  # e4m3 rounding ties, scaled by a power of two
        flat = x.view(-1)
        flat[:: data.draw(st.integers(2, 9))] = E4M3_TIE * 2.0 ** data.draw(st.integers(-8, 8))
    x = data.draw(laid_out(x))
    swizzled = data.draw(st.booleans())
    event(mxfp8_quantize_admission(x, swizzled=swizzled).path + (", 128-row tile" if tiled else ""))
    q, scales = mxfp8_quantize(x, swizzled=swizzled)
    q_ref, scales_ref = reference(x, swizzled=swizzled)
    assert q.dtype == q_ref.dtype and q.shape == q_ref.shape
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(scales, scales_ref)
