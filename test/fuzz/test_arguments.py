"""Fuzz: the one rule of every public op for arguments of any type or value.

Each op is called with one argument of a valid call replaced by a drawn value (None, bools,
huge ints, NaN, NumPy scalars, strings, lists, tensors of the wrong dtype, shape or rank). The
admission never raises; it returns a verdict. The op either runs or raises ``ValueError``
naming the argument: never another exception, from torch, Triton or the interpreter."""

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv41_kernels.admission import Admission
from dsv41_kernels.ops.attention.decoding_sched_meta import (
    DecodingSchedConfig,
    DecodingSchedMeta,
    decoding_sched_meta,
    decoding_sched_meta_admission,
    device_sched_config,
    num_sm_parts,
)
from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import (
    inverse_rope_quant_fp8,
    inverse_rope_quant_fp8_admission,
)
from dsv41_kernels.ops.mhc.hc_combine_norm import (
    hc_combine_norm,
    hc_combine_norm_admission,
    hc_combine_norm_mxfp8,
)
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats, hc_mix_stats_admission
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, moe_fused_gate_admission
from dsv41_kernels.ops.moe.pack_topk import pack_topk, pack_topk_admission
from dsv41_kernels.ops.quantization.mxfp8_quantize import mxfp8_quantize, mxfp8_quantize_admission
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy, accept_greedy_admission
from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission

from .values import FUZZ

pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@dataclass
class Op:
    call: Callable[..., Any]
    admission: Callable[..., Admission] | None
    valid: Callable[[], dict]
    """A valid call's keyword arguments, fresh each time (ops write into outputs)."""
    admission_extra: dict | None = None


def i32(*shape):
    return torch.zeros(shape, dtype=torch.int32)


def bf16(*shape):
    return torch.randn(shape).bfloat16()


OPS = {
    "row_argmax": Op(row_argmax, row_argmax_admission, lambda: dict(logits=torch.randn(2, 4096))),
    "accept_greedy": Op(
        accept_greedy,
        accept_greedy_admission,
        lambda: dict(
            candidates=torch.zeros(1, 3, dtype=torch.int64),
            logits=torch.randn(3, 4096),
            cutoff_verify_lens=torch.tensor([2]),
        ),
    ),
    "decoding_sched_meta": Op(
        decoding_sched_meta,
        decoding_sched_meta_admission,
        lambda: dict(
            tile_scheduler_metadata=i32(4, 8),
            num_splits=i32(3),
            config=DecodingSchedConfig(topk=64),
            topk_length=torch.tensor([3, 64], dtype=torch.int32),
        ),
    ),
    "DecodingSchedConfig": Op(
        lambda **fields: decoding_sched_meta(i32(4, 8), i32(3), DecodingSchedConfig(**fields)),
        lambda **fields: decoding_sched_meta_admission(
            i32(4, 8), i32(3), DecodingSchedConfig(**fields)
        ),
        lambda: dict(topk=64, extra_topk=8, block_size_n=64, fixed_overhead_num_blocks=5),
    ),
    "DecodingSchedMeta.empty": Op(
        DecodingSchedMeta.empty,
        None,
        lambda: dict(batch_size=2, num_sm_parts=4, device="cpu", config=DecodingSchedConfig(64)),
    ),
    "num_sm_parts": Op(
        num_sm_parts, None, lambda: dict(num_sms=132, s_q=1, h_q=64, arch_major=9, d_qk=512)
    ),
    "device_sched_config": Op(
        device_sched_config, None, lambda: dict(device="cuda", s_q=1, h_q=64, d_qk=512)
    ),
    "mxfp8_quantize": Op(
        mxfp8_quantize, mxfp8_quantize_admission, lambda: dict(x=bf16(2, 64), swizzled=True)
    ),
    "inverse_rope_quant_fp8": Op(
        inverse_rope_quant_fp8,
        inverse_rope_quant_fp8_admission,
        lambda: dict(
            o=bf16(2, 4, 128),
            freqs_cis=torch.ones(8, 16, dtype=torch.complex64),
            positions=torch.tensor([0, 7]),
            o_groups=2,
            group_size=32,
            rotate_o=True,
            tables_ready=False,
            out=None,
        ),
    ),
    "hc_combine_norm": Op(
        hc_combine_norm,
        hc_combine_norm_admission,
        lambda: dict(x=bf16(2, 128), pre=torch.rand(2, 4), weight=bf16(32), eps=1e-6),
    ),
    "hc_combine_norm_mxfp8": Op(
        hc_combine_norm_mxfp8,
        hc_combine_norm_admission,
        lambda: dict(x=bf16(2, 128), pre=torch.rand(2, 4), weight=bf16(32), eps=1e-6, out=None),
        admission_extra=dict(quantize=True),
    ),
    "moe_fused_gate": Op(
        moe_fused_gate,
        moe_fused_gate_admission,
        lambda: dict(
            logits=torch.randn(2, 16),
            bias=torch.zeros(16),
            bias_alt=torch.zeros(16),
            input_ids=torch.tensor([5, 1], dtype=torch.int32),
            image_token_id=5,
            top_k=3,
            renormalize=True,
            renormalize_eps=1e-20,
            routed_scaling_factor=1.5,
            scale_on_output=False,
            num_shared_slots=1,
            num_token_non_padded=1,
            packed_out=None,
        ),
    ),
    "pack_topk": Op(
        pack_topk, pack_topk_admission, lambda: dict(ids=i32(2, 3), weights=torch.rand(2, 3))
    ),
    "hc_mix_stats": Op(
        hc_mix_stats,
        hc_mix_stats_admission,
        lambda: dict(
            x=bf16(2, 64),
            weights=torch.randn(24, 64),
            scale=torch.ones(3),
            base=torch.zeros(24),
            iters=3,
            rms_eps=1e-6,
            eps=1e-6,
            post_mult=2.0,
            mode="auto",
            return_mix=False,
        ),
    ),
    "split_tf32": Op(split_tf32, None, lambda: dict(w=torch.randn(3, 5))),
    "HcDerivedWeights": Op(HcDerivedWeights, None, lambda: dict(fn=torch.randn(24, 8))),
}

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.integers(-3, 3), max_size=3),
    st.sampled_from([np.int64(3), np.int32(-1), np.float32(0.5), np.bool_(True), np.ones(2)]),
    st.sampled_from(["zeros 3", "int8 2x2", "1x1x1", "empty", "fp64 2x4096", "tuple of 3"]).map(
        lambda name: {
            "zeros 3": torch.zeros(3),
            "int8 2x2": torch.zeros(2, 2, dtype=torch.int8),
            "1x1x1": torch.zeros(1, 1, 1),
            "empty": torch.empty(0),
            "fp64 2x4096": torch.zeros(2, 4096, dtype=torch.float64),
            "tuple of 3": (torch.zeros(2), torch.zeros(2), torch.zeros(2)),
        }[name]
    ),
)


@settings(FUZZ, max_examples=400)
@given(name=st.sampled_from(sorted(OPS)), data=st.data())
def test_ill_typed_arguments_are_named_and_admissions_never_raise(name, data):
    op = OPS[name]
    kwargs = op.valid()
    argument = data.draw(st.sampled_from(sorted(kwargs)))
    kwargs[argument] = data.draw(JUNK)
    if op.admission is not None:
        params = inspect.signature(op.admission).parameters.values()
        takes_all = any(p.kind == p.VAR_KEYWORD for p in params)
        accepted = {k: v for k, v in kwargs.items() if takes_all or k in {p.name for p in params}}
        verdict = op.admission(**accepted, **(op.admission_extra or {}))
        assert isinstance(verdict, Admission), verdict
    try:
        op.call(**kwargs)
    except ValueError as e:
        assert argument in str(e) or str(e) == valid_call_error(name), (name, argument, e)


@functools.cache
def valid_call_error(name: str) -> str | None:
    """What the valid call itself raises here (``device_sched_config`` without CUDA), if any."""
    try:
        OPS[name].call(**OPS[name].valid())
    except ValueError as e:
        return str(e)
    return None
