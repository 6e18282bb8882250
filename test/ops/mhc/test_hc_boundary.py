"""hc_boundary: SGLang's post bit for bit, then the next statistics and combine + RMSNorm with the
bits of the unfused ops, in one launch (the GPU tier); the references, the admission and the
fallback (everywhere)."""

import dataclasses
import fractions
import struct

import numpy as np
import pytest
import torch

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.hc_boundary import boundary_inputs
from dsv41_kernels.cases.hc_mix_stats import example_inputs, mix_relative_error
from dsv41_kernels.ops.mhc.hc_boundary import hc_boundary, hc_boundary_admission
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm
from dsv41_kernels.ops.mhc.hc_mix_stats import MIX_RTOL, hc_mix_stats, hc_mix_stats_admission
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import (
    ROWS_KERNEL_DEPENDENT,
    ROWS_KERNEL_SLICES,
    launched_as,
    rows_kernel_fits,
    rows_kernel_tile,
)
from dsv41_kernels.reference.hc_boundary import fma_fp32, sglang_post
from dsv41_kernels.reference.hc_boundary import hc_boundary as ref_boundary
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as ref_combine_norm
from dsv41_kernels.reference.hc_mix_stats import hc_mix, hc_post
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0
from test.machine import on_cuda, pretend_arch

H = 5120
ROWS_KERNEL = "small_row/cuda fp32 " + ("dependent pair" if ROWS_KERNEL_DEPENDENT else "fused")


def fp32_neighbours_nearest(v: fractions.Fraction) -> float:
    """The fp32 nearest to the exact rational ``v`` (ties to even), by brute force."""
    r = struct.unpack("f", struct.pack("f", float(v)))[0]
    up = float(np.nextafter(np.float32(r), np.float32(np.inf)))
    down = float(np.nextafter(np.float32(r), np.float32(-np.inf)))
    odd = lambda c: struct.unpack("I", struct.pack("f", c))[0] & 1
    return min((r, up, down), key=lambda c: (abs(fractions.Fraction(c) - v), odd(c)))


def test_fma_fp32_rounds_once():
    gen = torch.Generator().manual_seed(0)
    scales = lambda: 2.0 ** torch.randint(-20, 20, (400,), generator=gen)
    a, b, c = (torch.randn(400, generator=gen) * scales() for _ in range(3))
    # Exact ties: a·b = 2^24 + 2^13 + 1 lies halfway between two fp32s; c breaks the tie or not.
    a = torch.cat([a, torch.full((3,), 4097.0)])
    b = torch.cat([b, torch.full((3,), 4097.0)])
    c = torch.cat([c, torch.tensor([2.0**-30, -(2.0**-30), 0.0])])
    got = fma_fp32(a, b, c)
    for i in range(a.numel()):
        exact = fractions.Fraction(a[i].item()) * fractions.Fraction(b[i].item())
        exact += fractions.Fraction(c[i].item())
        assert got[i].item() == fp32_neighbours_nearest(exact), i
    assert got[-3:].tolist() == [16785410.0, 16785408.0, 16785408.0]


def test_sglang_post_is_the_post_rounded_once_to_bf16():
    for seed in range(20):
        special = seed % 2 == 1
        y, residual, post, comb, *_ = boundary_inputs(5, seed=seed, hidden=64, special=special)
        exact = hc_post(y, residual, post, comb, dtype=torch.float64).float()
        ours = sglang_post(y, residual, post, comb).float()
        # one bf16 rounding of an fp32 value within a few fp32 ulps of the exact one
        ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(exact)[1] - 8).clamp_min(2.0**-133)
        assert ((ours - exact).abs() <= ulp).all()


def test_fallback_is_the_three_ops_unfused():
    args = boundary_inputs(6, seed=1, hidden=64)
    updated, normed, stats = hc_boundary(*args)
    y, residual, post, comb, pre, fn, scale, base, weight = args
    assert bit_mismatches(updated, sglang_post(y, residual, post, comb)) == 0
    flat = updated.flatten(1)
    for a, b in zip(stats, hc_mix_stats(flat, fn, scale, base), strict=True):
        assert bit_mismatches(a, b) == 0
    assert bit_mismatches(normed, hc_combine_norm(flat, pre, weight, 1e-6)) == 0
    ref_updated, ref_normed, ref_stats = ref_boundary(*args)
    assert bit_mismatches(updated, ref_updated) == 0
    assert (normed.double() - ref_normed).abs().max() < 0.05


def quant_out_like(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)`` buffers for ``y``'s rows, filled with garbage the op must overwrite."""
    m, h = y.shape
    q = torch.full((m, h), 0x55, dtype=torch.uint8, device=y.device).view(torch.float8_e4m3fn)
    return q, torch.full((m, h // 32), -7.0, device=y.device)


def assert_groups_of(normed, quant_out, what=None):
    """``quant_out`` is SGLang's ue8m0 quantizer of ``normed``, bit for bit."""
    q, scales = group_quant_ue8m0(normed, 32)
    assert bit_mismatches(quant_out[0].view(torch.uint8), q.view(torch.uint8)) == 0, what
    assert bit_mismatches(quant_out[1], scales) == 0, what


def nonfinite_rows(args, seed: int):
    """``args`` with +-Inf and NaN in some rows of y or the residual (so normed has NaN and
    +-Inf rows, and the groups their -448 codes and infinite scales)."""
    y, residual = args[0].clone(), args[1].clone()
    gen = torch.Generator().manual_seed(seed)
    bad = torch.tensor([float("inf"), float("-inf"), float("nan")]).bfloat16().to(y.device)
    for row in range(0, y.shape[0], 2):
        col = int(torch.randint(0, y.shape[1], (1,), generator=gen))
        (y if row % 4 == 0 else residual[:, 1])[row, col] = bad[row % 3]
    return (y, residual, *args[2:])


def test_fallback_fills_quant_out_with_sglangs_groups_of_normed():
    """Rows of every kind (special values, +-Inf and NaN inputs, so NaN rows): ``quant_out``
    holds SGLang's quantizer of the ``normed`` returned (the quantizer itself is held to
    SGLang's statement in test/sglang/test_rmsnorm_quant_fp8.py), and the other outputs are
    those of a call without it."""
    for seed in range(8):
        m = 3 + seed % 4
        args = boundary_inputs(m, seed=seed, hidden=256, special=seed % 2 == 1)
        if seed % 4 >= 2:
            args = nonfinite_rows(args, seed)
        quant_out = quant_out_like(args[0])
        updated, normed, stats = hc_boundary(*args, quant_out=quant_out)
        assert_groups_of(normed, quant_out, seed)
        plain = hc_boundary(*args)
        assert bit_mismatches((updated, normed, *stats), (plain[0], plain[1], *plain[2])) == 0


def test_quant_out_errors_name_it():
    args = boundary_inputs(3, seed=4, hidden=64)
    q, scales = quant_out_like(args[0])
    bad = {
        "a tuple": (q,),
        r"quant_out\[0\] \(q\) must have dtype": (q.view(torch.uint8), scales),
        r"quant_out\[1\] \(scales\) must be \[3, 2\]": (q, scales[:, :1]),
        r"quant_out\[0\] \(q\) must be \[3, 64\], contiguous": (q.t().contiguous().t(), scales),
    }
    for match, quant_out in bad.items():
        with pytest.raises(ValueError, match=match):
            hc_boundary(*args, quant_out=quant_out)
    overlapping = (q, args[1].view(torch.float32).flatten()[:6].view(3, 2))
    with pytest.raises(ValueError, match="residual shares memory"):
        hc_boundary(*args, quant_out=overlapping)
    on_weight = (q, args[8].view(torch.float32)[:6].view(3, 2))
    with pytest.raises(ValueError, match="weight shares memory"):
        hc_boundary(*args, quant_out=on_weight)
    with pytest.raises(ValueError, match=r"quant_out\[0\] \(q\) shares memory with the output"):
        hc_boundary(*args, quant_out=(q, q.view(torch.float32).flatten()[:6].view(3, 2)))
    shifted = torch.empty(3 * 64 + 1, dtype=torch.uint8)[1:].view(torch.float8_e4m3fn).view(3, 64)
    with pytest.raises(ValueError, match=r"quant_out\[0\] \(q\) must start 16-byte aligned"):
        hc_boundary(*args, quant_out=(shifted, scales))


def test_admission_refuses_off_cuda_and_names_bad_arguments():
    args = boundary_inputs(2, seed=2, hidden=64)
    assert not hc_boundary_admission(*args)
    assert "cpu" in hc_boundary_admission(*args).reason
    y, residual, post, comb, pre, fn, scale, base, weight = args
    bad = {
        "y": (y.float(), "y must have dtype"),
        "residual": (residual[:, :3], r"residual must be \[2, 4, 64\]"),
        "comb": (comb[:, :, :2], r"comb must be \[2, 4, 4\]"),
        "fn": (fn[:, :8], r"fn must be \[24, 256\]"),
        "weight": (weight[:8], r"weight must be \[64\]"),
        "pre": (pre.double(), "pre must have dtype"),
    }
    names = ("y", "residual", "post", "comb", "pre", "fn", "scale", "base", "weight")
    for name, (value, match) in bad.items():
        call = dict(zip(names, args, strict=True))
        call[name] = value
        assert not hc_boundary_admission(**call)
        with pytest.raises(ValueError, match=match):
            hc_boundary(**call)
    with pytest.raises(ValueError, match="iters"):
        hc_boundary(*args, iters=True)


def test_kernel_admission_on_a_pretend_h200(monkeypatch):
    """What an H200 takes: 1-64 rows of H = 5120, contiguous; the plan's rows a pass. From 65
    rows hc_mix_stats takes its compensated path, and the boundary declines."""
    pretend_arch(9, monkeypatch.setattr)
    import dsv41_kernels.ops.mhc.hc_mix_stats_plan as plan

    monkeypatch.setattr(plan, "multiprocessors", lambda index: 132)
    for m, tile in ((1, 8), (6, 8), (9, 16), (16, 16), (17, 32), (64, 32)):
        args = tuple(on_cuda(t) for t in boundary_inputs(m, seed=m))
        a = hc_boundary_admission(*args)
        assert a and a.kernel == "cuda" and a.plan.dependent == ROWS_KERNEL_DEPENDENT
        assert a.plan.row_tile == tile == rows_kernel_tile(m)
        x = args[1].flatten(1)
        stats = hc_mix_stats_admission(x, args[5])
        assert stats.kernel == ROWS_KERNEL
        for dependent, name in ((True, "dependent pair"), (False, "fused")):
            pair = dataclasses.replace(a.plan, dependent=dependent)
            assert launched_as(a, dependent).plan == pair
            launched = launched_as(stats, dependent)
            assert launched.kernel == launched.plan.kernel == f"small_row/cuda fp32 {name}"
            assert (launched.plan.dependent, launched.plan.fused) == (dependent, not dependent)
    for m in (65, 127, 128):
        args = tuple(on_cuda(t) for t in boundary_inputs(m, seed=0))
        assert not hc_boundary_admission(*args)
        compensated = hc_mix_stats_admission(args[1].flatten(1), args[5])
        assert compensated.kernel.startswith("compensated")
        with pytest.raises(ValueError, match="small-row"):
            launched_as(compensated, True)
    monkeypatch.setattr(plan, "multiprocessors", lambda index: 114)
    args = tuple(on_cuda(t) for t in boundary_inputs(6, seed=0))
    assert not rows_kernel_fits(args[1].flatten(1), args[5])
    assert "does not fit" in hc_boundary_admission(*args).reason


# ---- the GPU tier: fused against unfused, bit for bit

GPU_ROWS = (1, 2, 3, 5, 6, 7, 8, 9, 12, 16, 17, 24, 31, 32, 33, 48, 63, 64)


def _rows_kernel_gpu() -> bool:
    """A GPU the small-row kernel is for: sm_90+ with at least 128 SMs (the H200)."""
    if not torch.cuda.is_available():
        return False
    props = torch.cuda.get_device_properties(0)
    return props.major >= 9 and props.multi_processor_count >= ROWS_KERNEL_SLICES


needs_rows_kernel = pytest.mark.skipif(
    not _rows_kernel_gpu(), reason="the small-row kernel needs sm_90+ with 128+ SMs"
)


def _admitted(args):
    """The kernel's admission, asserted: on such a GPU these arguments must take it."""
    admission = hc_boundary_admission(*args)
    assert admission, admission.reason
    return admission


@pytest.mark.gpu
@needs_rows_kernel
@pytest.mark.parametrize("m", GPU_ROWS)
def test_gpu_fused_equals_unfused_bit_for_bit(m):
    for seed in range(12):
        args = boundary_inputs(m, seed=1000 * m + seed, device="cuda", special=seed % 3 == 2)
        admission = _admitted(args)
        updated, normed, stats = hc_boundary(*args, admission=admission)
        y, residual, post, comb, pre, fn, scale, base, weight = args
        assert bit_mismatches(updated, sglang_post(y, residual, post, comb)) == 0
        flat = updated.flatten(1)
        assert hc_mix_stats_admission(flat, fn).kernel == ROWS_KERNEL
        for a, b in zip(stats, hc_mix_stats(flat, fn, scale, base), strict=True):
            assert bit_mismatches(a, b) == 0
        assert bit_mismatches(normed, hc_combine_norm(flat, pre, weight, 1e-6)) == 0


@pytest.mark.gpu
@needs_rows_kernel
@pytest.mark.parametrize("m", (1, 6, 31, 64))
def test_gpu_statistics_against_float64(m):
    """The fp32 projection's error against float64, and the norm within one bf16 ulp."""
    args = boundary_inputs(m, seed=7 + m, device="cuda")
    _admitted(args)
    updated, normed, _ = hc_boundary(*args)
    flat = updated.flatten(1)
    fn, scale, base = args[5], args[6], args[7]
    ours = hc_mix_stats(flat, fn, scale, base, return_mix=True)
    err = mix_relative_error(ours[3], hc_mix(flat, fn))
    assert err <= MIX_RTOL / 10, err
    ref = ref_combine_norm(flat, args[4], args[8], 1e-6, dtype=torch.float64)
    ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref)[1] - 8)
    assert ((normed.double() - ref).abs() <= ulp).all()


@pytest.mark.gpu
@needs_rows_kernel
def test_gpu_graph_replay_and_repeat_are_identical():
    args = boundary_inputs(6, seed=3, device="cuda")
    _admitted(args)
    first = hc_boundary(*args)
    out = {}
    graph = torch.cuda.CUDAGraph()
    hc_boundary(*args)  # warm (module loaded, attributes set) before capture
    with torch.cuda.graph(graph):
        out["v"] = hc_boundary(*args)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for a, b in zip((first[0], first[1], *first[2]), (out["v"][0], out["v"][1], *out["v"][2])):
        assert bit_mismatches(a, b) == 0


@pytest.mark.gpu
@needs_rows_kernel
def test_gpu_matches_sglang_own_post_kernel():
    split_h = pytest.importorskip("sglang.kernels.ops.layernorm.mhc_post_split_h")
    for m in (1, 6, 48, 64):
        args = boundary_inputs(m, seed=50 + m, device="cuda", special=True)
        _admitted(args)
        updated, _, _ = hc_boundary(*args)
        y, residual, post, comb = args[:4]
        theirs = split_h.mhc_post_split_h(y, residual, post, comb)
        assert bit_mismatches(updated, theirs) == 0


@pytest.mark.gpu
@needs_rows_kernel
def test_gpu_a_rows_statistics_do_not_depend_on_the_batch():
    """The small-row kernel's sums of a row depend on the row alone: the same bits alone or in
    a batch, whatever the rows a pass (8, 16 or 32) and the row's position."""
    x, fn, scale, base = example_inputs(64, H, device="cuda", seed=5)
    assert hc_mix_stats_admission(x, fn).kernel == ROWS_KERNEL
    whole = hc_mix_stats(x, fn, scale, base)
    for m in (1, 8, 16, 33):
        alone = hc_mix_stats(x[-m:].clone(), fn, scale, base)
        for a, b in zip(alone, whole, strict=True):
            assert bit_mismatches(a, b[-m:]) == 0, m


@pytest.mark.gpu
@needs_rows_kernel
@pytest.mark.parametrize("m", (2, 6, 64))
def test_gpu_nonfinite_values_stay_in_their_row(m):
    """+-Inf and NaN in row 0's y and residual: ``updated`` is SGLang's post kernel's bits (NaN
    payloads included: both round with cvt.rn), the statistics and the normed rows are our
    unfused ops' on it, and every other row keeps the bits it has when row 0 is finite."""
    split_h = pytest.importorskip("sglang.kernels.ops.layernorm.mhc_post_split_h")
    args = boundary_inputs(m, seed=80 + m, device="cuda")
    _admitted(args)
    clean = hc_boundary(*args)
    y, residual = args[0].clone(), args[1].clone()
    bad = torch.tensor([float("inf"), float("-inf"), float("nan")], device="cuda")
    y[0, 7:10] = bad.bfloat16()
    residual[0, 2, 4000:4003] = bad.bfloat16()
    args = (y, residual, *args[2:])
    updated, normed, stats = hc_boundary(*args)
    post, comb, pre, fn, scale, base, weight = args[2:]
    assert bit_mismatches(updated, split_h.mhc_post_split_h(y, residual, post, comb)) == 0
    flat = updated.flatten(1)
    assert bit_mismatches(stats, hc_mix_stats(flat, fn, scale, base)) == 0
    assert bit_mismatches(normed, hc_combine_norm(flat, pre, weight, 1e-6)) == 0
    assert updated[0].isnan().any()
    ours = (updated, normed, *stats)
    for a, b in zip(ours, (clean[0], clean[1], *clean[2]), strict=True):
        assert bit_mismatches(a[1:], b[1:]) == 0


@pytest.mark.gpu
@needs_rows_kernel
@pytest.mark.parametrize("m", (1, 6, 17, 64))
def test_gpu_dependent_pair_has_the_cooperative_grids_bits(m):
    """The small-row kernel's two launches: the dependent pair and the cooperative grid give the
    same bits, fused and for the statistics alone, eagerly and in a CUDA graph, over a chain of
    boundaries each reading the one before (so a grid that started before its predecessor had
    finished, or a scratch the allocator hands on, would show)."""
    args = boundary_inputs(m, seed=600 + m, device="cuda", special=True)
    y, residual, rest = args[0], args[1], args[2:]
    fused = _admitted(args)
    stats = hc_mix_stats_admission(residual.flatten(1), args[5])
    assert stats.plan.dependent == ROWS_KERNEL_DEPENDENT

    def chain(dependent: bool, length: int = 6):
        outputs, streams = [], residual
        for _ in range(length):
            updated, normed, triplet = hc_boundary(
                y, streams, *rest, admission=launched_as(fused, dependent)
            )
            alone = hc_mix_stats(
                updated.flatten(1), *args[5:8], admission=launched_as(stats, dependent)
            )
            outputs += [updated, normed, *triplet, *alone]
            streams = updated
        return outputs

    cooperative = chain(False)
    for dependent in (True, False):
        assert bit_mismatches(chain(dependent), cooperative) == 0
        graph, captured = torch.cuda.CUDAGraph(), {}
        with torch.cuda.graph(graph):
            captured["v"] = chain(dependent)
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
        assert bit_mismatches(captured["v"], cooperative) == 0


@pytest.mark.gpu
@needs_rows_kernel
@pytest.mark.parametrize("m", (1, 6, 17, 64))
def test_gpu_quant_out_is_sglangs_quantizer_of_normed(m):
    """The FP8 epilogue, in both launches, eagerly and replayed: SGLang's ue8m0 groups of the
    normed rows the same launch stores, special and non-finite rows included, and every other
    output the bits of a launch without it."""
    for seed in range(6):
        args = boundary_inputs(m, seed=700 + 10 * m + seed, device="cuda", special=seed % 2 == 1)
        if seed >= 4:
            args = nonfinite_rows(args, seed)
        admission = _admitted(args)
        plain = hc_boundary(*args, admission=admission)
        for dependent in (False, True):
            launch = launched_as(admission, dependent)
            quant_out = quant_out_like(args[0])
            updated, normed, stats = hc_boundary(*args, admission=launch, quant_out=quant_out)
            assert_groups_of(normed, quant_out, (seed, dependent))
            ours = (updated, normed, *stats)
            assert bit_mismatches(ours, (plain[0], plain[1], *plain[2])) == 0
    quant_out = quant_out_like(args[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = hc_boundary(*args, admission=admission, quant_out=quant_out)
    for scale in (1.0, 1e20, 1e-20):
        args[0].mul_(scale)
        graph.replay()
        torch.cuda.synchronize()
        assert_groups_of(captured[1], quant_out, scale)
