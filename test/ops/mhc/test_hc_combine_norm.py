import math

import numpy as np
import pytest
import torch

from dsv41_kernels import interpreter
from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.hc_combine_norm import (
    beyond_one_bf16_ulp,
    example_inputs,
    mxfp8_outputs,
    triton_admission,
    triton_forms,
    unfused,
)
from dsv41_kernels.devices import sm_major
from dsv41_kernels.jit import load_module, module_available
from dsv41_kernels.ops.mhc.hc_combine_norm import (
    CUDA_CLUSTER,
    CUDA_ONE_CTA,
    TRITON,
    hc_combine_norm,
    hc_combine_norm_admission,
    hc_combine_norm_mxfp8,
)
from dsv41_kernels.ops.mhc.hc_combine_norm_plan import (
    CombineNormPlan,
    CudaShape,
    Kernel,
    KernelVariant,
    cuda_kernel_fits,
    cuda_shape,
)
from dsv41_kernels.ops.mhc.quant_out import no_quant_out
from dsv41_kernels.ops.quantization.mxfp8_quantize import Mxfp8SwizzledInput, mxfp8_quantize
from dsv41_kernels.reference.hc_combine_norm import bf16_sum_of_squares
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as reference
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize as reference_quantize
from dsv41_kernels.reference.mxfp8_quantize import scale_buffer_size
from test.machine import needs_kernel

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf * 0

EPS = 1e-6


def assert_bits_equal(ours, ref):
    assert bit_mismatches(ours, ref) == 0


def strided_inputs(m, h, *, seed, scale=1.0, device="cpu"):
    """Inputs whose rows, gate columns and weight are all strided views (of buffers built on
    ``device``: moving a view with ``.cuda()`` would make it contiguous)."""
    x, pre, weight = example_inputs(m, h, "cpu", seed=seed, scale=scale)
    x_big = torch.zeros(m, 4 * h + 64, dtype=torch.bfloat16)
    x_big[:, : 4 * h] = x
    pre_big = torch.zeros(m, 8)
    pre_big[:, ::2] = pre
    w_big = torch.zeros(2 * h, dtype=torch.bfloat16)
    w_big[::2] = weight
    x_big, pre_big, w_big = x_big.to(device), pre_big.to(device), w_big.to(device)
    return x_big[:, : 4 * h], pre_big[:, ::2], w_big[::2]


def assert_special_rows(y, y_ref, y64):
    """Rows of :func:`special_rows`: row 0 (ordinary) within one bf16 ulp of float64; every
    special row's Σx² is 0, +inf or NaN in any order of summation, so it equals the reference
    bit for bit."""
    assert beyond_one_bf16_ulp(y[:1], y64[:1]) == 0
    assert_bits_equal(y[1:8], y_ref[1:8])
    assert beyond_one_bf16_ulp(y[8:], y64[8:]) == 0


def special_rows(m, h, *, seed):
    """Ordinary rows, then rows holding Inf, NaN, all zeros, bf16 subnormals, a tiny row whose
    Σx² underflows fp32 and a huge row whose Σx² overflows it."""
    x, pre, weight = example_inputs(m, h, "cpu", seed=seed)
    specials = [
        lambda r: r.index_fill_(0, torch.tensor([3]), float("inf")),
        lambda r: r.index_fill_(0, torch.tensor([h + 1]), float("nan")),
        lambda r: r.zero_(),
        lambda r: r.mul_(1e-39),
        lambda r: r.mul_(1e-30),
        lambda r: r.mul_(1e25),
        lambda r: r.index_fill_(0, torch.tensor([0]), -float("inf")).index_fill_(
            0, torch.tensor([2]), float("inf")
        ),
    ]
    for i, make in enumerate(specials[: m - 1]):
        make(x[i + 1])
    return x, pre, weight


# ---- the reference --------------------------------------------------------------------------


def test_sum_of_squares_is_order_free_and_close_to_exact():
    gen = torch.Generator().manual_seed(0)
    v = (
        torch.randn(8, 512, generator=gen) * torch.pow(2.0, torch.randn(8, 512, generator=gen) * 12)
    ).to(torch.bfloat16)
    ss = bf16_sum_of_squares(v)
    shuffled = bf16_sum_of_squares(v[:, torch.randperm(512, generator=gen)])
    assert torch.equal(ss.view(torch.int32), shuffled.view(torch.int32))
    for row, got in zip(v.double().tolist(), ss.tolist(), strict=True):
        exact = math.fsum(t * t for t in row)
        assert abs(got - exact) <= exact * 2.0**-23
    assert bf16_sum_of_squares(torch.tensor([[1.0, float("inf")]]).bfloat16()).isinf().all()
    assert (
        bf16_sum_of_squares(torch.tensor([[float("inf"), float("nan")]]).bfloat16()).isnan().all()
    )


@pytest.mark.parametrize("scale", [1e-2, 1e-1, 1.0, 1e1, 1e2])
def test_reference_within_one_bf16_ulp_of_float64(scale):
    x, pre, weight = example_inputs(16, 256, "cpu", seed=int(scale * 1000), scale=scale)
    y = reference(x, pre, weight, EPS)
    assert y.dtype == torch.bfloat16 and y.shape == (16, 256)
    assert beyond_one_bf16_ulp(y, reference(x, pre, weight, EPS, dtype=torch.float64)) == 0


def test_reference_agrees_with_plain_torch_rmsnorm():
    # The textbook composition (torch sum order, torch.rsqrt) may differ by one rounding.
    x, pre, weight = example_inputs(8, 512, "cpu", seed=1)
    x_in = (x.view(8, 4, 512).float() * pre[:, :, None]).sum(1).bfloat16().float()
    plain = (
        x_in * torch.rsqrt(x_in.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()
    ).bfloat16()
    ours = reference(x, pre, weight, EPS)
    assert beyond_one_bf16_ulp(ours, plain.double()) == 0


# ---- the Triton kernels (interpreter on CPU) --------------------------------------------------


@needs_kernel
@pytest.mark.parametrize("m, h", [(1, 32), (5, 96)])
def test_kernel_equals_reference_with_strided_inputs(m, h):
    x, pre, weight = strided_inputs(m, h, seed=m * h, scale=10.0)
    assert hc_combine_norm_admission(x, pre, weight)
    y = hc_combine_norm(x, pre, weight, EPS)
    # The kernel's fp32 sum of squares is not the reference's order-free one: not bit-equal to
    # it, but within one bf16 ulp of float64 (as is the reference, the torch fallback).
    assert beyond_one_bf16_ulp(y, reference(x, pre, weight, EPS, dtype=torch.float64)) == 0
    fused = hc_combine_norm_mxfp8(x, pre, weight, EPS)
    assert isinstance(fused[1], Mxfp8SwizzledInput)
    assert_bits_equal(fused, unfused(x, pre, weight, EPS))


@needs_kernel
def test_fused_equals_unfused_beyond_one_scale_tile():
    x, pre, weight = example_inputs(129, 32, "cpu", seed=2, scale=0.1)
    y, quantized = hc_combine_norm_mxfp8(x, pre, weight, EPS)
    assert quantized.scales.numel() == scale_buffer_size(129, 32, swizzled=True) == 256 * 4
    assert_bits_equal((y, quantized), (y, reference_quantize(y)))
    assert_bits_equal(y, hc_combine_norm(x, pre, weight, EPS))
    assert beyond_one_bf16_ulp(y, reference(x, pre, weight, EPS, dtype=torch.float64)) == 0


@needs_kernel
def test_launch_variants_keep_fused_equal_to_unfused():
    """The benchmark's ``--sweep`` variants take the same code path on the interpreter."""
    x, pre, weight = example_inputs(3, 64, "cpu", seed=4)
    y64 = reference(x, pre, weight, EPS, dtype=torch.float64)
    for variant in (KernelVariant(8, True), KernelVariant(16, False)):
        y_alone, fused = triton_forms(x, pre, weight, EPS, variant)
        assert_bits_equal(fused, (y_alone, mxfp8_quantize(y_alone)))
        assert beyond_one_bf16_ulp(fused[0], y64) == 0


@needs_kernel
def test_special_rows_match_reference_bitwise():
    x, pre, weight = special_rows(8, 64, seed=3)
    y = hc_combine_norm(x, pre, weight, EPS)
    assert_special_rows(
        y, reference(x, pre, weight, EPS), reference(x, pre, weight, EPS, dtype=torch.float64)
    )
    assert torch.isnan(y[2]).all() and not y[1].isnan().all()  # NaN row; Inf row: 0 or NaN
    assert_bits_equal(hc_combine_norm_mxfp8(x, pre, weight, EPS), (y, reference_quantize(y)))


@needs_kernel
def test_every_scale_byte_written_and_out_used():
    m, h = 5, 96  # 3 scale columns padded to 4, rows padded to 128
    x, pre, weight = example_inputs(m, h, "cpu", seed=4)
    y = torch.full((m, h), 7.0, dtype=torch.bfloat16)
    data = torch.full((m, h), 3.0).to(torch.float8_e4m3fn)
    scales = torch.full((scale_buffer_size(m, h, swizzled=True),), 0xAB, dtype=torch.uint8)
    out = (y, Mxfp8SwizzledInput(data, scales))
    got = hc_combine_norm_mxfp8(x, pre, weight, EPS, out=out)
    assert got[0] is y and got[1].data is data and got[1].scales is scales
    assert_bits_equal(got, unfused(x, pre, weight, EPS))
    tiles = scales.view(1, 1, 32, 4, 4).transpose(1, 3).reshape(128, 4)
    assert not tiles[m:].any() and not tiles[:, 3].any()
    y2 = torch.empty(m, h, dtype=torch.bfloat16)
    assert hc_combine_norm(x, pre, weight, EPS, out=y2) is y2
    assert_bits_equal(y2, y)


def _unaligned_quantized_out(m, h, device):
    """e4m3 data and scales that start one byte into their buffers (scales pre-filled 0xAB)."""
    data = torch.zeros(m * h + 1, dtype=torch.float8_e4m3fn, device=device)[1:].view(m, h)
    size = scale_buffer_size(m, h, swizzled=True)
    scales = torch.full((size + 1,), 0xAB, dtype=torch.uint8, device=device)[1:]
    return Mxfp8SwizzledInput(data, scales)


@needs_kernel
def test_unaligned_quantized_out_is_filled_by_the_quantizer_with_the_same_bits():
    m, h = 5, 96
    x, pre, weight = example_inputs(m, h, "cpu", seed=8)
    quantized = _unaligned_quantized_out(m, h, "cpu")
    y = torch.empty(m, h, dtype=torch.bfloat16)
    assert hc_combine_norm_admission(x, pre, weight, quantize=True, out=(y, quantized))
    got = hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, quantized))
    assert_bits_equal(got, unfused(x, pre, weight, EPS))


@needs_kernel
def test_rows_are_batch_invariant():
    x, pre, weight = example_inputs(7, 64, "cpu", seed=5)
    whole = hc_combine_norm_mxfp8(x, pre, weight, EPS)
    for start, stop in [(0, 1), (3, 4), (6, 7), (2, 5), (1, 7)]:
        part = hc_combine_norm_mxfp8(x[start:stop], pre[start:stop], weight, EPS)
        assert_bits_equal(part[0], whole[0][start:stop])
        assert_bits_equal(part[1].data, whole[1].data[start:stop])


def test_fallback_paths_match_reference(monkeypatch):
    x, pre, weight = example_inputs(3, 40, "cpu", seed=6)  # H % 32 != 0: unfused only, torch path
    assert not hc_combine_norm_admission(x, pre, weight)
    assert_bits_equal(hc_combine_norm(x, pre, weight, EPS), reference(x, pre, weight, EPS))
    x, pre, weight = example_inputs(3, 64, "cpu", seed=7)
    strided = torch.zeros(3, 512, dtype=torch.bfloat16)
    strided[:, ::2] = x
    assert not hc_combine_norm_admission(strided[:, ::2], pre, weight)
    assert_bits_equal(
        hc_combine_norm(strided[:, ::2], pre, weight, EPS), reference(x, pre, weight, EPS)
    )
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    if not x.is_cuda:
        assert not hc_combine_norm_admission(x, pre, weight, quantize=True)
    assert_bits_equal(hc_combine_norm_mxfp8(x, pre, weight, EPS), unfused(x, pre, weight, EPS))


def test_empty_batch():
    x, pre, weight = example_inputs(0, 64, "cpu", seed=0)
    assert hc_combine_norm(x, pre, weight, EPS).shape == (0, 64)
    y, quantized = hc_combine_norm_mxfp8(x, pre, weight, EPS)
    assert y.shape == quantized.data.shape == (0, 64) and quantized.scales.numel() == 0


def _bad(name):
    x, pre, weight = example_inputs(2, 64, "cpu", seed=0)
    args = {"x": x, "pre": pre, "weight": weight, "eps": EPS}
    bad = {
        "x dtype": ("x", x.float(), "x must have dtype"),
        "x ndim": ("x", x.view(2, 4, 64), "x must be 2-D"),
        "x width": ("x", x[:, :255], r"x must be \[m, 4\*H\]"),
        "pre shape": ("pre", pre[:, :3], r"pre must be \[2, 4\]"),
        "pre dtype": ("pre", pre.double(), "pre must have dtype"),
        "weight shape": ("weight", weight[:32], r"weight must be \[64\]"),
        "weight dtype": ("weight", weight.float(), "weight must have dtype"),
        "eps": ("eps", -1.0, "eps must be"),
    }[name]
    args[bad[0]] = bad[1]
    return args, bad[2]


@pytest.mark.parametrize(
    "name",
    [
        "x dtype",
        "x ndim",
        "x width",
        "pre shape",
        "pre dtype",
        "weight shape",
        "weight dtype",
        "eps",
    ],
)
def test_bad_input_raises_value_error(name):
    args, message = _bad(name)
    with pytest.raises(ValueError, match=message):
        hc_combine_norm(**args)
    with pytest.raises(ValueError, match=message):
        hc_combine_norm_mxfp8(**args)
    if name != "eps":  # the admission takes no eps; it refuses, never raises
        args.pop("eps")
        for quantize in (False, True):
            verdict = hc_combine_norm_admission(**args, quantize=quantize)
            assert not verdict and verdict.reason.startswith("invalid arguments")


def test_bad_shapes_specific_to_each_form():
    x, pre, weight = example_inputs(2, 40, "cpu", seed=0)
    with pytest.raises(ValueError, match="multiple of 32"):
        hc_combine_norm_mxfp8(x, pre, weight, EPS)
    x, pre, weight = example_inputs(2, 64, "cpu", seed=0)
    with pytest.raises(ValueError, match="out must be"):
        hc_combine_norm(x, pre, weight, EPS, out=torch.empty(2, 32, dtype=torch.bfloat16))
    data = torch.empty(2, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="out scales must be"):
        hc_combine_norm_mxfp8(
            x,
            pre,
            weight,
            EPS,
            out=(
                torch.empty(2, 64, dtype=torch.bfloat16),
                (data, torch.empty(8, dtype=torch.uint8)),
            ),
        )


# ---- GPU tier ---------------------------------------------------------------------------------


def _gpu_case(m, h, scale, seed, specials=False):
    if specials:
        x, pre, weight = special_rows(m, h, seed=seed)
        x = x * scale
    else:
        x, pre, weight = example_inputs(m, h, "cpu", seed=seed, scale=scale)
    return x.cuda(), pre.cuda(), weight.cuda()


GPU_SCALES = (1e-2, 1e-1, 1.0, 1e1, 1e2)


@pytest.mark.gpu
def test_gpu_fused_equals_unfused_and_reference():
    """Every launch shape (clusters at 1, 6, 8 and 300 rows, one CTA a row at 64 and 128; a
    scale tile with padding rows at 300) at both widths: two magnitudes a shape, so each of
    GPU_SCALES meets each width, and rows of special values from 8 rows."""
    cases = 0
    shapes = [(m, h) for m in (1, 6, 8, 64, 128, 300) for h in (4096, 5120)]
    for i, (m, h) in enumerate(shapes):
        runs = [(GPU_SCALES[(2 * i + j) % len(GPU_SCALES)], j, False) for j in range(2)]
        if m >= 8:
            runs.append((GPU_SCALES[i % len(GPU_SCALES)], 3, True))
        for scale, seed, specials in runs:
            seed += 7 * (m * h + int(scale * 100))
            x, pre, weight = _gpu_case(m, h, scale, seed=seed, specials=specials)
            fused = hc_combine_norm_mxfp8(x, pre, weight, EPS)
            y = hc_combine_norm(x, pre, weight, EPS)
            # Fused == unfused on all three outputs, bit for bit.
            assert_bits_equal(fused, (y, mxfp8_quantize(y)))
            # The Triton quantizer == the reference quantizer on the same y.
            assert_bits_equal(mxfp8_quantize(y), reference_quantize(y))
            # y within one bf16 ulp of float64; special rows equal to the reference.
            y64 = reference(x, pre, weight, EPS, dtype=torch.float64)
            if specials:
                assert_special_rows(y, reference(x, pre, weight, EPS), y64)
            else:
                assert beyond_one_bf16_ulp(y, y64) == 0
            cases += 1
    assert cases == 32


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and sm_major(0) >= 9 and module_available("hc_combine_norm", 0)),
    reason="the CUDA cluster kernel needs sm_90+ and its module (prebuilt, or a toolchain)",
)
def test_gpu_cuda_and_triton_kernels_each_within_one_ulp_and_outputs_choose_one():
    for m, h in ((1, 5120), (6, 5120), (300, 4096), (130, 1024 + 32)):
        x, pre, weight = _gpu_case(m, h, 1.0, seed=31 * m + h)
        assert "cuda cluster" in hc_combine_norm_admission(x, pre, weight, quantize=True).reason
        assert hc_combine_norm_admission(x, pre, weight).kernel == CUDA_CLUSTER
        cuda_y = hc_combine_norm(x, pre, weight, EPS)
        triton_y = hc_combine_norm(x, pre, weight, EPS, admission=triton_admission())
        y64 = reference(x, pre, weight, EPS, dtype=torch.float64)
        assert beyond_one_bf16_ulp(cuda_y, y64) == 0
        assert beyond_one_bf16_ulp(triton_y, y64) == 0
        # Outputs the epilogue cannot write: the CUDA combine, then the quantizer, same bits.
        quantized = _unaligned_quantized_out(m, h, "cuda")
        y = torch.empty(m, h, dtype=torch.bfloat16, device="cuda")
        got = hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, quantized))
        assert_bits_equal(got, (cuda_y, mxfp8_quantize(cuda_y)))
        # A misaligned y: both ops take the Triton kernel.
        odd_y = torch.empty(m * h + 1, dtype=torch.bfloat16, device="cuda")[1:].view(m, h)
        assert not cuda_kernel_fits(x, weight, odd_y)
        assert hc_combine_norm_admission(x, pre, weight, out=odd_y).kernel == TRITON
        assert_bits_equal(hc_combine_norm(x, pre, weight, EPS, out=odd_y), triton_y)
        quantized = Mxfp8SwizzledInput(*mxfp8_quantize(cuda_y))
        got = hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(odd_y, quantized))
        assert_bits_equal(got, (triton_y, mxfp8_quantize(triton_y)))


@pytest.mark.gpu
def test_gpu_rows_are_batch_invariant():
    for h in (4096, 5120):
        x, pre, weight = _gpu_case(300, h, 1.0, seed=h)
        whole = hc_combine_norm_mxfp8(x, pre, weight, EPS)
        # Slices of 64-192 rows take one CTA a row, the whole batch clusters of CTAs.
        slices = [(0, 1), (5, 6), (299, 300), (0, 6), (3, 11), (0, 64), (100, 228), (8, 200)]
        for start, stop in slices + [(130, 300)]:
            part = hc_combine_norm_mxfp8(x[start:stop], pre[start:stop], weight, EPS)
            assert_bits_equal(part[0], whole[0][start:stop])
            assert_bits_equal(part[1].data, whole[1].data[start:stop])
            assert_bits_equal(
                hc_combine_norm(x[start:stop], pre[start:stop], weight, EPS), whole[0][start:stop]
            )


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and sm_major(0) >= 9 and module_available("hc_combine_norm", 0)),
    reason="the CUDA cluster kernel needs sm_90+ and its module (prebuilt, or a toolchain)",
)
def test_gpu_one_cta_a_row_has_the_bits_of_the_cluster():
    module = load_module("hc_combine_norm", 0)
    for m, h in ((64, 5120), (128, 5120), (192, 5120), (97, 4096)):
        x, pre, weight = _gpu_case(m, h, 1.0, seed=m + h, specials=m == 97)
        assert hc_combine_norm_admission(x, pre, weight, quantize=True).kernel == CUDA_ONE_CTA
        default = hc_combine_norm_mxfp8(x, pre, weight, EPS)
        y, quantized = mxfp8_outputs(m, h, "cuda")
        outputs = (y, quantized.data.view(torch.uint8), quantized.scales)
        # The cluster shape, as it runs below 64 rows: 4 CTAs of one vector a thread.
        none = no_quant_out(x.device, h)
        module.hc_combine_norm_cuda(x, pre, weight, *outputs, *none, EPS, True, 4, h // 32)
        assert_bits_equal(default, (y, quantized))
        assert_bits_equal(hc_combine_norm(x, pre, weight, EPS), y)


@pytest.mark.gpu
def test_gpu_strided_rows_and_cuda_graph_capture():
    m, h = 6, 5120
    x, pre, weight = strided_inputs(m, h, seed=9, device="cuda")
    assert x.stride(0) == 4 * h + 64 and pre.stride(1) == 2 and weight.stride(0) == 2
    assert hc_combine_norm_admission(x, pre, weight, quantize=True)
    expected = unfused(x, pre, weight, EPS)
    y = torch.empty(m, h, dtype=torch.bfloat16, device="cuda")
    quantized = Mxfp8SwizzledInput(
        torch.empty(m, h, dtype=torch.float8_e4m3fn, device="cuda"),
        torch.full(
            (scale_buffer_size(m, h, swizzled=True),), 0xAB, dtype=torch.uint8, device="cuda"
        ),
    )
    hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, quantized))  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, quantized))
    y.zero_()
    quantized.scales.fill_(0xAB)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal((y, quantized), expected)


def test_cuda_kernel_is_only_chosen_for_cuda_tensors():
    x, pre, weight = example_inputs(2, 64, "cpu", seed=1)
    assert not cuda_kernel_fits(x, weight)
    admission = hc_combine_norm_admission(x, pre, weight, quantize=True)
    assert "cuda cluster" not in admission.reason and admission.kernel != CUDA_CLUSTER
    if admission:  # the interpreter
        assert admission.plan == CombineNormPlan(Kernel.TRITON) and admission.kernel == TRITON


def test_cuda_launch_shapes():
    """The CUDA kernel's shape, chosen by the plan from m and H: a cluster of the largest of 4,
    2, 1 CTAs giving each whole 32-value blocks, with the fewest vectors a thread that keep a
    CTA within 256 threads; at 64-192 rows one CTA of all the cluster's threads, where they
    are one vector a thread in whole warps (the same bits)."""
    table = {
        (1, 5120): (Kernel.CUDA_CLUSTER, CudaShape(4, 160)),
        (6, 5120): (Kernel.CUDA_CLUSTER, CudaShape(4, 160)),
        (63, 5120): (Kernel.CUDA_CLUSTER, CudaShape(4, 160)),
        (64, 5120): (Kernel.CUDA_ONE_CTA, CudaShape(1, 640)),
        (192, 5120): (Kernel.CUDA_ONE_CTA, CudaShape(1, 640)),
        (193, 5120): (Kernel.CUDA_CLUSTER, CudaShape(4, 160)),
        (97, 4096): (Kernel.CUDA_ONE_CTA, CudaShape(1, 512)),
        (300, 4096): (Kernel.CUDA_CLUSTER, CudaShape(4, 128)),
        (130, 1056): (Kernel.CUDA_CLUSTER, CudaShape(1, 160)),  # 33 blocks: no cluster
        (100, 5248): (Kernel.CUDA_CLUSTER, CudaShape(4, 192)),  # 164 vectors: not whole warps
        (100, 4160): (Kernel.CUDA_CLUSTER, CudaShape(2, 160)),  # 260 vectors: two a thread
        (6, 40960): (Kernel.CUDA_CLUSTER, CudaShape(4, 256)),  # 5 vectors a thread
    }
    for (m, h), shape in table.items():
        assert cuda_shape(m, h) == shape, (m, h)


@pytest.mark.parametrize(
    "out, match",
    [
        ("y", "out must be \\(y, \\(data, scales\\)\\), got Tensor"),
        ("three", "out must be \\(y, \\(data, scales\\)\\), got a tuple of 3"),
        ("y and y", "out\\[1\\] must be \\(data, scales\\), got Tensor"),
    ],
)
def test_fused_out_of_the_wrong_structure_is_named(out, match):
    x, pre, weight = example_inputs(3, 64, "cpu", seed=9)
    y = torch.empty(3, 64, dtype=torch.bfloat16)
    out = {"y": y, "three": (y, y, y), "y and y": (y, y)}[out]
    with pytest.raises(ValueError, match=match):
        hc_combine_norm_mxfp8(x, pre, weight, EPS, out=out)
    verdict = hc_combine_norm_admission(x, pre, weight, quantize=True, out=out)
    assert not verdict and "out" in verdict.reason


def test_eps_takes_numpy_floats_and_refuses_bools():
    x, pre, weight = example_inputs(3, 64, "cpu", seed=10)
    plain = hc_combine_norm(x, pre, weight, float(np.float32(1e-6)))
    assert_bits_equal(hc_combine_norm(x, pre, weight, np.float32(1e-6)), plain)
    with pytest.raises(ValueError, match="eps must be a number, got the bool"):
        hc_combine_norm(x, pre, weight, True)


def _outputs(m, h):
    y = torch.empty(m, h, dtype=torch.bfloat16)
    data = torch.empty(m, h, dtype=torch.float8_e4m3fn)
    return y, data, torch.empty(scale_buffer_size(m, h, swizzled=True), dtype=torch.uint8)


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_overlapping_or_shared_outputs_are_refused_on_every_path(monkeypatch, path):
    """An out whose rows alias each other (an expand view) or outputs sharing memory: the
    kernel would overwrite rows where the fallback raises, so every path refuses them first,
    naming the argument (and the admission refuses them)."""
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    m, h = 4, 64
    x, pre, weight = example_inputs(m, h, "cpu", seed=11)
    y, data, scales = _outputs(m, h)
    row = y[:1].expand(m, h)
    with pytest.raises(ValueError, match="out has overlapping elements"):
        hc_combine_norm(x, pre, weight, EPS, out=row)
    assert not hc_combine_norm_admission(x, pre, weight, out=row)
    one_scale = scales[:1].expand(scales.numel())
    in_y = y.view(torch.uint8)[:, :h].view(torch.float8_e4m3fn)  # data inside y's bytes
    for out, match in (
        ((row, (data, scales)), "out y has overlapping elements"),
        ((y, (data[:1].expand(m, h), scales)), "out data has overlapping elements"),
        ((y, (data, one_scale)), "out scales has overlapping elements"),
        ((y, (in_y, scales)), "out y and out data share memory"),
    ):
        with pytest.raises(ValueError, match=match):
            hc_combine_norm_mxfp8(x, pre, weight, EPS, out=out)
        assert not hc_combine_norm_admission(x, pre, weight, quantize=True, out=out)
    # An admission made without an out does not let an overlapping one through.
    admission = hc_combine_norm_admission(x, pre, weight)
    with pytest.raises(ValueError, match="out has overlapping elements"):
        hc_combine_norm(x, pre, weight, EPS, out=row, admission=admission)
    admission = hc_combine_norm_admission(x, pre, weight, quantize=True)
    with pytest.raises(ValueError, match="out y and out data share memory"):
        hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, (in_y, scales)), admission=admission)


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_scalars_follow_one_rule_on_every_path(monkeypatch, path):
    """eps takes Python and NumPy numbers, never a bool; the admission's quantize takes bools."""
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    x, pre, weight = example_inputs(3, 64, "cpu", seed=12)
    for eps, same in (
        (np.float64(1e-6), 1e-6),
        (np.float32(2.0**-20), 2.0**-20),
        (np.int64(0), 0.0),
    ):
        assert_bits_equal(
            hc_combine_norm_mxfp8(x, pre, weight, eps)[0], hc_combine_norm(x, pre, weight, same)
        )
    for form in (hc_combine_norm, hc_combine_norm_mxfp8):
        quantize = form is hc_combine_norm_mxfp8
        for admission in (None, hc_combine_norm_admission(x, pre, weight, quantize=quantize)):
            with pytest.raises(ValueError, match="eps must be a number, got the bool"):
                form(x, pre, weight, np.bool_(True), admission=admission)
    flag = hc_combine_norm_admission(x, pre, weight, quantize=np.bool_(True))
    assert flag.ok == hc_combine_norm_admission(x, pre, weight, quantize=True).ok
    verdict = hc_combine_norm_admission(x, pre, weight, quantize=1)
    assert not verdict and "quantize must be a bool" in verdict.reason


def test_tensors_on_another_device_or_meta_are_named():
    """Every tensor on x's device, and x with data: a meta x is refused, never "computed"."""
    x, pre, weight = example_inputs(3, 64, "cpu", seed=13)
    meta = [t.to("meta") for t in (x, pre, weight)]
    for form in (hc_combine_norm, hc_combine_norm_mxfp8):
        with pytest.raises(ValueError, match="x is a meta tensor"):
            form(*meta, EPS)
        for i, name in ((1, "pre"), (2, "weight")):
            args = [x, pre, weight]
            args[i] = meta[i]
            with pytest.raises(ValueError, match=f"{name} is on meta, x on cpu"):
                form(*args, EPS)
    assert not hc_combine_norm_admission(*meta)
    y, data, scales = _outputs(3, 64)
    with pytest.raises(ValueError, match="out must be"):
        hc_combine_norm(x, pre, weight, EPS, out=y.to("meta"))
    with pytest.raises(ValueError, match="out scales must be"):
        hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, (data, scales.to("meta"))))


def test_admission_must_be_an_admission():
    x, pre, weight = example_inputs(3, 64, "cpu", seed=14)
    for form in (hc_combine_norm, hc_combine_norm_mxfp8):
        for admission in ("kernel", True):
            with pytest.raises(TypeError, match="admission must be an Admission"):
                form(x, pre, weight, EPS, admission=admission)
