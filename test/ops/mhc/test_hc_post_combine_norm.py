"""hc_post_combine_norm: SGLang's post and the next combine + RMSNorm in one launch, bitwise
the two unfused (the post as SGLang's kernels round it, the combine as hc_combine_norm's
kernel computes it for the same rows), and with ``quant_out`` SGLang's ue8m0 FP8 groups of the
normed rows."""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.hc_boundary import boundary_inputs
from dsv41_kernels.jit import module_available
from dsv41_kernels.ops.mhc.hc_boundary import hc_boundary, hc_boundary_admission
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm, hc_combine_norm_admission
from dsv41_kernels.ops.mhc.hc_post_combine_norm import (
    hc_post_combine_norm,
    hc_post_combine_norm_admission,
)
from dsv41_kernels.ops.mhc.quant_out import no_quant_out
from dsv41_kernels.reference.hc_boundary import sglang_post
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as ref_combine_norm
from test.machine import on_cuda, pretend_arch
from test.ops.mhc.test_hc_boundary import (
    assert_groups_of,
    needs_rows_kernel,
    nonfinite_rows,
    quant_out_like,
)

H = 5120
EPS = 1e-6


def post_inputs(m: int, *, seed: int, hidden: int = H, device="cpu", special: bool = False):
    """(y, residual, post, comb, pre, weight): the boundary's inputs without the statistics'."""
    y, residual, post, comb, pre, _, _, _, weight = boundary_inputs(
        m, seed=seed, hidden=hidden, device=device, special=special
    )
    return y, residual, post, comb, pre, weight


def test_fallback_is_the_post_then_the_combine():
    """On the CPU: the post bit for bit as SGLang rounds it, and hc_combine_norm of it, over
    random rows with zeros, signed zeros, huge and tiny values; within one bf16 ulp of the norm
    in float64."""
    for seed in range(40):
        m = 1 + seed % 9
        args = post_inputs(m, seed=seed, hidden=64 * (1 + seed % 3), special=seed % 2 == 1)
        updated, normed = hc_post_combine_norm(*args, EPS)
        y, residual, post, comb, pre, weight = args
        assert bit_mismatches(updated, sglang_post(y, residual, post, comb)) == 0
        flat = updated.flatten(1)
        assert bit_mismatches(normed, hc_combine_norm(flat, pre, weight, EPS)) == 0
        ref = ref_combine_norm(flat, pre, weight, EPS, dtype=torch.float64)
        ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref)[1] - 8).clamp_min(2.0**-133)
        assert ((normed.double() - ref).abs() <= ulp).all(), seed


def test_no_rows_and_nonfinite_rows_on_the_fallback():
    updated, normed = hc_post_combine_norm(*post_inputs(0, seed=1, hidden=64))
    assert updated.shape == (0, 4, 64) and normed.shape == (0, 64)
    y, residual, post, comb, pre, weight = post_inputs(3, seed=2, hidden=64)
    y[1, 5] = float("nan")
    residual[1, 2, 9] = float("inf")
    updated, normed = hc_post_combine_norm(y, residual, post, comb, pre, weight)
    clean = hc_post_combine_norm(*post_inputs(3, seed=2, hidden=64))
    assert normed[1].isnan().all() and updated[1].isnan().any()
    for a, b in zip((updated, normed), clean, strict=True):
        assert bit_mismatches(a[[0, 2]], b[[0, 2]]) == 0


def test_fallback_fills_quant_out_with_sglangs_groups_of_normed():
    """Rows of every kind (special values, +-Inf and NaN inputs): ``quant_out`` holds SGLang's
    quantizer of the ``normed`` returned, and the other outputs are a plain call's."""
    for seed in range(8):
        args = post_inputs(2 + seed % 5, seed=seed, hidden=96, special=seed % 2 == 1)
        if seed % 4 >= 2:
            args = nonfinite_rows(args, seed)
        quant_out = quant_out_like(args[0])
        updated, normed = hc_post_combine_norm(*args, quant_out=quant_out)
        assert_groups_of(normed, quant_out, seed)
        assert bit_mismatches((updated, normed), hc_post_combine_norm(*args)) == 0


def test_quant_out_errors_name_it():
    """The checks :mod:`dsv41_kernels.ops.mhc.quant_out` makes, with this op's inputs."""
    args = post_inputs(3, seed=4, hidden=64)
    q, scales = quant_out_like(args[0])
    with pytest.raises(ValueError, match=r"quant_out\[1\] \(scales\) must be \[3, 2\]"):
        hc_post_combine_norm(*args, quant_out=(q, scales[:, :1]))
    with pytest.raises(ValueError, match="pre shares memory"):
        hc_post_combine_norm(*args, quant_out=(q, args[4].view(-1)[:6].view(3, 2)))
    with pytest.raises(ValueError, match="must be a tuple"):
        hc_post_combine_norm(*args, quant_out=q)


def test_admission_refuses_off_cuda_and_names_bad_arguments():
    args = post_inputs(2, seed=3, hidden=64)
    verdict = hc_post_combine_norm_admission(*args)
    assert not verdict and "cpu" in verdict.reason
    y, residual, post, comb, pre, weight = args
    bad = {
        "y": (y.float(), "y must have dtype"),
        "residual": (residual[:, :3], r"residual must be \[2, 4, 64\]"),
        "post": (post[:1], r"post must be \[2, 4\]"),
        "comb": (comb[:, :, :2], r"comb must be \[2, 4, 4\]"),
        "pre": (pre.double(), "pre must have dtype"),
        "weight": (weight[:8], r"weight must be \[64\]"),
    }
    names = ("y", "residual", "post", "comb", "pre", "weight")
    for name, (value, match) in bad.items():
        call = dict(zip(names, args, strict=True))
        call[name] = value
        verdict = hc_post_combine_norm_admission(**call)
        assert not verdict and verdict.reason.startswith("invalid arguments"), name
        with pytest.raises(ValueError, match=match):
            hc_post_combine_norm(**call)
    with pytest.raises(ValueError, match="eps"):
        hc_post_combine_norm(*args, eps=float("nan"))


def test_kernel_admission_on_a_pretend_h200(monkeypatch):
    """An H200 takes every row count in hc_combine_norm's launch shape for the updated rows
    (so the normed rows have that kernel's bits), and declines what the kernel cannot hold."""
    pretend_arch(9, monkeypatch.setattr)
    for m in (1, 6, 63, 64, 192, 193, 384):
        args = tuple(on_cuda(t) for t in post_inputs(m, seed=m))
        verdict = hc_post_combine_norm_admission(*args)
        combine = hc_combine_norm_admission(args[1].flatten(1), args[4], args[5])
        assert verdict and verdict.kernel == combine.kernel, m
        assert verdict.plan.cuda == combine.plan.cuda, m
    y, residual, post, comb, pre, weight = (on_cuda(t) for t in post_inputs(6, seed=0))
    strided = residual.transpose(0, 1).contiguous().transpose(0, 1)
    refusals = {
        "residual is not contiguous": dict(residual=on_cuda(strided)),
        "y rows": dict(y=on_cuda(torch.empty(6, H + 4, dtype=torch.bfloat16)[:, 4:])),
        "post or comb": dict(comb=on_cuda(comb.transpose(1, 2))),
    }
    names = dict(y=y, residual=residual, post=post, comb=comb, pre=pre, weight=weight)
    for reason, change in refusals.items():
        verdict = hc_post_combine_norm_admission(**{**names, **change})
        assert not verdict and reason in verdict.reason, (reason, verdict.reason)
    # One row whose row stride is off: torch calls it contiguous, the module would not.
    odd = on_cuda(torch.empty_strided((1, 4, H), (H + 4, H, 1), dtype=torch.bfloat16))
    one = post_inputs(1, seed=2)
    one = tuple(on_cuda(t) for t in (one[0], odd.copy_(one[1]), *one[2:]))
    assert one[1].is_contiguous()
    assert "residual is not contiguous" in hc_post_combine_norm_admission(*one).reason
    # H = 8192 at 64 rows: hc_combine_norm's one CTA of 1024 threads, past the post's registers.
    wide = tuple(on_cuda(t) for t in post_inputs(64, seed=1, hidden=8192))
    assert hc_combine_norm_admission(wide[1].flatten(1), wide[4], wide[5]).plan.cuda[1] == 1024
    assert "registers" in hc_post_combine_norm_admission(*wide).reason
    pretend_arch(8, monkeypatch.setattr)
    assert "CUDA kernel" in hc_post_combine_norm_admission(*(on_cuda(t) for t in args)).reason


def test_the_thread_cap_is_the_kernels_launch_bound():
    """The admission's cap at one vector a thread is the kernel's launch bound for POST."""
    import re
    from pathlib import Path

    from dsv41_kernels.ops.mhc.hc_post_combine_norm import MAX_THREADS_ONE_VECTOR

    root = Path(__file__).resolve().parents[3]
    text = (root / "sgl-kernel/csrc/hc_combine_norm_kernel.cuh").read_text()
    (bound,) = re.findall(r"items == 1 \? \(post \? (\d+) :", text)
    assert int(bound) == MAX_THREADS_ONE_VECTOR


# ---- the GPU tier: fused against unfused, bit for bit

needs_kernel = pytest.mark.skipif(
    not (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability(0)[0] >= 9
        and module_available("hc_post_combine_norm", 0)
    ),
    reason="the kernel needs sm_90+ and its module (prebuilt, or a toolchain)",
)
GPU_ROWS = (1, 2, 3, 5, 6, 7, 8, 12, 31, 63, 64, 65, 96, 128, 191, 192, 193, 256, 384)


def _admitted(args):
    verdict = hc_post_combine_norm_admission(*args)
    assert verdict, verdict.reason
    return verdict


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("m", GPU_ROWS)
def test_gpu_fused_equals_unfused_bit_for_bit(m):
    for seed in range(12):
        args = post_inputs(m, seed=100 * m + seed, device="cuda", special=seed % 3 == 2)
        updated, normed = hc_post_combine_norm(*args, EPS, admission=_admitted(args))
        y, residual, post, comb, pre, weight = args
        assert bit_mismatches(updated, sglang_post(y, residual, post, comb)) == 0
        flat = updated.flatten(1)
        assert bit_mismatches(normed, hc_combine_norm(flat, pre, weight, EPS)) == 0


@pytest.mark.gpu
@needs_kernel
@needs_rows_kernel
def test_gpu_has_the_bits_of_the_boundary_with_statistics():
    for m in (1, 6, 31, 64):
        args = boundary_inputs(m, seed=7 * m, device="cuda", special=True)
        admission = hc_boundary_admission(*args)
        assert admission, admission.reason
        updated, normed, _ = hc_boundary(*args, admission=admission)
        y, residual, post, comb, pre, _, _, _, weight = args
        ours = hc_post_combine_norm(y, residual, post, comb, pre, weight, EPS)
        assert bit_mismatches(ours, (updated, normed)) == 0


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("m", (1, 6, 64))
def test_gpu_matches_sglang_own_post_and_nonfinite_rows_stay_put(m):
    """``updated`` is SGLang's post kernel's bits (NaN payloads included: both round with
    cvt.rn); ±Inf and NaN in row 0 leave every other row's bits as they are."""
    split_h = pytest.importorskip("sglang.kernels.ops.layernorm.mhc_post_split_h")
    args = post_inputs(m, seed=30 + m, device="cuda")
    clean = hc_post_combine_norm(*args)
    y, residual = args[0].clone(), args[1].clone()
    bad = torch.tensor([float("inf"), float("-inf"), float("nan")], device="cuda")
    y[0, 7:10] = bad.bfloat16()
    residual[0, 2, 4000:4003] = bad.bfloat16()
    post, comb, pre, weight = args[2:]
    updated, normed = hc_post_combine_norm(y, residual, post, comb, pre, weight)
    assert bit_mismatches(updated, split_h.mhc_post_split_h(y, residual, post, comb)) == 0
    assert bit_mismatches(normed, hc_combine_norm(updated.flatten(1), pre, weight, EPS)) == 0
    assert normed[0].isnan().all()
    for a, b in zip((updated, normed), clean, strict=True):
        assert bit_mismatches(a[1:], b[1:]) == 0


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("m", (65, 96, 128, 384))
def test_gpu_sglangs_tilelang_post_above_64_rows(m):
    """Above 64 rows SGLang's SM90 post is the TileLang ``mhc_post``: it has the split-H bits,
    which lets the hook take SGLang's post up to 384 rows on SM90."""
    kernels = pytest.importorskip("sglang.kernels.ops.layernorm.mhc")
    pytest.importorskip("tilelang")  # the kernel is built by TileLang at its first call
    from dsv41_kernels.calibration.drivers import one_rank_layout

    args = post_inputs(m, seed=60 + m, device="cuda", special=True)
    y, residual, post, comb = args[:4]
    updated, _ = hc_post_combine_norm(*args)
    with one_rank_layout():  # its post asks whether prefill context parallelism interleaves
        theirs = kernels.mhc_post(y, residual, post, comb)
    assert bit_mismatches(updated, theirs) == 0


@pytest.mark.gpu
@needs_kernel
def test_gpu_strided_rows_graph_replay_and_bad_launch_shapes():
    m = 6
    y, residual, post, comb, pre, weight = post_inputs(m, seed=9, device="cuda")
    wide = torch.zeros(m, H + 64, dtype=torch.bfloat16, device="cuda")
    wide[:, 64:] = y
    strided = (wide[:, 64:], residual, post, comb, pre.t().contiguous().t(), weight)
    _admitted(strided)
    first = hc_post_combine_norm(*strided)
    assert bit_mismatches(first, hc_post_combine_norm(y, residual, post, comb, pre, weight)) == 0
    out = {}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out["v"] = hc_post_combine_norm(*strided)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert bit_mismatches(out["v"], first) == 0
    from dsv41_kernels.jit import load_module

    module = load_module("hc_post_combine_norm", 0)
    updated, normed = (torch.empty_like(t) for t in first)
    none = no_quant_out(y.device, H)
    call = lambda *shape, out=(updated, normed), groups=none: module.hc_post_combine_norm_cuda(
        y, residual, post, comb, pre, weight, *out, *groups, EPS, *shape
    )
    with pytest.raises(ValueError, match="threads"):
        call(1, 1024)  # one vector a thread, more threads than the post's registers allow
    with pytest.raises(ValueError, match="cluster"):
        call(3, 160)
    with pytest.raises(ValueError, match="updated"):
        call(4, 160, out=(updated[:, :3], normed))
    q, scales = quant_out_like(y)
    with pytest.raises(ValueError, match="q_scales"):
        call(4, 160, groups=(q, scales[:, :8]))


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("m", (1, 6, 17, 64, 96, 384))
def test_gpu_quant_out_is_sglangs_quantizer_of_normed(m):
    """The FP8 epilogue in the launch shapes the rows get (H = 5120: one vector a thread in
    clusters of 4 or 1; 4160: clusters of 2, two vectors a thread; 9760: five, both with idle
    vectors), eagerly and replayed: SGLang's ue8m0 groups of the normed rows the same launch
    stores, special and non-finite rows included, and every other output the bits of a launch
    without it."""
    for seed in range(6):
        hidden = (H, 4160, 9760)[seed % 3]
        args = post_inputs(m, seed=900 + m + seed, hidden=hidden, device="cuda",
                           special=seed % 2 == 1)  # fmt: skip
        if seed >= 3:
            args = nonfinite_rows(args, seed)
        admission = _admitted(args)
        plain = hc_post_combine_norm(*args, admission=admission)
        quant_out = quant_out_like(args[0])
        ours = hc_post_combine_norm(*args, admission=admission, quant_out=quant_out)
        assert_groups_of(ours[1], quant_out, (seed, admission.plan.cuda))
        assert bit_mismatches(ours, plain) == 0
    args = post_inputs(m, seed=m, device="cuda")
    quant_out = quant_out_like(args[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = hc_post_combine_norm(*args, quant_out=quant_out)
    for scale in (1.0, 1e20, 1e-20):
        args[0].mul_(scale)
        graph.replay()
        torch.cuda.synchronize()
        assert_groups_of(captured[1], quant_out, scale)
