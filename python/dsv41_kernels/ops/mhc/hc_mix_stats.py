"""mHC mixing statistics: projection, RMS factor, gates and Sinkhorn in two launches (one on
Hopper from 16384 rows).

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
  the statistics: :func:`~.hc_mix_stats_kernels.fuses`); elsewhere Triton, whose partial is
  the 64 columns ``[hi | 0 | lo | 0]`` (the finisher adds the halves). The
  Triton projection's fp32 copy of x defeats its pipeliner (~1.2 TB/s, against ~2.7 for
  ``mma.sync`` and ~3.5 for ``wgmma``). The two differ in the last bits and the statistics feed
  the residual streams every rank of a tensor-parallel group holds a copy of, so the choice
  never depends on the toolchain: a machine that cannot build or load the CUDA module gets that
  error, not the other bits.
- ``small_row`` (fewer rows, decode): the same two launches on the raw ``fn`` (no split to
  hold): the projection is one TF32x3 ``tl.dot`` (the split made in registers; x's residual
  is zero), K cut into up to 128 slices so a handful of rows fills the machine.
- ``batch_invariant`` (asked for): the compensated kernels with one fixed launch shape (split
  count, tiles, finisher rows) for every ``m``, so a row's bits do not depend on the batch.

The kernels and their launch shapes are in :mod:`.hc_mix_stats_kernels`; the admission's
``kernel`` names the path and the projection's kernel, e.g. ``"compensated/cuda"``.

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
    check_flag,
    check_float,
    check_int,
    check_tensor,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, tf32_residual
from dsv41_kernels.ops.mhc.hc_mix_stats_kernels import (
    MODULE,
    SplitKConfig,
    check_config,
    cuda_kernel_fits,
    launch,
    num_sms,
    split_k_config,
    uses_wgmma,
)
from dsv41_kernels.reference.mhc import HC_MIX, HC_MULT, hc_gates, hc_mix

MODES = ("auto", "compensated", "small_row", "batch_invariant")
COMPENSATED_MIN_ROWS = 128
"""``auto`` takes the compensated path from this many rows; below, the small-row path."""
MIX_RTOL = 5e-6
"""Bound on ``max|mix - ref| / max|ref|`` against the float64 reference, stated for every path
(the GPU tests also hold the compensated path ten times below single-pass TF32)."""
MAX_SINKHORN_ITERS = 1000
"""Sinkhorn converges in tens of iterations (V4 runs 20); the bound keeps a mistyped count from
running for hours."""
CUDA = "cuda"
TRITON = "triton"
"""The projection's kernel, the second half of an admission's ``kernel`` name."""


def _validate_inputs(x, weights, mode) -> None:
    if not (isinstance(mode, str) and mode in MODES):
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_tensor("x", x, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    if x.dim() not in (2, 3) or (x.dim() == 3 and x.shape[1] != HC_MULT):
        raise ValueError(f"x must be [m, 4H] or [m, 4, H], got shape {tuple(x.shape)}")
    k = x.flatten(1).shape[1]
    fn = weights.fn if isinstance(weights, HcDerivedWeights) else weights
    check_tensor("weights", fn, dtypes=(torch.float32,), ndim=2)
    if fn.shape != (HC_MIX, k):
        raise ValueError(f"weights must be [{HC_MIX}, {k}], got {tuple(fn.shape)}")
    if fn.device != x.device:
        raise ValueError(f"weights is on {fn.device}, x on {x.device}")


def _validate(x, weights, mode, scale, base, scalars: dict) -> dict:
    """Raise ValueError naming the argument; returns ``scalars`` (``iters``, ``rms_eps``,
    ``eps``, ``post_mult``) as Python numbers."""
    _validate_inputs(x, weights, mode)
    check_tensor("scale", scale, dtypes=(torch.float32,))
    check_tensor("base", base, dtypes=(torch.float32,))
    if scale.numel() != 3 or base.numel() != HC_MIX:
        raise ValueError(f"scale must have 3 and base {HC_MIX} elements")
    for name, t in (("scale", scale), ("base", base)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    return {
        "iters": check_int("iters", scalars["iters"], low=1, high=MAX_SINKHORN_ITERS),
        **{name: check_float(name, scalars[name]) for name in ("rms_eps", "eps", "post_mult")},
    }


def _path(rows: int, mode: str) -> tuple[str, str]:
    if mode != "auto":
        return mode, "requested"
    if rows >= COMPENSATED_MIN_ROWS:
        return "compensated", f"{rows} rows >= {COMPENSATED_MIN_ROWS}"
    return "small_row", f"{rows} rows < {COMPENSATED_MIN_ROWS}"


def _plan(x: torch.Tensor, fn: torch.Tensor, derived: bool, mode: str) -> Admission:
    where = triton_device(x)
    if not where:
        return where
    if x.dtype != torch.bfloat16:
        return refuse(f"x dtype {x.dtype} (the kernels read bf16)")
    path, why = _path(x.shape[0], mode)
    projection, module = TRITON, None
    if path in ("compensated", "batch_invariant"):
        if cuda_kernel_fits(x.flatten(1), fn):  # never the toolchain: the same on every rank
            projection, module = CUDA, MODULE
            why += f", CUDA {'wgmma' if uses_wgmma(x.device) else 'mma.sync'} projection"
        if not derived:
            why += ", fn's residual made on every call (pass HcDerivedWeights)"
    return admit(f"{path}/{projection}", f"{path}: {why} ({where.reason})", module)


def hc_mix_stats_admission(x: torch.Tensor, weights, mode: str = "auto") -> Admission:
    """Whether the kernels run, which path and which projection kernel (the reason starts with
    the path's name). Pure: reads shapes, dtypes and devices only."""
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
    config: SplitKConfig | None = None,
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
        config: a :class:`SplitKConfig` overriding the launch shape (tuning); in
            ``batch_invariant`` mode invariance holds among calls that use the same one. On
            the CUDA projection its ``block_m`` is the rows a CTA: 128, or 256 on Hopper
            (anything else is a ValueError).
        admission: this call's :func:`hc_mix_stats_admission`, when the caller already made it.

    Without a Triton device (or with non-bf16 ``x``) the fp32 torch composition runs instead.
    """
    scalars = {"iters": iters, "rms_eps": rms_eps, "eps": eps, "post_mult": post_mult}
    scalars = _validate(x, weights, mode, scale, base, scalars)
    return_mix = check_flag("return_mix", return_mix)
    if config is not None and not isinstance(config, SplitKConfig):
        raise ValueError(f"config must be a SplitKConfig or None, got {type(config).__name__}")
    x2d = x.flatten(1)
    holder = weights if isinstance(weights, HcDerivedWeights) else None
    fn = holder.fn if holder else weights
    lo = holder.require_active() if holder else None
    if admission is None:
        admission = _plan(x, fn, holder is not None, mode)
    if not admission:
        mix = hc_mix(x2d, fn, rms_eps=scalars["rms_eps"], dtype=torch.float32)
        stats = hc_gates(
            mix,
            scale,
            base,
            iters=scalars["iters"],
            eps=scalars["eps"],
            post_mult=scalars["post_mult"],
        )
        return (*stats, mix) if return_mix else stats
    path, projection = admission.kernel.split("/")
    numerics = "tf32x3" if path == "small_row" else "compensated"
    if numerics == "compensated" and lo is None:
        lo = tf32_residual(fn)  # only compensated reads lo; tf32x3 splits fn in registers
    cuda = projection == CUDA
    wgmma = cuda and uses_wgmma(x.device)
    cfg = config or split_k_config(path, *x2d.shape, num_sms(x.device), cuda=cuda, wgmma=wgmma)
    check_config(cfg, cuda=cuda, wgmma=wgmma)
    return launch(
        x2d,
        fn,
        lo,
        scale,
        base,
        numerics=numerics,
        cuda=cuda,
        cfg=cfg,
        **scalars,
        return_mix=return_mix,
    )
