"""The mHC combine + RMSNorm's launch-shape sweep (``bench_hc_combine_norm.py --sweep``): the
Triton kernel's variants (warps a row, hardware bf16 rounding) and the CUDA kernel's shapes
(CTAs a row x threads) at decode and verify row counts, each checked, then timed.

A Triton variant is checked for the fused form equal to the unfused pair bit for bit, y
batch-invariant (rows alone and in another order give the same bits) and within one bf16 ulp of
float64; a CUDA shape for fused y == unfused y and its e4m3 bytes against the reference
quantizer. A record's ``defects`` lists what failed (empty: all checks pass).
"""

from __future__ import annotations

import torch
from common import timed

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.hc_combine_norm import (
    beyond_one_bf16_ulp,
    example_inputs,
    mxfp8_outputs,
    triton_forms,
    triton_plan,
)
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm_admission, run_kernel
from dsv41_kernels.ops.mhc.hc_combine_norm_plan import DEFAULT_VARIANT, Kernel, KernelVariant
from dsv41_kernels.ops.mhc.quant_out import no_quant_out
from dsv41_kernels.ops.quantization.mxfp8_quantize import mxfp8_quantize
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as reference_hc_combine_norm
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize as reference_mxfp8_quantize

EPS = 1e-6
SWEEP_ROWS = (6, 64, 96, 128, 192)
SWEEP_VARIANTS = [
    KernelVariant(num_warps, hw_round) for num_warps in (4, 8, 16) for hw_round in (False, True)
]
SWEEP_CUDA_SHAPES = [(c, t) for c in (1, 2, 4) for t in (128, 160, 256, 320, 640)]


def shape_of(m: int, h: int) -> str:
    return f"[{m}, 4x{h}] bf16"


def variant_defects(variant: KernelVariant, x, pre, weight) -> list[str]:
    """What breaks the contract for this Triton variant: fused != unfused (bitwise), y not
    batch-invariant (each row alone, and the rows reversed), y beyond one bf16 ulp of float64."""
    defects = []
    y_alone, (y, quantized) = triton_forms(x, pre, weight, EPS, variant)
    if bit_mismatches((y, quantized), (y_alone, mxfp8_quantize(y_alone))):
        defects.append("fused!=unfused")
    flipped = triton_forms(x.flip(0), pre.flip(0), weight, EPS, variant)[0].flip(0)
    single = [
        triton_forms(x[r : r + 1], pre[r : r + 1], weight, EPS, variant)[0]
        for r in range(x.shape[0])
    ]
    if bit_mismatches(flipped, y) or bit_mismatches(torch.cat(single), y):
        defects.append("not batch-invariant")
    if beyond_one_bf16_ulp(y, reference_hc_combine_norm(x, pre, weight, EPS, dtype=torch.float64)):
        defects.append(">1 ulp")
    return defects


def sweep(h: int, device) -> list[dict]:
    records = []
    for m in SWEEP_ROWS:
        x, pre, weight = example_inputs(m, h, device, seed=m)
        y, quantized = mxfp8_outputs(m, h, device)
        for variant in SWEEP_VARIANTS:
            defects = variant_defects(variant, x, pre, weight)
            arm = f"triton {variant.num_warps} warps{' hw' if variant.hw_round else ''}"
            arm += " (default)" if variant == DEFAULT_VARIANT else ""
            for op, quantize in (("hc_combine_norm", None), ("hc_combine_norm_mxfp8", quantized)):
                plan = triton_plan(variant, quantize)
                run = lambda p=plan, q=quantize: run_kernel(x, pre, weight, EPS, y, q, p)
                records.append(timed(op, shape_of(m, h), arm, run, defects=defects))
    x, pre, weight = example_inputs(1, h, device, seed=0)
    if hc_combine_norm_admission(x, pre, weight).plan.kernel is not Kernel.TRITON:
        records += cuda_sweep(h, device)
    return records


def cuda_sweep(h: int, device) -> list[dict]:
    """The CUDA kernel's launch shapes through its export (the public ops take the plan's
    shape, chosen from m and H: 4 CTAs of 160 threads at H = 5120, one CTA of 640 threads at
    64-192 rows, with the same bits)."""
    module = load_module("hc_combine_norm", device.index or 0)
    records = []
    for m in SWEEP_ROWS:
        x, pre, weight = example_inputs(m, h, device, seed=m)
        y_alone = torch.empty(m, h, dtype=torch.bfloat16, device=device)
        y, quantized = mxfp8_outputs(m, h, device)
        data = quantized.data.view(torch.uint8)
        groups = no_quant_out(device, h)
        for cluster, threads in SWEEP_CUDA_SHAPES:

            def combine_norm(c=cluster, t=threads):
                module.hc_combine_norm_cuda(
                    x, pre, weight, y_alone, y, y, *groups, EPS, False, c, t
                )

            def fused(c=cluster, t=threads):
                module.hc_combine_norm_cuda(
                    x, pre, weight, y, data, quantized.scales, *groups, EPS, True, c, t
                )

            try:
                combine_norm()
                fused()
            except ValueError:  # a shape that does not divide this H
                continue
            defects = []
            if bit_mismatches(y, y_alone):
                defects.append("fused y != unfused y")
            if bit_mismatches(quantized, reference_mxfp8_quantize(y_alone, swizzled=True)):
                defects.append("e4m3/scales != reference")
            arm = f"cuda {cluster} CTAs x {threads}"
            for op, run in (("hc_combine_norm", combine_norm), ("hc_combine_norm_mxfp8", fused)):
                records.append(timed(op, shape_of(m, h), arm, run, defects=defects))
    return records
