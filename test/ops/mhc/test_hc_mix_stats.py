import numpy as np
import pytest
import torch

from dsv41_kernels import interpreter
from dsv41_kernels.cases.hc_mix_stats import (
    example_inputs,
    forced_admission,
    mix_relative_error,
    reference_with_mix,
    single_pass_tf32,
    stats_mismatches,
)
from dsv41_kernels.devices import sm_major
from dsv41_kernels.jit import load_module, module_available
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32
from dsv41_kernels.ops.mhc.hc_mix_stats import MIX_RTOL, hc_mix_stats, hc_mix_stats_admission
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import (
    MixStatsPlan,
    Numerics,
    Path,
    Projection,
    SplitKConfig,
    check_config,
    cuda_kernel_fits,
    fuses,
    make_plan,
    num_sms,
    split_k_config,
)
from dsv41_kernels.reference.hc_mix_stats import hc_mix_stats as ref_mix_stats
from dsv41_kernels.reference.hc_mix_stats import hc_post, hc_pre, hc_sinkhorn
from test.machine import DEVICE, needs_kernel


def bits(t):
    return t.view(torch.int32)


def assert_rows_equal(a, b):
    """Bitwise equality of every output (pre, post, comb, mix)."""
    for u, v in zip(a, b, strict=True):
        assert torch.equal(bits(u.contiguous()), bits(v.contiguous()))


# ---- references ----------------------------------------------------------------------------


def test_references_float64_and_float32_agree():
    x, fn, scale, base = example_inputs(16, 256, device="cpu", seed=1)
    ref64 = reference_with_mix(x, fn, scale, base)
    ref32 = reference_with_mix(x, fn, scale, base, dtype=torch.float32)
    assert all(t.dtype == torch.float32 for t in ref32)
    assert mix_relative_error(ref32[3], ref64[3]) < 1e-6
    assert stats_mismatches(ref32, ref64, scale) == 0


def test_sinkhorn_rows_and_columns_sum_to_one():
    logits = torch.randn(256, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for dtype, col_tol in ((torch.float64, 2e-6), (torch.float32, 3e-6)):
        comb = hc_sinkhorn(logits.to(dtype))
        assert (comb.sum(-2) - 1).abs().max() < col_tol  # the last step normalises columns
        assert (comb.sum(-1) - 1).abs().max() < 1e-3
        assert (comb > 0).all()


def test_hc_pre_combines_with_pre_and_hc_post_sums_over_the_source_stream():
    gen = torch.Generator().manual_seed(3)
    m, hidden = 5, 16
    x, fn, scale, base = example_inputs(m, hidden, device="cpu", seed=3)
    x3 = x.reshape(m, 4, hidden)
    x_in, pre, post, comb = hc_pre(x3, fn, scale, base)
    assert x_in.dtype == torch.bfloat16 and x_in.shape == (m, hidden)
    loop = sum(pre[:, i, None] * x3[:, i].double() for i in range(4))
    assert torch.equal(x_in, loop.to(torch.bfloat16))
    x_in32, *stats32 = hc_pre(x3, fn, scale, base, dtype=torch.float32)
    assert (x_in32.float() - x_in.float()).abs().max() <= 2**-6 * x_in.float().abs().max()
    assert all(s.dtype == torch.float32 for s in stats32)

    # comb[i][j] weighs source stream i into destination j: a permutation moves streams.
    y = torch.randn(m, hidden, generator=gen).to(torch.bfloat16)
    res = torch.randn(m, 4, hidden, generator=gen).to(torch.bfloat16)
    sigma = [2, 0, 3, 1]
    perm = torch.zeros(m, 4, 4, dtype=torch.float64)
    for i, j in enumerate(sigma):
        perm[:, i, j] = 1.0
    moved = hc_post(y, res, torch.zeros(m, 4, dtype=torch.float64), perm)
    for i, j in enumerate(sigma):
        assert torch.equal(moved[:, j], res[:, i])
    out = hc_post(y, res, post, comb)
    loop = torch.stack(
        [
            post[:, j, None] * y.double()
            + sum(comb[:, i, j, None] * res[:, i].double() for i in range(4))
            for j in range(4)
        ],
        dim=1,
    )
    assert torch.equal(out, loop.to(torch.bfloat16))


@needs_kernel
def test_released_or_stale_weights_are_refused():
    x, fn, scale, base = example_inputs(3, 16, device=DEVICE)
    holder = HcDerivedWeights(fn)
    fn.add_(1.0)  # bypasses the guard: caught at the next use
    with pytest.raises(RuntimeError, match="modified in place"):
        hc_mix_stats(x, holder, scale, base)
    holder.release()
    with pytest.raises(ValueError, match="released"):
        hc_mix_stats(x, holder, scale, base)


# ---- admission, validation, launch shapes --------------------------------------------------


@needs_kernel
@pytest.mark.parametrize(
    "m,mode,path",
    [
        (1, "auto", "small_row"),
        (127, "auto", "small_row"),
        (128, "auto", "compensated"),
        (3, "compensated", "compensated"),
        (300, "batch_invariant", "batch_invariant"),
    ],
)
def test_admission_names_the_path(m, mode, path):
    x = torch.zeros(m, 64, dtype=torch.bfloat16, device=DEVICE)
    adm = hc_mix_stats_admission(x, torch.zeros(24, 64, device=DEVICE), mode)
    assert adm and adm.reason.startswith(path + ":")
    assert isinstance(adm.plan, MixStatsPlan) and adm.plan.path is Path(path)
    assert adm.kernel == adm.plan.kernel and adm.kernel.startswith(f"{path}/")
    if not x.is_cuda:
        assert adm.plan.projection is Projection.TRITON and adm.module is None


def test_plans_name_the_kernel_that_runs():
    """A plan's kernel names the path, the projection's kernel and a fused launch (K = 20480 on
    132 SMs: the wgmma kernel fuses the statistics from 16384 rows); numerics follow the
    path, and a launch shape the kernels do not take is refused when the plan is made."""
    k = 20480

    def plan(path, projection, m):
        cuda = projection is not Projection.TRITON
        wgmma = projection is Projection.CUDA_WGMMA
        return make_plan(path, projection, split_k_config(path, m, k, 132, cuda=cuda, wgmma=wgmma))

    named = {
        (Path.COMPENSATED, Projection.CUDA_WGMMA, 4096): "compensated/cuda wgmma",
        (Path.COMPENSATED, Projection.CUDA_WGMMA, 16384): "compensated/cuda wgmma fused",
        (Path.COMPENSATED, Projection.CUDA_MMA, 16384): "compensated/cuda mma.sync",
        (Path.COMPENSATED, Projection.TRITON, 16384): "compensated/triton",
        (Path.BATCH_INVARIANT, Projection.CUDA_WGMMA, 65536): "batch_invariant/cuda wgmma",
        (Path.SMALL_ROW, Projection.TRITON, 6): "small_row/triton",
    }
    for (path, projection, m), kernel in named.items():
        assert plan(path, projection, m).kernel == kernel
    assert plan(Path.SMALL_ROW, Projection.TRITON, 6).numerics is Numerics.TF32X3
    assert plan(Path.BATCH_INVARIANT, Projection.TRITON, 6).numerics is Numerics.COMPENSATED
    assert plan(Path.COMPENSATED, Projection.TRITON, 128).partial_columns == 64
    assert plan(Path.COMPENSATED, Projection.CUDA_MMA, 128).partial_columns == 32
    with pytest.raises(ValueError, match="block_m must be 128"):
        make_plan(Path.COMPENSATED, Projection.CUDA_MMA, SplitKConfig(256, 64, 8, 8, 4, 16))


@needs_kernel
def test_a_plan_with_another_launch_shape_runs_as_given():
    """The benchmark's sweep passes plans of other launch shapes through the admission: the
    kernels run them within the stated tolerances."""
    m, hidden = 9, 32
    x, fn, scale, base = example_inputs(m, hidden, device=DEVICE, seed=4)
    ref = reference_with_mix(x, fn, scale, base)
    for mode, config in (
        ("compensated", SplitKConfig(16, 32, 3, 4, 2, 2)),
        ("small_row", SplitKConfig(16, 64, 1, 4, 2, 4)),
    ):
        admission = forced_admission(x, fn, mode, Projection.TRITON, config)
        assert admission.plan.config == config
        ours = hc_mix_stats(x, fn, scale, base, mode=mode, return_mix=True, admission=admission)
        assert stats_mismatches(ours, ref, scale) == 0


def test_admission_refuses_without_triton_device_and_fallback_is_fp32_torch(monkeypatch):
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    x, fn, scale, base = example_inputs(4, 16, device="cpu")
    adm = hc_mix_stats_admission(x, fn)
    assert not adm and "without a Triton device" in adm.reason
    ours = hc_mix_stats(x, HcDerivedWeights(fn), scale, base, return_mix=True)
    ref = reference_with_mix(x, fn, scale, base, dtype=torch.float32)
    assert_rows_equal(ours, ref)
    assert_rows_equal(ours[:3], ref_mix_stats(x, fn, scale, base, dtype=torch.float32))


@needs_kernel
def test_admission_refuses_non_bf16_x():
    x, fn, scale, base = example_inputs(4, 16, device=DEVICE)
    adm = hc_mix_stats_admission(x.float(), fn)
    assert not adm and "bf16" in adm.reason


def test_bad_arguments_name_themselves():
    x, fn, scale, base = example_inputs(4, 16, device="cpu")
    with pytest.raises(ValueError, match="mode"):
        hc_mix_stats(x, fn, scale, base, mode="fast")
    with pytest.raises(ValueError, match="mode"):
        hc_mix_stats(x, fn, scale, base, mode="single_pass_tf32")  # not an op path
    for args in ((x, fn, "fast"), (x[0], fn), (x, fn[:, :32]), (x, fn.double())):
        verdict = hc_mix_stats_admission(*args)  # the admission refuses, never raises
        assert not verdict and verdict.reason.startswith("invalid arguments")
    with pytest.raises(ValueError, match="x"):
        hc_mix_stats(x[0], fn, scale, base)
    with pytest.raises(ValueError, match="weights"):
        hc_mix_stats(x, fn[:, :32], scale, base)
    with pytest.raises(ValueError, match="weights"):
        hc_mix_stats(x, fn.double(), scale, base)
    with pytest.raises(ValueError, match="scale"):
        hc_mix_stats(x, fn, scale[:2], base)
    with pytest.raises(ValueError, match="iters"):
        hc_mix_stats(x, fn, scale, base, iters=0)
    with pytest.raises(ValueError, match="fn"):
        HcDerivedWeights(fn[:8])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(iters=2.5), "iters must be an int"),
        (dict(iters=True), "iters must be an int, got the bool"),
        (dict(iters=10**6), "iters must be in"),
        (dict(eps="1e-6"), "eps must be a number"),
        (dict(rms_eps=None), "rms_eps must be a number"),
        (dict(post_mult=np.ones(2)), "post_mult must be a number"),
        (dict(return_mix=torch.ones(2)), "return_mix must be a bool"),
    ],
)
def test_bad_scalars_name_themselves_before_any_kernel(kwargs, match):
    x, fn, scale, base = example_inputs(4, 16, device="cpu")
    with pytest.raises(ValueError, match=match):
        hc_mix_stats(x, fn, scale, base, **kwargs)


@needs_kernel
def test_numpy_scalars_are_python_numbers():
    x, fn, scale, base = example_inputs(5, 16, device=DEVICE)
    plain = hc_mix_stats(x, fn, scale, base, iters=7, eps=1e-5, rms_eps=1e-6, post_mult=2.0)
    numpy = hc_mix_stats(
        x,
        fn,
        scale,
        base,
        iters=np.int64(7),
        eps=np.float64(1e-5),
        rms_eps=1e-6,
        post_mult=np.float32(2.0),
    )
    for a, b in zip(numpy, plain, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("path", ["compensated", "small_row", "batch_invariant"])
def test_launch_shapes_fit_grid_limits_up_to_65536_rows(path):
    for k in (4 * 4096, 4 * 5120, 4 * 7168, 160):
        for m in (1, 6, 64, 127, 128, 1024, 4096, 16384, 65536):
            cfg = split_k_config(Path(path), m, k, 132)
            assert -(-m // cfg.block_m) < 2**31 and -(-m // cfg.finish_rows) < 2**31
            assert 1 <= cfg.splits <= min(256, -(-k // cfg.block_k))  # grid axis 1 <= 65535
    invariant = {split_k_config(Path.BATCH_INVARIANT, m, 20480, 132) for m in (1, 384, 4096, 65536)}
    assert len(invariant) == 1
    assert split_k_config(Path.COMPENSATED, 6, 20480, 132).splits > 1  # small m fills the machine


def test_cuda_launch_shapes():
    """The CUDA projection's rows a CTA, slices and finisher rows (H200, K = 20480): 128 rows
    two CTAs an SM; with wgmma one CTA an SM from 256 rows: 128 rows a CTA in
    WGMMA_ONE_WAVE_ROWS (at least 4 finisher rows, every slice in one finisher step), 256 above;
    the table is checked."""
    shape = lambda m, wgmma: split_k_config(Path.COMPENSATED, m, 20480, 132, cuda=True, wgmma=wgmma)
    table = {
        128: (128, 128, 1),
        255: (128, 128, 1),
        256: (128, 64, 4),
        512: (128, 33, 4),
        1024: (128, 16, 8),
        1025: (256, 26, 8),
        2048: (256, 16, 16),
        4096: (256, 8, 32),
        16384: (256, 2, 32),
    }
    for m, want in table.items():
        cfg = shape(m, True)
        assert (cfg.block_m, cfg.splits, cfg.finish_rows) == want, m
    assert shape(512, False).splits == 66 and shape(512, False).finish_rows == 2
    assert shape(4096, False).block_m == 128 and shape(4096, False).splits == 8
    for m in (128, 1024, 65536):
        for wgmma in (False, True):
            check_config(shape(m, wgmma), cuda=True, wgmma=wgmma)
    with pytest.raises(ValueError, match="block_m must be 128"):
        check_config(shape(4096, True), cuda=True, wgmma=False)
    with pytest.raises(ValueError, match="block_m must be 128"):
        check_config(SplitKConfig(64, 64, 8, 8, 4, 16), cuda=True, wgmma=True)
    with pytest.raises(ValueError, match="16..128"):  # 256 rows are the wgmma kernel's only
        check_config(shape(4096, True))


# ---- the kernels under the interpreter (structure; no TF32 there) --------------------------

KERNEL_CASES = [
    (1, 16, "auto"),
    (5, 40, "auto"),  # K = 160: the last K block is partial
    (130, 32, "auto"),  # compensated, three row tiles
    (3, 32, "compensated"),
    (70, 16, "small_row"),  # two row tiles
    (9, 32, "batch_invariant"),
]


@needs_kernel
@pytest.mark.parametrize("m,hidden,mode", KERNEL_CASES)
def test_kernels_against_references(m, hidden, mode):
    x, fn, scale, base = example_inputs(m, hidden, device=DEVICE, seed=m + hidden)
    ours = hc_mix_stats(x, HcDerivedWeights(fn), scale, base, mode=mode, return_mix=True)
    assert [tuple(t.shape) for t in ours] == [(m, 4), (m, 4), (m, 4, 4), (m, 24)]
    ref = reference_with_mix(x, fn, scale, base)
    assert stats_mismatches(ours, ref, scale) == 0
    assert (ours[2].sum(-2) - 1).abs().max() < 3e-6
    # A bare fn (split per call) and [m, 4, H] input give the same bits.
    again = hc_mix_stats(x.reshape(m, 4, hidden), fn, scale, base, mode=mode, return_mix=True)
    assert_rows_equal(ours, again)
    assert_rows_equal(ours[:3], hc_mix_stats(x, fn, scale, base, mode=mode))


@needs_kernel
def test_single_pass_tf32_against_references():
    """Upstream's numerics on our kernels (what the compensation is measured against): exact
    in the interpreter, which has no TF32, so within the stated tolerances there."""
    m, hidden = 9, 32
    x, fn, scale, base = example_inputs(m, hidden, device=DEVICE, seed=m + hidden)
    ours = single_pass_tf32(x, fn, scale, base, return_mix=True)
    assert [tuple(t.shape) for t in ours] == [(m, 4), (m, 4), (m, 4, 4), (m, 24)]
    if not torch.cuda.is_available():
        assert stats_mismatches(ours, reference_with_mix(x, fn, scale, base), scale) == 0
    assert (ours[2].sum(-2) - 1).abs().max() < 3e-6
    assert_rows_equal(
        ours, single_pass_tf32(x.reshape(m, 4, hidden), fn, scale, base, return_mix=True)
    )
    assert_rows_equal(ours[:3], single_pass_tf32(x, fn, scale, base))


@needs_kernel
def test_kernel_options_reach_the_finisher():
    x, fn, scale, base = example_inputs(6, 16, device=DEVICE, seed=8)
    ours = hc_mix_stats(x, fn, scale, base, iters=3, rms_eps=1e-3, eps=1e-4, post_mult=1.0)
    ref = ref_mix_stats(x, fn, scale, base, iters=3, rms_eps=1e-3, eps=1e-4, post_mult=1.0)
    for a, b in zip(ours, ref, strict=True):
        assert (a.double() - b).abs().max() < 1e-5


@needs_kernel
def test_empty_batch():
    x, fn, scale, base = example_inputs(0, 16, device=DEVICE)
    pre, post, comb = hc_mix_stats(x, fn, scale, base)
    assert pre.shape == (0, 4) and comb.shape == (0, 4, 4)


@needs_kernel
def test_batch_invariant_mode_is_independent_of_batch_and_position():
    hidden = 32
    x, fn, scale, base = example_inputs(70, hidden, device=DEVICE, seed=9)
    holder = HcDerivedWeights(fn)
    run = lambda rows: hc_mix_stats(
        rows, holder, scale, base, mode="batch_invariant", return_mix=True
    )
    full = run(x)
    # Under the interpreter tl.dot is numpy's matmul, whose BLAS kernels may round a row by
    # its place in the M tile (OpenBLAS' Haswell sgemm does, on a 64-row tile's last row).
    # There each row keeps its in-tile place while the batch's size and other rows change;
    # on CUDA the MMA rows are independent of their place, so rows also move.
    moves = torch.cuda.is_available()
    tile = split_k_config(Path.BATCH_INVARIANT, 70, 4 * hidden, 1).block_m
    others = example_inputs(tile, hidden, device=DEVICE, seed=10)[0]
    for r in (0, 1, 63, 64, 69):
        place = 0 if moves else r % tile
        rows = others[: place + 1].clone()
        rows[place] = x[r]
        assert_rows_equal([t[r : r + 1] for t in full], [t[place : place + 1] for t in run(rows)])
    if moves:
        shifted = run(torch.cat([x[5:], x[:5]]))  # every row at another position and tile
        assert_rows_equal([t[5:] for t in full], [t[:65] for t in shifted])


def _fallback(monkeypatch, forced: str):
    """The device and x dtype that take the torch fallback: no Triton device (CPU tensors with
    the interpreter off) or fp32 x (the kernels read bf16)."""
    if forced == "no Triton device":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
        return "cpu", torch.bfloat16
    return DEVICE, torch.float32


@pytest.mark.parametrize("forced", ["no Triton device", "fp32 x"])
def test_batch_invariant_fallback_is_independent_of_batch_and_position(monkeypatch, forced):
    """The torch fallback keeps the mode's contract: a row's bits depend on neither the batch's
    size, nor its other rows, nor the row's place; every row within the stated tolerances."""
    device, dtype = _fallback(monkeypatch, forced)
    x, fn, scale, base = example_inputs(40, 256, device=device, seed=21)
    x = x.to(dtype)
    holder = HcDerivedWeights(fn)
    assert not hc_mix_stats_admission(x, holder, "batch_invariant")
    run = lambda rows: hc_mix_stats(
        rows, holder, scale, base, mode="batch_invariant", return_mix=True
    )
    full = run(x)
    assert stats_mismatches(full, reference_with_mix(x, fn, scale, base), scale) == 0
    for batch in (20, 40):
        whole = run(x[:batch])
        for start, stop in ((7, 9), (0, 1), (batch - 1, batch), (3, 17)):
            assert_rows_equal([t[start:stop] for t in whole], run(x[start:stop].clone()))
        assert_rows_equal([t[:batch] for t in full], whole)
    shifted = run(torch.cat([x[5:], x[:5]]))  # every row at another place
    assert_rows_equal([t[5:] for t in full], [t[:35] for t in shifted])


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_scale_and_base_must_have_their_documented_shapes(monkeypatch, path):
    """``scale [3]`` and ``base [24]`` exactly, on every path (a ``[1, 3]`` scale has the right
    number of elements but the fallback would broadcast it)."""
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    x, fn, scale, base = example_inputs(4, 16, device="cpu")
    for bad, match in (
        ({"scale": scale.view(1, 3)}, r"scale must be \[3\], got \(1, 3\)"),
        ({"scale": scale[:2]}, r"scale must be \[3\]"),
        ({"base": base.view(1, 24)}, r"base must be \[24\], got \(1, 24\)"),
        ({"base": base.view(4, 6)}, r"base must be \[24\]"),
    ):
        with pytest.raises(ValueError, match=match):
            hc_mix_stats(x, fn, **{"scale": scale, "base": base, **bad})


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_scalars_follow_one_rule_on_every_path(monkeypatch, path):
    """NumPy ints are ints; a bool or a float where an int is expected is refused; the mode is
    checked even when the caller passes its admission (the plan decides the path)."""
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    x, fn, scale, base = example_inputs(5, 16, device="cpu", seed=2)
    plain = hc_mix_stats(x, fn, scale, base, iters=7)
    assert_rows_equal(plain, hc_mix_stats(x, fn, scale, base, iters=np.int64(7)))
    for iters, match in (
        (True, "iters must be an int, got the bool"),
        (7.0, "iters must be an int"),
    ):
        with pytest.raises(ValueError, match=match):
            hc_mix_stats(x, fn, scale, base, iters=iters)
    assert len(hc_mix_stats(x, fn, scale, base, return_mix=np.bool_(True))) == 4
    admission = hc_mix_stats_admission(x, fn)
    for mode in ("fast", 1, None):
        with pytest.raises(ValueError, match="mode must be one of"):
            hc_mix_stats(x, fn, scale, base, mode=mode, admission=admission)


def test_tensors_on_another_device_or_meta_are_named():
    """Every tensor on x's device, and x with data: a meta x is refused, never "computed"."""
    x, fn, scale, base = example_inputs(4, 16, device="cpu")
    meta = [t.to("meta") for t in (x, fn, scale, base)]
    with pytest.raises(ValueError, match="x is a meta tensor"):
        hc_mix_stats(*meta)
    assert not hc_mix_stats_admission(meta[0], meta[1])
    for i, name in enumerate(("weights", "scale", "base")):
        args = [x, fn, scale, base]
        args[i + 1] = meta[i + 1]
        with pytest.raises(ValueError, match=f"{name} is on meta, x on cpu"):
            hc_mix_stats(*args)
    with pytest.raises(ValueError, match="weights is on meta, x on cpu"):
        hc_mix_stats(x, HcDerivedWeights(meta[1]), scale, base)


def test_admission_must_be_an_admission():
    x, fn, scale, base = example_inputs(4, 16, device="cpu")
    for admission in ("kernel", True, 1):
        with pytest.raises(TypeError, match="admission must be an Admission"):
            hc_mix_stats(x, fn, scale, base, admission=admission)


# ---- GPU tier (H200) -----------------------------------------------------------------------

GPU_ROWS = [1, 6, 64, 128, 1024, 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("m", GPU_ROWS)
def test_gpu_compensated_accuracy_vs_single_pass_tf32(m):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    holder = HcDerivedWeights(fn)
    ref = reference_with_mix(x, fn, scale, base)
    comp = hc_mix_stats(x, holder, scale, base, mode="compensated", return_mix=True)
    single = single_pass_tf32(x, fn, scale, base, return_mix=True)
    err, err_single = mix_relative_error(comp[3], ref[3]), mix_relative_error(single[3], ref[3])
    assert err <= MIX_RTOL, err
    assert err * 10 <= err_single, (err, err_single)
    assert stats_mismatches(comp, ref, scale) == 0
    auto = hc_mix_stats(x, holder, scale, base, return_mix=True)  # small_row below 128 rows
    assert mix_relative_error(auto[3], ref[3]) <= MIX_RTOL
    assert stats_mismatches(auto, ref, scale) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["batch_invariant", "small_row"])
def test_gpu_other_paths_accuracy(mode):
    for m in (1, 6, 64, 1024):
        x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=100 + m)
        ref = reference_with_mix(x, fn, scale, base)
        ours = hc_mix_stats(x, HcDerivedWeights(fn), scale, base, mode=mode, return_mix=True)
        assert mix_relative_error(ours[3], ref[3]) <= MIX_RTOL
        assert stats_mismatches(ours, ref, scale) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("m,hidden", [(65536, 4096), (300, 1000), (200, 4096), (7, 7168)])
def test_gpu_other_shapes(m, hidden):
    """Odd and large shapes (65536 rows: the fused kernel over 256 row tiles). A large batch
    repeats 4096 random rows, each checked in every copy: the same kernels and checks, without
    making and referencing 65536 random rows on the host."""
    unique = min(m, 4096)
    x, fn, scale, base = example_inputs(unique, hidden, device="cuda", seed=m)
    ref = reference_with_mix(x, fn, scale, base)
    copies = m // unique
    ref = [t.repeat(copies, *[1] * (t.dim() - 1)) for t in ref]
    ours = hc_mix_stats(x.repeat(copies, 1), HcDerivedWeights(fn), scale, base, return_mix=True)
    assert ours[0].shape[0] == m
    assert mix_relative_error(ours[3], ref[3]) <= MIX_RTOL
    assert stats_mismatches(ours, ref, scale) == 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and module_available("hc_mix_stats", 0)),
    reason="no GPU, or no CUDA module for it (none prebuilt, no toolchain): Triton projection",
)
def test_gpu_cuda_projection_agrees_with_the_triton_projection():
    projection = "CUDA wgmma projection" if sm_major(0) == 9 else "CUDA mma.sync projection"
    for m in (1, 128, 300, 4096):
        x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=200 + m)
        holder = HcDerivedWeights(fn)
        ref = reference_with_mix(x, fn, scale, base)
        admission = hc_mix_stats_admission(x, holder, "compensated")
        assert projection in admission.reason
        assert admission.kernel.startswith("compensated/cuda")
        results = []
        for admitted in (admission, forced_admission(x, holder, "compensated", Projection.TRITON)):
            ours = hc_mix_stats(
                x, holder, scale, base, mode="compensated", return_mix=True, admission=admitted
            )
            assert mix_relative_error(ours[3], ref[3]) <= MIX_RTOL
            assert stats_mismatches(ours, ref, scale) == 0
            results.append(ours[3])
        assert mix_relative_error(results[0], results[1].double()) <= 2 * MIX_RTOL
    # A row stride that keeps 16-byte alignment takes the CUDA kernel; a misaligned view does not.
    wide = example_inputs(64, 5120 + 4, device="cuda", seed=7)[0]
    _, fn, scale, base = example_inputs(64, 5120, device="cuda", seed=8)
    for view, cuda in ((wide[:, : 4 * 5120], True), (wide[:, 1 : 4 * 5120 + 1], False)):
        assert cuda_kernel_fits(view, fn) is cuda
        kernel = hc_mix_stats_admission(view, fn, "compensated").kernel
        assert kernel.startswith("compensated/cuda") if cuda else kernel == "compensated/triton"
        ref = reference_with_mix(view, fn, scale, base)
        holder = HcDerivedWeights(fn)
        ours = hc_mix_stats(view, holder, scale, base, mode="compensated", return_mix=True)
        assert stats_mismatches(ours, ref, scale) == 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and module_available("hc_mix_stats", 0)),
    reason="no GPU, or no CUDA module for it (none prebuilt, no toolchain)",
)
def test_gpu_cuda_projection_reads_fn_as_its_tf32_part():
    """The CUDA projection takes fn for hi: the tensor core reads the same TF32 value from
    both, so the partials equal those of a staged hi bit for bit, special values included, in
    every kernel and launch shape the GPU has; the wgmma kernel's bits do not depend on its
    rows a CTA, and its partials are the mma.sync kernel's to a few ulp of each slice's
    largest (the tensor cores round inside a chain differently, and the lanes' sqsum chains
    take other elements). An fn that is not contiguous takes the Triton projection."""
    module = load_module("hc_mix_stats")
    kernels = [(False, 128)] + ([(True, 128), (True, 256)] if sm_major(0) == 9 else [])
    for m, seed in ((1, 1), (128, 2), (300, 3)):
        x, fn, _, _ = example_inputs(m, 5120, device="cuda", seed=300 + seed)
        fn = fn * torch.logspace(-30, 30, fn.shape[1], device="cuda")  # every exponent range
        fn[0, :8] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-40,
                                  -1e-42, 3.4e38], device="cuda")  # fmt: skip
        fn[1, :2] = (
            torch.tensor([0x7F800001, 0xFF801FFF - 2**32], dtype=torch.int32)
            .cuda()
            .view(torch.float32)
        )  # NaNs whose payload lies in the 13 bits the tensor core drops
        hi, lo = split_tf32(fn)
        runs = []
        for kernel in kernels:
            got, want = [
                (torch.full((8, m, 32), 7.0, device="cuda"), torch.full((8, m), 7.0, device="cuda"))
                for _ in range(2)
            ]
            module.hc_mix_partials_tf32(x, fn, lo, *got, *kernel)
            module.hc_mix_partials_tf32(x, hi.contiguous(), lo, *want, *kernel)
            for u, v in zip(got, want, strict=True):
                assert torch.equal(bits(u), bits(v))
            assert torch.all(got[0][..., 24:] == 0)
            runs.append(got)
        for later in runs[2:]:  # wgmma at 256 rows a CTA against 128
            assert all(torch.equal(bits(u), bits(v)) for u, v in zip(later, runs[1], strict=True))
        for later in runs[1:2]:  # wgmma against mma.sync, slice by slice where both are finite
            for u, v in zip(later, runs[0], strict=True):
                assert torch.equal(torch.isfinite(u), torch.isfinite(v))
                for u_s, v_s in zip(u, v, strict=True):
                    finite = torch.isfinite(u_s)
                    scale = v_s[finite].abs().max()
                    assert (u_s - v_s)[finite].abs().max() <= 1e-6 * scale
    x, fn, _, _ = example_inputs(4, 5120, device="cuda", seed=9)
    part, sqsum = torch.empty(8, 4, 32, device="cuda"), torch.empty(8, 4, device="cuda")
    with pytest.raises(ValueError, match="rows_per_cta"):
        module.hc_mix_partials_tf32(x, fn, split_tf32(fn)[1], part, sqsum, False, 256)
    with pytest.raises(ValueError, match="part"):
        module.hc_mix_partials_tf32(x, fn, split_tf32(fn)[1], part[..., :16], sqsum, False, 128)
    # Slices past K's 64-column blocks hold no chunk and write zeros (K = 256: 4 blocks).
    x, fn, _, _ = example_inputs(3, 64, device="cuda", seed=10)
    lo = split_tf32(fn)[1]
    for kernel in kernels:
        part, sqsum = (
            torch.full((8, 3, 32), 7.0, device="cuda"),
            torch.full((8, 3), 7.0, device="cuda"),
        )
        module.hc_mix_partials_tf32(x, fn, lo, part, sqsum, *kernel)
        assert torch.all(part[4:] == 0) and torch.all(sqsum[4:] == 0) and torch.all(sqsum[:4] > 0)
    overlapping = x[:1].expand(3, -1)  # row stride 0: the Triton projection's, not a tensor map's
    assert not cuda_kernel_fits(overlapping, fn)
    if sm_major(0) == 9:
        with pytest.raises(ValueError, match="rows overlap"):
            module.hc_mix_partials_tf32(overlapping, fn, lo, part, sqsum, True, 128)
    x, fn, _, _ = example_inputs(128, 5120, device="cuda", seed=9)
    strided = torch.empty(fn.shape[1], fn.shape[0], device="cuda").t().copy_(fn)
    assert not cuda_kernel_fits(x, strided)
    assert hc_mix_stats_admission(x, strided, "compensated").kernel == "compensated/triton"


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and sm_major(0) == 9 and module_available("hc_mix_stats", 0)),
    reason="no Hopper GPU, or no CUDA module for it: the fused kernel is wgmma's",
)
def test_gpu_fused_statistics():
    """The fused kernel (one launch: each row tile's slices one cluster): within the stated
    tolerances of float64; its mix is the slices' partials (the partials entry's, bit for bit)
    added in slice order in fp32, times the RMS factor; deterministic, and a row's bits do not
    depend on where it sits or on m for a given slice count. The op takes it at 256 rows a CTA
    and at most FUSED_MAX_SPLITS slices."""
    module = load_module("hc_mix_stats")
    k = 4 * 5120

    def fused(x, fn, lo, scale, base, splits, iters=20, rms_eps=1e-6, eps=1e-6, post_mult=2.0):
        m = x.shape[0]
        outs = [torch.full(s, 7.0, device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4), (m, 24))]
        module.hc_mix_stats_fused(x, fn, lo, scale, base, *outs, splits, rms_eps, eps, post_mult,
                                  iters)  # fmt: skip
        return outs

    for m, splits in ((1, 1), (255, 8), (256, 3), (300, 5), (2000, 2), (4096 + 17, 8)):
        x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=400 + m)
        lo = split_tf32(fn)[1]
        ours = fused(x, fn, lo, scale, base, splits)
        ref = reference_with_mix(x, fn, scale, base)
        assert mix_relative_error(ours[3], ref[3]) <= MIX_RTOL, (m, splits)
        assert stats_mismatches(ours, ref, scale) == 0, (m, splits)
        part, sqsum = (
            torch.empty(splits, m, 32, device="cuda"),
            torch.empty(splits, m, device="cuda"),
        )
        module.hc_mix_partials_tf32(x, fn, lo, part, sqsum, True, 256)
        total, sq = part[0].clone(), sqsum[0].clone()
        for s in range(1, splits):  # fp32 adds in slice order
            total += part[s]
            sq += sqsum[s]
        mix = total[:, :24].double() * torch.rsqrt(sq.double() / k + 1e-6)[:, None]
        assert ((ours[3] - mix).abs().max() / mix.abs().max()) <= 2e-7, (m, splits)
        assert_rows_equal(ours, fused(x, fn, lo, scale, base, splits))
        other = example_inputs(m + 37, 5120, device="cuda", seed=500 + m)[0]
        other[37:] = x
        assert_rows_equal(ours, [t[37:] for t in fused(other, fn, lo, scale, base, splits)])
    options = fused(x, fn, lo, scale, base, 8, iters=3, rms_eps=1e-3, eps=1e-4, post_mult=1.0)
    want = ref_mix_stats(x, fn, scale, base, iters=3, rms_eps=1e-3, eps=1e-4, post_mult=1.0)
    for a, b in zip(options[:3], want, strict=True):
        assert (a.double() - b).abs().max() < 1e-5
    for m, fused_expected in ((1024, False), (4096, False), (16384, True), (65536, True)):
        cfg = split_k_config(Path.COMPENSATED, m, k, 132, cuda=True, wgmma=True)  # the H200's SMs
        assert fuses(cfg, wgmma=True) is fused_expected
    assert not fuses(split_k_config(Path.BATCH_INVARIANT, 4096, k, 132, cuda=True), wgmma=True)
    x, fn, scale, base = example_inputs(16384, 5120, device="cuda", seed=9)
    holder = HcDerivedWeights(fn)
    cfg = split_k_config(Path.COMPENSATED, 16384, k, num_sms(x.device), cuda=True, wgmma=True)
    assert hc_mix_stats_admission(x, holder).kernel == "compensated/cuda wgmma fused"
    assert_rows_equal(
        hc_mix_stats(x, holder, scale, base, return_mix=True),
        fused(x, fn, holder.lo, scale, base, cfg.splits),
    )
    for kw, match in (
        ({"splits": 9}, "splits"),
        ({"splits": 0}, "splits"),
        ({"iters": 0}, "iters"),
    ):
        with pytest.raises(ValueError, match=match):
            fused(x, fn, holder.lo, scale, base, **{"splits": 8, **kw})
    with pytest.raises(ValueError, match="base"):
        fused(x, fn, holder.lo, scale, base[:8], 8)


@pytest.mark.gpu
def test_gpu_batch_invariance_bit_for_bit():
    _, fn, scale, base = example_inputs(1, 5120, device="cuda", seed=11)
    holder = HcDerivedWeights(fn)
    run = lambda rows: hc_mix_stats(
        rows, holder, scale, base, mode="batch_invariant", return_mix=True
    )
    probes = example_inputs(5, 5120, device="cuda", seed=12)[0]
    batches = {
        batch: example_inputs(batch, 5120, device="cuda", seed=batch)[0] for batch in (384, 4096)
    }
    for p in range(probes.shape[0]):
        row = probes[p : p + 1]
        alone = run(row.clone())
        for batch, positions in ((384, (0, 1, 100, 383)), (4096, (0, 63, 64, 2049, 4095))):
            x = batches[batch]  # earlier probes stay in it: only row pos is compared
            for pos in positions:
                x[pos] = row[0]
                inside = run(x)
                assert_rows_equal(alone, [t[pos : pos + 1] for t in inside])


@pytest.mark.gpu
@pytest.mark.parametrize("m,mode", [(6, "small_row"), (64, "small_row"), (1024, "compensated")])
def test_gpu_deterministic_across_launches(m, mode):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=13)
    holder = HcDerivedWeights(fn)
    first = hc_mix_stats(x, holder, scale, base, mode=mode, return_mix=True)
    for _ in range(20):
        assert_rows_equal(first, hc_mix_stats(x, holder, scale, base, mode=mode, return_mix=True))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [6, 1024, 16384])  # small-row; partials + finisher; fused
def test_gpu_cuda_graph_capture_and_replay(m):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=14)
    holder = HcDerivedWeights(fn)
    eager = hc_mix_stats(x, holder, scale, base)  # compiles outside capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        hc_mix_stats(x, holder, scale, base)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = hc_mix_stats(x, holder, scale, base)
    x.copy_(example_inputs(m, 5120, device="cuda", seed=15)[0])
    graph.replay()
    torch.cuda.synchronize()
    assert_rows_equal(captured, hc_mix_stats(x, holder, scale, base))
    assert not torch.equal(captured[0], eager[0])


def test_cuda_projection_is_only_chosen_for_cuda_tensors():
    x = example_inputs(4, 64, device="cpu", seed=1)[0]
    _, fn, _, _ = example_inputs(4, 64, device="cpu", seed=1)
    assert not cuda_kernel_fits(x, fn)
    admission = hc_mix_stats_admission(x, fn, "compensated")
    assert "mma.sync" not in admission.reason
    assert admission.kernel in (None, "compensated/triton")
