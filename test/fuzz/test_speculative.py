"""Fuzz: row_argmax and accept_greedy against torch.argmax and the reference accept rule."""

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dsv41_kernels.ops.speculative.accept_greedy import (
    accept_greedy,
    accept_greedy_admission,
    accept_greedy_torch,
)
from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission
from dsv41_kernels.reference.accept_greedy import accept_greedy as accept_rule

from .values import FUZZ, laid_out, tensors

pytestmark = pytest.mark.fuzz

DTYPES = st.sampled_from((torch.float32, torch.bfloat16, torch.float16))
INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def logits(draw, rows):
    narrow = draw(st.integers(0, 4)) == 0  # one in five refused by the admission for it
    vocab = draw(st.integers(1, 300) if narrow else st.integers(4096, 6000))
    return draw(laid_out(draw(tensors(rows, vocab, draw(DTYPES), max_specials=12))))


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_row_argmax_is_torch_argmax(data):
    x = data.draw(logits(data.draw(st.integers(1, 9))))
    admission = row_argmax_admission(x)
    event(admission.path)
    ours = row_argmax(x)
    assert torch.equal(ours, torch.argmax(x, dim=-1)), (admission, ours)


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_accept_greedy_is_the_rule_on_every_path(data):
    bs, n = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 8))
    lg = data.draw(logits(bs * n))
    predict = torch.argmax(lg, dim=-1).view(bs, n)
    candidates = torch.tensor(
        data.draw(
            st.lists(
                st.lists(st.integers(0, 9000), min_size=n, max_size=n), min_size=bs, max_size=bs
            )
        ),
        dtype=data.draw(st.sampled_from((torch.int32, torch.int64))),
    )
    for b in range(bs):  # agree with the target for a drawn prefix, so lengths vary
        keep = data.draw(st.integers(0, n - 1))
        candidates[b, 1 : keep + 1] = predict[b, :keep].to(candidates.dtype)
    cutoff = None
    if data.draw(st.booleans()):
        near = st.integers(-2 * n, 2 * n)
        values = data.draw(st.lists(near | INT64, min_size=bs, max_size=bs))
        cutoff = torch.tensor(values, dtype=torch.int64)
        if data.draw(st.booleans()):
            cutoff = cutoff.clamp(-(2**31), 2**31 - 1).to(torch.int32)
    ref = accept_rule(candidates, lg, cutoff_verify_lens=cutoff)
    admission = accept_greedy_admission(candidates, lg, cutoff)
    event(admission.path)
    for got in (
        accept_greedy(candidates, lg, cutoff_verify_lens=cutoff),
        accept_greedy_torch(candidates, lg, cutoff),
    ):
        for ours, want in zip(got, ref, strict=True):
            assert ours.dtype == want.dtype and torch.equal(ours, want), (admission, got, ref)
