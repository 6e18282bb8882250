"""hc_combine_norm's FP8 groups (``quant_out``): y's e4m3 groups of 32 and their power-of-two
scales, bitwise SGLang's per-token-group quantizer (``scale_ue8m0``) of the y the same call
returns, on every path: the CUDA kernel's epilogue (GPU tier), the Triton kernel and then the
quantizer (interpreter or GPU), the torch fallback; y itself is a plain call's."""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels.admission import refuse
from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.hc_combine_norm import example_inputs
from dsv41_kernels.devices import sm_major
from dsv41_kernels.jit import module_available
from dsv41_kernels.ops.mhc.hc_combine_norm import (
    CUDA_CLUSTER,
    CUDA_ONE_CTA,
    TRITON,
    hc_combine_norm,
    hc_combine_norm_admission,
)
from test.machine import DEVICE, needs_kernel
from test.ops.mhc.test_hc_boundary import assert_groups_of, quant_out_like
from test.ops.mhc.test_hc_combine_norm import special_rows

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf * 0

EPS = 1e-6


def cases(device, hidden=(64, 96)):
    """``(x, pre, weight)`` of ordinary rows, of rows with every special value (Inf, NaN, zero,
    subnormal, under- and overflowing Σx²), at a few row counts and hidden sizes."""
    for seed, (m, h) in enumerate((m, h) for h in hidden for m in (1, 5, 8, 13)):
        make = special_rows if m >= 8 else lambda m, h, seed: example_inputs(m, h, "cpu", seed=seed)
        yield tuple(t.to(device) for t in make(m, h, seed=seed))


def assert_groups_of_a_plain_call(x, pre, weight, admission=None):
    quant_out = quant_out_like(torch.empty(x.shape[0], x.shape[1] // 4, device=x.device))
    y = hc_combine_norm(x, pre, weight, EPS, admission=admission, quant_out=quant_out)
    assert_groups_of(y, quant_out)
    assert bit_mismatches(y, hc_combine_norm(x, pre, weight, EPS, admission=admission)) == 0


def test_the_fallback_fills_quant_out():
    for x, pre, weight in cases("cpu"):
        assert_groups_of_a_plain_call(x, pre, weight, refuse("the fallback, asked for"))


@needs_kernel
def test_the_triton_kernel_then_the_quantizer():
    for x, pre, weight in cases(DEVICE, hidden=(64,)):
        admission = hc_combine_norm_admission(x, pre, weight)
        if admission.kernel == TRITON:  # on sm_90+ the CUDA kernel's test below
            assert_groups_of_a_plain_call(x, pre, weight, admission)


def test_quant_out_errors_name_it():
    x, pre, weight = example_inputs(3, 64, "cpu", seed=1)
    y = torch.empty(3, 64, dtype=torch.bfloat16)
    q, scales = quant_out_like(y)
    with pytest.raises(ValueError, match=r"quant_out\[0\] \(q\) must be \[3, 64\]"):
        hc_combine_norm(x, pre, weight, EPS, quant_out=(q[:2], scales))
    inside = lambda t: t.view(-1).view(torch.float32)[:6].view(3, 2)  # noqa: E731
    with pytest.raises(ValueError, match="out shares memory with the output quant_out"):
        hc_combine_norm(x, pre, weight, EPS, out=y, quant_out=(q, inside(y)))
    with pytest.raises(ValueError, match="x shares memory"):
        hc_combine_norm(x, pre, weight, EPS, quant_out=(q, inside(x)))


needs_cuda_kernel = pytest.mark.skipif(
    not (torch.cuda.is_available() and sm_major(0) >= 9 and module_available("hc_combine_norm", 0)),
    reason="the CUDA cluster kernel needs sm_90+ and its module (prebuilt, or a toolchain)",
)


@pytest.mark.gpu
@needs_cuda_kernel
@pytest.mark.parametrize("m", (1, 6, 64, 96, 128, 192, 384, 2048))
def test_gpu_the_cuda_epilogue_is_sglangs_quantizer_of_y(m):
    """The epilogue in the launch shapes the rows get (H = 5120: clusters of 4, one CTA a row
    from 64 rows; 4160: clusters of 2 with two vectors a thread; 9760: five, both with idle
    vectors), special rows included, and replayed from a CUDA graph."""
    for seed, h in enumerate((5120, 4160, 9760)):
        x, pre, weight = (t.cuda() for t in special_rows(m, h, seed=seed))
        admission = hc_combine_norm_admission(x, pre, weight)
        assert admission.kernel in (CUDA_CLUSTER, CUDA_ONE_CTA), admission.reason
        assert_groups_of_a_plain_call(x, pre, weight, admission)
    y = torch.empty(m, h, dtype=torch.bfloat16, device="cuda")
    quant_out = quant_out_like(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hc_combine_norm(x, pre, weight, EPS, out=y, quant_out=quant_out)
    for scale in (1.0, 1e20, 1e-20):
        x.mul_(scale)
        graph.replay()
        torch.cuda.synchronize()
        assert_groups_of(y, quant_out, scale)
