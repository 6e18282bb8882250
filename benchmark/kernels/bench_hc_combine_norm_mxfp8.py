"""mHC combine+RMSNorm then MXFP8 quantization: two launches (ours) vs the fused one-launch form.

DeepSeek-V4.1's hidden size (H = 5120), the decode/verify row counts m = 1, 6, 8, 64, 128
(DSpark verifies 6 rows per request). Unfused: ``hc_combine_norm`` then ``mxfp8_quantize``
(both ours); fused: ``hc_combine_norm_mxfp8``; the combine+norm alone is listed for reference.
Outputs are preallocated where the API takes them; the three outputs are checked bit-equal
first. CUDA-graph replay medians (dsv41_kernels.timing.graph_time_us). Target on the H200 at
m = 6: fused <= 3.0 us and <= 0.7x the unfused pair.
    python benchmark/kernels/bench_hc_combine_norm_mxfp8.py --json bench_hc_combine_norm_mxfp8.json

On sm_90+ the ops run the CUDA cluster kernel; "fused (triton)" is the Triton kernel forced,
for comparison. ``--sweep`` also times the launch shapes of both kernels at m = 6 and 64: the
Triton variants (warps per row, hardware bf16 rounding), after checking for each that the fused
form equals the unfused pair bit for bit, that y is batch-invariant (rows alone and in another
order give the same bits) and within one bf16 ulp of float64; and the CUDA cluster shapes (CTAs
per row x threads), after checking fused y == unfused y and the e4m3 bytes against the
reference quantizer. Its records go to the JSON file too.
"""

from __future__ import annotations

import argparse
import json

import torch

from dsv41_kernels.check import bit_mismatches
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.layernorm.hc_combine_norm import (
    DEFAULT_VARIANT,
    KernelVariant,
    beyond_one_bf16_ulp,
    example_inputs,
    hc_combine_norm,
    hc_combine_norm_admission,
    hc_combine_norm_mxfp8,
    uses_cuda_kernel,
)
from dsv41_kernels.ops.quantization.mxfp8_quantize import Mxfp8SwizzledInput, mxfp8_quantize
from dsv41_kernels.reference.mhc import hc_combine_norm as reference_hc_combine_norm
from dsv41_kernels.reference.mxfp8 import mxfp8_quantize as reference_mxfp8_quantize
from dsv41_kernels.reference.mxfp8 import scale_buffer_size
from dsv41_kernels.timing import graph_time_us

EPS = 1e-6
SWEEP_ROWS = (6, 64)
SWEEP_VARIANTS = [
    KernelVariant(num_warps, hw_round) for num_warps in (4, 8, 16) for hw_round in (False, True)
]
SWEEP_CUDA_SHAPES = [(c, t) for c in (1, 2, 4) for t in (128, 160, 256, 320)]


def preallocated(m: int, h: int, device) -> tuple[torch.Tensor, Mxfp8SwizzledInput]:
    return torch.empty(m, h, dtype=torch.bfloat16, device=device), Mxfp8SwizzledInput(
        torch.empty(m, h, dtype=torch.float8_e4m3fn, device=device),
        torch.empty(scale_buffer_size(m, h, swizzled=True), dtype=torch.uint8, device=device),
    )


def variant_defects(variant: KernelVariant, x, pre, weight) -> list[str]:
    """What breaks the contract for this variant: fused != unfused (bitwise), y not
    batch-invariant (each row alone, and the rows reversed), y beyond one bf16 ulp of float64."""
    defects = []
    y, quantized = hc_combine_norm_mxfp8(x, pre, weight, EPS, _variant=variant)
    y_alone = hc_combine_norm(x, pre, weight, EPS, _variant=variant)
    if bit_mismatches((y, quantized), (y_alone, mxfp8_quantize(y_alone))):
        defects.append("fused!=unfused")
    flipped = hc_combine_norm(x.flip(0), pre.flip(0), weight, EPS, _variant=variant).flip(0)
    single = [
        hc_combine_norm(x[r : r + 1], pre[r : r + 1], weight, EPS, _variant=variant)
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
        y, quantized = preallocated(m, h, device)
        for variant in SWEEP_VARIANTS:
            defects = variant_defects(variant, x, pre, weight)

            def combine_norm(v=variant):
                return hc_combine_norm(x, pre, weight, EPS, out=y, _variant=v)

            def fused(v=variant):
                return hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, quantized), _variant=v)

            records.append(
                {
                    "op": "hc_combine_norm_mxfp8 sweep",
                    "m": m,
                    "hidden": h,
                    "num_warps": variant.num_warps,
                    "hw_round": variant.hw_round,
                    "default": variant == DEFAULT_VARIANT,
                    "combine_norm_us": graph_time_us(combine_norm),
                    "fused_us": graph_time_us(fused),
                    "defects": defects,
                }
            )
    if uses_cuda_kernel(*example_inputs(1, h, device, seed=0)[::2]):
        records += cuda_sweep(h, device)
    print(f"\nsweep (H = {h}; * = the Triton default; CUDA default at H = 5120: 4 CTAs x 160)")
    print(f"{'m':>4} {'kernel shape':>24} {'combine+norm us':>16} {'fused us':>9}  checks")
    for r in records:
        mark = "*" if r["default"] else " "
        if "cluster" in r:
            shape = f"cuda {r['cluster']} CTAs x {r['threads']}"
        else:
            shape = f"triton {r['num_warps']} warps{' hw' if r['hw_round'] else ''}"
        checks = ", ".join(r["defects"]) or "ok"
        print(
            f"{r['m']:>4} {shape:>23}{mark} "
            f"{r['combine_norm_us']:>16.2f} {r['fused_us']:>9.2f}  {checks}"
        )
    return records


def cuda_sweep(h: int, device) -> list[dict]:
    """The CUDA kernel's launch shapes through its shape export (the public ops take the
    module's default shape, chosen from H: 4 CTAs of 160 threads at H = 5120)."""
    module = load_module("hc_combine_norm", device.index or 0)
    records = []
    for m in SWEEP_ROWS:
        x, pre, weight = example_inputs(m, h, device, seed=m)
        y_alone, (y, quantized) = (
            torch.empty(m, h, dtype=torch.bfloat16, device=device),
            (preallocated(m, h, device)),
        )
        data = quantized.data.view(torch.uint8)
        for cluster, threads in SWEEP_CUDA_SHAPES:

            def combine_norm(c=cluster, t=threads):
                module.hc_combine_norm_cuda_shape(x, pre, weight, y_alone, y, y, EPS, False, c, t)

            def fused(c=cluster, t=threads):
                module.hc_combine_norm_cuda_shape(
                    x, pre, weight, y, data, quantized.scales, EPS, True, c, t
                )

            try:
                combine_norm()
                fused()
            except ValueError as exc:  # a shape that does not divide this H
                records.append({"m": m, "cluster": cluster, "threads": threads, "error": str(exc)})
                continue
            defects = []
            if bit_mismatches(y, y_alone):
                defects.append("fused y != unfused y")
            if bit_mismatches(quantized, reference_mxfp8_quantize(y_alone, swizzled=True)):
                defects.append("e4m3/scales != reference")
            records.append(
                {
                    "op": "hc_combine_norm_mxfp8 sweep",
                    "m": m,
                    "hidden": h,
                    "cluster": cluster,
                    "threads": threads,
                    "default": False,
                    "combine_norm_us": graph_time_us(combine_norm),
                    "fused_us": graph_time_us(fused),
                    "defects": defects,
                }
            )
    return [r for r in records if "error" not in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--rows", default="1,6,8,64,128")
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--sweep", action="store_true", help="also time the launch variants")
    args = parser.parse_args()
    device = torch.device("cuda")
    h = args.hidden
    records = []
    for m in map(int, args.rows.split(",")):
        x, pre, weight = example_inputs(m, h, device, seed=m)
        y = torch.empty(m, h, dtype=torch.bfloat16, device=device)
        y_fused, quantized = preallocated(m, h, device)

        def combine_norm(y=y, x=x, pre=pre, weight=weight):
            return hc_combine_norm(x, pre, weight, EPS, out=y)

        def pair(y=y, x=x, pre=pre, weight=weight):
            return y, mxfp8_quantize(hc_combine_norm(x, pre, weight, EPS, out=y))

        def fused(out=(y_fused, quantized), x=x, pre=pre, weight=weight):
            return hc_combine_norm_mxfp8(x, pre, weight, EPS, out=out)

        def fused_triton(out=(y_fused, quantized), x=x, pre=pre, weight=weight):
            return hc_combine_norm_mxfp8(x, pre, weight, EPS, out=out, _variant=DEFAULT_VARIANT)

        bad = bit_mismatches(fused(), pair())
        if bad:
            raise AssertionError(f"fused and unfused outputs differ in {bad} elements at m={m}")
        record = {
            "op": "hc_combine_norm_mxfp8",
            "m": m,
            "hidden": h,
            "path": hc_combine_norm_admission(x, pre, weight, quantize=True).reason,
            "combine_norm_us": graph_time_us(combine_norm),
            "unfused_us": graph_time_us(pair),
            "fused_us": graph_time_us(fused),
            "fused_triton_us": graph_time_us(fused_triton),
        }
        record["fused_over_unfused"] = record["fused_us"] / record["unfused_us"]
        records.append(record)
    print(f"ours: {records[0]['path']}" if records else "")
    print(
        f"{'m':>4} {'H':>5} {'combine+norm us':>16} {'unfused pair us':>16} "
        f"{'fused us':>9} {'fused/unfused':>14} {'fused (triton) us':>18}"
    )
    for r in records:
        print(
            f"{r['m']:>4} {r['hidden']:>5} {r['combine_norm_us']:>16.2f} {r['unfused_us']:>16.2f} "
            f"{r['fused_us']:>9.2f} {r['fused_over_unfused']:>14.2f} {r['fused_triton_us']:>18.2f}"
        )
    if args.sweep:
        records += sweep(h, device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=2)


if __name__ == "__main__":
    main()
