"""mHC mixing statistics: projection, RMS factor, gates and Sinkhorn in two launches (one where
the CUDA projection fuses the statistics: Hopper, 1-2 K slices).

Every DeepSeek-V4(.1) sublayer turns its four residual streams ``x [m, 4H]`` (bf16) into
``(pre [m, 4], post [m, 4], comb [m, 4, 4])`` through a projection by ``fn [24, 4H]`` (fp32)
(docs/specs.md C.3). A plain fp32 GEMM is slow on tensor-core hardware and single-pass TF32,
what upstream runs, reads ``fn`` truncated to 11 significant bits (relative error ~2e-4).
Here ``fn`` is split into its TF32 part and the exact residual, ``fn = hi + lo``
(:func:`dsv41_kernels.ops.mhc.hc_derived_weights.split_tf32`); two tensor-core products
``x·hi + x·lo`` lose nothing on the activation side (bf16 is exact in TF32) and carry ``fn`` to
about 22 bits (C.7). Only ``lo`` is stored: ``hi`` is read from ``fn`` itself.

Paths (chosen by :func:`hc_mix_stats_admission`, every one deterministic):

- ``compensated`` (>= 128 rows): split-K TF32 passes over ``hi`` and ``lo``, per K slice a
  partial of the projection and a partial sum of squares ``[S, m]``; one finisher reduces the
  slices in a fixed order, applies the RMS factor, the gates and the 20-iteration Sinkhorn. On
  sm_80+ (aligned rows, ``fn`` contiguous) the projection is the CUDA kernel
  ``sgl-kernel/csrc/hc_mix_stats.cu`` (TF32 ``wgmma`` fed by TMA on Hopper, ``mma.sync`` fed
  by cp.async elsewhere), whose partial ``[S, m, 32]`` already holds each slice's
  ``x·hi + x·lo`` (on Hopper from 16384 rows, 1-2 K slices, the same launch also finishes
  the statistics: :func:`~.hc_mix_stats_plan.fuses`); elsewhere Triton, whose partial is
  the 64 columns ``[hi | 0 | lo | 0]`` (the finisher adds the halves). The Triton
  projection's fp32 copy of x defeats its pipeliner, so it reads x at well under the CUDA
  kernels' bandwidth. The two differ in the last bits and the statistics feed
  the residual streams every rank of a tensor-parallel group holds a copy of, so the choice
  never depends on the toolchain: a machine that cannot build or load the CUDA module gets that
  error, not the other bits.
- ``small_row`` (fewer rows, decode and verify) on the raw ``fn`` (no split to hold): on
  sm_90+ with 128+ SMs, H = 5120 and 1-64 rows (:func:`~.hc_mix_stats_plan.rows_kernel_fits`;
  ``auto`` takes the compensated path from 65 rows on such a GPU) the small-row kernel of
  ``sgl-kernel/csrc/hc_boundary.cu``, whose projection is fp32 fmas on CUDA cores (each
  product rounded once; the K slices and the orders are in the source's header) and whose
  CTAs then finish a row each, launched as a dependent pair of grids or as one cooperative
  grid (the plan's ``dependent``; the same bits); :func:`~.hc_boundary.hc_boundary` runs the
  same code after the post, so both give the same bits. Elsewhere the same two launches as
  above, the projection one TF32x3 ``tl.dot`` (the split made in registers; x's residual is
  zero), K cut into up to 128 slices so a handful of rows fills the machine.
- ``batch_invariant`` (asked for): the compensated kernels with one fixed launch shape (split
  count, tiles, finisher rows) for every ``m``, so a row's bits do not depend on the batch. Its
  torch fallback keeps that contract by computing each row alone (:func:`fallback`).

The admission chooses the path, the projection's kernel and the launch shape once, as a
:class:`~.hc_mix_stats_plan.MixStatsPlan` (``Admission.plan``); its ``kernel`` names the path and
the kernel that runs, e.g. ``"compensated/cuda wgmma"``, ``"compensated/cuda wgmma fused"`` or
``"small_row/triton"``. The Triton kernels are in :mod:`.hc_mix_stats_triton`.

Exactness claim: no path is bitwise equal to an fp32 SGEMM (tensor-core accumulation order is
not sequential, C.7). Against a float64 reference the mix values stay within
``MIX_RTOL = 5e-6`` (max error over max magnitude) and the gates within the tolerances that
implies (:func:`dsv41_kernels.cases.hc_mix_stats.stats_tolerances`); each path is deterministic
and ``batch_invariant`` is bitwise independent of batch size and row position.

Derived weights: :class:`~dsv41_kernels.ops.mhc.hc_derived_weights.HcDerivedWeights` holds the
residual of one sublayer's ``fn``, made once at load (the compensated paths make it from a bare
``fn`` on every call).
"""

from __future__ import annotations

import torch

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_flag,
    check_float,
    check_int,
    check_tensor,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import cuda_index
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc import hc_mix_stats_plan
from dsv41_kernels.ops.mhc import hc_mix_stats_triton as triton_kernels
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, tf32_residual
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import (
    MixStatsPlan,
    Numerics,
    Path,
    Projection,
    default_plan,
    projection_for,
    rows_kernel_fits,
    rows_kernel_shape,
)
from dsv41_kernels.reference.hc_mix_stats import HC_MIX, HC_MULT, hc_gates, hc_mix

MODES = ("auto", "compensated", "small_row", "batch_invariant")
COMPENSATED_MIN_ROWS = 128
"""``auto`` takes the compensated path from this many rows; below, the small-row path, except
between the small-row kernel's rows and this where that kernel would otherwise run (the
compensated CUDA projection is faster there)."""
ROWS_KERNEL_MAX_ROWS = hc_mix_stats_plan.ROWS_KERNEL_MAX_ROWS
MIX_RTOL = 5e-6
"""Bound on ``max|mix - ref| / max|ref|`` against the float64 reference, stated for every path
(the GPU tests also hold the compensated path ten times below single-pass TF32)."""
MAX_SINKHORN_ITERS = 1000
"""Sinkhorn converges in tens of iterations (V4 runs 20); the bound keeps a mistyped count from
running for hours."""
MODULE = "hc_mix_stats"  # sgl-kernel/csrc/hc_mix_stats.cu: the CUDA projection (fused or not)
ROWS_MODULE = "hc_boundary"  # sgl-kernel/csrc/hc_boundary.cu: the small-row kernel


def _check_mode(mode) -> None:
    if not (isinstance(mode, str) and mode in MODES):
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _on_device_of_x(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device}, x on {x.device}")


def _validate_inputs(x, weights, mode) -> None:
    _check_mode(mode)
    check_tensor("x", x, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    if x.dim() not in (2, 3) or (x.dim() == 3 and x.shape[1] != HC_MULT):
        raise ValueError(f"x must be [m, 4H] or [m, 4, H], got shape {tuple(x.shape)}")
    if x.is_meta:  # the fallback would "compute" meta outputs from no data
        raise ValueError("x is a meta tensor: the statistics need its values")
    k = x.flatten(1).shape[1]
    fn = weights.fn if isinstance(weights, HcDerivedWeights) else weights
    check_tensor("weights", fn, dtypes=(torch.float32,), ndim=2)
    if fn.shape != (HC_MIX, k):
        raise ValueError(f"weights must be [{HC_MIX}, {k}], got {tuple(fn.shape)}")
    _on_device_of_x("weights", fn, x)


def _validate_gates(x, scale, base, scalars: dict) -> dict:
    """What the admission does not see (``x`` already checked): raise ValueError naming the
    argument; returns ``scalars`` (``iters``, ``rms_eps``, ``eps``, ``post_mult``) as Python
    numbers."""
    for name, t, size in (("scale", scale, 3), ("base", base, HC_MIX)):
        check_tensor(name, t, dtypes=(torch.float32,))
        if tuple(t.shape) != (size,):
            raise ValueError(f"{name} must be [{size}], got {tuple(t.shape)}")
        _on_device_of_x(name, t, x)
    return {
        "iters": check_int("iters", scalars["iters"], low=1, high=MAX_SINKHORN_ITERS),
        **{name: check_float(name, scalars[name]) for name in ("rms_eps", "eps", "post_mult")},
    }


def _path(x2d: torch.Tensor, fn: torch.Tensor, mode: str) -> tuple[Path, str]:
    rows = x2d.shape[0]
    if mode != "auto":
        return Path(mode), "requested"
    if rows >= COMPENSATED_MIN_ROWS:
        return Path.COMPENSATED, f"{rows} rows >= {COMPENSATED_MIN_ROWS}"
    if rows_kernel_fits(x2d, fn):
        return Path.SMALL_ROW, f"{rows} rows <= {ROWS_KERNEL_MAX_ROWS}"
    # Past the small-row kernel's rows, on a GPU and layout it serves: compensated.
    if rows > ROWS_KERNEL_MAX_ROWS and rows_kernel_shape(x2d, fn):
        return Path.COMPENSATED, f"{rows} rows > {ROWS_KERNEL_MAX_ROWS}, the small-row kernel's"
    return Path.SMALL_ROW, f"{rows} rows < {COMPENSATED_MIN_ROWS}"


_PROJECTION_NOTES = {
    Projection.CUDA_WGMMA: ", CUDA wgmma projection",
    Projection.CUDA_MMA: ", CUDA mma.sync projection",
    Projection.CUDA_FP32: ", CUDA small-row kernel",
    Projection.TRITON: "",
}


def _plan(x: torch.Tensor, fn: torch.Tensor, derived: bool, mode: str) -> Admission:
    """The admission for valid arguments: the one place the plan is chosen."""
    where = triton_device(x)
    if not where:
        return where
    if x.dtype != torch.bfloat16:
        return refuse(f"x dtype {x.dtype} (the kernels read bf16)")
    x2d = x.flatten(1)
    path, why = _path(x2d, fn, mode)
    # Never the toolchain: the same projection on every rank (see the module docstring).
    projection = projection_for(x2d, fn, path)
    plan = default_plan(path, projection, *x2d.shape, x.device)
    why += _PROJECTION_NOTES[projection]
    if plan.numerics is Numerics.COMPENSATED and not derived:
        why += ", fn's residual made on every call (pass HcDerivedWeights)"
    module = {Projection.TRITON: None, Projection.CUDA_FP32: ROWS_MODULE}.get(projection, MODULE)
    return admit(plan.kernel, f"{path.value}: {why} ({where.reason})", module, plan)


def hc_mix_stats_admission(x: torch.Tensor, weights, mode: str = "auto") -> Admission:
    """Whether the kernels run, and the plan they run (``kernel`` names the path and the
    projection's kernel; the reason starts with the path's name). Pure: reads shapes,
    strides, dtypes and devices only."""
    try:
        _validate_inputs(x, weights, mode)
    except ValueError as e:
        return invalid(e)
    derived = isinstance(weights, HcDerivedWeights)
    return _plan(x, weights.fn if derived else weights, derived, mode)


def hc_mix_stats(
    x: torch.Tensor,
    weights,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    iters: int = 20,
    rms_eps: float = 1e-6,
    eps: float = 1e-6,
    post_mult: float = 2.0,
    mode: str = "auto",
    return_mix: bool = False,
    admission: Admission | None = None,
):
    """mHC statistics of ``x``: ``(pre [m, 4], post [m, 4], comb [m, 4, 4])``, all fp32.

    Args:
        x: ``[m, 4H]`` bf16, the flattened streams (``[m, 4, H]`` is accepted and flattened).
        weights: ``fn [24, 4H]`` fp32, or its :class:`HcDerivedWeights` (the compensated paths
            make a bare ``fn``'s residual on every call; pass the holder to make it once).
        scale: ``[3]`` fp32 (pre, post, comb). base: ``[24]`` fp32.
        iters, rms_eps, eps, post_mult: V4's 20, 1e-6, 1e-6, 2.0.
        mode: ``"auto"`` (compensated from 128 rows, small-row below), ``"compensated"``,
            ``"small_row"`` or ``"batch_invariant"`` (see the module).
        return_mix: also return ``mix [m, 24]`` fp32, the projection times the RMS factor.
        admission: this call's :func:`hc_mix_stats_admission`, when the caller already made it:
            its plan is what runs, and an admitted one is not validated again.

    Without a Triton device (or with non-bf16 ``x``) the fp32 torch composition runs instead,
    one row at a time in the ``batch_invariant`` mode (the same bits whatever the batch).
    """
    admission = check_admission(admission)
    holder = weights if isinstance(weights, HcDerivedWeights) else None
    fn = holder.fn if holder else weights
    if admission is None or not admission:
        _validate_inputs(x, weights, mode)
        admission = _plan(x, fn, holder is not None, mode) if admission is None else admission
    else:  # an admitted plan decides the path; the mode is still checked on every path
        _check_mode(mode)
    scalars = {"iters": iters, "rms_eps": rms_eps, "eps": eps, "post_mult": post_mult}
    scalars = _validate_gates(x, scale, base, scalars)
    return_mix = check_flag("return_mix", return_mix)
    x2d = x.flatten(1)
    lo = holder.require_active() if holder else None
    if not admission:
        outputs = fallback(x2d, fn, scale, base, **scalars, row_by_row=mode == "batch_invariant")
        return outputs if return_mix else outputs[:3]
    plan = admission.plan
    if plan.numerics is Numerics.COMPENSATED and lo is None:
        lo = tf32_residual(fn)  # only compensated reads lo; tf32x3 splits fn in registers
    return launch(x2d, fn, lo, scale, base, plan, **scalars, return_mix=return_mix)


def fallback(x2d, fn, scale, base, *, iters, rms_eps, eps, post_mult, row_by_row: bool):
    """The fp32 torch composition: ``(pre, post, comb, mix)``. ``row_by_row`` (the
    batch-invariant mode) computes each row alone from its own fresh copy, so the BLAS
    product's blocking, a reduction's split over threads and the vector loops' scalar tails
    (which round some elements differently) see the same shape and alignment whatever the
    batch: a row's bits depend on the row only. One row at a time, so slow for large batches."""

    def rows(x_rows):
        mix = hc_mix(x_rows, fn, rms_eps=rms_eps, dtype=torch.float32)
        return (*hc_gates(mix, scale, base, iters=iters, eps=eps, post_mult=post_mult), mix)

    m = x2d.shape[0]
    if not row_by_row or m == 0:
        return rows(x2d)
    alone = [rows(x2d[i : i + 1].clone(memory_format=torch.contiguous_format)) for i in range(m)]
    return tuple(torch.cat(parts) for parts in zip(*alone, strict=True))


def launch(
    x2d, fn, lo, scale, base, plan: MixStatsPlan, *, iters, rms_eps, eps, post_mult, return_mix
):
    """Run ``plan``: the projection (CUDA or Triton) and the finisher, or the fused CUDA kernel.
    Returns ``(pre, post, comb)`` and, with ``return_mix``, ``mix``. ``lo`` is fn's
    :func:`~dsv41_kernels.ops.mhc.hc_derived_weights.tf32_residual` (read with compensated
    numerics only)."""
    m, k = x2d.shape
    device = x2d.device
    pre = torch.empty((m, HC_MULT), dtype=torch.float32, device=device)
    post = torch.empty((m, HC_MULT), dtype=torch.float32, device=device)
    comb = torch.empty((m, HC_MULT, HC_MULT), dtype=torch.float32, device=device)
    mix = torch.empty((m, HC_MIX), dtype=torch.float32, device=device)  # the finishers write it
    outputs = (pre, post, comb, mix) if return_mix else (pre, post, comb)
    if m == 0:
        return outputs
    cfg = plan.config
    if plan.projection is Projection.CUDA_FP32:
        part = torch.empty((m, cfg.splits, HC_MIX + 1), dtype=torch.float32, device=device)
        load_module(ROWS_MODULE, cuda_index(device)).hc_mix_stats_rows_cuda(
            x2d, fn, scale.reshape(-1).contiguous(), base.reshape(-1).contiguous(), pre, post,
            comb, mix, part, cfg.block_m, plan.dependent, rms_eps, eps, post_mult, iters,
        )  # fmt: skip
        return outputs
    cuda = plan.projection is not Projection.TRITON
    module = load_module(MODULE, cuda_index(device)) if cuda else None
    if plan.fused:
        scale, base = scale.reshape(-1).contiguous(), base.reshape(-1).contiguous()
        module.hc_mix_stats_fused(
            x2d, fn, lo, scale, base, pre, post, comb, mix, cfg.splits, rms_eps, eps, post_mult,
            iters,
        )  # fmt: skip
        return outputs
    partial = torch.empty((cfg.splits, m, plan.partial_columns), dtype=torch.float32, device=device)
    sqsum = torch.empty((cfg.splits, m), dtype=torch.float32, device=device)
    if cuda:
        wgmma = plan.projection is Projection.CUDA_WGMMA
        module.hc_mix_partials_tf32(x2d, fn, lo, partial, sqsum, wgmma, cfg.block_m)
    else:
        triton_kernels.launch_partials(x2d, fn, lo, partial, sqsum, plan)
    triton_kernels.launch_finish(
        partial,
        sqsum,
        scale,
        base,
        (pre, post, comb, mix),
        plan,
        k=k,
        iters=iters,
        rms_eps=rms_eps,
        eps=eps,
        post_mult=post_mult,
    )
    return outputs
