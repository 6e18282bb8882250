"""MXFP8 quantization of decode activations: the torch reference vs the Triton quantizer.

DeepSeek-V4.1's hidden sizes (K = 5120, and 4096), m = 1 to 300 rows, bf16, the 128x4 swizzled
scale layout an MXFP8 GEMM reads. Arms: ``torch reference`` (the plain statement of FlashInfer's
bytes, :func:`dsv41_kernels.reference.mxfp8_quantize.mxfp8_quantize`) and ``ours``; every arm is
checked byte for byte against the reference first. ``sglang-0.5.23``: what SGLang's MXFP8
consumers call, FlashInfer's ``mxfp8_quantize``, where FlashInfer imports; its CUDA kernel is
compiled only for SM100+ (docs/specs.md B.6) and SGLang's MXFP8 dense backends are
Blackwell-only, so on Hopper that arm records why it did not run.
    python benchmark/kernels/bench_mxfp8_quantize.py --json bench_mxfp8_quantize.json
"""

from __future__ import annotations

import torch
from common import parser, report, sglang_arm, sglang_function, timed

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.ops.quantization.mxfp8_quantize import mxfp8_quantize, mxfp8_quantize_admission
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize as reference_mxfp8_quantize


def measure(m: int, k: int) -> list[dict]:
    gen = torch.Generator().manual_seed(m * k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
    ref = reference_mxfp8_quantize(x)
    shape = f"[{m}, {k}] bf16, swizzled"
    kernel = mxfp8_quantize_admission(x).kernel
    arms = {
        "torch reference": lambda: reference_mxfp8_quantize(x),
        "ours": lambda: mxfp8_quantize(x),
    }
    flashinfer, why = sglang_function("flashinfer", "mxfp8_quantize")
    if flashinfer is not None and torch.cuda.get_device_capability()[0] < 10:
        flashinfer, why = None, "FlashInfer's MXFP8 quantizer runs on SM100+ only"
    run = lambda: flashinfer(x, is_sf_swizzled_layout=True)
    records = [sglang_arm("mxfp8_quantize", shape, flashinfer, why, run)]
    for arm, run in arms.items():
        exact = bit_mismatches(run(), ref) == 0
        fields = {"exact": exact, "kernel": kernel if arm == "ours" else None}
        records.append(timed("mxfp8_quantize", shape, arm, run, **fields))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default="1,6,64,128,300")
    p.add_argument("--k", default="5120,4096")
    args = p.parse_args()
    records = [
        r
        for k in map(int, args.k.split(","))
        for m in map(int, args.rows.split(","))
        for r in measure(m, k)
    ]
    report(records, args.json, baseline="torch reference")


if __name__ == "__main__":
    main()
